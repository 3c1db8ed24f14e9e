"""benchmarks/gpu_hours.py (the paper recipe's cost estimate) and results/paper/README.md.

Fast and CPU-only: the arithmetic on stubbed timings, one real smoke measurement on tiny
shapes, and every sweep command of the recipe parsed by the real CLI with each model's
model_args validated against its family's sampler settings.
"""

import argparse
import inspect
import math
import re
import shlex
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import gpu_hours

ROOT = Path(__file__).resolve().parents[1]

RECIPE = ROOT / "results" / "paper" / "README.md"


def test_cell_arithmetic():
    # hours = step_time x steps x ceil(N / batch) / 3600
    assert gpu_hours.dlm_cell_hours(0.05, 256, 1319, 8) == pytest.approx(0.05 * 256 * 165 / 3600)
    assert gpu_hours.dlm_cell_hours(0.02, 512, 164, 1) == pytest.approx(0.02 * 512 * 164 / 3600)
    assert gpu_hours.arm_cell_hours(0.1, 0.025, 256, 1319, 8) == pytest.approx(
        (0.1 + 256 * 0.025) * 165 / 3600)


def test_fit_to_full_depth():
    times = {n: 0.3 + 0.02 * n for n in (2, 4)}  # fixed (embedding, head) + per layer
    assert gpu_hours.at_depth(times, 32) == pytest.approx(0.3 + 0.02 * 32)
    assert gpu_hours.at_depth({1: 0.5}, 32) == pytest.approx(16.0)  # one count: proportional
    # noise larger than the per-layer cost: no line, the deepest count scaled instead
    assert gpu_hours.per_layer_line({2: 0.5, 8: 0.49}) is None
    assert gpu_hours.at_depth({2: 0.5, 8: 0.49}, 32) == pytest.approx(0.49 * 4)
    # no change at all is no per-layer cost either
    assert gpu_hours.at_depth({2: 0.5, 8: 0.5}, 32) == pytest.approx(0.5 * 4)
    # three counts off a line: least squares, through the means (not through the first point)
    assert gpu_hours.per_layer_line({2: 1.0, 4: 2.0, 6: 2.0}) == pytest.approx((2 / 3, 0.25))


@pytest.mark.parametrize("key", ["dream", "llada"])
def test_a_fit_that_finds_no_per_layer_cost_is_reported_not_adopted(key, monkeypatch, capsys):
    """The real measure() on stubbed timings: a step that gets cheaper with more layers is
    scaled from the deepest count and named under "Checks failed", once (LLaDA's timing is
    also MMaDA's rows')."""
    depth = gpu_hours.SHAPES[key].layers
    monkeypatch.setattr(gpu_hours, "build", lambda shape, layers, device, dtype: layers)
    monkeypatch.setattr(gpu_hours, "time_dlm", lambda layers, kind, batch, seq, args, device: (
        {"a": 0.1 + 0.01 * layers, "c": 0.3 - 0.01 * layers}, 5))
    out = gpu_hours.main(["--device", "cpu", "--models", key, "--tasks", "gsm8k_sinkmask",
                          "--batch", "8", "--layers", "2,8"])
    t, = out["timings"]
    assert t["step_a"] == pytest.approx(0.1 + 0.01 * depth)  # a line: extrapolated
    assert t["step_c"] == pytest.approx((0.3 - 0.08) * depth / 8)  # none: the deepest, scaled
    assert out["checks_failed"] == [
        f"{key} gsm8k_sinkmask batch 8: the step top_k=5 found no per-layer cost between "
        "[2, 8] layers (scaled the deepest instead)"]
    text = capsys.readouterr().out
    assert "**Checks failed: do not adopt these numbers**" in text
    assert "- " + out["checks_failed"][0] in text


def test_a_step_cheaper_at_a_larger_batch_fails_the_checks():
    """The H200 run of 2026-11-28 fitted a batch-8 Llama step to a third of the batch-1 one."""
    def row(batch, a, c):
        return {"model": "llama", "task": "gsm8k_sinkmask", "batch": batch, "step_a": a,
                "step_c": c, "fit_notes": []}

    assert gpu_hours.failed_checks([row(1, 0.0273, 0.0597), row(8, 0.0088, 0.0613)]) == [
        "llama gsm8k_sinkmask: the unmasked step at batch 8 (0.0088 s) costs less than at "
        "batch 1 (0.0273 s)"]
    assert gpu_hours.failed_checks([row(1, 0.0273, 0.0597), row(8, 0.0260, 0.0613)]) == []
    # the rows in any batch order (--batch 8,1)
    assert gpu_hours.failed_checks([row(8, 0.0088, 0.0613), row(1, 0.0273, 0.0597)]) == [
        "llama gsm8k_sinkmask: the unmasked step at batch 8 (0.0088 s) costs less than at "
        "batch 1 (0.0273 s)"]
    # and the top_k=5 step is checked too
    assert gpu_hours.failed_checks([row(1, 0.0273, 0.0597), row(8, 0.0280, 0.0200)]) == [
        "llama gsm8k_sinkmask: the top_k=5 step at batch 8 (0.0200 s) costs less than at "
        "batch 1 (0.0597 s)"]


def test_flops_of_the_8b_shapes():
    llada = gpu_hours.SHAPES["llada"]
    # LLaDA-8B: 32 x 218 M + 4096 x 126464 head ~ 7.5 G matmul parameters
    assert llada.layers * llada.params_per_layer() + llada.hidden * llada.vocab == pytest.approx(
        7.497e9, rel=1e-3)
    assert llada.flops_per_forward(1, 1056) == pytest.approx(16.4e12, rel=0.01)


def stub_timer(key, shape, task, batch, prompt, gen, args, device, layer_counts, dtype):
    """Fixed per-step costs instead of a measurement."""
    step = {"llada": 0.04, "dream": 0.03, "llama": 0.02}[key]
    return gpu_hours.Timing(key, task, batch, prompt, gen, step_a=step, step_c=step * 1.5,
                            prefill_a=0.1 if key == "llama" else 0.0,
                            prefill_c=0.2 if key == "llama" else 0.0, keys_masked=7,
                            flops_step=1e12)


def test_hours_from_stubbed_timings(capsys):
    out = gpu_hours.main(["--device", "cpu", "--batch", "1,8"], timer=stub_timer)
    rows = out["rows"]
    # 4 sweep columns (mmada reuses llada's timing) x 2 tasks x 2 batch sizes
    assert sorted({r["model"] for r in rows}) == ["dream", "llada", "llama", "mmada"]
    assert len(rows) == 16
    for r in rows:
        n, steps, b = gpu_hours.PROBLEMS[r["task"]], gpu_hours.GEN_LENGTH[r["task"]], r["batch"]
        assert r["gen"] == steps and r["problems"] == n
        step = {"llada": 0.04, "mmada": 0.04, "dream": 0.03, "llama": 0.02}[r["model"]]
        for k in gpu_hours.KS:
            s = step * (1.5 if k else 1.0)
            if r["model"] == "llama":
                want = ((0.2 if k else 0.1) + steps * s) * math.ceil(n / b) / 3600
            else:
                want = s * steps * math.ceil(n / b) / 3600
            assert r["hours"][k] == pytest.approx(want)
        assert r["cell_total"] == pytest.approx(sum(r["hours"].values()))
        # top_k=5 / unmasked; the stub's 1e12 FLOPs per step in TFLOP/s
        assert r["ratio"] == pytest.approx(1.5) and r["tflops"] == pytest.approx(1 / step)
    assert out["checks_failed"] == []
    # the defaults (the module docstring's), as the JSON records them
    assert out["layers"] == [2, 8] and out["prompt_tokens"] == gpu_hours.PROMPT_TOKENS
    assert out["gen_tokens"] == gpu_hours.GEN_LENGTH
    text = capsys.readouterr().out
    assert "NOT GPU estimates" in text
    assert "layer counts timed 2,8 (fitted to the full depth); 5 interleaved repeats" in text
    assert "Checks: every fit to full depth found a per-layer cost" in text
    # the markdown rows: K=0, one K>0 cell, the four cells
    for r in (rows[0], rows[-1]):
        assert f"| {r['hours'][0]:.2f} | {r['hours'][5]:.2f} | {r['cell_total']:.2f} |" in text
    assert "| llada | gsm8k_sinkmask | 1 | 800+256 | 0.0400 | 0.0600 | 1.50 | 25 |" in text
    assert ("| llama | humaneval_sinkmask | 8 | 140+512 | 0.100 + 512x0.0200 "
            "| 0.200 + 512x0.0300 | 1.50 | 50 |") in text
    sel = [r for r in rows if r["batch"] == 1]
    per_model = ", ".join(f"{m} {sum(r['cell_total'] for r in sel if r['model'] == m):.1f}"
                          for m in ("llada", "mmada", "dream", "llama"))
    assert f"Whole sweep (4 models x 2 tasks x K in {{0, 1, 5, 10}} = 32 cells) at batch 1: " \
           f"**{sum(r['cell_total'] for r in sel):.1f} CPU-h (NOT a GPU estimate)** " \
           f"({per_model})." in text


def test_prompt_token_flags_set_each_tasks_prompt(capsys):
    """--gsm8k-prompt-tokens and --humaneval-prompt-tokens each time their own task's prompt,
    and the report says which length came from where."""
    out = gpu_hours.main(["--device", "cpu", "--models", "dream", "--batch", "1",
                          "--gsm8k-prompt-tokens", "900", "--humaneval-prompt-tokens", "150"],
                         timer=stub_timer)
    assert out["prompt_tokens"] == {"gsm8k_sinkmask": 900, "humaneval_sinkmask": 150}
    assert [(t["task"], t["prompt"]) for t in out["timings"]] == [
        ("gsm8k_sinkmask", 900), ("humaneval_sinkmask", 150)]
    out = gpu_hours.main(["--device", "cpu", "--models", "dream", "--batch", "1",
                          "--gsm8k-prompt-tokens", "900"], timer=stub_timer)
    assert ("# prompt tokens gsm8k_sinkmask 900 (given), humaneval_sinkmask 140 (default: "
            "character count / assumed characters per token)") in capsys.readouterr().out


def test_llama_prefill_and_decoding_step_are_fitted_apart(monkeypatch):
    """The real measure() on stubbed ARM timings: prefill and decoding step, each unmasked and
    masked, fitted to full depth from their own times; the keys masked at the deepest count;
    FLOPs of a step at the decoding's mean key count (prompt + gen / 2)."""
    monkeypatch.setattr(gpu_hours, "build", lambda shape, layers, device, dtype: layers)
    monkeypatch.setattr(gpu_hours, "time_arm", lambda layers, batch, prompt, args, device: (
        {"a": 0.01 * layers, "c": 0.02 * layers}, {"a": 0.001 * layers, "c": 0.003 * layers},
        10 * layers))
    shape = gpu_hours.SHAPES["llama"]
    t = gpu_hours.measure("llama", shape, "gsm8k_sinkmask", 8, 800, 256, None,
                          torch.device("cpu"), [2, 8], torch.float32)
    assert (t.prefill_a, t.prefill_c, t.step_a, t.step_c) == pytest.approx(
        (0.32, 0.64, 0.032, 0.096))
    assert t.keys_masked == 80 and t.fit_notes == []
    assert t.flops_step == shape.flops_per_forward(8, 800 + 128, new=1)


def test_a_step_is_per_forward_pass_and_per_decoding_step(monkeypatch):
    """time_dlm divides a timing of --passes forwards by the passes; time_arm's decoding step
    is (prefill + n steps) less the prefill, over n (generate makes n steps after the
    prefill). Medians stubbed; the warm-up runs are real, on tiny shapes."""
    med = {"a": 0.6, "c": 0.9, "a:0": 0.1, "c:0": 0.2, "a:4": 0.5, "c:4": 1.0}
    monkeypatch.setattr(gpu_hours, "interleaved", lambda run_one, names, repeats, device: (
        {n: med[n] for n in names}, {n: 7 for n in names}))
    args = argparse.Namespace(passes=3, decode_steps=4, repeats=1, chunk=64,
                              detect_backend="auto", candidates=False)
    cpu = torch.device("cpu")
    llada = gpu_hours.build(gpu_hours.QUICK["llada"], 1, cpu, torch.float32)
    step, keys = gpu_hours.time_dlm(llada, "llada", 1, 8, args, cpu)
    assert step == pytest.approx({"a": 0.2, "c": 0.3}) and keys == 7
    llama = gpu_hours.build(gpu_hours.QUICK["llama"], 1, cpu, torch.float32)
    prefill, step, keys = gpu_hours.time_arm(llama, 1, 8, args, cpu)
    assert prefill == pytest.approx({"a": 0.1, "c": 0.2}) and keys == 7
    assert step == pytest.approx({"a": 0.1, "c": 0.2})


def test_cpu_smoke_run(tmp_path, capsys):
    """The real measurement path (models, SinkMasker, fit) on tiny shapes, in seconds."""
    out = gpu_hours.main(["--device", "cpu", "--quick", "--models", "llada,llama",
                          "--tasks", "gsm8k_sinkmask", "--batch", "2",
                          "--json", str(tmp_path / "g.json")])
    assert not out["on_gpu"] and (tmp_path / "g.json").exists()
    assert out["timings"] and out["rows"]
    for t in out["timings"]:
        assert t["step_a"] > 0 and t["step_c"] > 0 and t["keys_masked"] > 0
    for r in out["rows"]:
        assert r["hours"][0] > 0
        if r["model"] != "llama":
            assert r["hours"][5] == pytest.approx(r["step_c"] * r["gen"] * 660 / 3600)
    assert "CPU numbers are NOT GPU estimates" in capsys.readouterr().out


def test_candidates_are_installed_around_the_masked_runs_only(monkeypatch):
    """--candidates: every top_k=5 run inside the candidate's block, no unmasked run."""
    import select_kernel

    from lm_eval_sinkmask.intercept import SinkMasker

    inside, masked = [], []
    for module, name in ((select_kernel, "call_path_installed"),):
        real = getattr(module, name)

        @contextmanager
        def watched(real=real, name=name):
            inside.append(name)
            with real():
                yield
            inside.remove(name)
        monkeypatch.setattr(module, name, watched)
    attach = SinkMasker.attach

    @contextmanager
    def seen(self, model, *a, **kw):
        masked.append(sorted(inside))
        with attach(self, model, *a, **kw) as stats:
            yield stats
    monkeypatch.setattr(SinkMasker, "attach", seen)
    out = gpu_hours.main(["--device", "cpu", "--quick", "--models", "llada,llama",
                          "--tasks", "gsm8k_sinkmask", "--batch", "2", "--candidates"])
    assert out["candidates"] and masked
    assert all(m == ["call_path_installed"] for m in masked), masked
    assert inside == []


def test_graphs_need_cuda_and_time_both_steps_as_replays(monkeypatch, capsys):
    """--graphs: refused without CUDA; on CUDA, the unmasked and masked steps are each captured
    once and replayed. The wiring runs here with the CPU stand-in for capture
    (tests/test_graphed_pass.py) on the accelerator's route."""
    import argparse

    import graphed_pass

    from lm_eval_sinkmask import graphed_steps, intercept
    from tests.recorded_graph import recorded

    with pytest.raises(SystemExit):
        gpu_hours.main(["--device", "cpu", "--quick", "--graphs"])
    assert "--graphs replays CUDA graphs: it needs a CUDA device" in capsys.readouterr().err

    monkeypatch.setattr(graphed_steps, "capture", recorded)
    monkeypatch.setattr(intercept, "_output_from_scores", lambda device: False)
    made, calls = [], []
    real, call = graphed_pass.GraphedForward.__init__, graphed_pass.GraphedForward.__call__
    monkeypatch.setattr(graphed_pass.GraphedForward, "__init__",
                        lambda self, *a, **kw: made.append(a[1]) or real(self, *a, **kw))
    monkeypatch.setattr(graphed_pass.GraphedForward, "__call__",
                        lambda self, **kw: calls.append(self.steps.logits is not None) or call(self, **kw))
    shape = gpu_hours.QUICK["llada"]
    model = gpu_hours.build(shape, 1, torch.device("cpu"), torch.float32)
    args = argparse.Namespace(graphs=True, passes=2, repeats=1, chunk=64, detect_backend="auto",
                              candidates=False)
    med, keys = gpu_hours.time_dlm(model, "llada", 2, 24, args, torch.device("cpu"))
    assert sorted(med) == ["a", "c"] and all(v > 0 for v in med.values())
    assert made[0] is None and made[1].top_k == 5 and len(made) == 2  # captured once each
    # per variant the warm-up calls and the capture, then passes x (variants x repeats + the
    # timing's warm-up run of (a)) replays
    warm = graphed_pass.WARM_UP_PASSES + 1
    assert calls == [False] * warm * 2 + [True] * 2 * (2 * 1 + 1) and keys > 0


# -- the recipe's commands --------------------------------------------------------------------


def recipe_commands():
    """Shell commands of the README's indented code blocks, continuation lines joined."""
    cmds, parts = [], []
    for line in RECIPE.read_text().splitlines():
        if not line.startswith("    "):
            parts = []
            continue
        text = line.strip()
        parts.append(text.rstrip("\\"))
        if not text.endswith("\\"):
            cmds.append(" ".join(parts))
            parts = []
    return [shlex.split(c, comments=True) for c in cmds]


def sweep_argvs():
    out = []
    for argv in recipe_commands():
        if argv[:2] == ["sinkmask", "sweep"]:
            out.append(argv[1:])
        elif argv[:2] == ["accelerate", "launch"]:
            from accelerate.commands.launch import launch_command_parser

            i = argv.index("-m")
            launch = launch_command_parser().parse_args(argv[2:i + 2])
            assert launch.multi_gpu and launch.num_processes == 8 and launch.module
            assert argv[i + 1] == "lm_eval_sinkmask.cli"
            out.append(argv[i + 2:])
    return out


def test_recipe_sweeps_parse_and_validate():
    from lm_eval.utils import simple_parse_args_string

    from lm_eval.models.huggingface import HFLM

    from lm_eval_sinkmask import cli
    from lm_eval_sinkmask.config import SinkMaskConfig
    from lm_eval_sinkmask.families import FAMILIES
    from lm_eval_sinkmask.sampler_settings import DiffusionSettings
    from lm_eval_sinkmask.sweep_plan import Cell, SweepPlan, parse_models

    argvs = sweep_argvs()
    assert len(argvs) == 3  # the main sweep, its accelerate variant, Dream's chat protocol
    assert argvs[0] == argvs[1]  # the multi-GPU command runs exactly the same sweep
    hflm_args = set(inspect.signature(HFLM.__init__).parameters)
    seen = set()
    for argv in argvs:
        a = cli.build_parser().parse_args(argv)
        assert a.func is cli._sweep and a.allow_code_execution
        models = parse_models(a.models, kind_of=lambda p: pytest.fail(f"kind not given: {p}"))
        per = dict(item.split(":", 1) for item in a.model_args_for or [])
        assert set(per) <= {m.name for m in models}
        tasks = a.tasks.split(",")
        for m in models:
            seen.add(m.name)
            m = type(m)(m.name, m.path, m.kind, per.get(m.name, ""))
            plan = SweepPlan(models=[m], tasks=tasks, ks=[int(k) for k in a.top_k.split(",")],
                             out=Path("unused"), model_args_extra=a.model_args_extra)
            for k in plan.ks:
                kwargs = simple_parse_args_string(Cell(plan, m, tasks[0], k).model_args)
                assert kwargs["dtype"] == "bfloat16" and kwargs["top_k"] == k
                mask = SinkMaskConfig.pop_from(kwargs)
                assert mask.top_k == k and mask.eps == 3.0
                if m.kind == "dlm":
                    family = FAMILIES[kwargs.pop("family", m.name)]
                    settings = DiffusionSettings.build(family, DiffusionSettings.pop_from(kwargs))
                    for gen in (256, 512):  # GSM8K, HumanEval: steps = gen_length
                        req = settings.for_request(gen, family)
                        assert req.steps == req.gen_length == gen
                    if family.sampler == "block":
                        assert settings.block_length == 32
                    else:
                        assert settings.alg == "entropy"
                    assert settings.temperature == 0
                    kwargs.pop("model_class", None)
                assert set(kwargs) <= hflm_args, f"{m.name}: unknown model_args {kwargs}"
    assert seen == {"llada", "dream", "mmada", "llama"}


def test_recipe_tasks_exist():
    from lm_eval_sinkmask import cli
    from lm_eval_sinkmask.tasks import TASKS_DIR

    names = {re.search(r"^task: (\S+)", p.read_text(), re.M).group(1)
             for p in Path(TASKS_DIR).glob("*.yaml")}
    for argv in sweep_argvs():
        a = cli.build_parser().parse_args(argv)
        assert set(a.tasks.split(",")) <= names


def test_llada_shapes_are_timed_with_lladas_kernel_switch(monkeypatch):
    """LLaDA-8B's code (and so MMaDA-8B's, the same network) turns the memory-efficient SDPA
    kernel off process-wide when built: its steps are timed in that state, Dream's are not,
    and the switch is as before afterwards."""
    seen = {}

    def fake_time_dlm(model, kind, batch, seq, args, device):
        seen[kind] = torch.backends.cuda.mem_efficient_sdp_enabled()
        return {"a": 1.0, "c": 1.2}, 7

    monkeypatch.setattr(gpu_hours, "build", lambda shape, n, device, dtype: None)
    monkeypatch.setattr(gpu_hours, "time_dlm", fake_time_dlm)
    before = torch.backends.cuda.mem_efficient_sdp_enabled()
    for key in ("llada", "dream"):
        gpu_hours.measure(key, gpu_hours.QUICK[key], "gsm8k_sinkmask", 1, 8, 8, None,
                          torch.device("cpu"), [1], torch.float32)
    assert seen == {"llada": False, "dream": before}
    assert torch.backends.cuda.mem_efficient_sdp_enabled() == before
