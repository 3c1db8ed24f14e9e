#!/usr/bin/env bash
# The CPU recipe trial behind README.md. LLaDA-style models of the CPU zoo's size (d 128,
# 6 layers, 4 heads; 1.4M parameters), 1,800 steps at batch 64, in three seeds under the
# zoo's recipe (peak lr 2e-3, weight decay 0.01) and with one setting changed (weight decay
# 0.1 for seeds 0 and 1; peak lr 4e-3), and the zoo's recipe over half the steps (seeds 0
# and 1) and twice the steps (seed 0). Dream-style models adapted from the first CPU zoo's
# ARM (git d09e265c^; d 128, 4 layers, 0.9M parameters), 1,800 steps at batch 64, seeds 0
# and 1, peak lr 1e-3 (the zoo's), 2e-3 and 5e-4, and the zoo's over 900 steps (seeds 0 and 1)
# and 3,600 (seed 0); and, in seeds 0, 1 and 2, an ARM of the same shape trained here (1,600
# steps at batch 64) under peak lr 2e-3 (the GPU zoo's) and 4e-3, each followed by its
# Dream-style model. Each judged by the report card's sink rule on 8 traced mini_gsm
# generations. About 15-37 minutes a model on one core (3,600 steps: 36-60); two at a time.
# Run it from the checkout's root (it takes the first zoo's ARM from git).
#
#   results/zoo_levers/reproduce.sh [RUNS_DIR]     # default runs/zoo_levers
set -euo pipefail
runs=${1:-runs/zoo_levers}
mkdir -p "$runs"
arm_rev=d09e265c^ arm="$runs/arm_v1/arm"  # the first CPU zoo's ARM, the Dream-style models' start
common=(--size full --batch-size 64 --row-groups 2 --threads 1 --warmup 100
        --eval-gsm 50 --eval-code 25 --log-every 300)
run() {  # NAME SEED LAST ARGS...: one training run, skipped when its LAST model's card is there
    local name=$1 seed=$2 last=$3; shift 3
    [ -f "$runs/$name/$last/train_info.json" ] && return 0
    python -m lm_eval_sinkmask.zoo.train --out "$runs/$name" "${common[@]}" --seed "$seed" "$@" \
        > "$runs/$name.log" 2>&1
}
llada() {  # NAME SEED STEPS EXTRA...: a LLaDA-style model from scratch
    run "$1" "$2" llada --models llada --steps-llada "$3" "${@:4}"
}
dream() {  # NAME SEED STEPS EXTRA...: adapted from the first CPU zoo's ARM
    run "$1" "$2" dream --models dream --dream-from "$arm" --steps-dream "$3" "${@:4}"
}
arm_dream() {  # NAME SEED EXTRA...: an ARM trained here, then its Dream-style model
    run "$1" "$2" dream --models arm,dream --steps-arm 1600 --steps-dream 1800 "${@:3}"
}
for seed in 0 1 2; do
    llada "s${seed}_base" "$seed" 1800 &
    llada "s${seed}_lr0.004" "$seed" 1800 --lr-llada 0.004 &
    wait
done
for seed in 0 1; do
    llada "s${seed}_wd0.1" "$seed" 1800 --weight-decay 0.1 &
done
wait
for seed in 0 1; do
    llada "s${seed}_base_900" "$seed" 900 &
done
wait
if [ ! -f "$arm/model.safetensors" ]; then
    mkdir -p "$arm"
    for f in $(git ls-tree --name-only "$arm_rev" lm_eval_sinkmask/zoo/checkpoints/arm/); do
        git show "$arm_rev:$f" > "$arm/$(basename "$f")"
    done
fi
for seed in 0 1; do
    dream "d${seed}_base" "$seed" 1800 &
    dream "d${seed}_lr0.002" "$seed" 1800 --lr-dream 0.002 &
    wait
done
llada s0_base_3600 0 3600 &
dream d0_base_3600 0 3600 &
wait
for seed in 0 1; do
    dream "d${seed}_base_900" "$seed" 900 &
    dream "d${seed}_lr0.0005" "$seed" 1800 --lr-dream 0.0005 &
    wait
done
for seed in 0 1 2; do
    arm_dream "a${seed}_arm0.002" "$seed" --lr-arm 0.002 &
    arm_dream "a${seed}_arm0.004" "$seed" --lr-arm 0.004 &
    wait
done
python -m lm_eval_sinkmask.zoo.sink_share "$runs"/s{0,1,2}_base/llada "$runs"/s{0,1}_wd0.1/llada \
    "$runs"/s{0,1,2}_lr0.004/llada "$runs"/s{0,1}_base_900/llada "$runs"/s0_base_3600/llada \
    "$runs"/d{0,1}_base/dream "$runs"/d{0,1}_lr0.002/dream "$runs"/d0_base_3600/dream \
    "$runs"/d{0,1}_base_900/dream "$runs"/d{0,1}_lr0.0005/dream \
    "$runs"/a{0,1,2}_arm0.00{2,4}/{arm,dream} \
    --traces 8 --out "$runs/traces"
