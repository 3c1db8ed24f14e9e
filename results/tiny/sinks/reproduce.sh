#!/usr/bin/env bash
# The sink figures of the README: one traced mini_gsm generation (64 tokens, eps = 3,
# unmasked) per tiny-zoo model, through the same intercept as the sweep.
#
#   results/tiny/sinks/reproduce.sh [OUT]      # OUT defaults to results/tiny/sinks
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-results/tiny/sinks}
zoo=lm_eval_sinkmask/zoo/checkpoints
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
prompt=$'Question: Lily has 4 apples. Each of her 2 friends gives her 3 apples. She loses 1 apples. How many apples does Lily have now?\nAnswer:'
for model in arm llada dream; do
  sinkmask sinks --model "$zoo/$model" --prompt "$prompt" --gen-length 64 --device cpu \
                 --out "$out/$model"
done
