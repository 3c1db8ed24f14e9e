"""How results/tiny/sinks/reproduce.sh checks its retrace: fails, naming the first difference,
unless each model's trace in OUT is the committed one in COMMITTED (as same_tables.sh does for
tables; a retrace into the committed folder itself has nothing to be compared with).

A trace's integers (sink positions, counts, histograms, the prompt's and generation's tokens)
and its settings must be equal. Its floats (scores, masses, value norms) are compared to
float noise only: another CPU, or another thread count, rounds the attention's sums in
another order (about 1e-7 relative, which a score of ~10 carries into the fifth decimal,
and one unit in the last place of the float16 full-score maps). The library versions a
trace records say what ran it, not what it found: a retrace under newer releases (the test
environment installs the newest ones its requirements allow) is compared on everything else,
and the changed versions are named.

    python results/same_traces.py COMMITTED OUT MODEL...
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

# (rtol, atol) by float width: float16 keeps about three decimal digits
TOLERANCE = {2: (2e-3, 1e-3), 4: (1e-4, 1e-5), 8: (1e-4, 1e-6)}
# meta.json's record of the software that ran the trace
RAN_ON = "versions"


def array_difference(name: str, committed: np.ndarray, rerun: np.ndarray) -> str | None:
    if committed.dtype != rerun.dtype or committed.shape != rerun.shape:
        return (f"{name}: {committed.dtype}{list(committed.shape)} committed, "
                f"{rerun.dtype}{list(rerun.shape)} retraced")
    if committed.dtype.kind == "f":
        rtol, atol = TOLERANCE[committed.dtype.itemsize]
        same = np.isclose(committed, rerun, rtol=rtol, atol=atol, equal_nan=True)
    else:
        same = committed == rerun
    if same.all():
        return None
    where = tuple(int(i) for i in np.argwhere(~same)[0])
    return (f"{name}: {(~same).sum()} entries differ, first at {where}: "
            f"{committed[where]} committed, {rerun[where]} retraced")


def json_difference(path: str, committed, rerun) -> str | None:
    """The first difference between two JSON values, floats compared to float noise."""
    if isinstance(committed, dict) and isinstance(rerun, dict):
        if committed.keys() != rerun.keys():
            return f"{path}: keys {sorted(committed.keys() ^ rerun.keys())} in one only"
        found = (json_difference(f"{path}.{k}", committed[k], rerun[k]) for k in committed)
        return next((d for d in found if d), None)
    if isinstance(committed, list) and isinstance(rerun, list):
        if len(committed) != len(rerun):
            return f"{path}: {len(committed)} items committed, {len(rerun)} retraced"
        found = (json_difference(f"{path}[{i}]", a, b) for i, (a, b) in
                 enumerate(zip(committed, rerun)))
        return next((d for d in found if d), None)
    if isinstance(committed, float) and isinstance(rerun, (int, float)) \
            and not isinstance(rerun, bool):
        if math.isclose(committed, rerun, rel_tol=1e-4, abs_tol=1e-6):
            return None
    elif type(committed) is type(rerun) and committed == rerun:
        return None
    return f"{path}: {committed!r} committed, {rerun!r} retraced"


def trace_difference(committed: Path, rerun: Path) -> str | None:
    """The first difference between two trace folders (``trace.npz`` and ``meta.json``)."""
    for folder in (committed, rerun):
        if not (folder / "trace.npz").is_file():
            return f"{folder}: no trace.npz"
    (committed_meta, _), (rerun_meta, _) = _meta(committed), _meta(rerun)
    meta = json_difference("meta.json", committed_meta, rerun_meta)
    if meta:
        return meta
    with np.load(committed / "trace.npz") as a, np.load(rerun / "trace.npz") as b:
        if sorted(a.files) != sorted(b.files):
            return f"trace.npz: arrays {sorted(set(a.files) ^ set(b.files))} in one only"
        found = (array_difference(f"trace.npz:{k}", a[k], b[k]) for k in a.files)
        return next((d for d in found if d), None)


def _meta(folder: Path) -> tuple[dict, dict]:
    """A trace's meta.json as what it found and was asked, and the versions that ran it."""
    meta = json.loads((folder / "meta.json").read_text())
    return meta, meta.pop(RAN_ON, None) or {}


def version_changes(committed: Path, rerun: Path) -> list[str]:
    """The software versions a retrace ran on that differ from the committed trace's."""
    (_, was), (_, now) = _meta(committed), _meta(rerun)
    return [f"{name} {was.get(name, 'absent')} -> {now.get(name, 'absent')}"
            for name in sorted(was.keys() | now.keys()) if was.get(name) != now.get(name)]


def main(argv: list[str]) -> int:
    committed, rerun, *models = argv
    if not models:
        sys.exit("usage: same_traces.py COMMITTED OUT MODEL...")
    if Path(rerun).resolve() == Path(committed).resolve():
        print(f"{rerun} is the committed folder: not compared")
        return 0
    differences = [(m, trace_difference(Path(committed) / m, Path(rerun) / m)) for m in models]
    for model, difference in differences:
        if difference:
            print(f"{rerun}/{model} differs from {committed}/{model}: {difference}",
                  file=sys.stderr)
    if any(d for _, d in differences):
        return 1
    changes = sorted({c for m in models for c in
                      version_changes(Path(committed) / m, Path(rerun) / m)})
    if changes:
        print(f"retraced on other versions than the committed traces: {', '.join(changes)}")
    print(f"reproduced: the traces of {', '.join(models)} in {rerun} are those of {committed}"
          " (floats to float noise)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
