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

import taken_calls
from lm_eval_sinkmask import compiled_tail, intercept
from lm_eval_sinkmask._decode_kernels import keeps_some, key_mask, store_selection, top_k_of
from lm_eval_sinkmask.decode_step import key_mask_view
from lm_eval_sinkmask.fused_mass import LAUNCH_OPTIONS, block_of
from lm_eval_sinkmask.metric import KeyCounts, key_counts

MAX_KEYS = 16384  # one program holds a row's keys in registers; longer rows stay eager
BIAS_ALIGN = 8  # CUDA's memory-efficient attention reads its mask in rows aligned to 8


@triton.jit
def _select_kernel(MASS, UNSEEN, ROWS, NKEYS, OTHERS, SEVERAL, SCORES, SINKS, CHOSEN, COUNTS,
                   BLOCKED, M, BIAS,
                   H, H_OUT, n_k, n_blocked, eps, hidden_below,
                   s_mb, s_mh, s_mn, s_ub, s_uh, s_un, s_rb, s_rh, s_rn, s_sb, s_sn,
                   s_nb, s_ob, s_bb, s_bh, s_bn, s_Mb, s_Mh, s_Mn, s_Br,
                   K: tl.constexpr, PER_LAYER: tl.constexpr, BLOCK: tl.constexpr,
                   WRITE_BIAS: tl.constexpr, HAS_BLOCKED: tl.constexpr,
                   HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr):
    """One (batch element, head) row: scores, Eq. 3 sinks and the top-K of them; with
    WRITE_BIAS also the row's additive mask for the masked output (see :func:`output_bias`)."""
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

    chosen = top_k_of(scores, sinks, offs, K)

    out = pid * n_k + offs
    store_selection(SCORES, SINKS, CHOSEN, COUNTS, out, in_k, scores, sinks, chosen)
    if WRITE_BIAS:
        if HAS_BLOCKED:  # last pass's choice; keys past n_blocked are new and stay
            blocked = tl.load(BLOCKED + b * s_bb + h * s_bh + offs * s_bn,
                              mask=offs < n_blocked, other=0) != 0
        else:
            blocked = chosen
        _, bias = output_bias(M, b, h, offs, in_k, blocked, hidden_below, s_Mb, s_Mh, s_Mn,
                              BLOCK, HAS_MASK, MASK_BOOL)
        tl.store(BIAS + pid * s_Br + offs, bias.to(BIAS.dtype.element_ty), mask=in_k)


@triton.jit
def output_bias(M, b, h, offs, in_k, blocked, hidden_below, s_Mb, s_Mh, s_Mn,
                BLOCK: tl.constexpr, HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr):
    """(keys hidden beyond the model's mask, the additive mask) of a call whose model mask
    does not depend on the query row: the model's own (its float values, or 0 / -inf for a
    bool mask) with the blocked keys hidden, unless they are every key the row sees (it then
    keeps its scores), as the package's output mask does; a float mask hides them with its
    dtype's minimum, as there."""
    visible = in_k
    model = tl.zeros([BLOCK], tl.float32)
    if HAS_MASK:
        mv = tl.load(M + b * s_Mb + h * s_Mh + offs * s_Mn, mask=in_k, other=0)
        visible, model = key_mask(mv, visible, hidden_below, MASK_BOOL)
    drop = blocked & keeps_some(visible, blocked, BLOCK)
    if HAS_MASK and not MASK_BOOL:  # hidden_below is finfo.min / 2
        return drop & visible, tl.where(drop, hidden_below * 2, model)
    return drop & visible, tl.where(drop | ~visible, float("-inf"), 0.0)


def select_and_count(mass: torch.Tensor, counts: KeyCounts, *, eps: float, k: int,
                     per_layer: bool):
    """What :func:`lm_eval_sinkmask.compiled_tail.select_and_count` returns (scores, sinks,
    chosen, number of sinks, number chosen), from one launch. mass: float32 [B, H, Sk]."""
    B, H, n_k = mass.shape
    if n_k > MAX_KEYS or mass.dtype != torch.float32:
        return compiled_tail.select_and_count(mass, counts, eps=eps, k=k, per_layer=per_layer)
    return _launch(mass, counts, eps, k, per_layer)[:5]


def _launch(mass, counts: KeyCounts, eps, k, per_layer, blocked=None, model_mask=None,
            bias_dtype=None):
    """The kernel over mass [B, H, Sk]: (scores, sinks, chosen, number of sinks, number
    chosen, output bias [B, H or 1, Sk] or None). With ``bias_dtype`` it also writes the
    additive output mask hiding ``blocked`` [B, H or 1, S' <= Sk] (or, None, this call's own
    choice) under ``model_mask`` (None, or bool/float broadcastable to [B, H or 1, 1, Sk])."""
    B, H, n_k = mass.shape
    dev = mass.device
    h_out = 1 if per_layer else H
    unseen = counts.unseen.expand(B, h_out, n_k)
    rows = counts.rows.expand(B, h_out, n_k)
    scores = torch.empty(B, h_out, n_k, device=dev, dtype=mass.dtype)
    sinks = torch.empty(B, h_out, n_k, device=dev, dtype=torch.bool)
    chosen = torch.empty(B, h_out, n_k, device=dev, dtype=torch.bool)
    tally = torch.zeros(2, device=dev, dtype=torch.int64)
    bias = None if bias_dtype is None else output_mask_buffer(B, h_out, n_k, bias_dtype, dev)
    m, hidden_below = key_mask_view(model_mask, B, h_out, n_k)
    if m is None:
        m = mass  # never read
    blk = blocked.expand(B, h_out, blocked.shape[-1]) if blocked is not None else sinks
    if blk.dtype == torch.bool:
        blk = blk.view(torch.uint8)
    _select_kernel[(B * h_out,)](
        mass, unseen, rows, counts.n_keys, counts.others, counts.several,
        scores, sinks, chosen, tally, blk, m, scores if bias is None else bias,
        H, h_out, n_k, blk.shape[-1] if blocked is not None else 0, float(eps), hidden_below,
        *mass.stride(), *unseen.stride(), *rows.stride(),
        counts.several.stride(0), counts.several.stride(2),
        counts.n_keys.stride(0), counts.others.stride(0), *blk.stride(),
        m.stride(0), m.stride(1), m.stride(-1), n_k if bias is None else bias.stride(1),
        K=max(int(k), 0), PER_LAYER=bool(per_layer), BLOCK=block_of(n_k),
        WRITE_BIAS=bias is not None, HAS_BLOCKED=blocked is not None,
        HAS_MASK=model_mask is not None,
        MASK_BOOL=model_mask is not None and model_mask.dtype == torch.bool,
        **LAUNCH_OPTIONS)
    return scores, sinks, chosen, tally[0], tally[1], bias


def output_mask_buffer(B: int, h_out: int, n_k: int, dtype, device) -> torch.Tensor:
    """An uninitialised additive output mask [B, H or 1, Sk] whose rows start at multiples
    of :data:`BIAS_ALIGN` elements: CUDA's memory-efficient attention takes it as it is, where
    SDPA would otherwise copy an unaligned mask into a padded one on every call."""
    row = -(-n_k // BIAS_ALIGN) * BIAS_ALIGN
    return torch.empty(B, h_out, row, device=device, dtype=dtype)[..., :n_k]


def select_and_count_from_rows(mass, rows, key_valid, *, eps, k, per_layer):
    """:func:`select_and_count` for the all_rows rule: the key counts of this call's rows
    (eager, as the package makes them), then the one-launch selection."""
    counts = key_counts(rows, key_valid, per_layer=per_layer, dtype=mass.dtype)
    return select_and_count(mass, counts, eps=eps, k=k, per_layer=per_layer)


# -- the call path (variant c_call): detection, the selection and the output mask -------------

CALL_NAME = "fused+select_kernel"  # the detection counter's name for calls taken here


def handles_call(run, a: dict) -> bool:
    """Whether a call of several query rows is in the call path's scope: one whose mask does
    not depend on the row (a DLM's; checked once its view is made), either granularity,
    under a rule whose row counts the pass's mask gives (not all_rows)."""
    return (a["query"].shape[-2] > 1 and taken_calls.in_scope(run, a, MAX_KEYS)
            and run.masker.rule != "all_rows")


def decide_call(run, layer: int, a: dict, chunk: int):
    """``_Run._decide`` for a call in scope, in five launches: the fused path's two detection
    kernels, a memset and the selection kernel, which also writes the output's additive mask
    (last pass's choice hidden under the model's own mask), and the model's SDPA given that
    mask. The package's fused path makes the same mask and output from about 20 more ops."""
    mask = taken_calls.key_only_view(run, a, chunk)
    if mask is None:
        return None
    sc = taken_calls.scores_of(a, mask)
    det = intercept._column_mass_detection(sc, "fused", checked=False)
    previous, n_previous = taken_calls.previous_choice(run, layer, sc)
    per_layer = run.config.granularity == "layer"
    given = mask.attn_mask
    *selected, bias = _launch(
        det.mass, mask.key_counts(per_layer, det.mass.dtype), run.config.eps,
        run.config.top_k, per_layer, blocked=previous, model_mask=given,
        bias_dtype=sc.dtype if given is None or given.dtype == torch.bool else given.dtype)
    kw = {"scale": a.get("scale")}
    if a.get("enable_gqa"):
        kw["enable_gqa"] = True
    out = run.original(sc.query, sc.key, sc.value, attn_mask=bias[:, :, None, :], **kw)
    return taken_calls.decision(run, layer, sc, out, selected, previous, n_previous, CALL_NAME)


def call_path_installed():
    """A block within which every intercepted call in the call path's scope is decided by
    :func:`decide_call`; the others by the package as before."""
    return taken_calls.taken_by(handles_call, decide_call)
