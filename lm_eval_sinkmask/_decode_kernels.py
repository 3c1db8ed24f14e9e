"""Triton kernel of :mod:`decode_step`: a one-row attention call, detected and masked in one launch.

Imported only when Triton is (``decode_step`` imports it lazily), so the package never needs
Triton; under ``TRITON_INTERPRET=1`` Triton runs it in its interpreter on CPU tensors, which
is how the tests check it without a GPU.

One program per (batch element, query head) holds the row's logits over every key in
registers (at most :data:`decode_step.MAX_KEYS`): pass 1 over K writes them, the row's
softmax is the column mass (the row is all of Q under last_row; under all_rows it is added
to the layer's earlier rows), then the Eq. 3 counts, scores, sinks and top-k, and pass 2
over V the output with the blocked keys left out of the softmax. The selection helpers
(:func:`top_k_of` and the others) follow :mod:`metric` line for line; a candidate kernel
beside the benchmarks shares them.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def top_k_of(scores, sinks, offs, K: tl.constexpr):
    """The top-K sinks of one row by repeated argmax: the largest remaining sink, ties to the
    lower position (as :func:`metric.top_k_sinks`' stable descending sort); a row with fewer
    than K sinks chooses all of them."""
    ranked = tl.where(sinks, scores, float("-inf"))
    chosen = offs < 0
    for _ in tl.static_range(K):
        at = tl.argmax(ranked, axis=0, tie_break_left=True)
        hit = (offs == at) & (ranked > float("-inf"))  # -inf left: no sink to choose
        chosen = chosen | hit
        ranked = tl.where(hit, float("-inf"), ranked)
    return chosen


@triton.jit
def keeps_some(visible, blocked, BLOCK: tl.constexpr):
    """Whether the row still sees a key once the blocked keys leave it, on every lane: where
    it does not, the package keeps the row's scores (removes nothing)."""
    return tl.sum((visible & ~blocked).to(tl.int32), axis=0) + tl.zeros([BLOCK], tl.int32) > 0


@triton.jit
def store_selection(SCORES, SINKS, CHOSEN, COUNTS, out, in_k, scores, sinks, chosen):
    """A row's scores, sinks and chosen keys stored at ``out``, and both counts added."""
    tl.store(SCORES + out, scores, mask=in_k)
    tl.store(SINKS + out, sinks, mask=in_k)
    tl.store(CHOSEN + out, chosen, mask=in_k)
    tl.atomic_add(COUNTS, tl.sum(sinks.to(tl.int64), axis=0))
    tl.atomic_add(COUNTS + 1, tl.sum(chosen.to(tl.int64), axis=0))


@triton.jit
def key_mask(mv, visible, hidden_below, MASK_BOOL: tl.constexpr):
    """(visibility, float term to add to the scores) of a model mask's loaded values: a bool
    mask hides where false and adds nothing; a float one hides at or below ``hidden_below``
    (half its dtype's minimum) and adds its values."""
    if MASK_BOOL:
        return visible & (mv != 0), tl.zeros(mv.shape, tl.float32)
    term = mv.to(tl.float32)
    return visible & (term > hidden_below), term


@triton.jit
def decode_kernel(Q, K, V, M, W, ROWS, VALID, OLD_MASS, OLD_ROWS, PREV,
                  OUT, SCRATCH, SCORES, SINKS, CHOSEN, NEW_MASS, NEW_ROWS, COUNTS,
                  s_qb, s_qh, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                  s_mb, s_mh, s_mn, s_wb, s_rb, s_rn, s_xb, s_xn, s_hb, s_hh, s_hn, s_gb, s_gn,
                  s_pb, s_ph, s_pn, s_ob, s_oh, s_od,
                  H, GROUP, n_k, n_old, n_prev, head_dim, v_dim, scale, hidden_below, eps,
                  HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, HISTORY: tl.constexpr,
                  HAS_PREV: tl.constexpr, TOP_K: tl.constexpr, BLOCK: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One (batch element, head): logits, column mass, Eq. 3 selection, masked output."""
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    hk = h // GROUP
    row = SCRATCH + pid * n_k
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(Q + b * s_qb + h * s_qh + offs_d * s_qd, mask=offs_d < head_dim,
                other=0.0).to(tl.float32)

    # pass 1 over K: the row's scaled logits, -inf where the mask hides the key
    for n0 in range(0, n_k, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < n_k
        kt = tl.load(K + b * s_kb + hk * s_kh + offs_n[:, None] * s_kn + offs_d[None, :] * s_kd,
                     mask=n_ok[:, None] & (offs_d[None, :] < head_dim), other=0.0)
        s = tl.sum(kt.to(tl.float32) * q[None, :], axis=1) * scale
        visible = n_ok
        if HAS_MASK:
            mv = tl.load(M + b * s_mb + h * s_mh + offs_n * s_mn, mask=n_ok, other=0)
            visible, term = key_mask(mv, visible, hidden_below, MASK_BOOL)
            s = s + term
        tl.store(row + offs_n, tl.where(visible, s, float("-inf")), mask=n_ok)
    tl.debug_barrier()

    # the whole row: its probabilities are the column mass of the call's one row
    offs = tl.arange(0, BLOCK)
    in_k = offs < n_k
    logits = tl.load(row + offs, mask=in_k, other=float("-inf"))
    top = tl.max(logits, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)  # a row that sees no key: mass 0
    e = tl.exp(logits - top)
    total_e = tl.sum(e, axis=0)
    mass = e / tl.where(total_e > 0, total_e, 1.0) * tl.load(W + b * s_wb)
    rows = tl.load(ROWS + b * s_rb + offs * s_rn, mask=in_k, other=0)
    if HISTORY:  # all_rows under a KV cache: this row added to the rows of earlier steps
        old = offs < n_old
        mass = tl.load(OLD_MASS + b * s_hb + h * s_hh + offs * s_hn, mask=old, other=0.0) + mass
        rows = tl.load(OLD_ROWS + b * s_gb + offs * s_gn, mask=old, other=0) + rows
        tl.store(NEW_MASS + pid * n_k + offs, mass, mask=in_k)
        if h == 0:
            tl.store(NEW_ROWS + b * n_k + offs, rows, mask=in_k)

    # Eq. 3 counts (metric.key_counts), scores (metric._share_scores) and sinks
    seen = (tl.load(VALID + b * s_xb + offs * s_xn, mask=in_k, other=0) != 0) & (rows > 0)
    n_keys = tl.sum(seen.to(tl.float32), axis=0) + tl.zeros([BLOCK], tl.float32)  # |K|, per lane
    others = tl.maximum(n_keys - 1.0, 1.0)
    scores = tl.where(seen, n_keys * mass / tl.maximum(rows, 1).to(tl.float32), 0.0)
    total = tl.sum(scores, axis=0)
    sinks = seen & (n_keys > 1.0) & (scores > (total - scores) / others + eps)

    chosen = top_k_of(scores, sinks, offs, TOP_K)

    store_selection(SCORES, SINKS, CHOSEN, COUNTS, pid * n_k + offs, in_k, scores, sinks,
                    chosen)

    # the output: blocked keys (last pass's choice, or this one's) leave the softmax, unless
    # they are every key the row sees (it then keeps its scores, as the package does)
    if HAS_PREV:
        blocked = tl.load(PREV + b * s_pb + h * s_ph + offs * s_pn, mask=offs < n_prev,
                          other=0) != 0
    else:
        blocked = chosen
    visible = logits > float("-inf")
    kept = tl.where(blocked & keeps_some(visible, blocked, BLOCK), float("-inf"), logits)
    top = tl.max(kept, axis=0)
    e = tl.exp(kept - tl.where(top == float("-inf"), 0.0, top))
    total_e = tl.sum(e, axis=0)
    p = e / tl.where(total_e > 0, total_e, 1.0)
    # a row that sees no key (a padding row: no token reads its output): the mean of V, SDPA's
    # output where the float mask's finfo.min terms swamp the scores (float16's -65504 may not)
    if HAS_MASK and not MASK_BOOL:
        p = tl.where(total_e > 0, p, 1.0 / n_k)
    tl.debug_barrier()  # every lane has read the logits before they are overwritten
    tl.store(row + offs, p, mask=in_k)
    tl.debug_barrier()

    # pass 2 over V: the weighted sum of the kept keys' values
    offs_dv = tl.arange(0, BLOCK_DV)
    acc = tl.zeros([BLOCK_DV], tl.float32)
    for n0 in range(0, n_k, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < n_k
        w = tl.load(row + offs_n, mask=n_ok, other=0.0)
        vt = tl.load(V + b * s_vb + hk * s_vh + offs_n[:, None] * s_vn + offs_dv[None, :] * s_vd,
                     mask=n_ok[:, None] & (offs_dv[None, :] < v_dim), other=0.0)
        acc += tl.sum(w[:, None] * vt.to(tl.float32), axis=0)
    tl.store(OUT + b * s_ob + h * s_oh + offs_dv * s_od, acc.to(OUT.dtype.element_ty),
             mask=offs_dv < v_dim)
