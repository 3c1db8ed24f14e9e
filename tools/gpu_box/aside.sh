#!/usr/bin/env bash
# Move what the GPU box never reads out of the checkout before the first device call, and back
# after the last: the device tool copies the working tree (tracked and untracked-not-ignored
# files, at most 64 MiB with the ~20 MiB of .whl/), not git's objects.
#
#   tools/gpu_box/aside.sh out     # before the first call: prints the size that will travel
#   tools/gpu_box/aside.sh back    # after the last call (also after a failed one)
#
# Aside: results/ and results_next/ (every committed result, and those made on a staged seed 0;
# nothing on the box reads them) and the installed zoo seeds' checkpoints, zoo_seeds/<name>/
# and zoo_seeds/staged_seed0/ (the box trains its own). zoo_seeds/plan.json stays:
# zoo_call.sh trains a later seed by the step counts it keeps. ASIDE moves the parking folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
aside=${ASIDE:-/tmp/gpu_box_aside}
mib() { awk '{s+=$1} END {printf "%.1f", s/2^20}'; }
case ${1:-} in
out)
    [ -e "$aside" ] && { echo "$aside exists: run '$0 back' first"; exit 2; }
    mkdir -p "$aside/zoo_seeds"
    for d in results results_next; do
        [ -d $d ] && mv $d "$aside/$d"
    done
    for d in zoo_seeds/*/; do
        [ -d "$d" ] && mv "${d%/}" "$aside/zoo_seeds/"
    done
    # tracked files parked above are still listed (and cannot be stat'ed): they do not travel
    tree=$( { git ls-files -z --cached --others --exclude-standard \
              | xargs -0 -r stat -c %s 2>/dev/null || true; } | mib)
    wheels=$( (find .whl -type f -printf '%s\n' 2>/dev/null || true) | mib)
    total=$(awk -v a="$tree" -v b="$wheels" 'BEGIN {printf "%.1f", a + b}')
    echo "travels: tree $tree MiB + .whl $wheels MiB = $total MiB (limit 64)"
    awk -v t="$total" 'BEGIN {exit !(t <= 64)}' || { echo "TOO BIG: the call will be refused"; exit 1; }
    ;;
back)
    [ -d "$aside" ] || { echo "nothing aside in $aside"; exit 0; }
    # a folder made again meanwhile would swallow the parked one (mv nests): refuse instead
    for d in "$aside"/results "$aside"/results_next "$aside"/zoo_seeds/*/; do
        target=${d#"$aside"/}; target=${target%/}
        [ -d "$d" ] && [ -e "$target" ] \
            && { echo "$target exists again: move it away, then '$0 back'"; exit 2; }
    done
    for d in results results_next; do
        [ -d "$aside/$d" ] && mv "$aside/$d" $d
    done
    mkdir -p zoo_seeds
    for d in "$aside"/zoo_seeds/*/; do
        [ -d "$d" ] && mv "${d%/}" zoo_seeds/
    done
    rmdir "$aside/zoo_seeds" "$aside"
    git status --short | head -5
    ;;
*)
    echo "usage: $0 out|back"; exit 2 ;;
esac
