#!/usr/bin/env bash
# Run a command with the staged GPU seed 0 as the package's zoo checkpoints (the project's
# virtual environment active: python and sinkmask are taken from PATH):
#
#   tools/gpu_box/with_staged_seed0.sh COMMAND [ARGS...]
#
# `python -m lm_eval_sinkmask.zoo.install RUN --seeds 0 --stage` keeps a GPU-trained seed 0 in
# zoo_seeds/staged_seed0/<name>/, beside the package's checkpoints that every committed result
# rests on. This runs COMMAND in a git worktree of HEAD whose lm_eval_sinkmask/zoo/checkpoints/
# holds the staged weights, with that worktree first on PYTHONPATH: there `zoo:llada` is the
# staged seed 0, and the cells and traces a command writes record `zoo:llada` and the staged
# weights' digest, which is the package's once `zoo.install --promote` has moved them in. So results made here today are the
# committed results of tomorrow's package, and can be made over several sessions before it.
#
# Each call makes its own worktree and removes it when COMMAND ends (so calls may run side by
# side); STAGED_WORKTREE names one to keep and reuse instead. The worktree is scratch: give
# COMMAND absolute output paths in this checkout, e.g.
#   tools/gpu_box/with_staged_seed0.sh results/tiny/sinks/reproduce.sh $PWD/results_next/tiny/sinks
# It holds HEAD, so uncommitted changes under lm_eval_sinkmask/ or tasks/ are refused (a result
# must come from code that is in the history; STAGED_ALLOW_UNCOMMITTED=1 runs HEAD anyway).
set -euo pipefail
[ $# -gt 0 ] || { sed -n 2,20p "$0"; exit 2; }
root=$(git rev-parse --show-toplevel)
# seeds >= 1 and the staged seed 0 from this checkout's zoo_seeds/ (the worktree's would be HEAD's)
export SINKMASK_ZOO_SEEDS=${SINKMASK_ZOO_SEEDS:-$root/zoo_seeds}
staged=$SINKMASK_ZOO_SEEDS/staged_seed0
names=$(cd "$root" && python -c "from lm_eval_sinkmask.zoo import ZOO_NAMES; print(*ZOO_NAMES)")
for name in $names; do
  [ -f "$staged/$name/config.json" ] || {
    echo "no staged seed 0 of $name ($staged/$name/config.json): python -m" \
         "lm_eval_sinkmask.zoo.install RUN --seeds 0 --stage puts it there" >&2; exit 1; }
done
if [ "${STAGED_ALLOW_UNCOMMITTED:-0}" != 1 ] \
    && ! git -C "$root" diff --quiet HEAD -- lm_eval_sinkmask tasks; then
  echo "uncommitted changes under lm_eval_sinkmask/ or tasks/: commit them first (the" \
       "worktree runs HEAD)" >&2
  exit 1
fi
head=$(git -C "$root" rev-parse HEAD)
if [ -n "${STAGED_WORKTREE:-}" ]; then
  wt=$STAGED_WORKTREE
else
  wt=$(mktemp -d /tmp/sinkmask-staged-seed0.XXXXXX)/worktree
  # a failed clean-up must not turn COMMAND's success into a failure
  trap 'git -C "$root" worktree remove --force "$wt" || true; rmdir "$(dirname "$wt")" || true' EXIT
fi
if [ -e "$wt/.git" ]; then
  git -C "$wt" checkout --quiet --force --detach "$head"
else
  git -C "$root" worktree add --quiet --detach "$wt" "$head"
fi
for name in $names; do
  rm -rf "$wt/lm_eval_sinkmask/zoo/checkpoints/$name"
  cp -r "$staged/$name" "$wt/lm_eval_sinkmask/zoo/checkpoints/$name"
done
cd "$wt"
PYTHONPATH="$wt${PYTHONPATH:+:$PYTHONPATH}" "$@"
