"""A masked DLM step replayed as one CUDA graph: the candidate for batch 1 (``c_graph``).

Why: at batch 1 the 8B-shaped LLaDA's masked pass waits on the host, not the GPU. On the lent
H200 (2026-11-27, benchmarks/results/gpu_h200_candidates.md) the package's fused path cost
2.1-2.3x the unmasked pass and the best candidate with fewer launches per call (``c_call``)
1.6-1.8x, against a bar of 1.3: every attention call still pays the intercept's Python and
a few kernel launches, about as long as the call's GPU work. A DLM step has fixed shapes
through a whole generation (the canvas [B, prompt + gen_length] and its mask stay, only the
tokens change), so the pass can be captured once and replayed at every step: the host then
launches one graph per step, whatever the intercept does inside it.

Replay reruns the captured kernels on the captured memory and no Python at all, so state a
pass hands to the next must live in tensors that are updated in place. The intercept's one
such state under ``detect=previous`` is each layer's choice, which the next pass masks;
``_Run`` rebinds it to the new choice's tensors, which a replay would never see (it would mask
the keys chosen in the warm-up pass forever). :func:`previous_in_place` copies each new choice
into the tensors that held the last one instead, one small copy per call; tests check on the
CPU that with it a recorded pass replayed on new tokens gives what eager passes give, and
that without it it does not (tests/test_graphed_pass.py). The run's record counts replays as
the eager passes they stand for (:class:`ReplayCounts`): what the intercept counts in Python
(passes, calls, detection paths) is repeated per replay, and the per-call device counts of sinks
and masked keys, which every replay rewrites, are kept per replay with one stacking launch, so
a graphed generation reports the same counters as an eager one. The unmasked pass is graphed
the same way (``a_graph``) for the fair ratio.

Adopting it would be a sampler change (capture per generation, replay per step), the in-place
update in ``intercept._Run`` and :class:`ReplayCounts` as a ``MaskingStats`` method: package
code, so it waits for the GPU's verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from unittest import mock

import torch
import torch.nn.functional as F

from lm_eval_sinkmask import intercept
from lm_eval_sinkmask.intercept import SinkMasker
from lm_eval_sinkmask.masking_stats import SETTLE_AT, MaskingStats

# eager calls before the capture: the first detects its own sinks (detect=previous has no
# last choice yet), the second is a steady-state pass; both compile what the capture then holds
WARM_UP_PASSES = 2


@contextmanager
def previous_in_place():
    """Within the block, each masked call writes its choice into the tensors that held the
    layer's last choice (same shape) instead of rebinding them: after the first pass the
    tensors a pass reads and writes are the same every pass, as replaying a graph needs."""
    package_sdpa = intercept._Run.sdpa

    def sdpa(run, *args, **kwargs):
        layer, kept = run.layer, run.previous.get(run.layer)
        if kept is None:
            return package_sdpa(run, *args, **kwargs)
        # the call counts its masked keys on a copy of their number: the update below
        # rewrites the original, and the run's record reads the count after the pass
        lent = kept._replace(count=kept.count.clone())
        run.previous[layer] = lent
        out = package_sdpa(run, *args, **kwargs)
        new = run.previous[layer]
        if new is lent or new.keys.shape == kept.keys.shape:
            if new is not lent:
                kept.keys.copy_(new.keys)  # after this call's masked output read them
                kept.count.copy_(new.count)
            run.previous[layer] = kept
        return out

    with mock.patch.object(intercept._Run, "sdpa", sdpa):
        yield


def chosen_keys(run) -> list[torch.Tensor]:
    """Each layer's keys chosen by the last pass of an attach block's ``run`` (masked by its
    next pass), by layer."""
    return [run.previous[layer].keys for layer in sorted(run.previous)]


def cuda_graph(fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
    """``fn`` captured as a CUDA graph: (replay, the output tensor every replay rewrites).
    Capturing records ``fn``'s kernels without running them."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


cuda_graph.runs_the_pass = False  # a stand-in that records by running sets it True
cuda_graph.needs_cuda = True


class ReplayCounts:
    """What one replay of a captured masked pass adds to the run's :class:`MaskingStats`, as
    the eager pass would have counted it. Made around the capture: the Python counters the
    captured pass incremented (passes, attention calls per layer, detection paths) are its
    per-pass step, and the device counts it deferred (each call's sinks and masked keys, in
    the graph's memory, rewritten by every replay) are taken out of the pending list and
    copied back into it after each replay, one ``stack`` per pass."""

    def __init__(self, stats: MaskingStats, capture: Callable[[], tuple]):
        # nothing pending: the capture's own counts are then the list, and no settle (a host
        # sync, which a capture refuses) can fall inside it
        stats.settle()
        before = self._python(stats)
        self.stats = stats
        self.result = capture()
        after = self._python(stats)
        self.passes = after[0] - before[0]
        self.calls = after[1] - before[1]
        self.layer_calls = {n: c - before[2].get(n, 0) for n, c in after[2].items()}
        self.detection = {b: c - before[3].get(b, 0) for b, c in after[3].items()}
        # (layer counters, sinks, masked, keys per masked entry), the tensors the graph rewrites
        self.deferred, stats._pending = stats._pending, []

    @staticmethod
    def _python(stats: MaskingStats) -> tuple:
        return (stats.forward_passes, stats.attention_calls,
                {n: c.calls for n, c in stats._layers.items()}, dict(stats.detection))

    def add_counts(self) -> None:
        """The device counts of the pass just run (the first, run by the capture or just
        after it, is in the Python counters already)."""
        if not self.deferred:
            return
        values = torch.stack([t for _, sinks, masked, _ in self.deferred for t in (sinks, masked)])
        for i, (counters, _, _, per_key) in enumerate(self.deferred):
            self.stats.defer_counts(counters, values[2 * i], values[2 * i + 1], per_key)
        if self.stats.pending >= SETTLE_AT:  # as the intercept does between eager passes
            self.stats.settle()

    def add_replay(self) -> None:
        """Everything one more replay counts."""
        s = self.stats
        s.forward_passes += self.passes
        s.attention_calls += self.calls
        for n, c in self.layer_calls.items():
            s.layer(n).calls += c
        for b, c in self.detection.items():
            s.detection[b] = s.detection.get(b, 0) + c
        self.add_counts()


class GraphedForward:
    """``model`` as a sampler calls it, ``forward(**inputs) -> logits`` (the model's keyword
    arguments: ``input_ids`` and whatever else the family passes, e.g. an attention mask and
    position ids; tensors or None), masked under ``config`` (None: unmasked). The first
    :data:`WARM_UP_PASSES` calls run eagerly (on a side stream on CUDA, as capture wants), the
    next captures the pass on static copies of its inputs (``capture``, default
    :func:`cuda_graph`) and replays it, and every later call copies its inputs in and replays.
    One instance per shape, e.g. per generation: a DLM's canvas, mask and positions keep theirs
    through it. The masking (an attach block) is open from construction to :meth:`close` (or
    the end of a ``with`` block); replays need no open block, eager calls do. ``passes_run``:
    the passes made so far, eager, captured or replayed; ``stats``: the masking's counters
    (None unmasked), replays counted as the eager passes they stand for."""

    def __init__(self, model, config, capture=None):
        self.model, self.capture = model, capture or cuda_graph
        self.passes_run = 0
        self.inputs: dict[str, torch.Tensor | None] = {}
        self.logits = self._replay = None
        self.run = self.stats = self._counts = None
        self._held = ExitStack()  # the attach block; its _Run outlives it, with the graph
        if config is not None:
            self._held.enter_context(previous_in_place())
            self.stats = self._held.enter_context(SinkMasker(config).attach(model))
            self.run = F.scaled_dot_product_attention.__self__  # the _Run of this block
        self.open = True

    def __enter__(self) -> GraphedForward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Ends the attach block: the model's SDPA is the package's again; replays go on."""
        self.open = False
        self._held.close()

    def __call__(self, **inputs: torch.Tensor | None) -> torch.Tensor:
        self.passes_run += 1
        if self._replay is not None:
            self._copy_in(inputs)
            self._replay()
            if self._counts is not None:
                self._counts.add_replay()
            return self.logits
        ids = inputs["input_ids"]
        if getattr(self.capture, "needs_cuda", False) and ids.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the inputs are on {ids.device}")
        if not self.open:
            raise RuntimeError("the masking block is closed before the pass was captured")
        self.inputs = {name: None if t is None else t.clone() for name, t in inputs.items()}
        if self.passes_run <= WARM_UP_PASSES:
            return self._eager()
        if self.stats is None:
            self._replay, self.logits = self.capture(self._forward)
        else:
            self._counts = ReplayCounts(self.stats, lambda: self.capture(self._forward))
            self._replay, self.logits = self._counts.result
        if not getattr(self.capture, "runs_the_pass", False):
            self._replay()  # capturing recorded the pass; this runs it
        if self._counts is not None:
            self._counts.add_counts()
        return self.logits

    def _copy_in(self, inputs: dict) -> None:
        """The call's inputs into the captured ones, which must be of the same form (the same
        tensors by name and shape; an input left out is one given as None)."""
        def form(named):
            return {name: tuple(t.shape) for name, t in named.items() if t is not None}

        if form(inputs) != form(self.inputs):
            raise ValueError(f"a captured pass replays inputs of one form, {form(self.inputs)}; "
                             f"got {form(inputs)}")
        for name, t in inputs.items():
            if t is not None:
                self.inputs[name].copy_(t)

    def _forward(self) -> torch.Tensor:
        return self.model(**self.inputs).logits

    def _eager(self) -> torch.Tensor:
        if self.inputs["input_ids"].device.type != "cuda":
            return self._forward()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            logits = self._forward()
        torch.cuda.current_stream().wait_stream(side)
        return logits

    def chosen(self) -> list[torch.Tensor]:
        """Each layer's keys chosen by the last pass (masked by the next), by layer."""
        return chosen_keys(self.run)


def captured(model, ids: torch.Tensor, attention_mask: torch.Tensor | None, config,
             capture=None) -> GraphedForward:
    """A :class:`GraphedForward` run on ``input_ids=ids, attention_mask=attention_mask`` until
    its pass is captured (and run once), its masking block closed: every later call is a
    replay (benchmarks time those)."""
    with GraphedForward(model, config, capture) as forward:
        for _ in range(WARM_UP_PASSES + 1):
            forward(input_ids=ids, attention_mask=attention_mask)
    return forward


def replays(forward: GraphedForward, steps: list[dict]) -> list[tuple]:
    """``forward`` called on each of ``steps`` (its inputs, by name): each call's logits and
    every layer's chosen keys, copied (the next replay rewrites them)."""
    return [(forward(**inputs).clone(), [k.clone() for k in forward.chosen()])
            for inputs in steps]


def eager_passes(model, config, first: dict, before: int, steps: list[dict]) -> list[tuple]:
    """What :func:`replays` of a pass captured after ``before`` passes on ``first`` must give:
    the package's eager masked passes in one attach block, ``before`` on ``first``, then one
    on each of ``steps``, each one's logits and every layer's chosen keys, copied."""
    with SinkMasker(config).attach(model):
        run = F.scaled_dot_product_attention.__self__
        for _ in range(before):
            model(**first)
        return [(model(**inputs).logits.clone(), [k.clone() for k in chosen_keys(run)])
                for inputs in steps]
