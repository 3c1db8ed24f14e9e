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
that without it it does not (tests/test_graphed_pass.py). The counters (sinks found, keys
masked) are Python and stop at the capture: a replayed pass is timed and compared, not
counted. The unmasked pass is graphed the same way (``a_graph``) for the fair ratio.

Adopting it would be a sampler change (capture per generation, replay per step) plus the
in-place update in ``intercept._Run``: package code, so it waits for the GPU's verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack, contextmanager

import torch
import torch.nn.functional as F

from lm_eval_sinkmask import intercept
from lm_eval_sinkmask.intercept import SinkMasker

WARM_UP_PASSES = 2  # the first detects this pass's sinks; the second is a steady-state pass


@contextmanager
def previous_in_place():
    """Within the block, each masked call writes its choice into the tensors that held the
    layer's last choice (same shape) instead of rebinding them: after the first pass the
    tensors a pass reads and writes are the same every pass, as replaying a graph needs."""
    package_sdpa = intercept._Run.sdpa

    def sdpa(run, *args, **kwargs):
        layer, kept = run.layer, run.previous.get(run.layer)
        out = package_sdpa(run, *args, **kwargs)
        new = run.previous.get(layer)
        if kept is not None and new is not kept and new.keys.shape == kept.keys.shape:
            kept.keys.copy_(new.keys)  # after this call's masked output read them
            kept.count.copy_(new.count)
            run.previous[layer] = kept
        return out

    intercept._Run.sdpa = sdpa
    try:
        yield
    finally:
        intercept._Run.sdpa = package_sdpa


def cuda_graph(fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
    """``fn`` captured as a CUDA graph: (replay, the output tensor every replay rewrites).
    Capturing records ``fn``'s kernels without running them."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


cuda_graph.runs_the_pass = False  # a stand-in that records by running sets it True
cuda_graph.needs_cuda = True


class GraphedPass:
    """One forward pass of ``model`` on static copies of ``ids`` and ``attention_mask``,
    masked under ``config`` (None: unmasked), captured by ``capture`` (default :func:`cuda_graph`)
    after :data:`WARM_UP_PASSES` eager passes, and replayed by :meth:`step`. ``passes_run``:
    the passes made before the first replay (the state an eager run has to match)."""

    def __init__(self, model, ids: torch.Tensor, attention_mask: torch.Tensor | None, config,
                 capture=None):
        capture = capture or cuda_graph
        if getattr(capture, "needs_cuda", False) and ids.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the inputs are on {ids.device}")
        self.ids = ids.clone()
        self.mask = None if attention_mask is None else attention_mask.clone()
        self.passes_run = WARM_UP_PASSES + getattr(capture, "runs_the_pass", False)
        self._held = ExitStack()  # the attach block's state lives as long as the graph
        self.run = None
        if config is not None:
            self._held.enter_context(previous_in_place())
            self.stats = self._held.enter_context(SinkMasker(config).attach(model))
            self.run = F.scaled_dot_product_attention.__self__  # the _Run of this block

        def forward() -> torch.Tensor:
            return model(input_ids=self.ids, attention_mask=self.mask).logits

        try:
            warm = torch.cuda.Stream() if ids.device.type == "cuda" else None
            with torch.cuda.stream(warm) if warm is not None else ExitStack():
                for _ in range(WARM_UP_PASSES):  # kernels compiled, last choice in hand
                    forward()
            if warm is not None:
                torch.cuda.current_stream().wait_stream(warm)
            if config is not None:
                self.stats.settle()  # nothing pending that the captured pass would settle
            self._replay, self.logits = capture(forward)
        finally:  # the capture holds what it needs; the model's SDPA is the package's again
            self._held.close()

    def step(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """One replayed pass, on new tokens if given (same shape); the logits tensor it wrote,
        which the next step rewrites."""
        if ids is not None:
            self.ids.copy_(ids)
        self._replay()
        return self.logits

    def chosen(self) -> list[torch.Tensor]:
        """Each layer's keys chosen by the last pass (masked by the next), by layer."""
        return [self.run.previous[layer].keys for layer in sorted(self.run.previous)]
