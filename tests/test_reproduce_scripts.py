"""The committed results' reproduce.sh scripts rerun into a new folder and compare its tables
with the committed ones: a sweep refuses to add to a folder whose cells ran on other package
code, so resuming the committed folder itself stops working at the first code change.

The sweep is a stand-in here (``sinkmask`` on PATH copies a folder's tables into ``--out``):
what is tested is the scripts' own logic, which folder they write and what they compare.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
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


def _stand_in_folder(tmp_path, script: str) -> Path:
    """A folder holding ``script`` as the ``sinkmask`` command, to put first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sinkmask").write_text(script)
    (bin_dir / "sinkmask").chmod(0o755)
    return bin_dir


def _reproduce(tmp_path, script: str, tables_of: str, *out: str, results: Path = RESULTS,
               **env: str):
    """Run ``results/<script>/reproduce.sh [OUT]`` of the ``results`` folder given, its sweep a
    stand-in that writes the committed tables of ``results/<tables_of>``."""
    bin_dir = _stand_in_folder(tmp_path, STAND_IN)
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


# ---- the sink traces: results/tiny/sinks/reproduce.sh and results/same_traces.py ----------

TRACE_STAND_IN = """#!/usr/bin/env bash
# sinkmask sinks --model .../NAME ... --out OUT: OUT gets the trace of $FROM/NAME
while [ $# -gt 0 ]; do
  case $1 in --model) model=$2 ;; --out) out=$2 ;; esac; shift
done
mkdir -p "$out" && cp "$FROM/$(basename "$model")"/{meta.json,trace.npz} "$out/"
"""
TRACED = ("arm", "llada", "dream")


def _retrace(tmp_path, traces: Path, *out: str, results: Path = RESULTS):
    """Run ``results/tiny/sinks/reproduce.sh [OUT]``, its tracer a stand-in that copies the
    traces of ``traces``."""
    bin_dir = _stand_in_folder(tmp_path, TRACE_STAND_IN)
    path = f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    return subprocess.run([str(results / "tiny" / "sinks" / "reproduce.sh"), *out],
                          cwd=tmp_path, env={**os.environ, "PATH": path, "FROM": str(traces)},
                          capture_output=True, text=True, timeout=120)


def _copied_traces(tmp_path) -> Path:
    copy = tmp_path / "traces"
    for model in TRACED:
        (copy / model).mkdir(parents=True)
        for name in ("meta.json", "trace.npz"):
            shutil.copy(RESULTS / "tiny" / "sinks" / model / name, copy / model / name)
    return copy


def _edit_array(folder: Path, name: str, edit) -> None:
    with np.load(folder / "trace.npz") as trace:
        arrays = {k: trace[k] for k in trace.files}
    arrays[name] = edit(arrays[name])
    np.savez_compressed(folder / "trace.npz", **arrays)


def test_a_retrace_that_gives_the_committed_traces_passes_into_a_new_folder(tmp_path):
    checkout = tmp_path / "checkout"
    shutil.copytree(RESULTS, checkout / "results", ignore=shutil.ignore_patterns("cells", "*.png"))
    done = _retrace(tmp_path, RESULTS / "tiny" / "sinks", results=checkout / "results")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reproduced: the traces of arm, llada, dream in runs/tiny_sinks" in done.stdout
    assert (checkout / "runs" / "tiny_sinks" / "llada" / "trace.npz").is_file()


@pytest.mark.parametrize("name,edit,passes", [
    # another CPU's rounding: scores a few 1e-6 apart, a float16 map one unit in the last place
    ("top_score", lambda a: a * np.float32(1 + 3e-6), True),
    ("full_scores", lambda a: np.nextafter(a, np.float16(np.inf)), True),
    ("top_score", lambda a: a * np.float32(1.01), False),
    ("top_pos", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 7, a + 1, a), False),
    ("n_sinks", lambda a: a.astype(np.int64), False),
])
def test_a_retrace_is_compared_integers_exactly_and_floats_to_float_noise(tmp_path, name, edit,
                                                                         passes):
    traces = _copied_traces(tmp_path)
    _edit_array(traces / "llada", name, edit)
    done = _retrace(tmp_path, traces, str(tmp_path / "rerun"))
    assert (done.returncode == 0) == passes, done.stdout + done.stderr
    if not passes:
        assert f"rerun/llada differs from results/tiny/sinks/llada: trace.npz:{name}" in done.stderr


def test_a_retrace_with_other_settings_or_statistics_fails(tmp_path):
    traces = _copied_traces(tmp_path)
    meta = json.loads((traces / "dream" / "meta.json").read_text())
    meta["eps"] = 2.0
    (traces / "dream" / "meta.json").write_text(json.dumps(meta))
    done = _retrace(tmp_path, traces, str(tmp_path / "rerun"))
    assert done.returncode != 0
    assert "rerun/dream differs from results/tiny/sinks/dream: meta.json.eps: 3.0 committed, " \
           "2.0 retraced" in done.stderr


def test_a_retrace_on_newer_libraries_is_compared_on_the_rest_and_names_them(tmp_path):
    # CI installs the newest releases the requirements allow; the traces are what must agree
    traces = _copied_traces(tmp_path)
    for model in TRACED:
        meta = json.loads((traces / model / "meta.json").read_text())
        meta["versions"]["accelerate"] = "99.0"
        (traces / model / "meta.json").write_text(json.dumps(meta))
    done = _retrace(tmp_path, traces, str(tmp_path / "rerun"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "retraced on other versions than the committed traces: accelerate " in done.stdout
    assert "-> 99.0" in done.stdout and "reproduced: the traces of arm, llada, dream" in done.stdout

    # with a changed setting beside it, the setting still fails the retrace
    dream = json.loads((traces / "dream" / "meta.json").read_text())
    (traces / "dream" / "meta.json").write_text(json.dumps({**dream, "eps": 2.0}))
    done = _retrace(tmp_path, traces, str(tmp_path / "rerun"))
    assert done.returncode != 0 and "meta.json.eps: 3.0 committed, 2.0 retraced" in done.stderr


def test_a_retrace_into_the_committed_folder_is_not_compared_with_itself(tmp_path):
    traces = _copied_traces(tmp_path)
    done = subprocess.run([sys.executable, str(RESULTS / "same_traces.py"), str(traces),
                           f"{traces}/.", *TRACED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "is the committed folder: not compared" in done.stdout
