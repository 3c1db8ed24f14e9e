"""Cost of sink masking: tokens/s, ratios and extra peak memory of the SDPA intercept.

    python benchmarks/bench_masking.py            # full run, 9 repeats (CPU: 5 to 15 minutes)
    python benchmarks/bench_masking.py --quick    # smaller sizes, fewer repeats
    python benchmarks/bench_masking.py --gpu      # section 3 only: the 8B-shaped bf16 config on CUDA

Variants, timed on the same model and inputs in one run, interleaved round-robin and
repeated, reported as medians (the machine may be shared: only ratios measured in the same
run mean anything):

    (a) no intercept    (b) intercept, top_k=0    (c) top_k=5, detect=previous
    (d) top_k=5, detect=current

Sections:
  1. tiny LLaDA-style model (the zoo checkpoint if trained, else random init of the same
     shape) through the real block sampler ``generate_block``;
  2. a wider random-init LLaDA-shaped model (d_model 1024) on CPU, forward passes at S=1024;
  3. (--gpu) an 8B-shaped LLaDA config (d_model 4096, 32 heads, a few layers, bf16, batch 8,
     S=700) on CUDA, also with the memory-efficient kernel off as LLaDA's own code sets it,
     or a line saying no GPU was available;
  4. extra peak memory of one intercepted attention call at S=1024 against chunk size, with
     the analytical O(batch x heads x S x chunk) term it should match;
  5. our block sampler against a reference implementation of LLaDA's published algorithm:
     same tokens (asserted), time ratio, throughput at batch 1, 4, 8;
  6. torch ops dispatched per attention call, masked against unmasked (a CPU count of what a
     GPU pays in kernel launches: benchmarks/op_counts.py), for the materialised and the
     fused detection path.

Random-init models rarely have a score above eps=3, so they run with eps=0 (every layer then
masks top_k keys, which is the expensive path); a trained zoo checkpoint runs with the
paper's eps=3. The number of keys masked is printed with each row so a "fast" figure can
never come from a run that masked nothing.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import statistics
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lm_eval_sinkmask import compiled_tail, decode_step, fused_mass, sdpa_backends  # noqa: E402
from lm_eval_sinkmask.config import SinkMaskConfig  # noqa: E402
from lm_eval_sinkmask.intercept import SinkMasker  # noqa: E402
from lm_eval_sinkmask.samplers import generate_block  # noqa: E402
from lm_eval_sinkmask.zoo.modeling import TinyLladaConfig, TinyLladaModel  # noqa: E402
from gpu_profile import per_unit, profile_table, profiled, sync  # noqa: E402

MMAP_THRESHOLD = 1 << 16  # bytes; fixed, so glibc never keeps freed large blocks in its heap
CHECKPOINT = ROOT / "lm_eval_sinkmask" / "zoo" / "checkpoints" / "llada"
VARIANTS = ("a", "b", "c", "d")
LABELS = {
    "a": "(a) no intercept",
    "b": "(b) top_k=0",
    "c": "(c) top_k=5 previous",
    "d": "(d) top_k=5 current",
}


# the GPU section also times the detection backends against each other: the fused
# path (default on CUDA) with the compiled selection, the same without compiling it, and the
# candidates, each on the fused path with one part replaced (candidate_of): the one-launch
# selection (c_kernel), the same kernel writing the output mask (c_call, calls of several
# rows), the row log-sum-exp taken from the masked output's (c_lse, calls of several rows),
# the detection kernels with 8 warps (c_w8), the masked pass replayed as one CUDA graph
# (c_graph, beside the unmasked pass graphed the same way, a_graph); in decoding steps the
# one-row calls by parts (c_byparts: the fused path before the package's one-launch decoding
# kernel took them); then the materialised path (the CPU's, and the GPU's before the fused
# path) and the same column mass from two compiled FlexAttention calls (c_flex)
GPU_VARIANTS = ("a", "b", "c", "c_tiles", "c_eager", "c_kernel", "c_call", "c_lse", "c_w8",
                "a_graph", "c_graph", "c_mat", "c_flex", "d")
# captured once per timed shape (graphed_pass.captured), then only replayed: CUDA only
GRAPHED = ("a_graph", "c_graph")
DECODING_VARIANTS = ("a", "c", "c_byparts", "c_eager", "c_kernel", "c_mat", "c_flex")
# timed on an H200 and twice on an H100 (results/gpu_h200.md, gpu_h100.md; the eager
# selection and detect=current within 0.03 of (c) each time), and the candidates c_lse and
# c_w8, timed on an H200 (results/gpu_h200_candidates.md: c_lse's output kernel costs more
# than the row pass it saves except where the one-row mask load removes that cost, and
# c_w8's gain was the spill of that same tile load), and the one-launch selection c_kernel,
# timed on both cards and contained in c_call (LLaDA) and the decoding kernel, each
# faster: left out by default so that a lent GPU's minutes go to the open candidates
# (--gpu-skip '' times them again)
GPU_SKIP = "c_mat,c_flex,c_eager,d,c_lse,c_w8,c_kernel"
GPU_LABELS = dict(LABELS, **{
    "c": "(c) top_k=5 previous, fused",
    "c_eager": "(c) fused, eager selection",
    "c_kernel": "(c) fused, one-launch selection kernel (candidate)",
    "c_byparts": "(c) fused, one-row calls by parts (before the decoding kernel)",
    "c_call": "(c) fused, selection kernel writes the output mask (candidate)",
    "c_lse": "(c) row log-sum-exp from the masked output, first pass on the call path "
             "(candidates)",
    "c_w8": "(c) fused, detection kernels with 8 warps (candidate)",
    "c_tiles": "(c) fused, every mask read as tiles (the kernels before the one-row load)",
    "a_graph": "(a) unmasked, replayed as one CUDA graph",
    "c_graph": "(c) fused, replayed as one CUDA graph (candidate)",
    "c_mat": "(c) materialized",
    "c_flex": "(c) flex (two FlexAttention calls)",
    "d": "(d) top_k=5 current, fused",
})


def gpu_configs(eps: float, chunk: int) -> dict[str, SinkMaskConfig | None]:
    base = configs(eps, chunk)
    # (c) and the variants that differ from it only in code (candidate_of), not in settings
    fused = SinkMaskConfig(top_k=5, eps=eps, query_chunk=chunk, detect_backend="fused")
    return {
        "a": None,
        "a_graph": None,
        "b": base["b"],
        **{n: fused for n in ("c", "c_eager", "c_kernel", "c_byparts", "c_call", "c_lse",
                              "c_w8", "c_tiles", "c_graph")},
        "c_mat": SinkMaskConfig(top_k=5, eps=eps, query_chunk=chunk,
                                detect_backend="materialized"),
        "c_flex": SinkMaskConfig(top_k=5, eps=eps, query_chunk=chunk, detect_backend="flex"),
        "d": SinkMaskConfig(top_k=5, eps=eps, detect="current", query_chunk=chunk,
                            detect_backend="fused"),
    }


@contextmanager
def candidate_of(variant: str):
    """What a variant runs besides the package's defaults on the fused path: the selection
    eager (``c_eager``: compiled_tail.ENABLED off), the one-launch Triton selection
    (``c_kernel``: select_kernel's functions where compiled_tail would hand out its compiled
    ones, i.e. on CUDA; the profile's timing of compiled_tail.selector still wraps them), the
    one-row calls by parts (``c_byparts``: the package's decoding kernel, decode_step, left
    out: detection, selection and output in turn, as before it), the call path (``c_call``:
    select_kernel's, which also writes the output mask, for calls of several rows), the row
    log-sum-exp from the masked output (``c_lse``: lse_reuse's, calls of several rows after
    the first pass; the first pass's, which mask their own choice, on the call path: the two
    as the package would adopt them), the detection kernels launched with 8 warps
    (``c_w8``: :func:`detection_warps`); or the package's kernels reading every mask as
    [BLOCK_M, BLOCK_N] tiles (``c_tiles``: the baseline of their one-row load of a mask that
    is the same for every query row, such as LLaDA's padding bias)."""
    old = compiled_tail.ENABLED, compiled_tail._COMPILED, compiled_tail._COMPILED_FROM_ROWS
    try:
        # the package's own switch (SINKMASK_COMPILE_TAIL) holds, but where a variant sets it
        compiled_tail.ENABLED = variant == "c_kernel" or (old[0] and variant != "c_eager")
        if variant == "c_kernel":
            import select_kernel

            compiled_tail._COMPILED = select_kernel.select_and_count
            compiled_tail._COMPILED_FROM_ROWS = select_kernel.select_and_count_from_rows
        with ExitStack() as stack:
            if variant == "c_byparts":
                stack.enter_context(mock.patch.object(decode_step, "takes",
                                                      lambda *args: False))
            elif variant == "c_lse":
                import lse_reuse

                stack.enter_context(lse_reuse.with_call_path())
            elif variant == "c_w8":
                stack.enter_context(detection_warps(8))
            elif variant == "c_tiles":
                stack.enter_context(mock.patch.object(fused_mass, "mask_has_rows",
                                                      lambda mask, n_q: True))
            if variant == "c_call":
                import select_kernel

                stack.enter_context(select_kernel.call_path_installed())
            yield
    finally:
        compiled_tail.ENABLED, compiled_tail._COMPILED, compiled_tail._COMPILED_FROM_ROWS = old


def detection_warps(n: int):
    """The fused path's two detection kernels launched with ``n`` warps instead of the
    package's 4. Why: compiled for sm_90 at head size 128 in bf16, the row log-sum-exp kernel
    uses 254 registers and spills 40 bytes of stack per thread with 4 warps, none with 8
    (benchmarks/README.md, "Compiled for the GPU without one")."""
    import taken_calls

    class Warps:
        def __init__(self, kernel, _name):
            self.kernel = kernel

        def __getitem__(self, grid):
            launch = self.kernel[grid]
            return lambda *args, **kwargs: launch(*args, **dict(kwargs, num_warps=n))

    return taken_calls.detection_kernels_through(Warps)


def configs(eps: float, chunk: int) -> dict[str, SinkMaskConfig | None]:
    return {
        "a": None,
        "b": SinkMaskConfig(top_k=0, query_chunk=chunk),
        "c": SinkMaskConfig(top_k=5, eps=eps, detect="previous", query_chunk=chunk),
        "d": SinkMaskConfig(top_k=5, eps=eps, detect="current", query_chunk=chunk),
    }


def interleaved(run_one, names, repeats: int, device) -> tuple[dict, dict]:
    """Median seconds per variant, variants interleaved (a b c d, b c d a, ...) each repeat.

    On the CPU the clock is the process's CPU time (``time.process_time``): a shared virtual
    machine's stolen time and other tenants' preemptions do not count, which wall time on
    such a machine scatters by +-10% between identical runs. On CUDA: wall time, synced."""
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    times = {n: [] for n in names}
    extra = {}
    run_one(names[0])  # warm-up (allocations, kernels, lazy imports)
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            sync(device)
            t0 = clock()
            extra[n] = run_one(n)
            sync(device)
            times[n].append(clock() - t0)
    interleaved.last_min = {n: min(t) for n, t in times.items()}
    return {n: statistics.median(t) for n, t in times.items()}, extra


def table(title, med, tokens, extra, note="", labels=LABELS):
    """A section's timings; ``labels``: GPU_LABELS for the GPU sections, whose (c) is the
    fused path, whichever variants were timed."""
    print(f"\n### {title}")
    if note:
        print(note)
    print()
    best = interleaved.last_min
    print("| variant | median s | tokens/s | ratio to (a), medians | ratio to (a), best runs "
          "| keys masked |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for n in med:
        print(f"| {labels[n]} | {med[n]:.3f} | {_per(tokens, med[n], ',.0f')} "
              f"| {_per(med[n], med['a'], '.3f')} | {_per(best[n], best['a'], '.3f')} "
              f"| {extra.get(n, '-')} |")
    sys.stdout.flush()


def _per(x: float, y: float, spec: str) -> str:
    """x / y formatted, or "n/a" where y is 0: a time below the clock's resolution (a
    decoding step's time is a difference of two timings, clamped at 0; the CPU smoke run's
    steps take microseconds)."""
    return format(x / y, spec) if y > 0 else "n/a"


# -- 1. tiny model through the real sampler --------------------------------------------------


def tiny_model():
    if (CHECKPOINT / "config.json").exists():
        from transformers import AutoModel

        import lm_eval_sinkmask.zoo  # noqa: F401  (registers the zoo classes)

        model = AutoModel.from_pretrained(CHECKPOINT).eval()
        return model, f"zoo checkpoint {CHECKPOINT.relative_to(ROOT)}", 3.0
    torch.manual_seed(0)
    cfg = TinyLladaConfig(vocab_size=2048, hidden_size=192, num_hidden_layers=4,
                          num_attention_heads=4, max_position_embeddings=1024, mask_token_id=2047)
    return TinyLladaModel(cfg).eval(), "random-init TinyLladaConfig (hidden 192, 4 layers, 4 heads)", 0.0


def mask_id_of(model):
    mid = getattr(model.config, "mask_token_id", None)
    return mid if mid is not None else model.config.vocab_size - 1


def model_fn_of(model):
    def model_fn(x, mask):  # as dlm_model does for LLaDA: a 2-D mask only when there is padding
        return model(input_ids=x, attention_mask=None if bool(mask.all()) else mask).logits
    return model_fn


def prompts(batch, length, vocab, mask_id, ragged=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, length), generator=g)
    ids = ids.masked_fill(ids == mask_id, 5)  # a prompt holds no mask token (the zoo's is id 3)
    mask = torch.ones(batch, length, dtype=torch.long)
    if ragged:  # left padding of different lengths, as lm-eval batches prompts
        for i in range(batch):
            mask[i, : (i * 7) % (length // 2)] = 0
    return ids, mask


def bench_tiny(args):
    model, what, eps = tiny_model()
    mask_id = mask_id_of(model)
    B, P = 4, 48
    gen, steps, block = (32, 32, 16) if args.quick else (64, 64, 32)
    ids, pmask = prompts(B, P, model.config.vocab_size, mask_id)
    fn = model_fn_of(model)
    cfgs = configs(eps, args.chunk)

    def run_one(n):
        # the invariant sampler, as in every recorded result: a random-init model predicts the
        # mask token, which the reference sampler would leave in place
        kw = dict(mask_id=mask_id, gen_length=gen, steps=steps, block_length=block,
                  variant="invariant")
        with torch.inference_mode():
            if cfgs[n] is None:
                generate_block(fn, ids, pmask, **kw)
                return "-"
            with SinkMasker(cfgs[n]).attach(model) as stats:
                generate_block(fn, ids, pmask, **kw)
            return stats.keys_masked

    med, extra = interleaved(run_one, list(VARIANTS), args.repeats, torch.device("cpu"))
    table(f"1. tiny LLaDA-style model, generate_block (CPU, {torch.get_num_threads()} threads)",
          med, B * gen, extra,
          f"{what}; batch {B}, prompt {P} (ragged left padding), gen_length {gen}, steps {steps}, "
          f"block_length {block}, eps {eps}, query_chunk {args.chunk}; tokens/s = generated tokens / s")
    return med


# -- 2./3. wider LLaDA-shaped model, forward passes -------------------------------------------


def wide_model(hidden, heads, layers, dtype, device, intermediate=None):
    torch.manual_seed(0)
    cfg = TinyLladaConfig(vocab_size=2048, hidden_size=hidden, intermediate_size=intermediate,
                          num_hidden_layers=layers,
                          num_attention_heads=heads, max_position_embeddings=4096,
                          mask_token_id=2047)
    return TinyLladaModel(cfg).to(device=device, dtype=dtype).eval()


def bench_forward(title, model, B, S, passes, args, device, ragged=True, variants=VARIANTS,
                  gpu=False):
    """Forward passes of ``model``, each variant timed; ``gpu``: section 3's variants (the
    fused path named, each warmed up first, GPU labels), whichever of them are timed."""
    ids, mask = prompts(B, S, model.config.vocab_size, 2047, ragged=ragged, seed=1)
    ids, mask = ids.to(device), mask.to(device)
    am = None if bool(mask.all()) else mask
    cfgs = gpu_configs(0.0, args.chunk) if gpu else configs(0.0, args.chunk)
    if device.type != "cuda":
        variants = tuple(n for n in variants if n not in GRAPHED)
    graphs = {}

    def run_one(n):
        # several passes per attach block, as in one denoising run: detect=previous then uses
        # the single sweep (mask last pass's sinks, detect this pass's) after the first pass
        with torch.inference_mode():
            if n in GRAPHED:  # captured at the first run (the warm-up), replayed as steps
                if n not in graphs:
                    import graphed_pass

                    graphs[n] = graphed_pass.captured(model, ids, am, cfgs[n])
                for _ in range(passes):
                    graphs[n](input_ids=ids, attention_mask=am)
                return "-"
            if cfgs[n] is None:
                for _ in range(passes):
                    model(input_ids=ids, attention_mask=am)
                return "-"
            with candidate_of(n), SinkMasker(cfgs[n]).attach(model) as stats:
                for _ in range(passes):
                    model(input_ids=ids, attention_mask=am)
            return stats.keys_masked

    if gpu:  # every variant once first: kernel and torch.compile warm-up
        variants = warm_up(run_one, variants, title)
    med, extra = interleaved(run_one, list(variants), args.repeats, device)
    c = model.config
    table(title, med, B * S * passes, extra,
          f"hidden {c.hidden_size}, MLP {c.intermediate_size}, {c.num_attention_heads} heads, "
          f"{c.num_hidden_layers} layers, "
          f"{next(model.parameters()).dtype}, batch {B}, S {S}, {passes} forward passes per timing, "
          f"eps 0, query_chunk {args.chunk}; tokens/s = B x S x passes / s",
          GPU_LABELS if gpu else LABELS)
    if getattr(args, "gpu_profile", False):
        rows = {n: per_unit(profiled(run_one, n, device), passes) for n in med}
        profile_table(title.removeprefix("3. "), rows, "forward pass", GPU_LABELS)
    return med


def warm_up(run_one, variants, what) -> list:
    """Each variant run once (kernels, torch.compile); a variant that raises (Triton or
    FlexAttention missing, a compile error) is reported and left out, so that the others are
    still timed. (a) failing fails the table."""
    kept = []
    for n in variants:
        try:
            run_one(n)
            kept.append(n)
        except Exception as e:
            if n == "a":
                raise
            print(f"\n**{what}: variant {GPU_LABELS.get(n, n)} FAILED, left out of the table:** "
                  f"{type(e).__name__}: {e}")
            sys.stdout.flush()
    return kept


def run_part(name, fn, *a):
    """One part of section 3; an exception is printed with its traceback and the run goes on
    with the next part, so that one failing part loses no other part's results."""
    try:
        return fn(*a)
    except Exception:
        import traceback

        print(f"\n**section 3, part {name} FAILED** (the other parts go on):\n```")
        traceback.print_exc(file=sys.stdout)
        print("```")
        sys.stdout.flush()
        return None


def bench_gpu(args):
    if args.gpu_smoke_cpu:  # the section's code on the CPU at toy sizes: a test, not a timing
        return bench_gpu_parts(args, torch.device("cpu"), hidden=64, heads=4, S=40, P=24)
    if not torch.cuda.is_available():
        print("\n### 3. 8B-shaped LLaDA config, bf16, batch 8, S 700 (GPU)\n")
        print("No GPU was available in this run (torch.cuda.is_available() is False): "
              "the 8B-shaped ratios were not measured.")
        return None
    return bench_gpu_parts(args, torch.device("cuda"))


def bench_gpu_parts(args, device, hidden=4096, heads=32, S=700, P=800):
    parts = set(args.gpu_parts.split(","))
    from lm_eval_sinkmask import flex_mass, fused_mass

    print(f"\nfused detection: Triton kernels {'available' if fused_mass.triton_runs_on(device) else 'NOT available (torch fallback)'}"
          f"; selection compiled: {compiled_tail.ENABLED}; flex_attention: "
          f"{flex_mass.unavailable_reason() or ('compiled' if device.type == 'cuda' else 'eager')}")
    med = None
    if "mass" in parts:
        run_part("mass", fused_mass_check, device, heads, S)
    if "select" in parts:
        run_part("select", selection_kernel_check, device, heads, S)
    if "decode" in parts:
        run_part("decode", decode_kernel_check, device, hidden, heads, P)
    if "llada" in parts:
        med = bench_llada(args, device, hidden, heads, S)
    if "llada_gap" in parts:
        run_part("llada_gap", bench_llada_gap, args, device, hidden, heads, S)
    if "llada_kernels" in parts:
        with lladas_kernels():
            m = bench_llada(args, device, hidden, heads, S, ", memory-efficient kernel off "
                            "(as LLaDA's code sets it)", memory=False)
        med = med or m
    if "llama" in parts:
        run_part("llama", bench_llama_decoding, args, device, hidden, heads, P)
    if "zoo" in parts:
        run_part("zoo", same_on_cuda_and_cpu, device)
        if device.type == "cuda":
            run_part("zoo cuda_graph", cuda_graph_through_lm_eval, device)
    if compiled_tail.compile_failed():
        print("\n**torch.compile of the selection FAILED in this run** (warning above): every "
              "'compiled selection' row ran the eager selection.")
    return med


@contextmanager
def lladas_kernels():
    """torch's SDPA kernels as LLaDA-8B's and MMaDA's own code leave them: the memory-efficient
    one switched off process-wide when the model is built. A masked call, whose mask the flash
    kernel cannot take, may then run on the math kernel; the stand-ins here do not switch it,
    so timings meant for those checkpoints run inside this (restored afterwards)."""
    with sdpa_backends.kept():
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        yield


def timed(variants, args) -> tuple:
    """``variants`` less those ``--gpu-skip`` names."""
    skip = set(filter(None, getattr(args, "gpu_skip", GPU_SKIP).split(",")))
    return tuple(n for n in variants if n not in skip)


def bench_llada(args, device, hidden, heads, S, condition="", memory=True):
    """Part llada: the 8B-shaped LLaDA config's forward at batch 8 and 1 (and its peak
    memory); returns batch 8's medians."""
    # LLaDA-8B's MLP is 3 x d_model (12288; gpu_hours.SHAPES), not the tiny zoo's 4 x:
    # a wider MLP would make (a) slower and the ratios look better than LLaDA-8B's
    model = run_part("llada", wide_model, hidden, heads, 2 if args.quick else 4,
                     torch.bfloat16, device, 3 * hidden)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (smoke run)"
    med = None
    for B in (8, 1) if model is not None else ():
        m = run_part(f"llada batch {B}", bench_forward,
                     f"3. 8B-shaped LLaDA config on {name}, batch {B}{condition}", model, B, S,
                     4, args, device, True, timed(GPU_VARIANTS, args), True)
        med = med or m
        if device.type == "cuda" and "c_graph" in timed(GPU_VARIANTS, args):
            run_part(f"llada graph check batch {B}", graph_check, model, B, S, args, device)
    if memory and device.type == "cuda" and model is not None:
        run_part("llada peak memory", gpu_peak_memory, model, args)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return med


def graph_check(model, B, S, args, device, capture=None, steps=3) -> list[str]:
    """``c_graph`` against eager masked passes (the package's fused path) on the same canvases:
    the warm-up prompts, then ``steps`` canvases with 5% of their tokens changed each, as
    denoising steps change them. Replayed passes must give the eager passes' logits and each
    layer's chosen keys. ``capture``: graphed_steps.capture, or a CPU stand-in (tests)."""
    import graphed_pass

    ids, mask = prompts(B, S, model.config.vocab_size, 2047, ragged=True, seed=1)
    ids, mask = ids.to(device), mask.to(device)
    am = None if bool(mask.all()) else mask
    g = torch.Generator().manual_seed(2)
    canvases, x = [], ids
    for _ in range(steps):
        x = x.clone()
        changed = torch.randint(0, S, (max(1, S // 20),), generator=g)
        x[:, changed] = torch.randint(5, 2000, (len(changed),), generator=g).to(device)
        canvases.append(x)
    cfg = gpu_configs(0.0, args.chunk)["c_graph"]
    later = [dict(input_ids=x, attention_mask=am) for x in canvases]
    with torch.inference_mode():
        graphed = graphed_pass.captured(model, ids, am, cfg, capture)
        before = graphed.passes_run  # the warm-up and the captured pass, on ``ids``
        replayed = graphed_pass.replays(graphed, later)
        eager = graphed_pass.eager_passes(model, cfg, dict(input_ids=ids, attention_mask=am),
                                          before, later)
    logits = sum(torch.equal(a[0], b[0]) for a, b in zip(eager, replayed))
    keys = sum(all(map(torch.equal, a[1], b[1])) for a, b in zip(eager, replayed))
    diff = max((a[0].float() - b[0].float()).abs().max().item() for a, b in zip(eager, replayed))
    line = (f"graph check, batch {B}: replayed masked passes vs eager ones on {steps} canvases "
            f"(5% of the tokens changed per step): logits equal in {logits}/{steps}, chosen keys "
            f"equal in {keys}/{steps} (largest logit difference {diff:.3g})")
    print("\n" + line)
    return [line]


def bench_llada_gap(args, device, hidden, heads, S):
    """Part llada_gap: the 8B-shaped LLaDA config at batch 8 without padding, at part llada's
    length and at gpu_hours' (prompt 800 + 256 generated, scaled with S), and padded at the
    latter. Part llada (padded, S 700, 4 layers) and gpu_hours' full-depth fit (unpadded,
    S 1056) disagree on (c)/(a) at batch 8; these tables say whether padding or length moves
    it (depth is what gpu_hours' fit takes out)."""
    model = wide_model(hidden, heads, 2 if args.quick else 4, torch.bfloat16, device,
                       3 * hidden)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (smoke run)"
    long = S * 1056 // 700
    for length, padded in ((S, False), (long, False), (long, True)):
        run_part(f"llada_gap S {length}", bench_forward,
                 f"3. 8B-shaped LLaDA config on {name}, batch 8, S {length}, "
                 f"{'padded' if padded else 'no padding'}", model, 8, length, 4, args, device,
                 padded, timed(("a", "c", "c_tiles", "c_lse", "c_w8", "c_mat"), args), True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()


def fused_mass_check(device, H=32, S=700):
    """The Triton kernels, and the two FlexAttention calls, against the torch blocked
    reference on the 8B shapes (bf16, LLaDA's padding bias, GQA causal): the largest
    difference in column mass."""
    from lm_eval_sinkmask import flex_mass, fused_mass

    torch.manual_seed(0)
    B, D = 8, 128
    q = torch.randn(B, H, S, D, device=device, dtype=torch.bfloat16)
    k = torch.randn(B, H, S, D, device=device, dtype=torch.bfloat16)
    bias = torch.zeros(B, 1, 1, S, device=device, dtype=torch.bfloat16)
    bias[1:, ..., :40] = torch.finfo(torch.bfloat16).min
    w = torch.ones(B, S, device=device)
    cases = {"LLaDA bias": dict(mask=bias), "GQA 4:1, causal": dict(is_causal=True)}
    triton = fused_mass.triton_runs_on(device)
    for name, kw in cases.items():
        kk = k[:, : H // 4] if "GQA" in name else k
        got = fused_mass.column_mass(q, kk, w, use_triton=triton, **kw)
        ref = fused_mass.blocked_column_mass(q, kk, w, scale=D ** -0.5, **kw)
        print(f"fused kernels vs torch reference, {name}, B {B} H {H} S {S}: max |mass diff| "
              f"{(got - ref).abs().max().item():.2e} (mass up to {ref.max().item():.1f})")
        flex = flex_mass.flex_column_mass(q, kk, w, **kw)
        print(f"flex (two FlexAttention calls) vs torch reference, {name}: max |mass diff| "
              f"{(flex - ref).abs().max().item():.2e}")
        if name == "LLaDA bias":
            lse_reuse_check(q, k, w, bias, ref)
    sys.stdout.flush()


def lse_reuse_check(q, k, w, bias, ref):
    """The log-sum-exp reuse candidate's column mass (the output's log-sum-exp from the
    memory-efficient kernel with 5 keys per head hidden, then the fix) against the torch
    reference ``ref`` of the unmasked attention, on the 8B shapes: where the CPU cannot
    check it, that the CUDA kernel's log-sum-exp is laid out and scaled as assumed."""
    from lm_eval_sinkmask import fused_mass

    device = q.device
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        print("log-sum-exp reuse (c_lse) vs torch reference: not checked on the CPU (the "
              "kernels run on CUDA, or in Triton's interpreter: tests/test_lse_reuse.py)")
        return
    import lse_reuse

    B, H, S, _ = q.shape
    g = torch.Generator(device=device).manual_seed(1)
    previous = torch.zeros(B, H, S, dtype=torch.bool, device=device)
    previous.scatter_(-1, torch.randint(40, S, (B, H, 5), device=device, generator=g), True)
    output_mask, hidden = lse_reuse.prepared(previous, bias, B, H, S, q.dtype, 5)
    _, lse = lse_reuse.output_with_lse(q, k, k, output_mask, None)
    with lse_reuse._row_lse_from(lse, hidden):
        got = fused_mass.column_mass(q, k, w, mask=bias, use_triton=True)
    print(f"log-sum-exp reuse (c_lse) vs torch reference, LLaDA bias, "
          f"{int((hidden >= 0).sum())} keys hidden: max |mass diff| "
          f"{(got - ref).abs().max().item():.2e}")


def selection_kernel_check(device, H=32, S=700):
    """The one-launch selection candidate against the package's eager selection on the 8B
    shapes (masses of softmaxed random scores with planted sinks; padding; granularity head
    and layer; the last_row and all_rows key counts): the same sinks and chosen keys, to the
    key. It is timed as variant c_kernel only where this holds."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        print("selection kernel vs eager: not checked on the CPU (the kernel runs on CUDA, or "
              "in Triton's interpreter: tests/test_select_kernel.py)")
        return
    import select_kernel
    from lm_eval_sinkmask.metric import key_counts

    g = torch.Generator(device=device).manual_seed(0)
    B, n_q = 8, S
    for what, q_rows, causal in (("bidirectional, padded", n_q, False),
                                 ("causal rows (all_rows)", n_q, True),
                                 ("one row (last_row)", 1, False)):
        logits = torch.randn(B, H, q_rows, S, device=device, generator=g)
        logits[..., torch.randint(0, S, (6,), device=device, generator=g)] += 5.0
        key_valid = torch.ones(B, S, dtype=torch.bool, device=device)
        key_valid[1:, :40] = False
        visible = key_valid[:, None, None, :].expand(B, 1, q_rows, S)
        if causal:
            visible = visible & torch.ones(q_rows, S, dtype=torch.bool, device=device).tril()
        attn = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0)
        mass = attn.sum(dim=-2)
        rows = visible.sum(dim=-2).float()
        for per_layer in (False, True):
            counts = key_counts(rows, key_valid, per_layer=per_layer, dtype=mass.dtype)
            ref = compiled_tail.select_and_count(mass, counts, eps=3.0, k=5, per_layer=per_layer)
            got = select_kernel.select_and_count(mass, counts, eps=3.0, k=5, per_layer=per_layer)
            same = all(torch.equal(a, b) for a, b in zip(got[1:3], ref[1:3]))
            print(f"selection kernel vs eager, {what}, granularity "
                  f"{'layer' if per_layer else 'head'}, B {B} H {H} S {S}: "
                  f"{'same' if same else '**DIFFERENT**'} sinks and chosen keys "
                  f"({int(ref[3])} sinks, {int(ref[4])} chosen; kernel {int(got[3])}, "
                  f"{int(got[4])}); max |score diff| {(got[0] - ref[0]).abs().max().item():.1e}")
    sys.stdout.flush()


def decode_kernel_check(device, hidden=4096, heads=32, P=800):
    """The package's one-launch decoding kernel (decode_step) against the one-row calls by
    parts (the fused path before it), through transformers' generate: on the zoo's ARM
    checkpoint (float32) and on a 2-layer 8B-shaped Llama (bf16, random weights),
    left-padded prompts, both ARM rules. Call by call the same keys masked, and the same
    tokens.
    (bf16 outputs may differ in their last bit, so a random model's near-tied tokens can
    differ there; the calls are then compared up to the first differing token. The same
    Llama in float32 follows: where bf16 differs and float32 does not, the difference is
    bf16's rounding breaking near-ties, not the kernel choosing other keys.)"""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        print("decoding kernel vs by parts: not checked on the CPU (the kernel runs on CUDA, "
              "or in Triton's interpreter: tests/test_decode_kernel.py)")
        return
    from transformers import AutoModelForCausalLM

    from lm_eval_sinkmask.zoo import checkpoint_path

    zoo_arm = AutoModelForCausalLM.from_pretrained(checkpoint_path("arm"),
                                                  attn_implementation="sdpa").to(device).eval()
    for what, model, length in (("zoo arm checkpoint, float32", zoo_arm, 40),
                                (f"8B-shaped Llama, 2 layers, bf16, prompt {P}",
                                 llama_model(2, device, hidden, heads), P),
                                (f"the same Llama in float32, prompt {P}",
                                 llama_model(2, device, hidden, heads, torch.float32), P)):
        vocab = min(model.config.vocab_size, 2000)
        ids = torch.randint(5, vocab, (4, length), generator=torch.Generator().manual_seed(2))
        mask = torch.ones_like(ids)
        mask[1, :length // 4] = 0
        mask[3, :3] = 0
        ids, mask = ids.to(device), mask.to(device)
        for rule in ("last_row", "all_rows"):
            runs = {}
            for variant in ("c_byparts", "c"):
                calls = []
                cfg = SinkMaskConfig(top_k=5, eps=0.0, detect_backend="fused")
                with torch.inference_mode(), candidate_of(variant), SinkMasker(
                        cfg, rule=rule, observers=[lambda e: calls.append(
                            (e.blocked.cpu(), e.scores.float().cpu(), e.chosen.cpu()))]
                ).attach(model) as stats:
                    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=16,
                                         do_sample=False, use_cache=True, eos_token_id=None,
                                         pad_token_id=0)
                runs[variant] = (out[:, length:].cpu(), calls, stats)
            (ref, ref_calls, ref_stats), (got, got_calls, got_stats) = runs["c_byparts"], runs["c"]
            steps = ref.shape[1]  # one forward pass per new token
            n = int((ref == got).all(dim=0).long().cumprod(0).sum())  # leading steps alike
            layers = len(ref_calls) // steps  # calls per forward pass
            # the pass that made the first differing token still saw the same inputs
            upto = min(layers * (n + 1), len(ref_calls))
            differs = [i for i, (a, b) in enumerate(zip(got_calls[:upto], ref_calls[:upto]))
                       if not torch.equal(a[0].expand_as(b[0]), b[0])]
            keys = (f"the same in the first {upto} calls" if not differs else
                    f"**DIFFERENT** from call {differs[0]} (pass {differs[0] // layers}, layer "
                    f"{differs[0] % layers}) on, {len(differs)} of the first {upto} calls")
            tokens = ("the same" if n == steps
                      else f"the same for {n} steps, then **DIFFERENT**")
            if differs or n < steps:
                keys += "; " + choice_margin([c[1:] for c in ref_calls[:upto]],
                                             [c[1:] for c in got_calls[:upto]], cfg.top_k)
            taken = got_stats.detection.get(decode_step.NAME, 0)
            print(f"decoding kernel vs by parts, {what}, arm_rule={rule}, batch 4 (two rows "
                  f"left-padded), 16 tokens: tokens {tokens}; masked keys {keys}; kernel took "
                  f"{taken} of {len(got_calls)} calls; keys masked {got_stats.keys_masked} vs "
                  f"{ref_stats.keys_masked}")
    sys.stdout.flush()


def choice_margin(a, b, top_k: int) -> str:
    """Why two runs' choices first differ, from their calls' (Eq. 3 scores, chosen) pairs: at
    the first call where the chosen keys differ, where each key that one run chose stands in
    the other run's score order (its rank among the visible keys, and how far below the k-th
    score it lies), beside the largest score difference between the runs on that call. Ranks
    just past top_k and gaps within the score difference are ties broken the other way; a
    distant rank is an error."""
    for i, ((sa, ca), (sb, cb)) in enumerate(zip(a, b)):
        if torch.equal(ca, cb):
            continue
        worst_rank, worst_gap = 0, 0.0
        for scores, mine, theirs in ((sa, ca, cb), (sb, cb, ca)):
            order = scores.argsort(dim=-1, descending=True).argsort(dim=-1) + 1  # 1 = first
            kth = scores.sort(dim=-1, descending=True).values[..., top_k - 1:top_k]
            only = theirs & ~mine  # chosen by the other run alone
            if not only.any():
                continue
            worst_rank = max(worst_rank, int(order[only].max()))
            worst_gap = max(worst_gap, float((kth.expand_as(scores) - scores)[only].max()))
        diff = float((sa - sb).abs().max())
        return (f"first differing choice at call {i}: the keys one run alone chose rank at "
                f"most {worst_rank} in the other's scores, at most {worst_gap:.2g} below its "
                f"top_k-th (largest score difference between the runs there {diff:.2g})")
    return "the chosen keys never differ"


def gpu_peak_memory(model, args):
    """Extra peak memory of one masked pass over an unmasked one, per variant."""
    device = torch.device("cuda")
    ids = torch.randint(5, 2000, (8, 700), device=device)
    peaks = {}
    cfgs = gpu_configs(0.0, args.chunk)
    for n in (n for n in timed(GPU_VARIANTS, args) if n not in GRAPHED):  # their (a), (c)'s
        cfg = cfgs[n]
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        with torch.inference_mode():
            if cfg is None:
                model(input_ids=ids)
                model(input_ids=ids)
            else:
                with candidate_of(n), SinkMasker(cfg).attach(model):
                    model(input_ids=ids)
                    model(input_ids=ids)
        torch.cuda.synchronize()
        peaks[n] = torch.cuda.max_memory_allocated()
    print("\nGPU peak memory, batch 8 (torch.cuda.max_memory_allocated, two passes): " + ", ".join(
        f"{GPU_LABELS[n]} {peaks[n] / 2**20:,.0f} MiB (+{(peaks[n] - peaks['a']) / 2**20:,.0f})"
        for n in peaks))


def llama_model(layers, device, hidden=4096, heads=32, dtype=torch.bfloat16):
    """Llama-3.1-8B's attention and MLP shapes (d_model 4096, 32 heads, 8 KV heads, MLP
    14336), a small vocabulary (the LM head is not what is measured), random weights in
    ``dtype`` (the same draw whatever the dtype: bf16's are float32's rounded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=2048, hidden_size=hidden, intermediate_size=hidden * 7 // 2,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=heads // 4, max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    return model.to(dtype=dtype).eval()


def generate_cached(model, ids, decode: int):
    """Greedy prefill of ``ids``, then ``decode`` one-token steps with the KV cache, through
    transformers' ``generate`` called as lm-eval's HFLM calls it (greedy, ``use_cache``, an
    attention mask, a pad id).

    Why ``generate`` and not a hand loop: what an evaluation pays per step is generate's step,
    which also processes the logits and, after every step, asks its stopping criteria whether
    every row has finished (a host sync; lm-eval's stop sequences add a decode of the new
    tokens). A hand loop that never syncs times a step no evaluation runs: its unmasked
    baseline queues kernels ahead of the GPU, so any host wait on the masked side shows in
    full in a launch-bound ratio. Both variants run this same function.
    EOS is off (``eos_token_id=None``) so that every row runs all ``decode`` steps: random
    weights would otherwise stop at an arbitrary step. One forward pass per new token, the
    first of them the prefill: ``decode + 1`` new tokens.
    """
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=decode + 1,
                   do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0)


def bench_llama_decoding(args, device, hidden=4096, heads=32, P=800):
    """Per decoding step with the KV cache (prefill 800 tokens, then one-row steps, through
    transformers' generate: :func:`generate_cached`), the ARM rules last_row and all_rows:
    (c) time of prefill + steps minus the prefill, per step."""
    layers = 2 if args.quick else 4
    model = llama_model(layers, device, hidden, heads)
    steps = 16
    variants = timed(DECODING_VARIANTS, args)
    for rule in ("last_row", "all_rows"):
        for B in (1, 8):
            ids = torch.randint(5, 2000, (B, P), generator=torch.Generator().manual_seed(1))
            ids = ids.to(device)
            cfgs = {n: c for n, c in gpu_configs(0.0, args.chunk).items() if n in variants}

            def runner(decode):
                def run_one(n):
                    with torch.inference_mode():
                        if cfgs[n] is None:
                            generate_cached(model, ids, decode)
                            return "-"
                        with candidate_of(n), \
                                SinkMasker(cfgs[n], rule=rule).attach(model) as stats:
                            generate_cached(model, ids, decode)
                        return stats.keys_masked
                return run_one

            # warm-up of every variant (kernels, torch.compile) over the same key counts as the
            # timed runs: Triton specialises its kernels on sizes divisible by 16 (P + 16 keys)
            run = warm_up(runner(steps), variants, f"Llama {rule}, batch {B}")
            prefill, _ = interleaved(runner(0), run, args.repeats, device)
            best_prefill = interleaved.last_min
            both, extra = interleaved(runner(steps), run, args.repeats, device)
            best_both = interleaved.last_min
            step = {n: max(both[n] - prefill[n], 0.0) / steps for n in run}
            interleaved.last_min = {n: max(best_both[n] - best_prefill[n], 0.0) / steps
                                    for n in run}
            table(f"3b. Llama-shaped decoding step with a KV cache, arm_rule={rule}, batch {B}",
                  step, B, extra,
                  f"d_model {hidden}, {heads} heads, {heads // 4} KV heads, MLP {hidden * 7 // 2}, "
                  f"vocab 2048, {layers} layers, "
                  f"bf16; prompt {P}, {steps} decoding steps per timing, through transformers' "
                  f"generate as lm-eval runs it (a host sync per step, in every variant); "
                  f"s = (prefill + steps - prefill) / steps; tokens/s = B / s per step; keys "
                  f"masked over prefill + steps", GPU_LABELS)
            if args.gpu_profile:
                rows = {}
                for n in run:
                    both, alone = profiled(runner(steps), n, device), profiled(runner(0), n, device)
                    rows[n] = per_unit(both, steps, minus=alone)
                profile_table(f"Llama decoding, arm_rule={rule}, batch {B}", rows,
                              "decoding step (prefill + steps - prefill) / steps", GPU_LABELS)


def same_on_cuda_and_cpu(device=torch.device("cuda")):
    """The zoo checkpoint decoded on the CPU (materialised path, output from its own scores),
    on CUDA with the materialised path (fused SDPA output), and on CUDA with the fused and
    flex detection paths and the candidates for a DLM's calls (variants c_call and c_lse):
    the tokens, the number of masked keys and, call by call, the masked keys themselves must
    agree."""
    model, what, eps = tiny_model()
    mask_id = mask_id_of(model)
    ids, pmask = prompts(4, 40, model.config.vocab_size, mask_id)
    runs = {}
    accel = device.type  # "cpu" only in the smoke run
    candidate = {"call": "c_call", "lse": "c_lse"}
    for dev, backend in (("cpu", "auto"), (accel, "materialized"), (accel, "fused"),
                         (accel, "flex"), *((accel, name) for name in candidate)):
        model = model.to(dev)
        blocked = []
        cfg = SinkMaskConfig(top_k=5, eps=eps,
                             detect_backend="fused" if backend in candidate else backend)
        try:
            masker = SinkMasker(cfg, observers=[lambda e: blocked.append(e.blocked.cpu())])
            with torch.inference_mode(), \
                    candidate_of(candidate.get(backend, "c")), \
                    masker.attach(model) as stats:
                tokens = generate_block(model_fn_of(model), ids.to(dev), pmask.to(dev),
                                        mask_id=mask_id, gen_length=32, steps=32,
                                        block_length=16, variant="invariant")
        except Exception as e:  # fused or flex failing must not hide the other's comparison
            if backend in ("auto", "materialized"):
                raise
            print(f"\n**CUDA {backend} detection FAILED on the zoo checkpoint:** "
                  f"{type(e).__name__}: {e}")
            continue
        runs[(dev, backend)] = (tokens.cpu(), stats.keys_masked, blocked)
    cpu, mat = runs[("cpu", "auto")], runs[(accel, "materialized")]
    same = torch.equal(cpu[0], mat[0]) and cpu[1] == mat[1]
    print(f"\n{what}, top_k 5, detect=previous, 32 tokens x batch 4: CUDA and CPU "
          f"{'decode the same tokens' if same else 'DIFFER'} (keys masked: CPU "
          f"{cpu[1]}, CUDA {mat[1]})")
    for name in ("fused", "flex", *candidate):
        if (accel, name) not in runs:
            continue
        other = runs[(accel, name)]
        calls_same = len(other[2]) == len(mat[2]) and all(
            torch.equal(a, b) for a, b in zip(other[2], mat[2]))
        tokens_same = torch.equal(other[0], mat[0])
        print(f"CUDA {name} detection vs CUDA materialized: tokens "
              f"{'the same' if tokens_same else 'DIFFER'}, masked keys "
              f"{'the same in every one of the ' + str(len(mat[2])) + ' calls' if calls_same else 'DIFFER'}"
              f" (keys masked: {name} {other[1]}, materialized {mat[1]})")
    if accel == "cuda":
        run_part("zoo graph", graphed_generation_check, model, ids, pmask, mask_id, eps,
                 mat, runs.get((accel, "fused")))
    sys.stdout.flush()


def graphed_generation_check(model, ids, pmask, mask_id, eps, materialized, fused, capture=None):
    """c_graph through the sampler, as a sampler would use it (its first steps eager, then
    one capture, then replays): the tokens and the number of keys masked of the eager paths,
    ``materialized`` and ``fused`` (tokens, keys masked; None: not run). Replays run no
    Python, so there are no keys to compare call by call; their counts are the graph's."""
    import graphed_pass

    device = next(model.parameters()).device
    cfg = SinkMaskConfig(top_k=5, eps=eps, detect_backend="fused")
    with torch.inference_mode(), graphed_pass.GraphedForward(model, cfg, capture) as forward:
        tokens = generate_block(
            lambda x, mask: forward(input_ids=x,
                                    attention_mask=None if bool(mask.all()) else mask),
            ids.to(device), pmask.to(device), mask_id=mask_id, gen_length=32, steps=32,
            block_length=16, variant="invariant").cpu()
    keys = forward.stats.keys_masked

    def verdict(other):
        if other is None:
            return "not run"
        same = torch.equal(tokens, other[0]) and keys == other[1]
        return f"{'the same' if same else 'DIFFER'} (keys masked {other[1]})"

    line = (f"CUDA graph (c_graph, {forward.passes_run} passes, {graphed_pass.WARM_UP_PASSES} "
            f"eager, then one capture; keys masked {keys}) vs CUDA materialized: tokens and "
            f"keys masked {verdict(materialized)}; vs CUDA fused: {verdict(fused)}")
    print(line)
    return line


GRAPH_PROMPTS = ("Question: Tom has 3 apples and buys 4 more. How many apples does Tom have?\n"
                 "Answer:", "Question: 7 + 5 = ?\nAnswer:",
                 "Question: Anna has 12 books. She gives 4 away.\nAnswer:",
                 "Question: A box holds 6 eggs. How many eggs are in 3 boxes?\nAnswer:")


def cuda_graph_through_lm_eval(device, models=("llada", "dream", "llada_sink")) -> list[str]:
    """The package's ``cuda_graph=true`` as a user runs it: ``dlm_sinkmask`` on each zoo
    checkpoint, top_k 5, the four prompts in one batch, with and without it. The texts and
    the whole counters record (passes, calls, sinks and keys masked per layer, detection
    paths) must be the same."""
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    requests = [Instance("generate_until", {}, (p, {"until": ["Question:"], "max_gen_toks": 32}), i)
                for i, p in enumerate(GRAPH_PROMPTS)]
    lines = []
    for name in models:
        runs = []
        for graphed in (False, True):
            lm = get_model("dlm_sinkmask").create_from_arg_string(
                f"pretrained=zoo:{name},top_k=5,device={device},batch_size={len(requests)},"
                f"cuda_graph={str(graphed).lower()}")
            texts = lm.generate_until(requests)
            runs.append((texts, lm.get_model_info()["sinkmask"]["counters"]))
        (texts, counters), (g_texts, g_counters) = runs
        same = sum(a == b for a, b in zip(texts, g_texts))
        line = (f"cuda_graph=true through lm-eval, zoo:{name}, top_k 5, batch {len(requests)}, "
                f"{counters['forward_passes']} steps: texts the same in {same}/{len(texts)}, "
                f"counters {'the same' if g_counters == counters else 'DIFFER'} (keys masked "
                f"{counters['keys_masked']} eager, {g_counters['keys_masked']} graphed)")
        print(line)
        lines.append(line)
    sys.stdout.flush()
    return lines


# -- 4. memory ------------------------------------------------------------------------------


def _status_kib(field):
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def _reset_peak():
    Path("/proc/self/clear_refs").write_text("5")  # Linux: resets VmHWM to the current RSS


def peak_extra_mib(fn) -> float:
    """Peak resident memory of fn() above the resident memory before it, in MiB (VmHWM reset
    through /proc/self/clear_refs, so it sees every tensor torch's CPU allocator touches)."""
    gc.collect()
    _reset_peak()
    before = _status_kib("VmRSS")
    out = fn()
    peak = _status_kib("VmHWM")
    del out
    return (peak - before) / 1024


def bench_memory(args):
    if not Path("/proc/self/clear_refs").exists():
        print("\n### 4. memory: /proc/self/clear_refs not available, skipped")
        return
    B, H, S, D = 1, 16, 1024, 64
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    bias = torch.zeros(B, 1, 1, S)
    bias[..., :37] = torch.finfo(torch.float32).min  # padded keys, LLaDA's additive form

    class Attn(torch.nn.Module):
        def forward(self):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    attn = Attn()

    def unmasked():
        with torch.inference_mode():
            return attn()

    def masked(cfg, passes):
        def run():
            with torch.inference_mode(), SinkMasker(cfg).attach(attn):
                for _ in range(passes):
                    out = attn()
            return out
        return run

    reps = 3
    base = min(peak_extra_mib(unmasked) for _ in range(reps))
    print(f"\n### 4. extra peak memory of one attention call, B {B}, H {H}, S {S}, D {D} (CPU)\n")
    print("Measured: peak RSS during the call minus RSS before it (VmHWM after resetting it via "
          "/proc/self/clear_refs), min of "
          f"{reps}; the unmasked fused SDPA call itself peaks at +{base:.1f} MiB (its output). "
          "Intercept extra = masked peak - unmasked peak. Predicted chunk term: two float32 "
          "[B, H, chunk, S] blocks, the scores and their softmax (alive together for the "
          "length of one softmax call) = 8 B H S chunk bytes; the rest is O(B H S D): scaled "
          "q copy and float32 output.\n")
    print("| query_chunk | (c) previous, 2 passes: extra MiB | (d) current: extra MiB | "
          "8·B·H·S·chunk MiB | O(BHSD) terms MiB |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    chunks = (64, 128, 256) if args.quick else (64, 128, 256, 512, 1024)
    rows = []
    for c in chunks:
        prev = min(peak_extra_mib(masked(SinkMaskConfig(top_k=5, eps=0.0, query_chunk=c), 2))
                   for _ in range(reps)) - base
        cur = min(peak_extra_mib(masked(SinkMaskConfig(top_k=5, eps=0.0, detect="current",
                                                       query_chunk=c), 1))
                  for _ in range(reps)) - base
        pred = 8 * B * H * S * c / 2**20
        rows.append((c, prev, cur, pred))
        print(f"| {c} | {prev:.1f} | {cur:.1f} | {pred:.1f} | {2 * 4 * B * H * S * D / 2**20:.1f} |")
    if len(rows) >= 2:
        (c0, p0, d0, _), (c1, p1, d1, _) = rows[0], rows[-1]
        per = 4 * B * H * S / 2**20
        print(f"\nSlope: (c) {(p1 - p0) / (c1 - c0) / per:.2f}, (d) {(d1 - d0) / (c1 - c0) / per:.2f} "
              "float32 [B, H, 1, S] rows alive per query row of chunk (2 = scores and softmax). "
              "The unmasked model's own attention allocates none of this: the extra memory is "
              "linear in chunk, i.e. O(batch x heads x S x chunk), not O(S^2) per layer.")
    sys.stdout.flush()


# -- 5. sampler against the reference algorithm -------------------------------------------


@torch.no_grad()
def reference_llada_generate(model, prompt, *, steps, gen_length, block_length, mask_id,
                             temperature=0.0):
    """LLaDA's published sampler (Nie et al. 2025, Alg. / App. B), written from its
    description: the answer starts as gen_length mask tokens, decoded in semi-autoregressive
    blocks; each block gets steps/num_blocks forward passes; at each the model predicts every
    masked token and, per row, the top-k most confident predictions inside the current block
    are kept (low-confidence remasking), k spread evenly over the block's steps with the
    remainder first. Greedy (temperature 0). Like our sampler's invariant variant (the one
    timed here), the mask token itself is never accepted as a prediction and confidences are
    float32. Equal-length prompts (no padding)."""
    B, P = prompt.shape
    x = torch.full((B, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks
    for nb in range(num_blocks):
        start, end = P + nb * block_length, P + (nb + 1) * block_length
        n_masked = (x[:, start:end] == mask_id).sum(dim=1, keepdim=True)
        base, rem = n_masked // steps_per_block, n_masked % steps_per_block
        num_transfer = base.repeat(1, steps_per_block)
        for i in range(steps_per_block):
            num_transfer[:, i] += (i < rem[:, 0]).long()
        for i in range(steps_per_block):
            mask_index = x == mask_id
            logits = model(x).logits
            logits[..., mask_id] = -torch.inf
            x0 = logits.argmax(dim=-1)
            p = F.softmax(logits.float(), dim=-1)
            x0_p = torch.gather(p, -1, x0[..., None])[..., 0]
            x0_p[:, end:] = -torch.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(-torch.inf))
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(B):
                _, select = torch.topk(confidence[j], k=int(num_transfer[j, i]))
                transfer[j, select] = True
            x[transfer] = x0[transfer]
    return x[:, P:]


def bench_sampler(args):
    model, what, _ = tiny_model()
    mask_id = mask_id_of(model)
    gen, steps, block = (32, 32, 16) if args.quick else (64, 64, 32)
    P = 40
    fn = model_fn_of(model)
    print(f"\n### 5. block sampler vs reference LLaDA algorithm ({what}, CPU)\n")
    print(f"gen_length {gen}, steps {steps}, block_length {block}, prompt {P}, greedy; "
          "tokens/s = generated tokens / s; same tokens asserted at every batch size.\n")
    print("| batch | ours s | reference s | ours / reference, medians | ours / reference, best runs "
          "| ours tokens/s | reference tokens/s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    out = {}
    for B in (1, 4, 8):
        ids, _ = prompts(B, P, model.config.vocab_size, mask_id, ragged=False, seed=2)
        ones = torch.ones_like(ids)
        kw = dict(mask_id=mask_id, gen_length=gen, steps=steps, block_length=block)
        ours = generate_block(fn, ids, ones, variant="invariant", **kw)
        ref = reference_llada_generate(model, ids, **kw)
        assert torch.equal(ours, ref), f"batch {B}: our sampler and the reference disagree"

        def run_one(n):
            with torch.inference_mode():
                if n == "ours":
                    generate_block(fn, ids, ones, variant="invariant", **kw)
                else:
                    reference_llada_generate(model, ids, **kw)

        med, _ = interleaved(run_one, ["ours", "ref"], args.repeats, torch.device("cpu"))
        out[B] = med
        best = interleaved.last_min
        print(f"| {B} | {med['ours']:.3f} | {med['ref']:.3f} | {med['ours'] / med['ref']:.3f} "
              f"| {best['ours'] / best['ref']:.3f} "
              f"| {B * gen / med['ours']:,.0f} | {B * gen / med['ref']:,.0f} |")
        sys.stdout.flush()
    return out


def bench_op_counts(args):
    import op_counts

    print("\n### 6. torch ops per attention call, masked against unmasked (CPU count)\n")
    print("Aten ops dispatched, views and allocations left out (each a kernel launch on "
          "CUDA; the fused path's two "
          "Triton launches included); tiny models, top_k 5, detect=previous, eps 0, a steady "
          "call (a layer after the first, a pass after the first). 'after the call': what the "
          "model does differently with the masked output, per layer. 'extra per layer': "
          "masked - unmasked + after the call. 'selection': of the masked call, the Eq. 3 "
          "selection, which CUDA runs compiled (a few fused kernels). 'per pass': ops made "
          "once per forward pass whatever its depth (fitted from 2 and 3 layers).\n")
    print("| call | path | unmasked call | masked call | after the call | extra per layer "
          "| of which selection | per pass |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for scenario in op_counts.SCENARIOS:
        for path in op_counts.paths(scenario):
            c = op_counts.compare(scenario, path)
            print(f"| {scenario} | {path} | {c.unmasked_call} | {c.masked_call} "
                  f"| {c.outside_per_layer} | {c.extra_per_call} | {c.selection} "
                  f"| {c.per_pass_fixed} |")
    sys.stdout.flush()
    print("\nThe host's time per layer of the same passes (process time, one thread, median of "
          f"{args.repeats} interleaved runs of 20 passes or decoding steps): at these sizes "
          "the arithmetic is negligible, so it is what the host spends per call, which a GPU "
          "at batch 1 or in a decoding step waits on. The fused path as on CUDA (its Triton "
          "launches stubbed), the selection eager; one-row calls (llama decode) in the decoding "
          "kernel, byparts: by parts as before it; call: the call path (select_kernel.py), lse: the row "
          "log-sum-exp from the masked output (lse_reuse.py), their launches stubbed.\n")
    print("| call | path | unmasked us | masked us | added us | ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for scenario in op_counts.SCENARIOS:
        for path in op_counts.paths(scenario):
            t = op_counts.host_time(scenario, path, repeats=args.repeats)
            print(f"| {scenario} | {path} | {t.unmasked:,.0f} | {t.masked:,.0f} "
                  f"| {t.added:,.0f} | {t.masked / t.unmasked:.2f} |")
            sys.stdout.flush()


def header(args):
    print(f"# bench_masking: torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
          "CUDA " + ("available: " + torch.cuda.get_device_name() if torch.cuda.is_available()
                     else "not available (no GPU in this run)")
          + f", repeats {args.repeats}, command: python {' '.join(sys.argv)}")
    print(f"# load average at start: {os.getloadavg()[0]:.1f} (ratios are medians of "
          "interleaved repeats in this one run; 's' on the CPU is the process's CPU time, "
          "on CUDA wall time)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    ap.add_argument("--gpu", action="store_true", help="the 8B-shaped bf16 config on CUDA (section 3 alone unless --only names others)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per variant")
    ap.add_argument("--chunk", type=int, default=SinkMaskConfig().query_chunk,
                    help="query_chunk for the masked variants")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: on a shared 2-core machine more threads "
                         "mostly add spin-wait noise)")
    ap.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--only", default=None,
                    help="sections to run, e.g. 1,4 (default 1,2,3,4,5,6; with --gpu 3: the CPU "
                         "sections take longer than a lent GPU's 10-minute command)")
    ap.add_argument("--gpu-parts", default="mass,select,decode,llada,llada_gap,llada_kernels,llama,zoo",
                    help="parts of section 3: mass (kernels vs reference), select (the "
                         "one-launch selection candidate vs the package's), decode (the "
                         "package's decoding kernel vs by parts), llada (8B-shaped "
                         "forward, batch 8 and 1), llada_gap (batch 8 unpadded at S 700 and "
                         "1056, padded at 1056), llada_kernels (the same with the "
                         "memory-efficient kernel off, as LLaDA's code sets it), llama "
                         "(decoding steps), zoo (same tokens)")
    ap.add_argument("--gpu-skip", default=GPU_SKIP,
                    help="variants left out of section 3's timings (default: the materialized "
                         "and flex paths, the eager selection and (d), timed on both cards "
                         "already; '' times every one)")
    ap.add_argument("--gpu-profile", action="store_true",
                    help="after each timed table of parts llada, llada_gap and llama, one run "
                         "of every variant under torch.profiler: kernel time, kernel launches, "
                         "host syncs and copies per forward pass or decoding step, and the host's time "
                         "per masked call split into the intercept's parts")
    ap.add_argument("--gpu-smoke-cpu", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 9
    torch.set_num_threads(args.threads)
    if args.only is None:
        args.only = "3" if args.gpu else "1,2,3,4,5,6"
    only = set(args.only.split(","))
    if not args.no_header:
        header(args)
    if "1" in only:
        bench_tiny(args)
    if "2" in only:
        S = 512 if args.quick else 1024
        model = wide_model(1024, 16, 2, torch.float32, torch.device("cpu"))
        bench_forward("2. wide random-init LLaDA-shaped model, forward passes (CPU)",
                      model, 1, S, 3, args, torch.device("cpu"))
        del model
    if "3" in only:
        if args.gpu or args.gpu_smoke_cpu or torch.cuda.is_available():
            bench_gpu(args)
        else:
            print("\n### 3. 8B-shaped LLaDA config (GPU)\n\nNo GPU was available in this run: "
                  "the 8B-shaped bf16 ratios were not measured (run with --gpu on a CUDA machine).")
    if "4" in only:
        if os.environ.get("MALLOC_MMAP_THRESHOLD_") == str(MMAP_THRESHOLD):
            bench_memory(args)
        else:  # a child whose large allocations are all mmap'ed: freed tensors leave RSS at once
            import subprocess

            cmd = [sys.executable, __file__, "--only", "4", "--threads", str(args.threads),
                   "--no-header"] + (["--quick"] if args.quick else [])
            env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD))
            subprocess.run(cmd, env=env, check=True)
            sys.stdout.flush()
    if "5" in only:
        bench_sampler(args)
    if "6" in only:
        bench_op_counts(args)


if __name__ == "__main__":
    main()
