#!/usr/bin/env bash
# Fill .whl/ (ignored) with wheels of requirements.txt for the GPU box: CPython 3.12 on x86-64,
# no network there. Pure-Python packages published only as source are built into wheels here.
# lm-eval's own task library (thousands of YAMLs this project never loads) is dropped from its
# wheel to keep what travels small.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.whl
mkdir -p "$dest"
# a fresh set each time: a wheel of an earlier requirements.txt left beside the new one is a
# second version of that package, which stops the whole install on the box
rm -f "$dest"/*.whl
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
grep -v '^#' tools/gpu_box/requirements.txt | while read -r req; do
    [ -n "$req" ] || continue
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" -d "$dest" "$req" 2>/dev/null \
    || python3 -m pip wheel --quiet --no-deps -w "$dest" "$req"  # source only: pure Python
done
python3 - "$dest" <<'PY'
import sys, zipfile
from pathlib import Path
[wheel] = Path(sys.argv[1]).glob("lm_eval-*.whl")
slim = wheel.with_suffix(".slim")
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
    for item in src.infolist():
        parts = item.filename.split("/")
        if parts[:2] == ["lm_eval", "tasks"] and len(parts) > 3:
            continue  # a task subfolder; lm_eval/tasks/*.py stays
        dst.writestr(item, src.read(item))
slim.replace(wheel)
PY
du -sh "$dest"
