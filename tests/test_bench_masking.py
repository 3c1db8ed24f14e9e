"""benchmarks/bench_masking.py runs on the shipped zoo checkpoint (a smoke run, not a timing).

The benchmark is a script, not a test, but a script nobody runs rots: this runs its tiny-model
and sampler sections once, in seconds, and checks that it printed a ratio for every variant and
that our sampler matched the reference algorithm (it asserts the same tokens itself).
"""

import argparse
import re
import types
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lm_eval_sinkmask import masking_stats
from lm_eval_sinkmask.config import SinkMaskConfig
from lm_eval_sinkmask.intercept import SinkMasker

import bench_masking
import gpu_profile

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_of_the_tiny_and_sampler_sections(capsys):
    bench_masking.main(["--quick", "--only", "1,5", "--repeats", "1", "--no-header"])
    out = capsys.readouterr().out
    assert "zoo checkpoint lm_eval_sinkmask/zoo/checkpoints/llada" in out
    for variant in ("(a) no intercept", "(b) top_k=0", "(c) top_k=5 previous", "(d) top_k=5 current"):
        assert variant in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "4", "8"]  # batch sizes, section 5


def test_gpu_section_code_runs_on_the_cpu_at_toy_sizes(capsys):
    """Section 3 (--gpu) runs only where a GPU is lent; its code runs here on the CPU at
    toy sizes (the fused path takes its torch fallback), so a GPU run fails on nothing but the
    GPU. The zoo part must find the fused, flex and materialised paths masking the same keys.
    Every variant is timed (``--gpu-skip ''``), the two left out by default included."""
    bench_masking.main(["--quick", "--only", "3", "--repeats", "1", "--no-header",
                        "--gpu-smoke-cpu", "--gpu-skip", ""])
    out = capsys.readouterr().out
    for title in ("batch 8", "batch 1", "arm_rule=last_row, batch 1", "arm_rule=all_rows, batch 8"):
        assert title in out
    for variant in ("(c) fused, eager selection", "(c) flex (two FlexAttention calls)",
                    "(c) fused, one-launch selection kernel (candidate)"):
        # four LLaDA tables (two under LLaDA's own kernel switch), four Llama decoding tables
        assert out.count(variant) == 8
    assert out.count("(c) fused, selection kernel writes the output mask (candidate)") == 4
    # the LLaDA tables and part llada_gap's
    assert out.count("(c) row log-sum-exp from the masked output, first pass on the call path "
                     "(candidates)") == 4 + 3
    # the Llama tables (the same path as (c) here: the decoding kernel needs Triton's CUDA)
    assert out.count("(c) fused, one-row calls by parts (before the decoding kernel)") == 4
    # the LLaDA tables and part llada_gap's
    assert out.count("(c) fused, detection kernels with 8 warps (candidate)") == 4 + 3
    assert out.count("(c) fused, every mask read as tiles (the kernels before the one-row "
                     "load)") == 4 + 3
    for variant in ("(c) top_k=5 previous, fused", "(c) materialized"):
        assert out.count(variant) == 8 + 3  # and the three tables of part llada_gap
    for title in ("batch 8, S 40, no padding", "batch 8, S 60, no padding", "batch 8, S 60, padded"):
        assert title in out
    assert "fused kernels vs torch reference" in out
    assert "replayed as one CUDA graph" not in out and "graph check" not in out  # CUDA only
    assert "flex (two FlexAttention calls) vs torch reference" in out
    assert "selection kernel vs eager: not checked on the CPU" in out
    assert "log-sum-exp reuse (c_lse) vs torch reference: not checked on the CPU" in out
    for name in ("fused", "flex"):
        assert f"CUDA {name} detection vs CUDA materialized: tokens the same, masked keys the " \
               "same in every one of the" in out


def test_gpu_profile_adds_a_profile_of_every_timed_variant(capsys):
    """--gpu-profile: after each timed table, every variant once under torch.profiler (kernel
    time, launches, syncs and copies per pass or step; zeros on the CPU, where no CUDA call
    is made). The numbers are the GPU's to give; here the tables must be there and whole."""
    bench_masking.main(["--quick", "--only", "3", "--repeats", "1", "--no-header",
                        "--gpu-smoke-cpu", "--gpu-parts", "llada,llama", "--gpu-profile"])
    out = capsys.readouterr().out
    titles = [line for line in out.splitlines() if line.startswith("#### Profile: ")]
    assert len(titles) == 2 + 4  # llada at batch 8 and 1; Llama's two rules at batch 1 and 8
    assert sum("per decoding step" in t for t in titles) == 4
    rows = [line for line in out.splitlines() if line.startswith("| (")]
    # every variant but those --gpu-skip leaves out by default (materialized, flex, the
    # eager selection, (d), c_lse, c_w8, c_kernel; the graphed ones run on CUDA only): LLaDA
    # a, b, c, c_tiles and one candidate; Llama a, c and one
    assert sum(r.endswith("| 0.000 | 0.0 | 0.00 | 0.00 |") for r in rows) == 2 * 5 + 4 * 3
    # and, per masked variant, the host's time per call split into the intercept's parts
    splits = [line for line in out.splitlines() if ", host time in the intercept: " in line]
    assert len(splits) == 2 * 3 + 4 * 2  # (c) x 3 for LLaDA; (c) x 2 for Llama
    # (a decoding step's parts are the difference of two runs: one near zero may print
    # slightly negative)
    assert all(re.search(r"us a call = mask view -?[\d,]+ \+ detection -?[\d,]+ \+ output "
                         r"-?[\d,]+ \+ selection -?[\d,]+ \+ rest -?[\d,]+$", line)
               for line in splits), splits


def test_gpu_flag_runs_only_the_gpu_section_by_default(monkeypatch):
    """A lent GPU runs one command for at most 10 minutes: the CPU sections (about 15 minutes
    in all, sections 1 and 2 before section 3) must not run there unless asked for."""
    ran = []
    for name in ("bench_tiny", "bench_forward", "bench_gpu", "bench_memory", "bench_sampler"):
        monkeypatch.setattr(bench_masking, name, lambda *a, _n=name, **k: ran.append(_n))
    monkeypatch.setattr("subprocess.run", lambda *a, **k: ran.append("child (section 4)"))
    bench_masking.main(["--gpu", "--no-header"])
    assert ran == ["bench_gpu"]


def test_gpu_section_llada_config_has_llada_8b_shape(monkeypatch):
    """The 8B-shaped LLaDA config is LLaDA-8B's layer (gpu_hours.SHAPES): an MLP wider than
    12288 makes the unmasked time larger and the masked/unmasked ratio look better."""
    import gpu_hours

    seen = {}

    class Stop(BaseException):
        pass

    def fake(hidden, heads, layers, dtype, device, intermediate=None):
        seen.update(hidden=hidden, heads=heads, intermediate=intermediate or 4 * hidden,
                    layers=layers, dtype=dtype)
        raise Stop

    monkeypatch.setattr(bench_masking, "wide_model", fake)
    args = bench_masking.argparse.Namespace(gpu_parts="llada", quick=True, repeats=1, chunk=256)
    try:
        bench_masking.bench_gpu_parts(args, bench_masking.torch.device("cpu"))
    except Stop:
        pass
    shape = gpu_hours.SHAPES["llada"]
    # and in bf16, 2 layers under --quick (4 otherwise)
    assert seen == dict(hidden=shape.hidden, heads=shape.heads, intermediate=shape.ffn,
                        layers=2, dtype=torch.bfloat16)


def test_a_failing_backend_loses_no_other_part(monkeypatch, capsys):
    """FlexAttention failing on the GPU box (missing, or a compile error) is reported; the
    fused rows, the Llama tables and the zoo comparison of the fused path still come out."""
    from lm_eval_sinkmask import flex_mass

    def broken(*a, **k):
        raise RuntimeError("flex broken here")

    monkeypatch.setattr(flex_mass, "flex_column_mass", broken)
    bench_masking.main(["--quick", "--only", "3", "--repeats", "1", "--no-header",
                        "--gpu-smoke-cpu", "--gpu-skip", ""])
    out = capsys.readouterr().out
    assert "part mass FAILED" in out and "flex broken here" in out
    assert out.count("(c) top_k=5 previous, fused") == 8 + 3  # with part llada_gap's tables
    assert "variant (c) flex (two FlexAttention calls) FAILED" in out
    assert "CUDA fused detection vs CUDA materialized: tokens the same" in out
    assert "CUDA flex detection FAILED on the zoo checkpoint" in out


def test_decoding_steps_are_timed_through_generate_as_lm_eval_runs_them():
    """Section 3b (and gpu_hours) time a decoding step as lm-eval's HFLM makes it: through
    ``model.generate`` (its per-step stopping check included), masked and unmasked alike, one
    forward pass per new token however early the model would emit EOS."""
    torch = bench_masking.torch
    from lm_eval_sinkmask.config import SinkMaskConfig
    from lm_eval_sinkmask.intercept import SinkMasker

    model = bench_masking.llama_model(1, "cpu", hidden=64, heads=4)
    eos = model.generation_config.eos_token_id
    model.lm_head.register_forward_hook(  # EOS wins every step
        lambda module, args, out: out.index_fill(-1, torch.tensor([eos]), 1e4))
    generated = []
    real = model.generate
    model.generate = lambda **kw: generated.append(real(**kw))
    ids = torch.randint(5, 2000, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        bench_masking.generate_cached(model, ids, 0)
        with SinkMasker(SinkMaskConfig(top_k=2, eps=0.0), rule="last_row").attach(model) as stats:
            bench_masking.generate_cached(model, ids, 3)
    assert [g.shape for g in generated] == [(2, 13), (2, 16)]
    assert stats.forward_passes == 4 and stats.keys_masked > 0


def test_llada_kernels_part_runs_under_lladas_own_kernel_switch(monkeypatch, capsys):
    """LLaDA-8B's and MMaDA's own code turn the memory-efficient SDPA kernel off process-wide
    when built; part llada_kernels times the 8B-shaped forward in that state (a masked call
    cannot take the flash kernel, so it may land on the math one), and leaves the switch as
    it found it."""
    torch = bench_masking.torch
    seen = []

    def fake_forward(title, model, B, S, passes, args, device, ragged=True, variants=None,
                     gpu=False):
        seen.append((title, B, torch.backends.cuda.mem_efficient_sdp_enabled()))
        return {}

    monkeypatch.setattr(bench_masking, "bench_forward", fake_forward)
    before = torch.backends.cuda.mem_efficient_sdp_enabled()
    args = bench_masking.argparse.Namespace(gpu_parts="llada_kernels", quick=True, repeats=1,
                                            chunk=256)
    bench_masking.bench_gpu_parts(args, torch.device("cpu"), hidden=64, heads=4, S=40, P=24)
    assert [(B, on) for _, B, on in seen] == [(8, False), (1, False)]
    assert all("memory-efficient kernel off" in title for title, _, _ in seen)
    assert torch.backends.cuda.mem_efficient_sdp_enabled() == before


def test_gpu_profile_names_what_the_masked_variant_adds_on_the_device():
    """The profile's last lines name the kernels and copies (c) runs more often than (a), per
    pass or step: the next thing to cut. Decoding steps subtract the prefill-only run."""
    a = {"kernel ms": 2.0, "launches": 8, "syncs": 0, "copies": 0,
         "device": {"gemm": (8, 1000.0), "flash_fwd": (4, 400.0)}}
    c = {"kernel ms": 3.0, "launches": 20, "syncs": 0, "copies": 2,
         "device": {"gemm": (8, 1000.0), "flash_fwd": (4, 400.0), "row_lse_kernel": (4, 200.0),
                    "Memcpy HtoD (Pageable -> Device)": (8, 8.0), "triton_poi_" + "x" * 80: (4, 40.0)}}
    per_a, per_c = gpu_profile.per_unit(a, 4), gpu_profile.per_unit(c, 4)
    assert per_c["launches"] == 5 and per_c["device"]["row_lse_kernel"] == (1, 50.0)
    added = gpu_profile.added_on_device(per_c, per_a)
    assert added[0] == "2.0 x `Memcpy HtoD (Pageable -> Device)` (+2.0 us)"
    assert added[1] == "1.0 x `row_lse_kernel` (+50.0 us)"
    assert added[2].startswith("1.0 x `triton_poi_xxx") and "...` (+10.0 us)" in added[2]
    assert not any("gemm" in x or "flash" in x for x in added)
    # a decoding step: the run with steps less the prefill-only run, per step
    alone = {"kernel ms": 1.0, "launches": 4, "syncs": 0, "copies": 1,
             "device": {"gemm": (4, 500.0), "Memcpy HtoD (Pageable -> Device)": (4, 4.0)}}
    step = gpu_profile.per_unit(c, 2, minus=alone)
    assert step["copies"] == 0.5 and step["device"]["gemm"] == (2, 250.0)
    assert step["device"]["Memcpy HtoD (Pageable -> Device)"] == (2, 2.0)


def test_host_parts_split_a_call_and_leave_the_package_as_it_was():
    """The profile's host split: per intercepted call, each part's time and what the parts
    leave over, from the ranges :func:`host_parts_recorded` opens; the functions it wraps
    are the package's own again after the block."""
    from lm_eval_sinkmask import compiled_tail, intercept

    before = {name: getattr(owner, attr) for name, (owner, attr) in
              gpu_profile.HOST_PARTS.items()}
    selector = compiled_tail.selector
    model = bench_masking.wide_model(32, 2, 2, torch.float32, torch.device("cpu"))
    ids = torch.randint(5, 2000, (2, 12), generator=torch.Generator().manual_seed(0))

    def run_one(_):
        with torch.inference_mode(), SinkMasker(SinkMaskConfig(top_k=2, eps=0.0)).attach(model):
            for _ in range(3):
                model(input_ids=ids)

    prof = gpu_profile.profiled(run_one, "c", torch.device("cpu"))
    assert prof["host"]["call"][0] == 3 * 2  # passes x layers
    for part in ("mask view", "detection", "selection", "output"):
        count, us = prof["host"][part]
        assert count >= 1 and us > 0
    assert all(getattr(owner, attr) is before[name]
               for name, (owner, attr) in gpu_profile.HOST_PARTS.items())
    assert compiled_tail.selector is selector and intercept._Run.sdpa is before["call"]

    per_call = {"host": {"call": (4, 4000.0), "detection": (4, 1200.0), "selection": (4, 800.0),
                         "output": (2, 400.0), "mask view": (4, 100.0)}}
    assert gpu_profile.host_split(per_call) == (
        "1,000 us a call = mask view 25 + detection 300 + output 100 + selection 200 + rest 375")
    assert gpu_profile.host_split({"host": {}}) is None


def test_gpu_profile_reads_a_cuda_profile_in_ms_less_its_own_sync(monkeypatch):
    """What a CUDA profile's events become (faked: this machine has no GPU): the kernels' own
    time from us to ms, without the device side of the intercept's ranges; launches, copies,
    and host waits less profiled()'s own final sync."""
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(key, count, device_us=0.0, device_type=cpu, cpu_us=0.0):
        return types.SimpleNamespace(key=key, count=count, self_device_time_total=device_us,
                               device_type=device_type, cpu_time_total=cpu_us)

    events = [event("gemm", 4, 1500.0, cuda), event("sinkmask: detection", 2, 900.0, cuda),
              event("sinkmask: detection", 2, cpu_us=80.0), event("cudaLaunchKernel", 6),
              event("cuLaunchKernel", 2), event("cudaDeviceSynchronize", 3),
              event("cudaMemcpyAsync", 1)]

    class Profile:
        def __init__(self, activities):
            assert torch.profiler.ProfilerActivity.CUDA in activities

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def key_averages(self):
            return events

    monkeypatch.setattr(torch.profiler, "profile", Profile)
    monkeypatch.setattr(gpu_profile, "sync", lambda device: None)
    assert gpu_profile.profiled(lambda n: None, "c", torch.device("cuda")) == {
        "kernel ms": 1.5, "launches": 8, "syncs": 2, "copies": 1,
        "device": {"gemm": (4, 1500.0)}, "host": {"detection": (2, 80.0)}}


def test_variant_c_w8_launches_both_detection_kernels_with_8_warps(monkeypatch):
    """c_w8 (candidate): the fused path's own launches, the number of warps alone changed."""
    from lm_eval_sinkmask import fused_mass

    launched = []

    class Kernel:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append((self.name, grid, args, kwargs))

    monkeypatch.setattr(fused_mass, "_kernels", lambda: types.SimpleNamespace(
        row_lse_kernel=Kernel("row_lse"), column_mass_kernel=Kernel("column_mass")))
    with bench_masking.candidate_of("c_w8"):
        kernels = fused_mass._kernels()
        kernels.row_lse_kernel[(3, 4)](1, 2, BLOCK_M=64, num_warps=4)
        kernels.column_mass_kernel[(5, 4)](1, 2, BLOCK_N=64, num_warps=4)
    assert launched == [("row_lse", (3, 4), (1, 2), {"BLOCK_M": 64, "num_warps": 8}),
                        ("column_mass", (5, 4), (1, 2), {"BLOCK_N": 64, "num_warps": 8})]
    assert fused_mass._kernels().row_lse_kernel.name == "row_lse"  # restored: 4 warps again


def test_choice_margin_tells_a_near_tie_from_a_distant_choice():
    """The decoding check's verdict on two runs whose chosen keys differ: a key the other run
    chose just past top_k within the score difference is a tie; one from far down is not."""
    scores = torch.tensor([[[5.0, 4.0, 3.0, 2.0001, 2.0, 1.0, 0.5]]])
    chosen = torch.tensor([[[True, True, True, True, False, False, False]]])
    tie = scores.clone()
    tie[..., 4] = 2.0002  # the 4th and 5th swap: a difference of 2e-4
    tie_chosen = torch.tensor([[[True, True, True, False, True, False, False]]])
    line = bench_masking.choice_margin([(scores, chosen)] * 2, [(scores, chosen), (tie, tie_chosen)],
                                       top_k=4)
    assert line.startswith("first differing choice at call 1")
    assert "rank at most 5 " in line and "0.0001 below" in line and "there 0.0002" in line
    far_chosen = torch.tensor([[[True, True, True, False, False, False, True]]])
    line = bench_masking.choice_margin([(scores, chosen)], [(scores, far_chosen)], top_k=4)
    assert "rank at most 7 " in line and "1.5 below" in line
    assert bench_masking.choice_margin([(scores, chosen)], [(scores, chosen)], 4) == \
        "the chosen keys never differ"


def test_variant_c_tiles_reads_every_mask_as_tiles_and_only_inside(monkeypatch):
    """c_tiles (the one-row load's baseline): the fused path's launches get MASK_ROWS true for
    every mask, a row-free one included; outside the variant the row-free mask is one row."""
    import types

    from lm_eval_sinkmask import fused_mass

    launched = []

    class Kernel:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append((self.name, kwargs["MASK_ROWS"]))

    monkeypatch.setattr(fused_mass, "_kernels", lambda: types.SimpleNamespace(
        row_lse_kernel=Kernel("row_lse"), column_mass_kernel=Kernel("column_mass")))
    q = torch.zeros(2, 4, 6, 8)
    row_free = torch.zeros(2, 1, 1, 9)
    per_row = torch.zeros(2, 1, 6, 9)

    def launch(mask):
        fused_mass.column_mass(q, torch.zeros(2, 4, 9, 8), torch.ones(2, 6), mask=mask,
                               use_triton=True)
        return [rows for _, rows in launched[-2:]]

    assert launch(row_free) == [False, False] and launch(per_row) == [True, True]
    with bench_masking.candidate_of("c_tiles"):
        assert launch(row_free) == [True, True] and launch(per_row) == [True, True]
    assert launch(row_free) == [False, False]  # restored


def test_variant_c_call_installs_the_call_path(monkeypatch):
    import select_kernel

    entered = []
    monkeypatch.setattr(select_kernel, "call_path_installed",
                        lambda: _entered(entered, "call_path_installed"))
    for variant in ("c_tiles", "c_call"):
        with bench_masking.candidate_of(variant):
            entered.append("|")
    assert entered == ["|", "call_path_installed", "|"]


@contextmanager
def _entered(log, name):
    log.append(name)
    yield


def test_the_graph_check_compares_replayed_passes_with_eager_ones(monkeypatch):
    """c_graph's check (part llada, on CUDA), run here with the CPU stand-in for capture
    (tests/test_graphed_pass.py) on the accelerator's route: equal, and not equal once the
    intercept's in-place update of the last choice is taken away."""
    import argparse

    from lm_eval_sinkmask import intercept
    from tests.recorded_graph import recorded

    monkeypatch.setattr(intercept, "_output_from_scores", lambda device: False)
    model = bench_masking.wide_model(64, 4, 2, torch.float32, torch.device("cpu"), 128)
    args = argparse.Namespace(chunk=64)
    for B in (2, 1):
        [line] = bench_masking.graph_check(model, B, 40, args, torch.device("cpu"), recorded)
        assert ("logits equal in 3/3, chosen keys equal in 3/3 (largest logit difference 0)"
                in line), line
    # choices rebound to new tensors, as without ``attach(in_place=True)``
    monkeypatch.setattr(intercept._Run, "_keep_in_place", lambda run, layer, kept: None)
    [line] = bench_masking.graph_check(model, 2, 40, args, torch.device("cpu"), recorded)
    assert "logits equal in 3/3" not in line and "chosen keys equal in 3/3" not in line


def test_the_zoo_checkpoint_decodes_the_same_tokens_through_the_captured_pass(monkeypatch):
    """Part zoo's c_graph line (CUDA only), run here with the CPU stand-in for capture on the
    accelerator's route, against the eager fused path's tokens."""
    from lm_eval_sinkmask import intercept
    from lm_eval_sinkmask.samplers import generate_block
    from tests.recorded_graph import recorded

    monkeypatch.setattr(intercept, "_output_from_scores", lambda device: False)
    model, _, eps = bench_masking.tiny_model()
    mask_id = bench_masking.mask_id_of(model)
    ids, pmask = bench_masking.prompts(4, 40, model.config.vocab_size, mask_id)
    cfg = SinkMaskConfig(top_k=5, eps=eps, detect_backend="fused")
    with torch.inference_mode(), SinkMasker(cfg).attach(model) as stats:
        eager = generate_block(bench_masking.model_fn_of(model), ids, pmask, mask_id=mask_id,
                               gen_length=32, steps=32, block_length=16, variant="invariant")
    assert stats.keys_masked > 0
    line = bench_masking.graphed_generation_check(
        model, ids, pmask, mask_id, eps, (eager, stats.keys_masked), None, recorded)
    assert line == (f"CUDA graph (c_graph, 32 passes, 2 eager, then one capture; keys masked "
                    f"{stats.keys_masked}) vs CUDA materialized: tokens and keys masked the same "
                    f"(keys masked {stats.keys_masked}); vs CUDA fused: not run"), line
    line = bench_masking.graphed_generation_check(
        model, ids, pmask, mask_id, eps, (eager, stats.keys_masked + 1), None, recorded)
    assert "tokens and keys masked DIFFER" in line


def test_part_zoo_runs_cuda_graph_through_lm_eval(monkeypatch):
    """Part zoo's cuda_graph lines (CUDA only), run here with the CPU stand-in for capture on
    the accelerator's route: the user's path, with and without the graph."""
    from lm_eval_sinkmask import attention_view, graphed_steps, intercept
    from tests.recorded_graph import recorded

    monkeypatch.setattr(intercept, "_output_from_scores", lambda device: False)
    monkeypatch.setattr(attention_view, "_host_reads_are_free", lambda device: False)
    monkeypatch.setattr(graphed_steps, "capture", recorded)
    monkeypatch.setattr(graphed_steps, "check_device", lambda device: None)
    lines = bench_masking.cuda_graph_through_lm_eval(torch.device("cpu"), models=("llada",))
    assert len(lines) == 1 and "texts the same in 4/4, counters the same" in lines[0], lines
    monkeypatch.setattr(masking_stats.ReplayCounts, "add_replay", lambda self: None)
    [line] = bench_masking.cuda_graph_through_lm_eval(torch.device("cpu"), models=("llada",))
    assert "counters DIFFER" in line


@pytest.mark.parametrize("device,clock", [("cpu", "process_time"), ("cuda", "perf_counter")])
def test_interleaved_times_each_run_alone_round_robin_after_a_warm_up(monkeypatch, device, clock):
    """The protocol every ratio rests on: one untimed warm-up, the variants rotated each
    repeat, each run timed alone between two device syncs on the clock the docstring names
    (the CPU's process time, CUDA's wall time); medians, and minima for the best runs."""
    now, log = [0.0], []
    other = {"process_time": "perf_counter", "perf_counter": "process_time"}[clock]
    monkeypatch.setattr(bench_masking.time, clock, lambda: log.append("clock") or now[0])
    monkeypatch.setattr(bench_masking.time, other, lambda: log.append("other clock") or now[0])
    monkeypatch.setattr(bench_masking, "sync", lambda dev: log.append(f"sync {dev.type}"))
    costs = {"a": [100.0, 1.0, 2.0, 6.0], "b": [3.0, 4.0, 11.0], "c": [5.0, 5.0, 20.0]}

    def run_one(n):
        log.append(n)
        now[0] += costs[n].pop(0)
        return f"keys {n}"

    med, extra = bench_masking.interleaved(run_one, ["a", "b", "c"], 3,
                                           types.SimpleNamespace(type=device))
    timed = [[f"sync {device}", "clock", n, f"sync {device}", "clock"]
             for n in "abc" + "bca" + "cab"]
    assert log == ["a"] + sum(timed, [])
    assert med == {"a": 2.0, "b": 4.0, "c": 5.0}
    assert bench_masking.interleaved.last_min == {"a": 1.0, "b": 3.0, "c": 5.0}
    assert extra == {"a": "keys a", "b": "keys b", "c": "keys c"}


def _table_rows(out):
    return [[cell.strip() for cell in line.split("|")[1:-1]]
            for line in out.splitlines() if line.startswith("| (")]


def test_table_rows_are_ratios_to_a_and_tokens_per_median_second(monkeypatch, capsys):
    """A row: median s, tokens / median s, its median over (a)'s and its best run over
    (a)'s best, keys masked; the CPU sections' rows carry their own labels; a time of 0 (a
    decoding step below the clock's resolution) prints n/a, not a division by zero."""
    monkeypatch.setattr(bench_masking.interleaved, "last_min",
                        {"a": 1.0, "b": 1.5, "c": 3.0, "d": 0.5}, raising=False)
    bench_masking.table("t", {"a": 2.0, "b": 2.5, "c": 4.0, "d": 5.0}, 100, {"c": 7, "d": 9})
    assert _table_rows(capsys.readouterr().out) == [
        ["(a) no intercept", "2.000", "50", "1.000", "1.000", "-"],
        ["(b) top_k=0", "2.500", "40", "1.250", "1.500", "-"],
        ["(c) top_k=5 previous", "4.000", "25", "2.000", "3.000", "7"],
        ["(d) top_k=5 current", "5.000", "20", "2.500", "0.500", "9"]]
    monkeypatch.setattr(bench_masking.interleaved, "last_min", {"a": 0.0, "c": 0.25})
    bench_masking.table("t", {"a": 0.0, "c": 0.5}, 8, {})
    assert _table_rows(capsys.readouterr().out) == [
        ["(a) no intercept", "0.000", "n/a", "n/a", "n/a", "-"],
        ["(c) top_k=5 previous", "0.500", "16", "n/a", "n/a", "-"]]


def test_each_variant_runs_the_settings_its_label_names():
    """(c) and (d) differ in detect alone; on the GPU the candidates share (c)'s settings
    (they differ in code: candidate_of) and c_mat, c_flex and d differ from it in the one
    field their labels name; every masked variant takes the eps and chunk asked for (a
    random model under the default eps 3 masks nothing)."""
    cpu = bench_masking.configs(0.5, 64)
    assert cpu["a"] is None and cpu["b"].top_k == 0
    assert cpu["c"] == SinkMaskConfig(top_k=5, eps=0.5, detect="previous", query_chunk=64)
    assert cpu["d"] == replace(cpu["c"], detect="current")
    gpu = bench_masking.gpu_configs(0.5, 64)
    fused = replace(cpu["c"], detect_backend="fused")
    assert set(gpu) == set(bench_masking.GPU_VARIANTS + bench_masking.DECODING_VARIANTS)
    assert gpu["a"] is None and gpu["a_graph"] is None and gpu["b"] == cpu["b"]
    assert all(gpu[n] == fused for n in ("c", "c_tiles", "c_eager", "c_kernel", "c_call",
                                         "c_lse", "c_w8", "c_graph", "c_byparts"))
    assert gpu["c_mat"] == replace(fused, detect_backend="materialized")
    assert gpu["c_flex"] == replace(fused, detect_backend="flex")
    assert gpu["d"] == replace(fused, detect="current")


@pytest.mark.parametrize("ragged,variants,gpu,backends", [
    (False, bench_masking.VARIANTS, False, {"auto"}),
    (True, ("a", "c", "c_mat"), True, {"fused", "materialized"}),
    (False, bench_masking.VARIANTS, True, {"fused"}),  # --gpu-skip left exactly (a)-(d)
])
def test_forward_tables_time_the_same_passes_in_every_variant(monkeypatch, ragged, variants,
                                                              gpu, backends):
    """Every variant runs as many forward passes on the same inputs (no mask where no row
    is padded, as dlm_model calls LLaDA); section 3's variants, whichever are left, each run
    once before the timings (kernel and compile warm-up), on the paths and under the labels
    of section 3 (its (c) the fused path, section 2's auto's); tokens/s counts every pass and
    the profile is per pass."""
    model = bench_masking.wide_model(32, 2, 2, torch.float32, torch.device("cpu"))
    masks, passes, warm, tables, divisors, detected = [], {}, [], [], [], set()
    model.register_forward_pre_hook(
        lambda module, args, kwargs: masks.append(kwargs.get("attention_mask")),
        with_kwargs=True)
    real, real_masker = bench_masking.interleaved, bench_masking.SinkMasker

    def masker(config):
        if config.top_k:  # (b), top_k=0, detects nothing
            detected.add(config.detect_backend)
        return real_masker(config)

    def counted(run_one, names, repeats, device):
        warm.append(len(masks))
        for n in names:
            before = len(masks)
            run_one(n)
            passes[n] = len(masks) - before
        return real(run_one, names, repeats, device)  # (which sets counted.last_min)

    monkeypatch.setattr(bench_masking, "interleaved", counted)
    monkeypatch.setattr(bench_masking, "SinkMasker", masker)
    monkeypatch.setattr(bench_masking, "table", lambda title, med, tokens, extra, note, labels:
                        tables.append((tokens, labels)))
    monkeypatch.setattr(bench_masking, "profiled", lambda run_one, n, device: n)
    monkeypatch.setattr(bench_masking, "per_unit",
                        lambda prof, divisor, minus=None: divisors.append(divisor))
    monkeypatch.setattr(bench_masking, "profile_table", lambda *a: None)
    args = argparse.Namespace(chunk=64, repeats=1, gpu_profile=True)
    bench_masking.bench_forward("t", model, 2, 20, 3, args, torch.device("cpu"), ragged,
                                variants, gpu)
    assert warm == [3 * len(variants) if gpu else 0]
    assert passes == {n: 3 for n in variants}
    assert all((m is not None) == ragged for m in masks) and masks
    labels = bench_masking.GPU_LABELS if gpu else bench_masking.LABELS
    assert tables == [(2 * 20 * 3, labels)] and divisors == [3] * len(variants)
    assert detected == backends


def test_warm_up_leaves_out_a_failing_candidate_but_not_the_baseline(capsys):
    """A candidate raising in its warm-up run is reported and left out; (a) raising fails
    the table, every ratio of which divides by it."""
    failing = {"c_flex"}

    def run_one(n):
        if n in failing:
            raise RuntimeError(f"{n} broke")

    assert bench_masking.warm_up(run_one, ("a", "c", "c_flex"), "t") == ["a", "c"]
    assert "variant (c) flex (two FlexAttention calls) FAILED" in capsys.readouterr().out
    failing.add("a")
    with pytest.raises(RuntimeError, match="a broke"):
        bench_masking.warm_up(run_one, ("a", "c", "c_flex"), "t")


def test_variants_c_eager_and_c_kernel_change_the_selection_only_inside(monkeypatch):
    """c_eager: the selection eager (compiled_tail.ENABLED off); c_kernel: select_kernel's
    two entry points where compiled_tail hands out its compiled ones, whatever the switch;
    (c) and the other candidates keep the package's switch (SINKMASK_COMPILE_TAIL=0 holds
    there, as the header reports it)."""
    import select_kernel

    from lm_eval_sinkmask import compiled_tail

    def state():
        return compiled_tail.ENABLED, compiled_tail._COMPILED, compiled_tail._COMPILED_FROM_ROWS

    for switch in (True, False):
        monkeypatch.setattr(compiled_tail, "ENABLED", switch)
        before = state()
        with bench_masking.candidate_of("c_eager"):
            assert compiled_tail.ENABLED is False
        for variant in ("c", "c_w8"):
            with bench_masking.candidate_of(variant):
                assert compiled_tail.ENABLED is switch
        with bench_masking.candidate_of("c_kernel"):
            assert state() == (True, select_kernel.select_and_count,
                               select_kernel.select_and_count_from_rows)
        assert state() == before


def test_a_decoding_step_is_the_run_with_steps_less_the_prefill_alone(monkeypatch):
    """Section 3b: per variant (prefill + steps - prefill) / steps, for the medians and the
    best runs alike; tokens/s = batch / that; the profile subtracts the prefill-only run."""
    decodes, tables, profiles = [], [], []
    prefill = {"med": {"a": 1.0, "c": 1.5, "c_byparts": 1.5},
               "best": {"a": 0.5, "c": 1.0, "c_byparts": 1.0}}
    per_step = {"med": {"a": 0.25, "c": 0.5, "c_byparts": 1.0},
                "best": {"a": 0.125, "c": 0.25, "c_byparts": 0.5}}

    def timings(run_one, names, repeats, device):
        for n in names:
            run_one(n)
        decode = decodes[-1]
        timings.last_min = {n: prefill["best"][n] + decode * per_step["best"][n] for n in names}
        return {n: prefill["med"][n] + decode * per_step["med"][n] for n in names}, {}

    monkeypatch.setattr(bench_masking, "generate_cached",
                        lambda model, ids, decode: decodes.append(decode))
    monkeypatch.setattr(bench_masking, "interleaved", timings)
    monkeypatch.setattr(bench_masking, "table", lambda title, med, tokens, extra, note, labels:
                        tables.append((med, dict(timings.last_min), tokens)))
    monkeypatch.setattr(bench_masking, "profiled",
                        lambda run_one, n, device: (run_one(n), decodes[-1])[1])
    monkeypatch.setattr(bench_masking, "per_unit", lambda prof, divisor, minus=None:
                        profiles.append((prof, divisor, minus)))
    monkeypatch.setattr(bench_masking, "profile_table", lambda *a: None)
    args = argparse.Namespace(quick=True, repeats=1, chunk=64, gpu_skip=bench_masking.GPU_SKIP,
                              gpu_profile=True)
    bench_masking.bench_llama_decoding(args, torch.device("cpu"), hidden=64, heads=4, P=8)
    assert [tokens for _, _, tokens in tables] == [1, 8, 1, 8]  # last_row, then all_rows
    for med, best, _ in tables:
        assert med == pytest.approx(per_step["med"]) and best == pytest.approx(per_step["best"])
    assert profiles == [(16, 16, 0)] * 3 * 4


def test_the_sampler_section_refuses_other_tokens_and_reports_ours_over_the_reference(
        monkeypatch, capsys):
    """Section 5: a time ratio is printed only for samplers that decoded the same tokens;
    the row is ours / reference and generated tokens (batch x gen_length) per second."""
    def timings(run_one, names, repeats, device):
        timings.last_min = {"ours": 1.0, "ref": 4.0}
        return {"ours": 2.0, "ref": 4.0}, {}

    reference = [0]
    monkeypatch.setattr(bench_masking, "generate_block",
                        lambda fn, ids, mask, gen_length, **kw: torch.zeros(len(ids), gen_length))
    monkeypatch.setattr(bench_masking, "reference_llada_generate",
                        lambda model, ids, gen_length, **kw:
                        torch.full((len(ids), gen_length), reference[0]))
    monkeypatch.setattr(bench_masking, "interleaved", timings)
    args = argparse.Namespace(quick=True, repeats=1)
    bench_masking.bench_sampler(args)
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line[:3] in ("| 1", "| 4", "| 8")]
    assert rows == [f"| {B} | 2.000 | 4.000 | 0.500 | 0.250 | {16 * B} | {8 * B} |"
                    for B in (1, 4, 8)]
    reference[0] = 1
    with pytest.raises(AssertionError, match="batch 1: our sampler and the reference disagree"):
        bench_masking.bench_sampler(args)


def test_the_reference_sampler_gives_a_blocks_remainder_to_its_first_steps():
    """Where a block's steps do not divide its length (never at the timed sizes), LLaDA's
    algorithm unmasks one more token in the first steps: the reference must still decode
    our sampler's tokens."""
    from lm_eval_sinkmask.samplers import generate_block

    model, _, _ = bench_masking.tiny_model()
    mask_id = bench_masking.mask_id_of(model)
    ids, _ = bench_masking.prompts(2, 12, model.config.vocab_size, mask_id, ragged=False)
    kw = dict(mask_id=mask_id, gen_length=16, steps=6, block_length=8)  # 3 + 3 + 2 per block
    with torch.inference_mode():
        ours = generate_block(bench_masking.model_fn_of(model), ids, torch.ones_like(ids),
                              variant="invariant", **kw)
        assert torch.equal(bench_masking.reference_llada_generate(model, ids, **kw), ours)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc")
def test_memory_rows_set_the_measured_extra_beside_the_predicted_chunk_term(monkeypatch, capsys):
    """Section 4 from stubbed peaks (in the order it measures them): each masked peak less
    the unmasked one, the predicted 8 B H S chunk bytes, and the slope in float32
    [B, H, 1, S] rows per query row (2 where the extra is two [B, H, chunk, S] blocks)."""
    row = 4 * 16 * 1024 / 2**20  # MiB of a float32 [B, H, 1, S] row at B 1, H 16, S 1024
    peaks = [9.0, 8.0, 8.5]  # unmasked: min 8
    for chunk in (64, 128, 256):
        peaks += [8 + v for v in (2 * row * chunk + 3,) * 3] + [8 + row * chunk + 1] * 3
    monkeypatch.setattr(bench_masking, "peak_extra_mib", lambda fn: peaks.pop(0))
    bench_masking.bench_memory(argparse.Namespace(quick=True))
    out = capsys.readouterr().out
    assert "the unmasked fused SDPA call itself peaks at +8.0 MiB" in out
    assert [line for line in out.splitlines() if line[:3] in ("| 6", "| 1", "| 2")] == [
        "| 64 | 11.0 | 5.0 | 8.0 | 8.0 |", "| 128 | 19.0 | 9.0 | 16.0 | 8.0 |",
        "| 256 | 35.0 | 17.0 | 32.0 | 8.0 |"]
    assert "Slope: (c) 2.00, (d) 1.00 float32 [B, H, 1, S] rows" in out and not peaks


@pytest.mark.parametrize("argv", [["--quick", "--threads", "2"], []])
def test_section_4_runs_in_a_child_with_the_sizes_and_threads_asked_for(monkeypatch, argv):
    """Section 4 measures RSS in a child whose large allocations are all mmap'ed; it gets
    the parent's --quick and --threads."""
    runs = []
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: runs.append(n))
    monkeypatch.setattr("subprocess.run", lambda cmd, env, check: runs.append((cmd[1:], env)))
    bench_masking.main(argv + ["--only", "4", "--no-header"])
    threads = "2" if argv else "1"
    [set_threads, (cmd, env)] = runs
    assert set_threads == int(threads) and env["MALLOC_MMAP_THRESHOLD_"] == "65536"
    assert cmd == [bench_masking.__file__, "--only", "4", "--threads", threads, "--no-header"] + \
        (["--quick"] if argv else [])


def test_section_1_runs_the_checkpoints_eps_and_the_chunk_asked_for(monkeypatch):
    """The shipped checkpoint is trained: section 1 masks with the paper's eps 3 (as its
    note says), at --chunk's query_chunk, 3 repeats under --quick (9 otherwise); tokens/s
    counts the generated tokens (batch 4 x gen_length)."""
    made, timed, tables = [], [], []
    configs = bench_masking.configs
    monkeypatch.setattr(bench_masking, "configs",
                        lambda eps, chunk: made.append((eps, chunk)) or configs(eps, chunk))
    monkeypatch.setattr(bench_masking, "interleaved", lambda run_one, names, repeats, device:
                        timed.append((names, repeats)) or ({n: 1.0 for n in names}, {}))
    monkeypatch.setattr(bench_masking, "table", lambda title, med, tokens, extra, note="":
                        tables.append((tokens, note)))
    bench_masking.main(["--quick", "--only", "1", "--chunk", "64", "--no-header"])
    bench_masking.main(["--only", "1", "--no-header"])
    assert made == [(3.0, 64), (3.0, SinkMaskConfig().query_chunk)]
    assert timed == [(list(bench_masking.VARIANTS), 3), (list(bench_masking.VARIANTS), 9)]
    assert [tokens for tokens, _ in tables] == [4 * 32, 4 * 64]
    assert ", eps 3.0, query_chunk 64;" in tables[0][1]


def test_part_zoo_says_differ_where_a_path_decodes_other_tokens_or_masks_other_keys(
        monkeypatch, capsys):
    """Part zoo's verdicts compare each path's own run with the materialised one: a path
    decoding other tokens reads DIFFER, the others the same; the CPU reads DIFFER where it
    masked another number of keys, even with the same tokens."""
    backends = []
    config = bench_masking.SinkMaskConfig
    monkeypatch.setattr(bench_masking, "SinkMaskConfig", lambda **kw: backends.append(
        kw["detect_backend"]) or config(**kw))

    def generate(fn, ids, mask, gen_length, **kw):
        if backends[-1] == "auto":  # the CPU run: two passes, the second masking keys
            fn(ids, mask), fn(ids, mask)
        return torch.full((len(ids), gen_length), int(backends[-1] == "flex"))

    monkeypatch.setattr(bench_masking, "generate_block", generate)
    bench_masking.same_on_cuda_and_cpu(torch.device("cpu"))
    out = capsys.readouterr().out
    assert "32 tokens x batch 4: CUDA and CPU DIFFER (keys masked: CPU " in out
    assert "keys masked: CPU 0," not in out
    assert "CUDA flex detection vs CUDA materialized: tokens DIFFER" in out
    for name in ("fused", "call", "lse"):
        assert f"CUDA {name} detection vs CUDA materialized: tokens the same" in out
