"""Run a test file as a child process under Triton's interpreter and read its results; and,
in that child, run the same passes through the intercept with and without a kernel (a
candidate of benchmarks/, or the package's own on another detect_backend) and compare them
call by call.

``TRITON_INTERPRET=1`` must be set before Triton compiles anything, so the Triton checks run
their cases in one child (the test file run as a script), which prints one JSON line per case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def interpreted_results(script: str, *paths: Path) -> dict[str, dict]:
    """case -> result of ``script`` run by the interpreter on the CPU, with the repository
    root and ``paths`` importable."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(map(str, (ROOT, *paths))))
    proc = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {r["case"]: r for r in map(json.loads, proc.stdout.splitlines())}


def print_results(*cases) -> None:
    """The child's side of :func:`interpreted_results` (a test file run as a script): each
    result of the ``cases`` iterables printed as one JSON line, under the interpreter only."""
    import itertools

    assert os.environ.get("TRITON_INTERPRET") == "1", "run it through interpreted_results"
    for result in itertools.chain(*cases):
        print(json.dumps(result), flush=True)


def tiny_dlm_passes(kind: str, *, bf16: bool = False, padded: bool = False, passes: int = 3):
    """(model, run: () -> final logits) of ``passes`` forward passes of the tiny ``kind``
    DLM ("llada" or "dream") over one batch of three, two of them left-padded where
    ``padded``: the candidates' model cases for calls of several rows."""
    import torch

    from lm_eval_sinkmask.families import FAMILIES
    from tests import tiny

    model = tiny.build(kind)
    if bf16:
        model = model.to(torch.bfloat16)
    ids = torch.randint(5, 40, (3, 11), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(3, 11, dtype=torch.long)
    if padded:
        mask[1, :3] = 0
        mask[2, :1] = 0
    kwargs = FAMILIES["dream"].model_inputs(ids, mask) if kind == "dream" else \
        {"input_ids": ids, "attention_mask": mask}

    def run():
        for _ in range(passes - 1):
            model(**kwargs)
        return model(**kwargs).logits.float()

    return model, run


class SyntheticAttention:
    """A model of two SDPA calls (layers) per pass over fixed DLM-shaped q/k/v (as many
    query rows as keys, 80: two query tiles), sinks planted at a few keys, under a float bias
    with left padding, or ``bool_mask``, ``no_mask``, ``all_visible_blocked`` (element 2 sees
    only three keys, the first sinks); ``gqa``: K and V with half the query's heads, passed to
    SDPA with ``enable_gqa``."""

    def __init__(self, name: str):
        import torch

        g = torch.Generator().manual_seed(6)
        B, H, D, S = 3, 4, 16, 80
        Hk = H // 2 if name == "gqa" else H
        self.q = torch.randn(2, B, H, S, D, generator=g)
        self.k = torch.randn(2, B, Hk, S, D, generator=g)
        self.k[:, :, :, [0, 5, 9, 17, 30]] += 2.5 * self.q[:, :, ::H // Hk].mean(dim=3,
                                                                                keepdim=True)
        self.v = torch.randn(2, B, Hk, S, D, generator=g)
        self.gqa = Hk != H
        keep = torch.ones(B, S, dtype=torch.bool)
        keep[1, :6] = False  # left padding
        if name == "all_visible_blocked":  # element 2 sees three keys, all of them sinks
            keep[2] = False
            keep[2, [0, 5, 9]] = True
        keep = keep[:, None, None, :]
        if name == "no_mask":
            self.mask = None
        elif name in ("bool_mask", "all_visible_blocked"):
            self.mask = keep
        else:
            bias = torch.linspace(-0.5, 0.5, S).expand(keep.shape)
            self.mask = bias.masked_fill(~keep, torch.finfo(torch.float32).min)

    def run(self):
        import torch
        import torch.nn.functional as F

        return torch.cat([F.scaled_dot_product_attention(self.q[i], self.k[i], self.v[i],
                                                         attn_mask=self.mask,
                                                         enable_gqa=self.gqa)
                          for i in range(2)], dim=2)


def synthetic_passes(name: str, *, passes: int = 3):
    """(model, run: () -> last pass's output, attention) of ``passes`` passes of the
    :class:`SyntheticAttention` ``name``: the candidates' synthetic cases."""
    import torch

    att = SyntheticAttention(name)
    model = torch.nn.Module()
    model.forward = lambda: att.run()  # the masker hooks the module's forward passes

    def run():
        for _ in range(passes - 1):
            model()
        return model()

    return model, run, att


def compared_with_the_package(case: str, installed, name: str, model, rule: str, detect: str,
                              run, *, top_k: int, eps: float, tol: float, takes,
                              granularity: str = "head", backend: str = "auto",
                              versus_backend: str | None = None) -> dict:
    """``run`` (the model's passes, returning its final logits) through the intercept as the
    package runs on the CPU, then within ``installed()`` (a candidate taking some calls, its
    detections counted under ``name``) and with detect_backend ``versus_backend`` (default:
    ``backend``), compared: every call's sinks, chosen and blocked
    keys, the stats, the scores (relative to max(|score|, 1); over all calls and over the
    first layer's, whose inputs are the same both ways), the logits (within ``tol``) and
    their argmax. ``takes(query)``: whether the candidate should take a call. ``backend``:
    the package's detect_backend ("fused" for a candidate of the fused kernels)."""
    import torch

    cfg = dict(top_k=top_k, eps=eps, detect=detect, granularity=granularity,
               detect_backend=backend)
    package = _intercepted(model, rule, cfg, run, None, takes)
    kernel = _intercepted(model, rule, dict(cfg, detect_backend=versus_backend or backend), run,
                          installed, takes)
    (pe, ps, pl, n_taken), (ke, ks, kl, _) = package, kernel
    same = len(pe) == len(ke)
    pairs = list(zip(pe, ke))
    return {
        "case": case, "calls": len(pe), "taken_calls": n_taken,
        "kernel_calls": ks.detection.get(name, 0),
        "blocked": int(sum(int(e.blocked.sum()) for e in pe)),
        "same_sinks": same and all(torch.equal(a.sinks, b.sinks) for a, b in pairs),
        "same_chosen": same and all(torch.equal(a.chosen, b.chosen) for a, b in pairs),
        "same_blocked": same and all(torch.equal(a.blocked.expand_as(b.blocked), b.blocked)
                                     for a, b in pairs),
        "first_layer_same_chosen": same and all(torch.equal(a.chosen, b.chosen)
                                                for a, b in pairs if a.layer == 0),
        "same_stats": (ps.sinks_detected, ps.keys_masked) == (ks.sinks_detected, ks.keys_masked),
        "scores_max_diff": max(_score_diff(a, b) for a, b in pairs),
        "first_layer_scores_max_diff": max(_score_diff(a, b) for a, b in pairs if a.layer == 0),
        "output_max_diff": float((pl - kl).abs().max()), "output_tol": tol,
        "same_tokens": bool(torch.equal(pl.argmax(-1), kl.argmax(-1))),
    }


def _intercepted(model, rule, cfg: dict, run, installed, takes):
    """(events, stats, final logits, calls the candidate should take) of ``run`` through the
    intercept, within ``installed()`` where given."""
    from contextlib import nullcontext

    import torch
    import torch.nn.functional as F

    from lm_eval_sinkmask.config import SinkMaskConfig
    from lm_eval_sinkmask.intercept import SinkMasker

    events, taken = [], []
    masker = SinkMasker(SinkMaskConfig(**cfg), rule=rule, observers=[events.append])
    with torch.no_grad(), (installed() if installed else nullcontext()), \
            masker.attach(model) as stats:
        intercepted = F.scaled_dot_product_attention

        def counted(query, *args, **kwargs):
            taken.append(takes(query))
            return intercepted(query, *args, **kwargs)

        F.scaled_dot_product_attention = counted
        try:
            logits = run()
        finally:
            F.scaled_dot_product_attention = intercepted
    return events, stats, logits, sum(taken)


def _score_diff(a, b) -> float:
    return float(((a.scores - b.scores).abs() / a.scores.abs().clamp(min=1)).max())
