#!/usr/bin/env bash
# The committed results that rest on the package's seed 0, made again on a staged seed 0
# (zoo.install --seeds 0 --stage) into results_next/, in the layout of results/:
#
#   tools/gpu_box/rerun_on_staged_seed0.sh [STEP...]   # default: every step, in this order
#
# with the project's virtual environment active. Every step runs through with_staged_seed0.sh
# (HEAD's code, the staged weights as zoo:NAME) over the seeds installed here, and resumes its
# folder: run it again after a cut-off. RESULTS_NEXT moves the output folder (out of the
# checkout, say, to commit only what the promotion keeps). Costs on 2 cores for the zoo v2
# (measured on 2026-11-26/27 with seeds 1 and 2 installed):
#   sinks       tiny/sinks: the README's sink figures, one prompt per model (20 s)
#   zoo         zoo: the report card of every installed seed. The other seeds' cells and traces
#               come from results/zoo; seed 0's accuracy comes from the GPU box's cells copied
#               into results_next/zoo/gpu_eval/cells/ at staging (else it is computed here on
#               the whole splits: 10 min), its traces are made here (20 s)
#   tiny        tiny: Table 1 over the seeds, results/tiny/reproduce.sh's problems per cell
#               (PROBLEMS overrides; 6-14 minutes for three seeds at 12, idle or beside a sweep)
#   mc          mc: mini_mc beside random keys over the seeds, four draws (11 min a seed; the
#               other seeds' cells come from results/mc)
#   control     control: Table 1's columns beside random keys on seed 0, four draws (~50 min;
#               results/seed1 and results/seed2 hold the other seeds' grids)
#   sink_token  sink_token: llada against llada_sink over the seeds, whole test splits, one
#               process per model side by side (~50 min a seed; the other seeds' cells come
#               from results/sink_token_v2)
# A resumed sweep reuses a cell whose request, weights, task and package code are today's, and
# makes again one whose code has changed since.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
root=$PWD next=${RESULTS_NEXT:-$PWD/results_next}
with=${STAGED_WITH:-tools/gpu_box/with_staged_seed0.sh}  # tests put a recorder here
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(sinks zoo tiny mc control sink_token)
seeds=$(python -c "from lm_eval_sinkmask.zoo import installed_seeds; print(','.join(map(str, installed_seeds())))")
names=$(python -c "from lm_eval_sinkmask.zoo import ZOO_NAMES; print(*ZOO_NAMES)")
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

prefill() {  # prefill DEST SOURCE...: the cells of seeds >= 1 kept from earlier folders
  # A seed's folder is copied only where DEST lacks it: a resumed step must not merge the old
  # files back into cells the sweep has made again since (their names carry a timestamp, so
  # cp -n would add them beside the new ones, and cell.json would no longer list its folder);
  # and cp -n exits 1 on a skipped file under coreutils 9.2-9.4, which set -e turns into a stop.
  local dest=$1; shift
  for source in "$@"; do
    for cells in "$root/$source"/cells/*/seed[1-9]*; do
      [ -d "$cells" ] || continue
      local target="$dest/cells/$(basename "$(dirname "$cells")")"
      [ -e "$target/$(basename "$cells")" ] && continue
      mkdir -p "$target"
      cp -r "$cells" "$target/"
    done
  done
}

for step in "${steps[@]}"; do
  echo "== $step (seeds $seeds) $(date +%T)"
  case $step in
    sinks) $with results/tiny/sinks/reproduce.sh "$next/tiny/sinks" ;;
    zoo)
      # results/zoo without the package's old seed 0; nothing made here is overwritten
      mkdir -p "$next/zoo"
      tar -C results/zoo --exclude=seed0 -cf - . | tar -C "$next/zoo" --skip-old-files -xf -
      accuracy=--skip-accuracy  # only when the box's cells hold every model's seed 0
      for name in $names; do
        [ -d "$next/zoo/gpu_eval/cells/$name/seed0" ] || accuracy=
      done
      $with python -m lm_eval_sinkmask.zoo.report --out "$next/zoo" --seeds 0 \
        --cells "$next/zoo/gpu_eval" $accuracy ;;
    tiny) SEEDS=$seeds $with results/tiny/reproduce.sh "$next/tiny" ;;
    mc)
      prefill "$next/mc" results/mc
      SEEDS=$seeds $with results/mc/reproduce.sh "$next/mc" ;;
    control)
      SEEDS=0 $with results/control/reproduce.sh "$next/control" ;;
    sink_token)
      prefill "$next/sink_token" results/sink_token_v2
      # one process per model, side by side (one thread each), then one that traces and
      # writes the report over every cell saved
      args=(--out "$next/sink_token" --seeds "$seeds" --limit-gsm 300 --limit-code 100)
      models=$(python -c "from lm_eval_sinkmask.experiments.sink_token import MODELS; print(*MODELS)")
      pids=()
      for model in $models; do
        $with python -m lm_eval_sinkmask.experiments.sink_token "${args[@]}" \
          --models "$model" --skip-traces &
        pids+=($!)
      done
      for pid in "${pids[@]}"; do wait "$pid"; done  # a failed one stops the script here
      $with python -m lm_eval_sinkmask.experiments.sink_token "${args[@]}" ;;
    *) echo "unknown step $step: sinks zoo tiny mc control sink_token" >&2; exit 2 ;;
  esac
done
echo "== done $(date +%T): results_next/ holds the steps run; commit it"
