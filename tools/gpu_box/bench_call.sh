#!/usr/bin/env bash
# One command on the GPU box for the speed work alone, when the session's device time is too
# short for the zoo (15 minutes, the box's start included): from the repository root with
# .whl/ beside it,
#
#   [CHECKS=0] tools/gpu_box/bench_call.sh [BUDGET_S]
#
# returns within BUDGET_S seconds (default 560) of its start, the wheels' install included,
# and leaves in $OUT one file per step (at most 8 files come back from a call):
# - cuda_tests.log, bench_checks.md: the CUDA tests of the fused and flex detection paths and of
#   the samplers' tie order, and the bench's parts mass, select and zoo (kernels vs reference,
#   the one-launch selection candidate vs the package's selection, CUDA vs CPU tokens), side
#   by side:
#   they compare and time nothing. CHECKS=0 leaves them out, for the timings' sake, when the
#   package's cell code (provenance.package_code_digest) is the one an earlier call checked;
# - then the timings, alone on the GPU, most needed first (the LLaDA shape's ratios), each cut
#   short when the budget runs out (what it printed so far stays): bench_llada.md (8B-shaped
#   LLaDA, batch 8 and 1, then batch 8 unpadded and at another length), bench_llama.md
#   (decoding steps), each table followed by its profile (kernel time, launches, host syncs
#   per pass or step: whether the host or the GPU sets the masked cost), gpu_hours.md and gpu_hours.json,
#   bench_llada_kernels.md (LLaDA's kernel switch);
# - summary.txt: the device, versions, and how each step ended.
set -uo pipefail
budget=${1:-560}
out=${OUT:?no \$OUT to write to}
summary=$out/summary.txt
. tools/gpu_box/env.sh > "$summary" 2>&1 || { cat "$summary"; exit 1; }
{ echo "date: $(date -u +%F)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, \
'triton', triton.__version__, 'transformers', transformers.__version__)"; } >> "$summary" 2>&1

step() {  # step NAME SECONDS_KEPT_IN_RESERVE COMMAND...: runs while the budget lasts
    local name=$1 reserve=$2; shift 2
    local left=$((budget - SECONDS - reserve))
    if [ $left -lt 30 ]; then echo "$name: not run, ${left}s left" >> "$summary"; return; fi
    local t0=$SECONDS
    timeout "$left" "$@"
    echo "$name: exit $? after $((SECONDS - t0))s" >> "$summary"
}

bench=(python3 benchmarks/bench_masking.py --gpu)
checks_budget=$((budget / 3))
# the fused kernels' CUDA tests take about 3 minutes; flex's unit cases compile one graph each
# (about 20 s apiece, 25 minutes in all), so only its model-level ones run here
if [ "${CHECKS:-1}" = 0 ]; then
    echo "cuda tests, bench checks: skipped (CHECKS=0)" | tee "$out/cuda_tests.log" >> "$summary"
else
    step "cuda tests" 0 timeout "$checks_budget" python3 -m pytest -q -p no:cacheprovider -rs \
        tests/test_fused_mass.py tests/test_flex_mass.py tests/test_decode_kernel.py \
        tests/test_sampler_draws.py \
        -k "cuda and (test_fused_mass or detection_masks or the_kernel_decodes or ties)" \
        > "$out/cuda_tests.log" 2>&1 &
    step "bench checks" 0 timeout "$checks_budget" "${bench[@]}" --gpu-parts mass,select,decode,zoo \
        > "$out/bench_checks.md" 2>&1 &
    wait
fi
step "bench llada" 10 "${bench[@]}" --gpu-parts llada,llada_gap --gpu-profile \
    > "$out/bench_llada.md" 2>&1
step "bench llama" 10 "${bench[@]}" --gpu-parts llama --gpu-profile > "$out/bench_llama.md" 2>&1
# the DLM steps graphed, as dlm_sinkmask runs them on CUDA by default (cuda_graph=auto)
step "gpu_hours" 10 python3 benchmarks/gpu_hours.py --detect-backend fused --batch 1,8 --graphs \
    --json "$out/gpu_hours.json" > "$out/gpu_hours.md" 2>&1
step "bench llada_kernels" 5 "${bench[@]}" --gpu-parts llada_kernels \
    > "$out/bench_llada_kernels.md" 2>&1

# the call returns only the last 12,000 characters of its output: the tables, then the verdicts
grep -h "^|\|^#\|FAILED\|DIFFER\|decode the same\|max |mass\|^selection kernel\|^graph check\|^CUDA graph\|^cuda_graph=true" "$out"/bench_*.md | cut -c1-220
tail -n 3 "$out/cuda_tests.log"
cat "$summary"
