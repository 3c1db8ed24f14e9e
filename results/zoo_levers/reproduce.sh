#!/usr/bin/env bash
# The CPU recipe trial behind README.md: LLaDA-style models of the CPU zoo's size (d 128,
# 6 layers, 4 heads; 1.4M parameters), 1,800 steps at batch 64, in three seeds under the
# zoo's recipe (peak lr 2e-3, weight decay 0.01) and with one setting changed (weight decay
# 0.1 for seeds 0 and 1; peak lr 4e-3), then each judged by the report card's sink rule on
# 8 traced mini_gsm generations. About 25 minutes a model on one core; two at a time.
#
#   results/zoo_levers/reproduce.sh [RUNS_DIR]     # default runs/zoo_levers
set -euo pipefail
runs=${1:-runs/zoo_levers}
mkdir -p "$runs"
train() {  # NAME SEED EXTRA...: one model, skipped when its checkpoint is there
    local name=$1 seed=$2; shift 2
    [ -f "$runs/$name/llada/train_info.json" ] && return 0
    python -m lm_eval_sinkmask.zoo.train --out "$runs/$name" --size full --models llada \
        --batch-size 64 --row-groups 2 --threads 1 --steps-llada 1800 --warmup 100 \
        --seed "$seed" --eval-gsm 50 --eval-code 25 --log-every 300 "$@" > "$runs/$name.log" 2>&1
}
for seed in 0 1 2; do
    train "s${seed}_base" "$seed" &
    train "s${seed}_lr0.004" "$seed" --lr-llada 0.004 &
    wait
done
for seed in 0 1; do
    train "s${seed}_wd0.1" "$seed" --weight-decay 0.1 &
done
wait
python -m lm_eval_sinkmask.zoo.sink_share "$runs"/s{0,1,2}_base/llada "$runs"/s{0,1}_wd0.1/llada \
    "$runs"/s{0,1,2}_lr0.004/llada --traces 8 --out "$runs/traces"
