#!/usr/bin/env bash
# The sink figures of the README: one traced mini_gsm generation (64 tokens, eps = 3,
# unmasked) per tiny-zoo model, through the same intercept as the sweep, retraced into OUT
# and compared with the committed traces (results/same_traces.py: integers equal, floats to
# float noise). OUT = results/tiny/sinks retraces the committed figures in place.
#
#   results/tiny/sinks/reproduce.sh [OUT]      # OUT defaults to runs/tiny_sinks
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-runs/tiny_sinks}
zoo=lm_eval_sinkmask/zoo/checkpoints
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
prompt=$'Question: Lily has 4 apples. Each of her 2 friends gives her 3 apples. She loses 1 apples. How many apples does Lily have now?\nAnswer:'
models=(arm llada dream)
for model in "${models[@]}"; do
  sinkmask sinks --model "$zoo/$model" --prompt "$prompt" --gen-length 64 --device cpu \
                 --out "$out/$model"
done
python results/same_traces.py results/tiny/sinks "$out" "${models[@]}"
