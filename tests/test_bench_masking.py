"""benchmarks/bench_masking.py runs on the shipped zoo checkpoint (a smoke run, not a timing).

The benchmark is a script, not a test, but a script nobody runs rots: this runs its tiny-model
and sampler sections once, in seconds, and checks that it printed a ratio for every variant and
that our sampler matched the reference algorithm (it asserts the same tokens itself).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_masking  # noqa: E402


def test_quick_run_of_the_tiny_and_sampler_sections(capsys):
    bench_masking.main(["--quick", "--only", "1,5", "--repeats", "1", "--no-header"])
    out = capsys.readouterr().out
    assert "zoo checkpoint lm_eval_sinkmask/zoo/checkpoints/llada" in out
    for variant in ("(a) no intercept", "(b) top_k=0", "(c) top_k=5 previous", "(d) top_k=5 current"):
        assert variant in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "4", "8"]  # batch sizes, section 5


def test_gpu_section_code_runs_on_the_cpu_at_toy_sizes(capsys):
    """Section 3 (--gpu) runs only where the lead has a GPU; its code runs here on the CPU at
    toy sizes (the fused path takes its torch fallback), so a GPU run fails on nothing but the
    GPU. The zoo part must find the fused, flex and materialised paths masking the same keys."""
    bench_masking.main(["--quick", "--only", "3", "--repeats", "1", "--no-header",
                        "--gpu-smoke-cpu"])
    out = capsys.readouterr().out
    for title in ("batch 8", "batch 1", "arm_rule=last_row, batch 1", "arm_rule=all_rows, batch 8"):
        assert title in out
    for variant in ("(c) top_k=5 previous, fused", "(c) fused, eager selection", "(c) materialized",
                    "(c) flex (two FlexAttention calls)"):
        assert out.count(variant) == 6  # two LLaDA tables, four Llama decoding tables
    assert "fused kernels vs torch reference" in out
    assert "flex (two FlexAttention calls) vs torch reference" in out
    for name in ("fused", "flex"):
        assert f"CUDA {name} detection vs CUDA materialized: tokens the same, masked keys the " \
               "same in every one of the" in out
