"""Triton kernels of :mod:`fused_mass`: the row log-sum-exp, then the column mass.

Imported only when Triton is (``fused_mass`` imports this module lazily), so the package never
needs Triton. With ``TRITON_INTERPRET=1`` set before the first import, Triton runs these same
kernels in its interpreter on CPU tensors, which is how the tests check them without a GPU.

Written against the plain ``tl.load`` / ``tl.dot`` / ``tl.store`` API, which Triton 3.x keeps
stable (checked with 3.6 and 3.9). Both kernels read Q and K (and the mask), never V.

Mask conventions (shared by both kernels, and by the torch reference in :mod:`fused_mass`):
key ``j`` is visible to query row ``i`` iff ``j < n_k``; and, with ``CAUSAL``,
``j <= i + causal_offset``; and, with a bool mask, ``mask[i, j]`` is true; and, with a float
mask, ``mask[i, j] > hidden_below`` (the mask is then also added to the scores). The mask is
read through four strides, 0 along broadcast dimensions.

``MASK_ROWS`` false (a mask that is the same for every query row, such as a padding mask
[B, 1, 1, Sk], or a call of one row) reads one row of keys per tile and broadcasts it: the same
values as the [BLOCK_M, BLOCK_N] tile load, which for such a mask loads BLOCK_M copies of each
and, compiled for sm_90 (bf16, head size 128), cost the row pass 254 registers with spills
against 71 without (tests/test_triton_compiles.py compiles both).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _scores_tile(q, kt, offs_m, offs_n, M, b, h, n_k, scale, causal_offset, hidden_below,
                 stride_mb, stride_mh, stride_mm, stride_mn, row_ok,
                 HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, CAUSAL: tl.constexpr,
                 IEEE: tl.constexpr, UPCAST: tl.constexpr, MASK_ROWS: tl.constexpr):
    """Scaled scores of one [BLOCK_M, BLOCK_N] tile, -inf where the key is hidden."""
    if UPCAST:
        q = q.to(tl.float32)
        kt = kt.to(tl.float32)
    if IEEE:
        s = tl.dot(q, kt, input_precision="ieee")
    else:
        s = tl.dot(q, kt)
    s = s * scale
    key_ok = offs_n < n_k
    visible = row_ok[:, None] & key_ok[None, :]
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
    if HAS_MASK:
        mp = M + b * stride_mb + h * stride_mh
        if MASK_ROWS:
            mv = tl.load(mp + offs_m[:, None] * stride_mm + offs_n[None, :] * stride_mn,
                         mask=row_ok[:, None] & key_ok[None, :], other=0)
        else:  # one row of keys, broadcast (rows outside the call are hidden above anyway)
            mv = tl.load(mp + offs_n * stride_mn, mask=key_ok, other=0)[None, :]
        if MASK_BOOL:
            visible = visible & (mv != 0)
        else:
            mv = mv.to(tl.float32)
            visible = visible & (mv > hidden_below)
            s = s + mv
    return tl.where(visible, s, float("-inf"))


@triton.jit
def row_lse_kernel(Q, K, M, LSE,
                   stride_qb, stride_qh, stride_qm, stride_qd,
                   stride_kb, stride_kh, stride_kn, stride_kd,
                   stride_mb, stride_mh, stride_mm, stride_mn,
                   H, GROUP, n_q, n_k, head_dim, row0, scale, causal_offset, hidden_below,
                   HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, CAUSAL: tl.constexpr,
                   IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MASK_ROWS: tl.constexpr):
    """LSE[b, h, i] = log sum_j exp(s_ij) over the visible keys (online over key tiles);
    -inf for a row that sees no key. One program per (query tile, batch x head)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    m0 = row0 + pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n_q
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm
                + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & (offs_d[None, :] < head_dim), other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    hi = n_k
    if CAUSAL:  # keys past the tile's last row + offset are hidden from all its rows
        hi = tl.minimum(hi, m0 + BLOCK_M + causal_offset)
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kt = tl.load(K + b * stride_kb + hk * stride_kh + offs_n[None, :] * stride_kn
                     + offs_d[:, None] * stride_kd,
                     mask=(offs_n[None, :] < n_k) & (offs_d[:, None] < head_dim), other=0.0)
        s = _scores_tile(q, kt, offs_m, offs_n, M, b, h, n_k, scale, causal_offset,
                         hidden_below, stride_mb, stride_mh, stride_mm, stride_mn, row_ok,
                         HAS_MASK, MASK_BOOL, CAUSAL, IEEE, UPCAST, MASK_ROWS)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp(m_i - m_safe) + tl.sum(tl.exp(s - m_safe[:, None]), 1)
        m_i = m_new
    lse = tl.where(l_i > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    tl.store(LSE + bh * n_q + offs_m, lse, mask=row_ok)


@triton.jit
def column_mass_kernel(Q, K, M, LSE, W, OUT,
                       stride_qb, stride_qh, stride_qm, stride_qd,
                       stride_kb, stride_kh, stride_kn, stride_kd,
                       stride_mb, stride_mh, stride_mm, stride_mn,
                       H, GROUP, n_q, n_k, head_dim, row0, scale, causal_offset, hidden_below,
                       HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, CAUSAL: tl.constexpr,
                       IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MASK_ROWS: tl.constexpr):
    """OUT[b, h, j] = sum_i W[b, i] * exp(s_ij - LSE[b, h, i]) over rows i >= row0 that see
    some key (rows with LSE = -inf weigh nothing). One program per (key tile, batch x head):
    its K tile stays in registers while the query tiles stream past, so no atomics are needed
    and the sum order is fixed (the same mass on every run)."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kt = tl.load(K + b * stride_kb + hk * stride_kh + offs_n[None, :] * stride_kn
                 + offs_d[:, None] * stride_kd,
                 mask=(offs_n[None, :] < n_k) & (offs_d[:, None] < head_dim), other=0.0)
    acc = tl.zeros([BLOCK_N], tl.float32)
    lo = row0
    if CAUSAL:  # rows before the tile's first key - offset see none of its keys
        lo = tl.maximum(lo, ((n0 - causal_offset - row0) // BLOCK_M) * BLOCK_M + row0)
    for m0 in range(lo, n_q, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        row_ok = offs_m < n_q
        q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm
                    + offs_d[None, :] * stride_qd,
                    mask=row_ok[:, None] & (offs_d[None, :] < head_dim), other=0.0)
        s = _scores_tile(q, kt, offs_m, offs_n, M, b, h, n_k, scale, causal_offset,
                         hidden_below, stride_mb, stride_mh, stride_mm, stride_mn, row_ok,
                         HAS_MASK, MASK_BOOL, CAUSAL, IEEE, UPCAST, MASK_ROWS)
        lse = tl.load(LSE + bh * n_q + offs_m, mask=row_ok, other=float("-inf"))
        w = tl.load(W + b * n_q + offs_m, mask=row_ok, other=0.0)
        dead = lse == float("-inf")
        w = tl.where(dead, 0.0, w)
        p = tl.exp(s - tl.where(dead, 0.0, lse)[:, None])
        acc += tl.sum(p * w[:, None], 0)
    tl.store(OUT + bh * n_k + offs_n, acc, mask=offs_n < n_k)
