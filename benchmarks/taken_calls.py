"""How a candidate kernel takes over some of the intercept's attention calls.

The candidates beside the benchmarks (decode_kernel.py, select_kernel.py's call path,
lse_reuse.py) each make one call's whole decision (the keys it blocks, this pass's sinks and
choice, the masked output) in fewer launches than the package. This module holds what they share: last pass's
choice as the package keeps it, the decision assembled with the run's state updated as the
package updates it, and a block within which :class:`intercept._Run` asks a candidate first
and the package for every call the candidate does not take. A candidate that changes only
how the fused path's two detection kernels are launched (bench_masking's ``c_w8``) takes them
through :func:`detection_kernels_through`.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace
from unittest import mock

import torch
import torch.nn.functional as F

from lm_eval_sinkmask import fused_mass, intercept
from lm_eval_sinkmask.attention_view import MaskView, Scores


def in_scope(run, a: dict, max_keys: int) -> bool:
    """What every candidate needs of a call and its run: the fused kernels can run on its
    device, at most ``max_keys`` keys (a row's keys are held in registers), the sinks
    themselves masked (not the random control), no extra sink token to leave out."""
    cfg, q = run.config, a["query"]
    return (a["key"].shape[-2] <= max_keys and fused_mass.triton_runs_on(q.device)
            and cfg.mask_target == "sinks"
            and not (cfg.sink_token == "exclude" and run.masker.extra_keys is not None)
            and q.dtype in (torch.float16, torch.bfloat16, torch.float32))


def key_only_view(run, a: dict, chunk: int) -> MaskView | None:
    """The pass's view of the call's mask, where it does not depend on the query row and
    has no head axis (the candidates' scope); None otherwise."""
    q = a["query"]
    mask = run._mask_view(a.get("attn_mask"), a.get("is_causal", False), q.shape[0],
                          q.shape[-2], a["key"].shape[-2], q.device, chunk)
    if not mask.key_only or mask.rows.shape[1] != 1 or (
            mask.attn_mask is not None and mask.attn_mask.shape[1] != 1):
        return None
    return mask


def scores_of(a: dict, mask: MaskView) -> Scores:
    return Scores(a["query"], a["key"], a["value"], mask, a.get("scale"),
                  a.get("enable_gqa", False))


def previous_choice(run, layer: int, sc: Scores):
    """(keys [B, H or 1, S' <= Sk], their number) chosen at this layer on the last pass, or
    (None, None): as ``_Run._previous``, without padding the keys (the kernels read past S'
    as not chosen)."""
    kept = run.previous.get(layer) if run.config.detect == "previous" else None
    if kept is None or kept.keys.shape[0] != sc.batch or kept.keys.shape[-1] > sc.n_k:
        return None, None
    return kept.keys, kept.count


def decision(run, layer: int, sc: Scores, out, selected, previous, n_previous, name: str):
    """The call's ``_Decision``, the run's state updated as the package updates it: the
    detection counted under ``name``, this pass's choice kept for the next pass. selected:
    (scores, sinks, chosen, number of sinks, number chosen)."""
    scores, sinks, chosen, n_sinks, n_chosen = selected
    run.stats.count_detection(name)
    run.previous[layer] = intercept._Chosen(chosen, n_chosen)
    if previous is None:  # detect=current, or the first pass: this pass's choice
        blocked, n_blocked = chosen, n_chosen
    else:  # observers read the blocked keys key by key: only they need them padded
        blocked = F.pad(previous, (0, sc.n_k - previous.shape[-1]), value=False) \
            if run.masker.observers else previous
        n_blocked = n_previous
    return intercept._Decision(sc, blocked, False, out, scores, sinks, chosen, n_sinks,
                               n_blocked)


@contextmanager
def taken_by(handles, decide):
    """Within the block, each intercepted call for which ``handles(run, a)`` holds is decided
    by ``decide(run, layer, a, chunk)`` (None: not in scope after all); every other call by
    the package as before."""
    package_decide = intercept._Run._decide

    def _decide(run, layer, a, chunk):
        d = decide(run, layer, a, chunk) if handles(run, a) else None
        return package_decide(run, layer, a, chunk) if d is None else d

    intercept._Run._decide = _decide
    try:
        yield
    finally:
        intercept._Run._decide = package_decide


@contextmanager
def detection_kernels_through(wrap):
    """A block within which fused_mass launches each of its two detection kernels through
    ``wrap(kernel, name)``, an object indexed by the grid as the kernel is (nothing changes
    where fused_mass has no Triton to launch)."""
    kernels = fused_mass._kernels()
    if kernels is None:
        yield
        return
    spy = SimpleNamespace(**{name: wrap(getattr(kernels, name), name)
                             for name in ("row_lse_kernel", "column_mass_kernel")})
    with mock.patch.object(fused_mass, "_kernels", lambda: spy):
        yield
