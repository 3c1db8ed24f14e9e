#!/usr/bin/env bash
# The ARM's random control over eight independent draws: the seed-0 zoo ARM masked at its
# top-K Eq. 3 sinks (arm) and, beside it, at as many non-sink keys per (layer, head) and step
# drawn with mask_seed 0..7 (draw0..draw7; draw0 and draw1 are results/control's arm_random
# and arm_random1). One draw leaves the ARM's mini_code comparison open (two draws disagreed
# by 0.09); eight show how far a random removal of the same number of keys goes, draw to draw.
# Same tasks, problems and settings as results/tiny and results/control (first 64 test
# problems, greedy, one thread per process). About a minute on 2 cores.
#
#   results/arm_draws/reproduce.sh [OUT]      # OUT defaults to results/arm_draws (resumes)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-results/arm_draws}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
models="arm=zoo:arm"
draws=()
for s in 0 1 2 3 4 5 6 7; do
  models="$models,draw$s=zoo:arm"
  draws+=(--model-args-for "draw$s:mask_target=random,mask_seed=$s")
done
sinkmask sweep \
  --models "$models" "${draws[@]}" \
  --seeds 0 \
  --tasks mini_gsm_sinkmask,mini_code_sinkmask --top-k 0,1,5,10 \
  --limit 64 --batch-size 32 --device cpu --seed 0 --jobs 2 \
  --allow-code-execution \
  --title "The ARM's random control over eight draws: its top-K Eq. 3 sinks masked, and as many non-sink keys drawn with mask_seed 0-7 (eps = 3)" \
  --out "$out"
# the repository keeps lm-eval's per-problem samples gzipped (the table reads either form)
find "$out/cells" -name 'samples_*.jsonl' -exec gzip -9nf {} +
