#!/usr/bin/env bash
# One command on the GPU box, from the repository root with .whl/ beside it:
#
#   tools/gpu_box/zoo_call.sh WAIT_S [PART] [MINUTES]
#
# The box takes commands of at most 10 minutes and gives itself back when idle, so the zoo
# (python -m lm_eval_sinkmask.zoo.gpu_zoo, ~15 minutes) runs in the background and each call
# waits on it, returning within WAIT_S seconds of its start:
# - first call: installs the wheels (once), starts the zoo training with MINUTES of training
#   budget (default 11), and once its step plan is fixed the CUDA correctness tests of the
#   fused and flex detection paths beside it, and bench_masking's parts mass and zoo
#   (correctness only; timings must run alone);
# - every call: waits until the zoo is DONE, fails, or WAIT_S seconds have passed since the
#   call began (the first call's install included), then leaves in $OUT a
#   status.txt, the logs (logs.tgz) and, when done, the evaluation cells (eval.tgz);
# - PART a or b (after DONE): the trained checkpoints, one archive per seed, in two calls
#   because at most 64 MiB come back per call: a = arm + llada, b = dream + llada_sink.
# Unpack every archive into runs/zoo2, then `python -m lm_eval_sinkmask.zoo.install runs/zoo2`.
# ZOO_ARGS adds gpu_zoo options; ZOO_RUN moves its folder, ZOO_SITE the wheels' (env.sh).
set -uo pipefail
wait_s=${1:?usage: zoo_call.sh WAIT_S [none|a|b] [MINUTES]}
part=${2:-none}
minutes=${3:-11}
seeds=0,1,2
run=${ZOO_RUN:-/tmp/zoo2}
out=${OUT:?no \$OUT to write to}
mkdir -p "$run"
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
    [ -f $run/plan.json ] && [ ! -f $run/cuda_tests.pid ] || return 0
    start cuda_tests python3 -m pytest -q -p no:cacheprovider -rs \
        tests/test_fused_mass.py tests/test_flex_mass.py -k cuda
    # the bench's parts that time nothing (kernels vs reference; the zoo checkpoint's tokens
    # and masked keys, CUDA against CPU): beside the training, so that the device time after
    # it goes to the timings alone
    start bench_checks python3 benchmarks/bench_masking.py --gpu --gpu-parts mass,zoo
}

if [ ! -f $run/DONE ] && ! alive $run/gpu_zoo.pid; then
    start gpu_zoo python3 -m lm_eval_sinkmask.zoo.gpu_zoo --out $run --seeds $seeds \
        --minutes "$minutes" ${ZOO_ARGS:-}
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

case $part in
    a) models=(arm llada) ;;
    b) models=(dream llada_sink) ;;
    *) models=() ;;
esac
if [ ${#models[@]} -gt 0 ]; then
    [ -f $run/DONE ] || { echo "not DONE yet: nothing to fetch"; exit 1; }
    for s in ${seeds//,/ }; do
        tar czf "$out/$part-seed$s.tgz" -C $run "${models[@]/#/seed$s/}"
    done
    ls -l "$out"
fi
