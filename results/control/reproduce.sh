#!/usr/bin/env bash
# The random-key control of the tiny-zoo Table 1 on the zoo's seed 0 (the package's
# checkpoints, zoo v2): each column of results/tiny (arm, llada, dream; arm_all_rows, the ARM
# under the all_rows query rule; llada_l2r, the LLaDA-style model decoded left to right) masked
# at its top-K Eq. 3 sinks and, beside it, at as many keys per (layer, head) and step drawn
# from the keys that are not sinks (*_random: mask_target=random), over four independent draws
# (--mask-seeds 0-3: every masked random cell runs once per mask_seed; the table gives the mean
# and the spread across draws). A drop that the sinks cause and the random keys do not is the
# sinks' doing, not the removal of any k keys; the table's last section gives sinks minus
# random per column pair (--versus), paired over the same problems within each draw. First 64
# test problems per task, greedy, one thread per process; 170 cells, about 50 minutes on 2
# cores. results/seed1 and results/seed2 run the same grid on seeds 1 and 2.
#
#   results/control/reproduce.sh [OUT]      # OUT defaults to runs/control (a killed run resumes)
#
# The run ends by comparing its table.md, table.csv and versus.csv with the committed ones and
# fails if they differ. SEEDS, DRAWS and TITLE run the same grid on other training seeds or
# draws, compared with the folder COMMITTED names if given (results/seed1's script does), else
# not; the committed results/control is made with the values here.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-runs/control}
seeds=${SEEDS:-0}
draws=${DRAWS:-0-3}
title=${TITLE:-"Zoo v2 seed 0: accuracy under masking of the top-K Eq. 3 sinks and of as many random non-sink keys, over four draws (eps = 3)"}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
sinkmask sweep \
  --models "arm=zoo:arm,arm_random=zoo:arm,llada=zoo:llada,llada_random=zoo:llada,dream=zoo:dream,dream_random=zoo:dream,arm_all_rows=zoo:arm,arm_all_rows_random=zoo:arm,llada_l2r=zoo:llada,llada_l2r_random=zoo:llada" \
  --model-args-for "arm_random:mask_target=random" \
  --model-args-for "llada_random:mask_target=random" \
  --model-args-for "dream_random:mask_target=random" \
  --model-args-for "arm_all_rows:arm_rule=all_rows" \
  --model-args-for "arm_all_rows_random:arm_rule=all_rows,mask_target=random" \
  --model-args-for "llada_l2r:block_length=1" \
  --model-args-for "llada_l2r_random:block_length=1,mask_target=random" \
  --seeds "$seeds" --mask-seeds "$draws" \
  --tasks mini_gsm_sinkmask,mini_code_sinkmask --top-k 0,1,5,10 \
  --limit 64 --batch-size 32 --device cpu --seed 0 --jobs 2 \
  --allow-code-execution \
  --versus arm:arm_random,llada:llada_random,dream:dream_random,arm_all_rows:arm_all_rows_random,llada_l2r:llada_l2r_random \
  --title "$title" \
  --out "$out"
if [ -n "${SEEDS:-}${DRAWS:-}${TITLE:-}" ] && [ -z "${COMMITTED:-}" ]; then
  echo "SEEDS, DRAWS or TITLE set: not compared with a committed folder"
else
  results/same_tables.sh "${COMMITTED:-results/control}" "$out" table.md table.csv versus.csv
fi
