#!/usr/bin/env bash
# One command on the GPU box, from the repository root with .whl/ beside it:
#
#   tools/gpu_box/zoo_call.sh WAIT_S [PART] [MINUTES] [SEEDS]
#
# The box takes commands of at most 10 minutes and gives itself back when idle, so the zoo
# (python -m lm_eval_sinkmask.zoo.gpu_zoo) runs in the background and each call waits on it,
# returning within WAIT_S seconds of its start:
# - first call: installs the wheels (once), starts the zoo training of SEEDS (e.g. 1: one
#   seed per 15-minute session; the run's folder remembers them, so later calls need not
#   repeat them) with MINUTES of training budget (default 7). When zoo_seeds/plan.json is
#   here (the step counts the installed seeds trained with), the run takes its steps from it
#   instead of probing, so every seed trains the same steps. With ZOO_CHECKS=1 the CUDA
#   correctness tests and bench_masking's parts mass and zoo start beside the training once
#   its step plan is fixed (they share the GPU with it: not in a 15-minute session);
# - every call: waits until the zoo is DONE, fails, or WAIT_S seconds have passed since the
#   call began (the first call's install included), then leaves in $OUT a
#   status.txt, the logs (logs.tgz) and the evaluation cells so far (eval.tgz);
# - PART a, b or ab: the trained checkpoints, one archive per seed and part (a = arm + llada,
#   b = dream + llada_sink; each under 16 MiB), as soon as every model of the seeds is trained
#   (DONE not needed: a run whose evaluation did not finish still returns its weights). One
#   seed's ab fits one call; the call says what would not come back (at most 8 files, 16 MiB
#   each, 64 MiB together).
# Unpack every archive into runs/zoo2, then `python -m lm_eval_sinkmask.zoo.install runs/zoo2
# --seeds SEEDS`. ZOO_ARGS adds gpu_zoo options; ZOO_RUN moves its folder, ZOO_SITE the
# wheels' (env.sh). A lever trial (ZOO_ARGS="--weight-decay 0.1", say) trains the kept plan's
# steps under its changed recipe with ZOO_PLAN_FLAG=--steps-from (--plan refuses it).
set -uo pipefail
wait_s=${1:?usage: zoo_call.sh WAIT_S [none|a|b|ab] [MINUTES] [SEEDS]}
part=${2:-none}
minutes=${3:-7}
run=${ZOO_RUN:-/tmp/zoo2}
out=${OUT:?no \$OUT to write to}
mkdir -p "$run"
# the seeds are the run's: named by the call that starts it, remembered for the later calls
if [ -f "$run/seeds" ]; then
    seeds=$(cat "$run/seeds")
    if [ -n "${4:-}" ] && [ "$4" != "$seeds" ]; then
        echo "this box's run trains seeds $seeds, not $4"; exit 2
    fi
else
    seeds=${4:?name the seed(s) to train, e.g. 1 (one seed per 15-minute session)}
    echo "$seeds" > "$run/seeds"
fi
kept_plan=${SINKMASK_ZOO_SEEDS:-zoo_seeds}/plan.json  # the installed seeds' folder, as zoo.install
. tools/gpu_box/env.sh || exit 1

# A process that ended but was never reaped (a zombie: the box's PID 1 need not reap the
# orphans a call leaves) still answers kill -0; without the State check a crashed zoo would
# read as running forever, never restarted, the GPU idle.
alive() {
    [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null \
        && ! grep -q '^State:[[:space:]]*Z' "/proc/$(cat "$1")/status" 2>/dev/null
}
start() {  # start NAME COMMAND...: in its own session, so it outlives this call
    local name=$1; shift
    setsid nohup "$@" >> "$run/$name.log" 2>&1 < /dev/null &
    echo $! > "$run/$name.pid"
}
start_tests() {
    [ "${ZOO_CHECKS:-0}" = 1 ] && [ -f $run/plan.json ] && [ ! -f $run/cuda_tests.pid ] \
        || return 0
    start cuda_tests python3 -m pytest -q -p no:cacheprovider -rs \
        tests/test_fused_mass.py tests/test_flex_mass.py -k cuda
    # the bench's parts that time nothing (kernels vs reference; the zoo checkpoint's tokens
    # and masked keys, CUDA against CPU): beside the training, so that the device time after
    # it goes to the timings alone
    start bench_checks python3 benchmarks/bench_masking.py --gpu --gpu-parts mass,select,decode,zoo
}

if [ ! -f $run/DONE ] && ! alive $run/gpu_zoo.pid; then
    start gpu_zoo python3 -m lm_eval_sinkmask.zoo.gpu_zoo --out $run --seeds $seeds \
        --minutes "$minutes" ${ZOO_ARGS:-} \
        $([ -f $kept_plan ] && echo ${ZOO_PLAN_FLAG:---plan} $kept_plan)
fi
# WAIT_S counts from this call's start (SECONDS), the install included, and no sleep passes
# it: the box kills a command at 600 s, and a killed call writes no status.txt
while [ ! -f $run/DONE ] && alive $run/gpu_zoo.pid && left=$((wait_s - SECONDS)) \
        && [ $left -gt 0 ]; do
    start_tests
    sleep $(( left < 10 ? left : 10 ))
done
start_tests

if [ -f $run/DONE ]; then verdict="zoo: DONE"
elif alive $run/gpu_zoo.pid; then verdict="zoo: running"
else verdict="zoo: STOPPED without DONE (see gpu_zoo.log)"; fi
# The device tool returns only the last 12,000 characters of a call's output, and each
# training log ends in its model card (one JSON line of thousands): log lines are cut short
# and the verdict is said again last, so that it is in what comes back
{
    echo "$verdict"
    if alive $run/cuda_tests.pid; then echo "cuda tests: running"
    elif [ -f $run/cuda_tests.pid ]; then echo "cuda tests: $(tail -n 1 $run/cuda_tests.log)"; fi
    if alive $run/bench_checks.pid; then echo "bench checks: running"
    elif [ -f $run/bench_checks.pid ]; then
        echo "bench checks: done, $(grep -c 'FAILED\|DIFFER' $run/bench_checks.log) FAILED/DIFFER lines"
    fi
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=utilization.gpu,memory.used,memory.total --format=csv,noheader
    echo "--- gpu_zoo.log"; tail -n 15 $run/gpu_zoo.log
    for log in $run/logs/*.log; do [ -f "$log" ] && { echo "--- $log"; tail -n 2 "$log"; }; done
    echo "$verdict"
} 2>&1 | cut -c 1-200 > "$out/status.txt"
cat "$out/status.txt"
tar czf "$out/logs.tgz" -C $run --ignore-failed-read logs plan.json gpu_zoo.log cuda_tests.log \
    bench_checks.log \
    2>/dev/null
[ -d $run/eval ] && tar czf "$out/eval.tgz" -C $run eval

part_models() {  # the models of archive a or b
    case $1 in a) echo arm llada ;; b) echo dream llada_sink ;; esac
}
case $part in
    a|b) parts=($part) ;;
    ab) parts=(a b) ;;
    *) parts=() ;;
esac
trained() {  # trained SEED MODEL...: every model's checkpoint is complete (train_info.json)
    local s=$1; shift
    for m in "$@"; do [ -f "$run/seed$s/$m/train_info.json" ] || return 1; done
}
if [ ${#parts[@]} -gt 0 ]; then
    for s in ${seeds//,/ }; do
        for p in "${parts[@]}"; do
            trained $s $(part_models $p) \
                || { echo "seed $s not trained yet: nothing to fetch"; exit 1; }
        done
    done
    for s in ${seeds//,/ }; do
        for p in "${parts[@]}"; do
            models=($(part_models $p))
            tar czf "$out/$p-seed$s.tgz" -C $run "${models[@]/#/seed$s/}"
        done
    done
    ls -l "$out"
fi
# what the device tool would leave behind: more than 8 files, one over 16 MiB, 64 MiB in all
files=("$out"/*)
[ ${#files[@]} -le 8 ] || echo "WILL NOT ALL COME BACK: ${#files[@]} files in \$OUT (8 at most)"
for f in "${files[@]}"; do
    [ "$(stat -c %s "$f")" -le $((16 * 2**20)) ] || echo "WILL NOT COME BACK: $f over 16 MiB"
done
[ "$(du -cb "${files[@]}" | tail -n 1 | cut -f 1)" -le $((64 * 2**20)) ] \
    || echo "WILL NOT ALL COME BACK: over 64 MiB in \$OUT"
