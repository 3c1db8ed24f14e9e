#!/usr/bin/env bash
# Sink masking on multiple choice, tiny zoo: the three zoo checkpoints x mini_mc_sinkmask x
# K in {0, 1, 5, 10} on the first 40 questions (160 scored choices per cell), in each of the
# zoo's three training seeds (zoo:NAME@S), on the CPU, each beside its random-key control
# (*_random: as many non-sink keys per (layer, head) and pass, over four draws, --mask-seeds
# 0-3; --versus gives sinks minus random within each draw). The ARM scores each choice with one
# causal pass (lm-eval's HFLM); the DLMs with the Monte Carlo bound, 32 samples per choice
# (mc_num=32, one forward pass of 32 rows). Deterministic: one thread per process, fixed batch
# size, fixed seeds (the DLMs' samples and the random keys are seeded per request). About 11
# minutes a seed on 2 cores (51 cells a seed, 153 in all).
#
#   results/mc/reproduce.sh [OUT]      # OUT defaults to runs/mc (a killed run resumes there)
#
# The run ends by comparing its table.md, table.csv and versus.csv with the committed ones and
# fails if they differ. SEEDS, DRAWS and TITLE run the same grid on other seeds or draws (not
# compared); the committed results/mc is made with the values here.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-runs/mc}
seeds=${SEEDS:-0,1,2}
draws=${DRAWS:-0-3}
title=${TITLE:-"Zoo v2, seeds $seeds: mini_mc accuracy under masking of the top-K Eq. 3 sinks and of as many random non-sink keys, over four draws (eps = 3)"}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
sinkmask sweep \
  --models "arm=zoo:arm,arm_random=zoo:arm,llada=zoo:llada,llada_random=zoo:llada,dream=zoo:dream,dream_random=zoo:dream" \
  --seeds "$seeds" \
  --model-args-for "arm_random:mask_target=random" \
  --model-args-for "llada:mc_num=32,mc_batch_size=32" \
  --model-args-for "llada_random:mc_num=32,mc_batch_size=32,mask_target=random" \
  --model-args-for "dream:mc_num=32,mc_batch_size=32" \
  --model-args-for "dream_random:mc_num=32,mc_batch_size=32,mask_target=random" \
  --mask-seeds "$draws" --versus arm:arm_random,llada:llada_random,dream:dream_random \
  --tasks mini_mc_sinkmask --top-k 0,1,5,10 \
  --limit 40 --batch-size 8 --device cpu --seed 0 --jobs 2 \
  --title "$title" \
  --out "$out"
if [ -n "${SEEDS:-}${DRAWS:-}${TITLE:-}" ]; then
  echo "SEEDS, DRAWS or TITLE set: not compared with results/mc"
else
  results/same_tables.sh results/mc "$out" table.md table.csv versus.csv
fi
