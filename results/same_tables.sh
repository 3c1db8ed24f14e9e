#!/usr/bin/env bash
# How a reproduce.sh script checks its rerun: fails, showing the difference, unless each FILE
# that the rerun wrote to OUT is byte for byte the committed one in COMMITTED. A rerun into the
# committed folder itself (which resumes it) has nothing to be compared with.
#
#   results/same_tables.sh COMMITTED OUT FILE...
set -euo pipefail
committed=$1 out=$2
shift 2
if [ "$(realpath -m "$out")" = "$(realpath -m "$committed")" ]; then
  echo "$out is the committed folder: not compared"
  exit 0
fi
for file in "$@"; do
  diff -u "$committed/$file" "$out/$file"
done
echo "reproduced: $* in $out are those of $committed"
