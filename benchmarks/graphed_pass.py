"""The masked DLM pass replayed as one CUDA graph, for the benchmarks (``c_graph``, ``a_graph``).

Why: at batch 1 the 8B-shaped LLaDA's masked pass waits on the host, not the GPU. On the lent
H200 (2026-11-27, benchmarks/results/gpu_h200_candidates.md) the package's fused path cost
2.1-2.3x the unmasked pass and the best candidate with fewer launches per call (``c_call``)
1.6-1.8x, against a bar of 1.3: every attention call still pays the intercept's Python and
a few kernel launches, about as long as the call's GPU work. The package's ``cuda_graph=true``
(lm_eval_sinkmask/graphed_steps.py) captures a generation's step once and replays it; this
module times and checks that on the model's own keyword inputs: :class:`GraphedForward` is
``graphed_steps.GraphedSteps`` over ``model(**inputs).logits`` in an attach block of its own
(``in_place=True``), which may close after the capture (replays need no Python). The unmasked
pass is graphed the same way (``a_graph``) for the fair ratio.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch
import torch.nn.functional as F

from lm_eval_sinkmask import graphed_steps
from lm_eval_sinkmask.intercept import SinkMasker

WARM_UP_PASSES = graphed_steps.WARM_UP_STEPS


def chosen_keys(run) -> list[torch.Tensor]:
    """Each layer's keys chosen by the last pass of an attach block's ``run`` (masked by its
    next pass), by layer."""
    return [run.previous[layer].keys for layer in sorted(run.previous)]


class GraphedForward:
    """``model`` as a sampler calls it, ``forward(**inputs) -> logits`` (the model's keyword
    arguments: ``input_ids`` and whatever else the family passes; tensors or None), masked
    under ``config`` (None: unmasked), as ``graphed_steps.GraphedSteps`` (its first calls eager,
    then one capture with ``capture``, default ``graphed_steps.capture``, then replays). The
    masking (an attach block, ``in_place=True``) is open from construction to :meth:`close`
    (or the end of a ``with`` block); replays need no open block, eager calls do.
    ``passes_run``: the passes made so far; ``stats``: the masking's counters (None unmasked),
    replays counted as the eager passes they stand for."""

    def __init__(self, model, config, capture=None):
        self._held = ExitStack()  # the attach block; its _Run outlives it, with the graph
        self.run = self.stats = None
        if config is not None:
            self.stats = self._held.enter_context(SinkMasker(config).attach(model, in_place=True))
            self.run = F.scaled_dot_product_attention.__self__  # the _Run of this block
        self.steps = graphed_steps.GraphedSteps(lambda **inputs: model(**inputs).logits,
                                                self.stats, capture)
        self.open = True

    def __enter__(self) -> GraphedForward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Ends the attach block: the model's SDPA is the package's again; replays go on."""
        self.open = False
        self._held.close()

    @property
    def passes_run(self) -> int:
        return self.steps.steps_run

    @property
    def inputs(self) -> dict:
        return self.steps.kwargs

    def __call__(self, **inputs: torch.Tensor | None) -> torch.Tensor:
        if self.steps.logits is None:  # an eager pass or the capture: they need the block
            if not self.open:
                raise RuntimeError("the masking block is closed before the pass was captured")
            if not getattr(self.steps.capture_with, "runs_the_pass", False):  # a real capture
                graphed_steps.check_device(inputs["input_ids"].device)
        return self.steps(**inputs)

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
