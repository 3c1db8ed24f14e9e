"""Eq. 3 selection in fewer kernel launches: what ``metric.select_sinks`` does per call, under
``torch.compile``, with the two per-call counts the stats keep (:func:`select_and_count`).

Why this: once detection is two Triton kernels (:mod:`fused_mass`), what is left of a masked
attention call at batch 1 or in a one-row decoding step is launch overhead, not GPU work. The
largest share is the selection: ``select_sinks`` is about 25 small tensor ops (scores, the
others-mean threshold, a stable sort for the top-k), each a separate CUDA launch and a few
microseconds of Python, on tensors of a few thousand elements; 32 layers pay it 32 times per
step. Its counts of keys and rows depend on the mask alone and are made once per forward pass
(:class:`metric.KeyCounts`, eager); the rest (:func:`metric.select_counted`), or all of it
under the all_rows rule, whose counts change with every call
(:func:`select_and_count_from_rows`), is compiled and runs as a handful of fused kernels.
The alternatives were weighed and not taken: CUDA graphs need fixed shapes, but the key
count grows with every decoding step and differs per task; hand-fusing the ops would make a
second copy of Eq. 3, where this keeps the one pure function (``dynamic=True``: one graph
serves every key count).

Used only where it pays and is cheap to be wrong about: tensors on CUDA, the fused detection
path. If compiling fails in an environment (no compiler toolchain, an unsupported Triton),
the eager function is used from then on, with one warning; the selection is the same function
either way. ``SINKMASK_COMPILE_TAIL=0`` (or :data:`ENABLED` = False) keeps it eager.
"""

from __future__ import annotations

import os

import torch

from .log import module_logger
from .metric import KeyCounts, key_counts, select_counted

logger = module_logger(__name__)

ENABLED = os.environ.get("SINKMASK_COMPILE_TAIL", "1") != "0"


def select_and_count(mass, counts: KeyCounts, *, eps, k, per_layer):
    """:func:`metric.select_counted` (:func:`metric.select_sinks` given the pass's key
    counts), and how many sinks it found and keys it chose (0-dim tensors, for
    :meth:`MaskingStats.defer_counts`). Why one function: compiled, the two sums fuse into
    the selection's kernels instead of costing two launches per call."""
    scores, sinks, chosen = select_counted(mass, counts, eps=eps, k=k, per_layer=per_layer)
    return scores, sinks, chosen, sinks.sum(), chosen.sum()


def select_and_count_from_rows(mass, rows, key_valid, *, eps, k, per_layer):
    """:func:`select_and_count` with the key counts made in the same call, from rows
    [B, H or 1, Sk] and key_valid [B, Sk]: for the all_rows rule, whose rows grow with each
    call's history, so that no pass can share them; compiled, the counts fuse with the rest
    instead of costing their own launches per call."""
    counts = key_counts(rows, key_valid, per_layer=per_layer, dtype=mass.dtype)
    return select_and_count(mass, counts, eps=eps, k=k, per_layer=per_layer)


class _Compiled:
    """``fn`` (:func:`select_and_count` or :func:`select_and_count_from_rows`) compiled on
    first use, falling back to eager for good on an error."""

    def __init__(self, fn=select_and_count):
        self.eager = fn
        self.fn = None
        self.failed = False

    def __call__(self, *args, **kwargs):
        if not self.failed:
            try:
                if self.fn is None:
                    self.fn = torch.compile(self.eager, dynamic=True)
                return self.fn(*args, **kwargs)
            except Exception as e:  # a compiler/toolchain problem, not a wrong selection
                self.failed = True
                logger.warning("torch.compile of the sink selection failed (%s: %s); using the "
                               "eager %s from now on", type(e).__name__, e, self.eager.__name__)
        return self.eager(*args, **kwargs)


_COMPILED = _Compiled()
_COMPILED_FROM_ROWS = _Compiled(select_and_count_from_rows)


def compile_failed() -> bool:
    """Whether either compiled selection fell back to eager in this process."""
    return _COMPILED.failed or _COMPILED_FROM_ROWS.failed


def selector(device: torch.device, unmaterialized: bool, from_rows: bool = False):
    """The selection function for a call on ``device``: :func:`select_and_count` given the
    pass's key counts, or with ``from_rows`` :func:`select_and_count_from_rows`; compiled on
    CUDA when detection never held the probabilities (``unmaterialized``: the fused or the
    flex path), else eager (CPU, and the materialised path kept as it was for comparison)."""
    compiled = ENABLED and unmaterialized and device.type == "cuda"
    if from_rows:
        return _COMPILED_FROM_ROWS if compiled else select_and_count_from_rows
    return _COMPILED if compiled else select_and_count
