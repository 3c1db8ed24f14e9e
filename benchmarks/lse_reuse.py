"""Detection from the masked output's own row log-sum-exp: a candidate for the fused path.

Why: the fused path's detection is two passes over all keys, a row log-sum-exp and then the
column mass; on an H100 (8B-shaped LLaDA, batch 8, benchmarks/results/gpu_h100.md) the first
pass takes 3.25 of detection's 4.78 ms per forward pass of 4 layers. Yet the memory-efficient
attention kernel that makes the masked output computes every row's log-sum-exp anyway. Under
``detect=previous`` that output hides last pass's choice (at most top_k keys per head, and
only while the row sees another key), so its log-sum-exp lacks exactly their terms:

    lse_i = log(exp(lse_out_i) + sum over hidden keys j of exp(s_ij))

a product of the rows with at most top_k keys, instead of a pass over all of them. Per call:

1. ``_prep_kernel``, one program per (batch element, head): the output's additive mask (the
   model's, last pass's choice hidden, as the call path of select_kernel.py writes it) and
   the positions of the keys it hides beyond the model's mask;
2. the masked output and its row log-sum-exp from one attention call (PyTorch's
   memory-efficient kernel on CUDA, the one SDPA runs for a masked call; its CPU flash kernel
   elsewhere);
3. ``_lse_fix_kernel`` launched where the package launches its row log-sum-exp kernel: the
   hidden keys' terms added back; then the package's column-mass kernel, unchanged;
4. the one-launch selection of select_kernel.py.

Six launches per call (with the counts' memset), against the call path's five and the fused
path's 25, and one pass over the keys instead of two.

This lives beside the benchmarks, not in the package: ``bench_masking.py --gpu`` times it as
variant ``c_lse`` beside the fused path and checks that it masks the same keys and decodes
the same tokens (part ``zoo``); ``tests/test_lse_reuse.py`` runs it in Triton's interpreter on
the CPU against the package's intercept.

Scope (every other call goes through the package): several query rows (a DLM's call), a mask
that does not depend on the row and has no head axis, in the query's dtype where it is a
float one; K with as many heads as Q (the memory-efficient kernel takes no GQA); last pass's
choice in hand (``detect=previous`` after the first pass: the first pass masks its own
choice, known only after detection); mask_target=sinks; no extra sink token; the rule's row
counts from the pass's mask (not all_rows); top_k >= 1; SDPA allowed that kernel
(:func:`kernel_enabled`).
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import torch
import triton
import triton.language as tl

import taken_calls
from lm_eval_sinkmask import fused_mass, intercept
from lm_eval_sinkmask._mass_kernels import _scores_tile
from select_kernel import (MAX_KEYS, block_of, key_mask_view, output_bias, output_mask_buffer,
                           select_and_count)

NAME = "fused+lse_reuse"  # the detection counter's name for calls taken here
# the kernels SDPA runs for a masked call that also return the rows' log-sum-exp (the
# overloads themselves: a call through the packet costs the host a lookup each time)
_EFFICIENT = torch.ops.aten._scaled_dot_product_efficient_attention.default
_CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


@triton.jit
def _prep_kernel(BLOCKED, M, BIAS, IDX, H_OUT, n_k, n_blocked, hidden_below,
                 s_bb, s_bh, s_bn, s_Mb, s_Mh, s_Mn, s_Bb, s_Bh,
                 K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr,
                 HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr):
    """One (batch element, head) row: the output's additive mask with last pass's choice
    hidden, and the positions of the keys that hides beyond the model's mask (at most K,
    lowest first, -1 in the slots past them)."""
    pid = tl.program_id(0)
    b = pid // H_OUT
    h = pid % H_OUT
    offs = tl.arange(0, BLOCK)
    in_k = offs < n_k
    blocked = tl.load(BLOCKED + b * s_bb + h * s_bh + offs * s_bn, mask=offs < n_blocked,
                      other=0) != 0  # keys past n_blocked are new and stay
    hidden, bias = output_bias(M, b, h, offs, in_k, blocked, hidden_below, s_Mb, s_Mh, s_Mn,
                               BLOCK, HAS_MASK, MASK_BOOL)
    tl.store(BIAS + b * s_Bb + h * s_Bh + offs, bias.to(BIAS.dtype.element_ty), mask=in_k)
    left = tl.where(hidden, offs, BLOCK)
    slots = tl.arange(0, KP)
    idx = tl.full([KP], -1, tl.int32)
    for t in tl.static_range(K):
        at = tl.min(left, axis=0)
        idx = tl.where(slots == t, tl.where(at < BLOCK, at, -1), idx)
        left = tl.where(offs == at, BLOCK, left)
    tl.store(IDX + pid * KP + slots, idx)


@triton.jit
def _lse_fix_kernel(Q, K, M, LSE,
                    stride_qb, stride_qh, stride_qm, stride_qd,
                    stride_kb, stride_kh, stride_kn, stride_kd,
                    stride_mb, stride_mh, stride_mm, stride_mn,
                    H, GROUP, n_q, n_k, head_dim, row0, scale, causal_offset, hidden_below,
                    LSE_OUT, s_lb, s_lh, s_lm, IDX, H_IDX,
                    HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, CAUSAL: tl.constexpr,
                    IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MASK_ROWS: tl.constexpr,
                    KP: tl.constexpr):
    """LSE[b, h, i]: the output's row log-sum-exp LSE_OUT with the hidden keys' terms added
    back. Launched with the package's row log-sum-exp kernel's grid and arguments (one program
    per query tile and batch x head), then the extra ones; BLOCK_N is that kernel's and unused:
    the tile here is the KP hidden keys, read where IDX says."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    offs_m = row0 + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n_q
    idx = tl.load(IDX + (b * H_IDX + h % H_IDX) * KP + tl.arange(0, KP))
    offs_n = tl.where(idx >= 0, idx, n_k)  # an empty slot reads as a key past the last
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm
                + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & (offs_d[None, :] < head_dim), other=0.0)
    kt = tl.load(K + b * stride_kb + hk * stride_kh + offs_n[None, :] * stride_kn
                 + offs_d[:, None] * stride_kd,
                 mask=(offs_n[None, :] < n_k) & (offs_d[:, None] < head_dim), other=0.0)
    s = _scores_tile(q, kt, offs_m, offs_n, M, b, h, n_k, scale, causal_offset, hidden_below,
                     stride_mb, stride_mh, stride_mm, stride_mn, row_ok,
                     HAS_MASK, MASK_BOOL, CAUSAL, IEEE, UPCAST, MASK_ROWS)
    lse = tl.load(LSE_OUT + b * s_lb + h * s_lh + offs_m * s_lm, mask=row_ok,
                  other=float("-inf")).to(tl.float32)
    top = tl.maximum(lse, tl.max(s, 1))
    safe = tl.where(top == float("-inf"), 0.0, top)
    total = tl.exp(lse - safe) + tl.sum(tl.exp(s - safe[:, None]), 1)
    lse = tl.where(total > 0, safe + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))
    tl.store(LSE + bh * n_q + offs_m, lse, mask=row_ok)


class _FixLaunch:
    """Stands in for the package's row log-sum-exp kernel: ``kernel[grid](*args, **flags)``
    launches :func:`_lse_fix_kernel` on the same arguments, then the output's log-sum-exp and
    the hidden keys' positions."""

    def __init__(self, lse_out: torch.Tensor, idx: torch.Tensor):
        self.extra = (lse_out, *lse_out.stride(), idx, idx.shape[1])
        self.kp = idx.shape[-1]

    def __getitem__(self, grid):
        return lambda *args, **flags: _lse_fix_kernel[grid](*args, *self.extra, **flags,
                                                           KP=self.kp)


@contextmanager
def _row_lse_from(lse_out: torch.Tensor, idx: torch.Tensor):
    """A block within which the fused path's column mass takes its row log-sum-exp from
    ``lse_out`` and the hidden keys ``idx`` instead of a pass over all keys. Patched by hand,
    not with mock.patch: it runs once per attention call, whose host time is measured."""
    saved = fused_mass._kernels
    fix = SimpleNamespace(row_lse_kernel=_FixLaunch(lse_out, idx),
                          column_mass_kernel=saved().column_mass_kernel)
    fused_mass._kernels = lambda: fix
    try:
        yield
    finally:
        fused_mass._kernels = saved


def prepared(previous: torch.Tensor, model_mask, B: int, h_out: int, n_k: int, dtype, k: int):
    """(additive output mask [B, H or 1, Sk] in ``dtype``, in rows aligned for the
    memory-efficient kernel; positions [B, H or 1, KP] int32 of the keys it hides beyond
    ``model_mask``, -1 past them) from last pass's choice ``previous`` [B, H or 1, S' <= Sk]."""
    dev = previous.device
    bias = output_mask_buffer(B, h_out, n_k, dtype, dev)
    kp = block_of(k)
    idx = torch.empty(B, h_out, kp, device=dev, dtype=torch.int32)
    m, hidden_below = key_mask_view(model_mask, B, h_out, n_k)
    blocked = previous.expand(B, h_out, previous.shape[-1]).view(torch.uint8)
    _prep_kernel[(B * h_out,)](
        blocked, bias if m is None else m, bias, idx, h_out, n_k, blocked.shape[-1],
        hidden_below, *blocked.stride(), *(m.stride() if m is not None else (0, 0, 0)),
        bias.stride(0), bias.stride(1),
        K=int(k), KP=kp, BLOCK=block_of(n_k), HAS_MASK=m is not None,
        MASK_BOOL=model_mask is not None and model_mask.dtype == torch.bool,
        **fused_mass.LAUNCH_OPTIONS)
    return bias, idx


def output_with_lse(q, k, v, bias, scale):
    """(attention output, row log-sum-exp [B, H, Sq] float32) of one call with the additive
    mask ``bias`` [B, H or 1, Sk], from the kernel SDPA runs for a masked call: the
    memory-efficient one on CUDA, the flash one on a CPU."""
    B, H, n_q, _ = q.shape
    mask = bias[:, :, None, :].expand(B, H, n_q, k.shape[-2])
    if q.device.type == "cuda":
        out, lse = _EFFICIENT(q, k, v, mask, True, 0.0, False, scale=scale)[:2]
    else:
        out, lse = _CPU_FLASH(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
    return out, lse[..., :n_q]  # CUDA pads the rows to a multiple of 32


def kernel_enabled(device: torch.device) -> bool:
    """Whether the process lets SDPA run the kernel :func:`output_with_lse` calls. LLaDA-8B's
    and MMaDA's own code turn the memory-efficient one off when the model is built; their
    masked calls then run another kernel, and so they stay with the package here."""
    if device.type == "cuda":
        return torch.backends.cuda.mem_efficient_sdp_enabled()
    return torch.backends.cuda.flash_sdp_enabled()  # the switch of the CPU's flash kernel too


def handles(run, a: dict) -> bool:
    """Whether a call may be in scope (the rest is checked once its mask view is made)."""
    q, key, cfg = a["query"], a["key"], run.config
    return (q.shape[-2] > 1 and key.shape[1] == q.shape[1] and not a.get("is_causal")
            and cfg.detect == "previous" and cfg.top_k >= 1 and run.masker.rule != "all_rows"
            and taken_calls.in_scope(run, a, MAX_KEYS) and kernel_enabled(q.device))


def decide(run, layer: int, a: dict, chunk: int):
    """``_Run._decide`` for a call in scope: the masked output first, its log-sum-exp made
    whole, the column mass and the selection; None (the package decides) where it is not."""
    mask = taken_calls.key_only_view(run, a, chunk)
    if mask is None:
        return None
    sc = taken_calls.scores_of(a, mask)
    previous, n_previous = taken_calls.previous_choice(run, layer, sc)
    given = mask.attn_mask
    if previous is None or (given is not None and given.dtype not in (torch.bool, sc.dtype)):
        return None
    cfg = run.config
    per_layer = cfg.granularity == "layer"
    bias, idx = prepared(previous, given, sc.batch, previous.shape[1], sc.n_k, sc.dtype,
                         cfg.top_k)
    out, lse = output_with_lse(sc.query, sc.key, sc.value, bias, a.get("scale"))
    with _row_lse_from(lse, idx):
        det = intercept._column_mass_detection(sc, "fused", checked=False)
    selected = select_and_count(det.mass, mask.key_counts(per_layer, det.mass.dtype),
                                eps=cfg.eps, k=cfg.top_k, per_layer=per_layer)
    return taken_calls.decision(run, layer, sc, out, selected, previous, n_previous, NAME)


def installed():
    """A block within which every intercepted call in scope is decided by :func:`decide`;
    the others by the package as before."""
    return taken_calls.taken_by(handles, decide)


@contextmanager
def with_call_path():
    """:func:`installed`, and select_kernel's call path for the DLM calls it leaves (each
    block's first pass, which masks its own choice): the two as the package would adopt
    them. The block entered last is asked first."""
    import select_kernel

    with select_kernel.call_path_installed(), installed():
        yield
