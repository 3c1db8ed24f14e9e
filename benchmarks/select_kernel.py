"""Eq. 3 selection of one attention call in one Triton launch: a candidate for the fused path.

Why: on a GPU at batch 1 and in one-row decoding steps a masked attention call is bound by
the host, not the device, and the largest share of the host's time per call is the selection
(``compiled_tail.select_and_count``: about 25 small tensor ops eager, a handful of fused kernels
compiled, whose guards on dynamic shapes cost the host about as much as the launches they
save). Here the whole of it (scores in units of the uniform share, the others-mean threshold,
the top-k with ties to the lower position, the two counts) is one program per (batch element,
head) over all of that row's keys, so one launch (and one memset for the counts) per call.

This lives beside the benchmarks, not in the package: ``bench_masking.py --gpu`` times it as
variant ``c_kernel`` beside the compiled and the eager selection and checks that it selects
what they select (``--gpu-parts select``); only a measured gain on a GPU would move it into
``compiled_tail``. ``tests/test_select_kernel.py`` runs it in Triton's interpreter on the CPU
against ``metric.select_counted``.

Same arithmetic as :func:`lm_eval_sinkmask.metric.select_counted` in float32, but not always
the same bits: the sum of a row's scores (the threshold's total) and, under
``granularity=layer``, the mean over heads are reduced in another order, so a key within an
ulp or so of the threshold can fall the other way. The checks compare the selected keys.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lm_eval_sinkmask import compiled_tail
from lm_eval_sinkmask.metric import KeyCounts, key_counts

MAX_KEYS = 16384  # one program holds a row's keys in registers; longer rows stay eager


@triton.jit
def _select_kernel(MASS, UNSEEN, ROWS, NKEYS, OTHERS, SEVERAL, SCORES, SINKS, CHOSEN, COUNTS,
                   H, H_OUT, n_k, eps,
                   s_mb, s_mh, s_mn, s_ub, s_uh, s_un, s_rb, s_rh, s_rn, s_sb, s_sn,
                   s_nb, s_ob,
                   K: tl.constexpr, PER_LAYER: tl.constexpr, BLOCK: tl.constexpr):
    """One (batch element, head) row: scores, Eq. 3 sinks and the top-K of them."""
    pid = tl.program_id(0)
    b = pid // H_OUT
    h = pid % H_OUT
    offs = tl.arange(0, BLOCK)
    in_k = offs < n_k
    if PER_LAYER:  # granularity=layer: the heads' mean mass
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for hh in range(0, H):
            acc += tl.load(MASS + b * s_mb + hh * s_mh + offs * s_mn, mask=in_k, other=0.0)
        mass = acc / H
    else:
        mass = tl.load(MASS + b * s_mb + h * s_mh + offs * s_mn, mask=in_k, other=0.0)
    unseen = tl.load(UNSEEN + b * s_ub + h * s_uh + offs * s_un, mask=in_k, other=1) != 0
    rows = tl.load(ROWS + b * s_rb + h * s_rh + offs * s_rn, mask=in_k, other=1.0)
    several = tl.load(SEVERAL + b * s_sb + offs * s_sn, mask=in_k, other=0) != 0
    n_keys = tl.load(NKEYS + b * s_nb)
    others = tl.load(OTHERS + b * s_ob)

    scores = tl.where(unseen | ~in_k, 0.0, n_keys * mass / rows)
    total = tl.sum(scores, axis=0)
    sinks = several & (scores > (total - scores) / others + eps)

    # top-K by repeated argmax: the largest remaining sink, ties to the lower position (as a
    # stable descending sort); a row with fewer than K sinks chooses all of them
    ranked = tl.where(sinks, scores, float("-inf"))
    chosen = offs < 0
    for _ in tl.static_range(K):
        at = tl.argmax(ranked, axis=0, tie_break_left=True)
        hit = (offs == at) & (ranked > float("-inf"))  # -inf left: no sink to choose
        chosen = chosen | hit
        ranked = tl.where(hit, float("-inf"), ranked)

    out = pid * n_k + offs
    tl.store(SCORES + out, scores, mask=in_k)
    tl.store(SINKS + out, sinks, mask=in_k)
    tl.store(CHOSEN + out, chosen, mask=in_k)
    tl.atomic_add(COUNTS, tl.sum(sinks.to(tl.int64), axis=0))
    tl.atomic_add(COUNTS + 1, tl.sum(chosen.to(tl.int64), axis=0))


def select_and_count(mass: torch.Tensor, counts: KeyCounts, *, eps: float, k: int,
                     per_layer: bool):
    """What :func:`lm_eval_sinkmask.compiled_tail.select_and_count` returns (scores, sinks,
    chosen, number of sinks, number chosen), from one launch. mass: float32 [B, H, Sk]."""
    B, H, n_k = mass.shape
    if n_k > MAX_KEYS or mass.dtype != torch.float32:
        return compiled_tail.select_and_count(mass, counts, eps=eps, k=k, per_layer=per_layer)
    h_out = 1 if per_layer else H
    unseen = counts.unseen.expand(B, h_out, n_k)
    rows = counts.rows.expand(B, h_out, n_k)
    scores = torch.empty(B, h_out, n_k, device=mass.device, dtype=mass.dtype)
    sinks = torch.empty(B, h_out, n_k, device=mass.device, dtype=torch.bool)
    chosen = torch.empty_like(sinks)
    tally = torch.zeros(2, device=mass.device, dtype=torch.int64)
    _select_kernel[(B * h_out,)](
        mass, unseen, rows, counts.n_keys, counts.others, counts.several,
        scores, sinks, chosen, tally,
        H, h_out, n_k, float(eps),
        *mass.stride(), *unseen.stride(), *rows.stride(),
        counts.several.stride(0), counts.several.stride(2),
        counts.n_keys.stride(0), counts.others.stride(0),
        K=max(int(k), 0), PER_LAYER=bool(per_layer), BLOCK=triton.next_power_of_2(n_k))
    return scores, sinks, chosen, tally[0], tally[1]


def select_and_count_from_rows(mass, rows, key_valid, *, eps, k, per_layer):
    """:func:`select_and_count` for the all_rows rule: the key counts of this call's rows
    (eager, as the package makes them), then the one-launch selection."""
    counts = key_counts(rows, key_valid, per_layer=per_layer, dtype=mass.dtype)
    return select_and_count(mass, counts, eps=eps, k=k, per_layer=per_layer)
