"""How a candidate kernel takes over some of the intercept's attention calls.

The candidates beside the benchmarks (select_kernel.py's call path, lse_reuse.py) each make
one call's whole decision (the keys it blocks, this pass's sinks and choice, the masked
output) in fewer launches than the package's path by parts, as the package's own decoding
kernel does for one-row calls (lm_eval_sinkmask/decode_step.py). This module holds what they
share: last pass's choice as the package keeps it, the decision assembled with the run's
state updated as the package updates it, and a block within which :class:`intercept._Run` asks a candidate first
and the package for every call the candidate does not take. A candidate that changes only
how the fused path's two detection kernels are launched (bench_masking's ``c_w8``) takes them
through :func:`detection_kernels_through`.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace
from unittest import mock

import torch

from lm_eval_sinkmask import decode_step, fused_mass, intercept
from lm_eval_sinkmask.attention_view import MaskView, Scores


def in_scope(run, a: dict, max_keys: int) -> bool:
    """What every candidate needs of a call and its run: the fused kernels can run on its
    device, at most ``max_keys`` keys (a row's keys are held in registers), the sinks
    themselves masked (not the random control), no extra sink token to leave out."""
    cfg, q = run.config, a["query"]
    return (a["key"].shape[-2] <= max_keys and fused_mass.triton_runs_on(q.device)
            and cfg.mask_target == "sinks"
            and run.masker.excluded_keys is None
            and q.dtype in (torch.float16, torch.bfloat16, torch.float32))


def key_only_view(run, a: dict, chunk: int) -> MaskView | None:
    """The pass's view of the call's mask, where it does not depend on the query row and
    has no head axis (the candidates' scope); None otherwise."""
    mask = run._mask_view(a, chunk)
    return mask if decode_step.fits(mask) else None


# the call's attention and last pass's choice (unpadded, as the package's decoding kernel
# reads it: the kernels read keys past S' as not chosen), as the package reads them
scores_of = intercept._scores_of


def previous_choice(run, layer: int, sc: Scores):
    return run._previous(layer, sc, padded=False)


def decision(run, layer: int, sc: Scores, out, selected, previous, n_previous, name: str):
    """The call's ``_Decision``, the run's state updated as the package updates it for a
    call decided whole by one kernel (``_Run._decided_whole``)."""
    return run._decided_whole(layer, sc, out, selected, previous, n_previous, name)


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
