"""Run a test file as a child process under Triton's interpreter and read its results.

``TRITON_INTERPRET=1`` must be set before Triton compiles anything, so the Triton checks run
their cases in one child (the test file run as a script), which prints one JSON line per case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def interpreted_results(script: str, *paths: Path) -> dict[str, dict]:
    """case -> result of ``script`` run by the interpreter on the CPU, with the repository
    root and ``paths`` importable."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(map(str, (ROOT, *paths))))
    proc = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {r["case"]: r for r in map(json.loads, proc.stdout.splitlines())}
