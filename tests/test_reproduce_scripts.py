"""The committed results' reproduce.sh scripts rerun into a new folder and compare its tables
with the committed ones: a sweep refuses to add to a folder whose cells ran on other package
code, so resuming the committed folder itself stops working at the first code change.

The sweep is a stand-in here (``sinkmask`` on PATH copies a folder's tables into ``--out``):
what is tested is the scripts' own logic, which folder they write and what they compare.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"

STAND_IN = """#!/usr/bin/env bash
# sinkmask sweep ... --out OUT: OUT gets the tables of $FROM, one changed where $SPOIL says
out=""
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
mkdir -p "$out"
for f in table.md table.csv versus.csv; do [ -f "$FROM/$f" ] && cp "$FROM/$f" "$out/"; done
if [ -n "${SPOIL:-}" ]; then echo "changed row" >> "$out/$SPOIL"; fi
echo "$out" > "$out/.written_by_stand_in"
"""


def _reproduce(tmp_path, script: str, tables_of: str, *out: str, results: Path = RESULTS,
               **env: str):
    """Run ``results/<script>/reproduce.sh [OUT]`` of the ``results`` folder given, its sweep a
    stand-in that writes the committed tables of ``results/<tables_of>``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sinkmask").write_text(STAND_IN)
    (bin_dir / "sinkmask").chmod(0o755)
    environ = {k: v for k, v in os.environ.items()
               if k not in ("SEEDS", "DRAWS", "TITLE", "PROBLEMS", "COMMITTED", "SPOIL")}
    environ.update(PATH=f"{bin_dir}:{os.environ['PATH']}", FROM=str(RESULTS / tables_of), **env)
    return subprocess.run([str(results / script / "reproduce.sh"), *out], cwd=tmp_path,
                          env=environ, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("script,files", [
    ("tiny", "table.md table.csv"),
    ("control", "table.md table.csv versus.csv"),
    ("seed1", "table.md table.csv versus.csv"),
    ("seed2", "table.md table.csv versus.csv"),
    ("mc", "table.md table.csv versus.csv"),
])
def test_a_rerun_that_gives_the_committed_tables_passes(tmp_path, script, files):
    out = tmp_path / "rerun"
    done = _reproduce(tmp_path, script, script, str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / ".written_by_stand_in").exists()
    assert f"reproduced: {files} in {out} are those of results/{script}" in done.stdout


@pytest.mark.parametrize("script,spoil", [("tiny", "table.csv"), ("control", "versus.csv"),
                                          ("seed2", "table.md"), ("mc", "versus.csv")])
def test_a_rerun_with_another_table_fails_and_shows_the_difference(tmp_path, script, spoil):
    done = _reproduce(tmp_path, script, script, str(tmp_path / "rerun"), SPOIL=spoil)
    assert done.returncode != 0 and "+changed row" in done.stdout
    assert "reproduced" not in done.stdout


def test_each_seed_is_compared_with_its_own_folder(tmp_path):
    # seed 1's rerun giving seed 0's tables is not a reproduction of results/seed1
    done = _reproduce(tmp_path, "seed1", "control", str(tmp_path / "rerun"))
    assert done.returncode != 0 and "results/seed1/table.md" in done.stdout


@pytest.mark.parametrize("script,env", [("tiny", {"PROBLEMS": "2"}), ("tiny", {"SEEDS": "0,1"}),
                                        ("control", {"SEEDS": "1"}), ("mc", {"DRAWS": "0"})])
def test_a_trial_run_with_other_settings_is_not_compared(tmp_path, script, env):
    done = _reproduce(tmp_path, script, script, str(tmp_path / "rerun"), SPOIL="table.md", **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not compared" in done.stdout


@pytest.mark.parametrize("script", ["tiny", "control", "seed1", "seed2", "mc"])
def test_the_default_folder_is_a_new_one_under_runs(tmp_path, script):
    # a checkout of its own (results/ without the cells), whose runs/ is the script's default
    checkout = tmp_path / "checkout"
    shutil.copytree(RESULTS, checkout / "results", ignore=shutil.ignore_patterns("cells", "*.png"))
    done = _reproduce(tmp_path, script, script, results=checkout / "results")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (checkout / "runs" / script / ".written_by_stand_in").exists()


def test_a_rerun_into_the_committed_folder_is_not_compared_with_itself(tmp_path):
    committed = tmp_path / "committed"
    committed.mkdir()
    (committed / "table.md").write_text("| a |\n")
    done = subprocess.run([str(RESULTS / "same_tables.sh"), str(committed), f"{committed}/.",
                           "table.md"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "is the committed folder: not compared" in done.stdout
