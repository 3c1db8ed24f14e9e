#!/usr/bin/env bash
# The tiny-zoo Table 1: the three zoo checkpoints x (mini_gsm, mini_code) x K in {0, 1, 5, 10}
# on the first 32 test problems of each task, greedy, on the CPU. The ARM appears twice: under
# the paper's query rule (last_row) and under all_rows (docs/method.md section 5), to show whether its collapse
# depends on the rule. Deterministic: one thread per
# process (OMP_NUM_THREADS=1), fixed batch size, fixed seed. CI reruns it into a fresh folder
# and fails if table.md or table.csv differ from the committed ones.
#
#   results/tiny/reproduce.sh [OUT]      # OUT defaults to results/tiny (resumes, skips done cells)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-results/tiny}
zoo=lm_eval_sinkmask/zoo/checkpoints
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
sinkmask sweep \
  --models "arm=$zoo/arm,llada=$zoo/llada,dream=$zoo/dream,arm_all_rows=$zoo/arm" \
  --model-args-for "arm_all_rows:arm_rule=all_rows" \
  --tasks mini_gsm_sinkmask,mini_code_sinkmask --top-k 0,1,5,10 \
  --limit 32 --batch-size 32 --device cpu --seed 0 --jobs 2 \
  --allow-code-execution --out "$out"
