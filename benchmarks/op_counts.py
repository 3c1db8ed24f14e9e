"""Torch ops dispatched per attention call, masked against unmasked: a CPU proxy for the
kernel launches a GPU pays.

Why: at batch 1 and in one-row decoding steps a layer's GPU work is shorter than the launches
of the intercept's small tensor ops, so their number, not their size, sets the masked cost.
Each op that reaches the dispatcher below autograd (an aten op) is one launch on CUDA; views
and allocations (no kernel) are left out, and each launch of the fused path's Triton kernels
counts as one. The count is of ops, not of their Python overhead or size.

What is counted, per scenario (the tiny models of tests/tiny.py, CPU):

* ``call``: ops inside one steady attention call (a layer after the first, in a pass after
  the first, so detect=previous has last pass's sinks), masked and unmasked;
* ``selection``: of the masked call's ops, those of the Eq. 3 selection, which CUDA runs
  compiled (:mod:`lm_eval_sinkmask.compiled_tail`: these fuse into a few kernels there);
* ``first_call``: what the pass's first layer adds over the others (the mask view, made once
  per forward pass and shared by the layers);
* ``outside``: masked minus unmasked ops of the pass outside its attention calls, at two
  depths, split into a part per layer (the model handling the masked output differently)
  and a part per pass (the hooks that open and close a pass).

Paths: ``materialized`` (the CPU's: detection and output from float32 probabilities),
``fused`` (the CUDA default, as a GPU runs it: the output from the model's SDPA kernel with the
sinks hidden, the column mass from two Triton kernel launches, which here are only counted;
a decoding step's one-row calls in the package's one-launch decoding kernel, also counted),
for decoding steps ``byparts`` (the fused path without that kernel: detection, selection and
output in turn, as before it), and two candidates for the LLaDA calls, their launches
counted: ``call`` (select_kernel.py's call path: the fused detection, then one launch for the
selection and the output mask) and ``lse`` (lse_reuse.py: the row log-sum-exp from the masked
output's, then the column mass and the selection).
"""

from __future__ import annotations

import collections
import sys
import types
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lm_eval_sinkmask import (attention_view, compiled_tail, decode_step, fused_mass,  # noqa: E402
                              intercept)
from lm_eval_sinkmask.config import SinkMaskConfig  # noqa: E402
from lm_eval_sinkmask.intercept import SinkMasker  # noqa: E402

PATHS = ("materialized", "fused", "byparts", "call", "lse")
# path: (module, the block it installs, the Triton kernels it launches as (module, name))
CANDIDATES = {
    "call": ("select_kernel", "call_path_installed", (("select_kernel", "_select_kernel"),)),
    "lse": ("lse_reuse", "installed", (("lse_reuse", "_prep_kernel"),
                                       ("lse_reuse", "_lse_fix_kernel"),
                                       ("select_kernel", "_select_kernel"))),
}
SCENARIOS = ("llada batch 1", "llada batch 8", "llama decode last_row", "llama decode all_rows")


# ops that launch no kernel on CUDA besides views: allocations, and a view that the
# dispatcher does not mark as one
NO_LAUNCH = {"aten::empty.memory_format", "aten::empty_strided", "aten::_unsafe_view"}


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while active that would launch a kernel on CUDA (no
    views, no allocations), under the label in ``phase``."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.ops: collections.Counter = collections.Counter()  # (phase, op name): count
        self.phase = "outside"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.name() not in NO_LAUNCH:
            self.count(func.name())
        return func(*args, **(kwargs or {}))

    def count(self, name: str) -> None:
        self.counts[self.phase] += 1
        self.ops[self.phase, name] += 1


@contextmanager
def in_phase(counter: OpCounter, phase: str):
    old, counter.phase = counter.phase, phase
    try:
        yield
    finally:
        counter.phase = old


class _CountedKernel:
    """A Triton kernel stand-in: ``kernel[grid](...)`` counts one launch and computes nothing
    (the counts do not depend on the mass values)."""

    def __init__(self, counter: OpCounter, name: str):
        self.counter, self.name = counter, name

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.counter.count(f"triton.{self.name}")


def paths(scenario: str) -> tuple[str, ...]:
    """The paths a scenario is counted on: ``byparts`` only where the fused path has
    one-row calls, a candidate only where it takes the calls (``call`` and ``lse`` the LLaDA
    calls; elsewhere each is the fused path), and either only where Triton is installed."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return PATHS[:2]
    return (*PATHS[:2], *(("byparts",) if scenario.startswith("llama") else ("call", "lse")))


def path_on_cpu(path: str, counter: OpCounter):
    """The block in which a masked run takes ``path``: the fused ones as on a GPU."""
    if path == "materialized":
        return nullcontext()
    return as_on_a_gpu(counter, CANDIDATES.get(path), one_row_kernel=path != "byparts")


@contextmanager
def as_on_a_gpu(counter: OpCounter, candidate: tuple | None = None, one_row_kernel: bool = True):
    """The intercept's choices as on CUDA, on CPU tensors: the masked output from the model's
    SDPA kernel, no mask's values read on the host, and the fused path's Triton launches
    (its one-row decoding kernel's too, unless ``one_row_kernel`` is false: those calls then
    go by parts) counted instead of run; with a ``candidate`` (module, installer, kernels;
    :data:`CANDIDATES`), it installed, its kernels' launches counted instead of run."""
    import importlib

    kernels = types.SimpleNamespace(row_lse_kernel=_CountedKernel(counter, "row_lse_kernel"),
                                    column_mass_kernel=_CountedKernel(counter, "column_mass_kernel"))
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(intercept, "_output_from_scores",
                                              lambda device: False))
        stack.enter_context(mock.patch.object(attention_view, "_host_reads_are_free",
                                              lambda device: False))
        stack.enter_context(mock.patch.object(fused_mass, "triton_runs_on", lambda device: True))
        stack.enter_context(mock.patch.object(fused_mass, "_kernels", lambda: kernels))
        one_row = types.SimpleNamespace(decode_kernel=_CountedKernel(counter, "decode_kernel"))
        stack.enter_context(mock.patch.object(decode_step, "_kernels",
                                              lambda: one_row if one_row_kernel else None))
        if candidate is not None:
            module_name, installer, launched = candidate
            for where, name in launched:  # counted under its name, less the underscore
                counted = _CountedKernel(counter, name.lstrip("_"))
                stack.enter_context(mock.patch.object(importlib.import_module(where), name,
                                                      counted))
            stack.enter_context(getattr(importlib.import_module(module_name), installer)())
        yield


@contextmanager
def calls_recorded(counter: OpCounter, per_call: list):
    """Each SDPA call made in the block (through whatever is installed now) counted under
    phase "call"; ``per_call`` gets one Counter of op names per call. The Eq. 3 selection
    inside a call is counted under "selection" too."""
    inner, select = F.scaled_dot_product_attention, compiled_tail.selector

    def call(*args, **kwargs):
        before = counter.ops.copy()
        with in_phase(counter, "call"):
            out = inner(*args, **kwargs)
        per_call.append(counter.ops - before)
        return out

    def selector(device, unmaterialized, **kw):
        chosen = select(device, unmaterialized, **kw)

        def counted(*args, **kwargs):
            with in_phase(counter, "selection"):
                return chosen(*args, **kwargs)
        return counted

    F.scaled_dot_product_attention, compiled_tail.selector = call, selector
    try:
        yield
    finally:
        F.scaled_dot_product_attention, compiled_tail.selector = inner, select


@dataclass
class PassCount:
    """The ops of one counted forward pass, split by where they ran."""

    calls: list  # per SDPA call: Counter of op names (selection included)
    outside: int  # ops of the pass outside its SDPA calls

    def call(self, index: int) -> int:
        return sum(self.calls[index].values())

    def selection(self, index: int) -> int:
        return sum(n for (phase, _), n in self.calls[index].items() if phase == "selection")


def _tiny(kind: str, layers: int = 3):
    from tests import tiny

    config = tiny.build(kind).config
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    return type(tiny.build(kind))(config).eval()


def _llada_inputs(batch: int, length: int = 24):
    """Prompts as bench_masking's forward sections make them (ragged left padding), and as
    dlm_model passes them to LLaDA, a 2-D mask only when some row is padded (LLaDA's bias)."""
    from bench_masking import prompts

    ids, mask = prompts(batch, length, vocab=40, mask_id=-1, seed=0)  # no id is -1
    return {"input_ids": ids, "attention_mask": None if bool(mask.all()) else mask}


def _count_last_pass(model, passes, config: SinkMaskConfig | None, rule: str,
                     counter: OpCounter) -> PassCount:
    """Runs ``passes`` (callables of the model, sharing one attach block) and counts the last."""
    per_call: list = []
    with torch.no_grad(), ExitStack() as stack:  # inference_mode hides dtype casts from the mode
        if config is not None:
            stack.enter_context(SinkMasker(config, rule=rule).attach(model))
        for run in passes[:-1]:
            run()
        counter.counts.clear()  # kernel launches of the uncounted passes
        counter.ops.clear()
        stack.enter_context(calls_recorded(counter, per_call))
        with counter:
            passes[-1]()
    return PassCount(per_call, counter.counts["outside"])


def _passes(scenario: str, layers: int = 3, passes: int = 3):
    """(model, the pass callables, arm rule) of a scenario; the last pass is the counted one.
    LLaDA: ``passes`` forward passes of one batch; Llama: a prefill, then ``passes - 1``
    one-row decoding steps with the KV cache."""
    if scenario.startswith("llada"):
        model = _tiny("llada", layers)
        kw = _llada_inputs(int(scenario.split()[-1]))
        return model, [lambda: model(**kw)] * passes, "all"
    model = _tiny("llama", layers)
    prompt = 18
    ids = torch.randint(5, 40, (1, prompt + passes - 1), generator=torch.Generator().manual_seed(0))
    state = {}

    def prefill():
        state["cache"] = model(ids[:, :prompt], use_cache=True).past_key_values

    def step(t):
        def run():
            model(ids[:, t:t + 1], past_key_values=state["cache"], use_cache=True)
        return run

    return model, [prefill, *(step(t) for t in range(prompt, ids.shape[1]))], scenario.split()[-1]


def config_of(path: str) -> SinkMaskConfig:
    """top_k 5 with detect=previous, eps 0: every layer of a random-init model then masks."""
    backend = "fused" if path in CANDIDATES or path == "byparts" else path
    return SinkMaskConfig(top_k=5, eps=0.0, detect="previous", detect_backend=backend)


@dataclass
class Comparison:
    """One scenario on one path: ops per call and per pass, masked against unmasked."""

    scenario: str
    path: str
    unmasked_call: int
    masked_call: int
    selection: int  # of masked_call: the Eq. 3 selection (compiled into a few kernels on CUDA)
    first_call: int  # the first layer's extra ops over the others': made once per pass
    # masked minus unmasked ops outside the calls, fitted as per_pass + per_layer x layers:
    # per layer, what the model does differently with the masked output (e.g. a copy when its
    # layout differs from SDPA's); per pass, the hooks that open and close a pass
    outside_per_layer: int
    outside_per_pass: int

    @property
    def extra_per_call(self) -> int:
        """What each masked layer adds: in its attention call and after it."""
        return self.masked_call - self.unmasked_call + self.outside_per_layer

    @property
    def per_pass_fixed(self) -> int:
        """What a masked forward pass adds once, whatever its depth."""
        return self.first_call + self.outside_per_pass


def compare(scenario: str, path: str, layers=(2, 3)) -> Comparison:
    counts = {}
    for n in layers:
        for masked in (False, True):
            counter = OpCounter()
            model, passes, rule = _passes(scenario, n)
            with path_on_cpu(path, counter) if masked else nullcontext():
                counts[n, masked] = _count_last_pass(model, passes, config_of(path) if masked
                                                     else None, rule, counter)
    outside = {n: counts[n, True].outside - counts[n, False].outside for n in layers}
    per_layer = (outside[layers[1]] - outside[layers[0]]) // (layers[1] - layers[0])
    masked, plain = counts[layers[-1], True], counts[layers[-1], False]
    return Comparison(scenario, path, plain.call(1), masked.call(1), masked.selection(1),
                      masked.call(0) - masked.call(1), per_layer,
                      outside[layers[-1]] - per_layer * layers[-1])


def op_table(scenario: str, path: str) -> dict:
    """Op names of the masked pass by where they ran: {"call": ..., "first_call": ...,
    "outside": ...} (Counters; "outside" masked minus unmasked), to see which ops a count holds."""
    def counted(config):
        counter = OpCounter()
        model, passes, rule = _passes(scenario)
        with path_on_cpu(path, counter) if config else nullcontext():
            result = _count_last_pass(model, passes, config, rule, counter)
        return result, counter

    (masked, mc), (_, pc) = counted(config_of(path)), counted(None)
    outside = lambda c: collections.Counter({n: k for (ph, n), k in c.ops.items() if ph == "outside"})  # noqa: E731
    return {"call": masked.calls[1], "first_call": masked.calls[0] - masked.calls[1],
            "outside": outside(mc) - outside(pc)}


@dataclass
class HostTime:
    """Process time per attention call of one scenario and path, unmasked and masked (us)."""

    scenario: str
    path: str
    unmasked: float
    masked: float

    @property
    def added(self) -> float:
        return self.masked - self.unmasked


def host_time(scenario: str, path: str, layers: int = 3, timed: int = 20,
              repeats: int = 5) -> HostTime:
    """The host's time per attention call, masked and unmasked: median over ``repeats``
    interleaved runs of the process time of ``timed`` passes (LLaDA: the same pass again;
    Llama: that many decoding steps, one key more each), per pass and layer.

    Why: at these tiny sizes a call's arithmetic is negligible, so the time is what the host
    spends per call (Python, dispatch); a GPU at batch 1 or in a decoding step waits on that,
    not on kernels (benchmarks/results/gpu_h100.md: about 1 ms more host time per masked call
    for 0.1 ms more GPU work). The fused path runs as on a GPU, its two Triton launches
    stubbed (so its column mass is never computed and which keys it masks is arbitrary: the
    host's work per call is the same); the selection is eager, as the CPU runs it. Times
    include the model's own work per layer besides attention, the same masked or not."""
    import statistics
    import time

    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for masked in (False, True):
            model, passes, rule = _passes(scenario, layers, passes=2 + timed)
            with torch.no_grad(), ExitStack() as stack:
                if masked:
                    stack.enter_context(path_on_cpu(path, OpCounter()))
                    stack.enter_context(SinkMasker(config_of(path), rule=rule).attach(model))
                for run in passes[:2]:  # the prefill, or a first pass: detect=previous's sinks
                    run()
                start = time.process_time()
                for run in passes[2:]:
                    run()
                times[masked].append((time.process_time() - start) / timed / layers * 1e6)
    return HostTime(scenario, path, statistics.median(times[False]),
                    statistics.median(times[True]))
