"""A one-row attention call (a decoding step) masked in one Triton launch: a candidate.

Why: in a KV-cached decoding step each attention call has one query row, and the masked call
costs about twice the unmasked one on an H100 in wall time and 1.35x in GPU kernel time
(benchmarks/results/gpu_h100.md), almost all of it small launches: the fused path's two
detection kernels, the selection, the output mask and a second SDPA call. Cutting host time
alone cannot meet a 1.3 bar when the GPU itself does 1.35x the work. With one query row the
whole call fits in one program per (batch element, head): the row's logits over all keys
(its probabilities are the column mass, as the last_row rule reads it; under all_rows they
are added to the layer's history), the Eq. 3 counts, scores, sinks and top-k, and the
attention output with the blocked keys removed. K and V are read once each, as by the
unmasked call: one launch and one memset per call, against 26 (last_row) or 45 (all_rows)
torch ops of the package's fused path (``bench_masking.py`` section 6).

This lives beside the benchmarks, not in the package: ``bench_masking.py --gpu`` times it as
variant ``c_decode`` in its decoding section and checks that it masks the same keys and
decodes the same tokens (``--gpu-parts decode``); only a measured gain on a GPU would move it
into the intercept. ``tests/test_decode_kernel.py`` runs it in Triton's interpreter on the
CPU against the package's intercept.

Scope (anything else goes through the package's path, call by call): one query row; a mask
that does not depend on the row (none, key padding, a float bias), whose rows have no head
axis; granularity=head; mask_target=sinks; no extra sink token; up to :data:`MAX_KEYS` keys.
Same arithmetic as the package in float32, not always the same bits (the dot products and
sums run in another order), so a key within an ulp or so of the threshold can fall the other
way; the checks compare chosen keys and tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import taken_calls
from lm_eval_sinkmask.attention_view import Detection, Scores
from select_kernel import (block_of, keeps_some, key_mask, key_mask_view, store_selection,
                           top_k_of)

MAX_KEYS = 16384  # one program holds a row's keys in registers; longer rows use the package
BLOCK_N = 64  # keys per tile of the two passes over K and V
NAME = "decode_kernel"  # the detection counter's name for calls made here


@triton.jit
def _decode_kernel(Q, K, V, M, W, ROWS, VALID, OLD_MASS, OLD_ROWS, PREV,
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
    if HAS_MASK and not MASK_BOOL:  # a row that sees no key: SDPA's output under a float mask,
        p = tl.where(total_e > 0, p, 1.0 / n_k)  # whose finfo.min terms make it uniform
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


def masked_decode(sc: Scores, *, eps: float, k: int, previous: torch.Tensor | None,
                  history: Detection | None):
    """One one-row call's (output [B, H, 1, Dv], scores, sinks, chosen [B, H, Sk], number of
    sinks, number chosen, Detection of the history or None) in one launch.

    previous: bool [B, H, S'] with S' <= Sk, the keys to remove (last pass's choice; keys past
    S' are new and stay), or None to remove this call's own choice. history (all_rows):
    the column mass [B, H, Sk - 1] and rows [B, 1, Sk - 1] of the layer's earlier steps, or
    None under last_row; with it the call also returns the updated history."""
    q, k_, v, mask = sc.query, sc.key, sc.value, sc.mask
    B, H, _, D = q.shape
    n_k, dv = k_.shape[-2], v.shape[-1]
    dev = q.device
    scale = sc.scale if sc.scale is not None else D ** -0.5
    m, hidden_below = key_mask_view(mask.attn_mask, B, H, n_k)
    if m is None:
        m = q[:, :, 0]  # never read
    rows = mask.rows.expand(B, 1, n_k)
    weight = mask.qw[:, 0, 0, 0]  # the row's weight in Q: 1, or 0 for a padding row
    valid = mask.key_valid.view(torch.uint8)
    out = torch.empty(B, H, 1, dv, device=dev, dtype=q.dtype)
    scratch = torch.empty(B * H, n_k, device=dev, dtype=torch.float32)
    scores = torch.empty(B, H, n_k, device=dev, dtype=torch.float32)
    sinks = torch.empty(B, H, n_k, device=dev, dtype=torch.bool)
    chosen = torch.empty(B, H, n_k, device=dev, dtype=torch.bool)
    tally = torch.zeros(2, device=dev, dtype=torch.int64)
    if history is not None:
        old_mass, old_rows = history.mass, history.rows.expand(B, 1, history.rows.shape[-1])
        new_mass = torch.empty(B, H, n_k, device=dev, dtype=torch.float32)
        new_rows = torch.empty(B, 1, n_k, device=dev, dtype=rows.dtype)
        n_old = old_mass.shape[-1]
    else:
        old_mass, old_rows, new_mass, new_rows, n_old = scores, rows, scores, rows, 0  # unread
    prev = previous.view(torch.uint8) if previous is not None else sinks  # unread if None
    n_prev = previous.shape[-1] if previous is not None else 0
    _decode_kernel[(B * H,)](
        q, k_, v, m, weight, rows, valid, old_mass, old_rows, prev,
        out, scratch, scores, sinks, chosen, new_mass, new_rows, tally,
        q.stride(0), q.stride(1), q.stride(3), *k_.stride(), *v.stride(), *m.stride(),
        weight.stride(0), rows.stride(0), rows.stride(2), valid.stride(0), valid.stride(1),
        old_mass.stride(0), old_mass.stride(1), old_mass.stride(2),
        old_rows.stride(0), old_rows.stride(2), *_head_strides(prev, H),
        out.stride(0), out.stride(1), out.stride(3),
        H, H // k_.shape[1], n_k, n_old, n_prev, D, dv, float(scale), hidden_below, float(eps),
        HAS_MASK=mask.attn_mask is not None, MASK_BOOL=mask.attn_mask is not None
        and mask.attn_mask.dtype == torch.bool, HISTORY=history is not None,
        HAS_PREV=previous is not None, TOP_K=max(int(k), 0), BLOCK=block_of(n_k),
        BLOCK_N=BLOCK_N, BLOCK_D=block_of(D), BLOCK_DV=block_of(dv), num_warps=4)
    new = Detection(new_mass, new_rows) if history is not None else None
    return out, scores, sinks, chosen, tally[0], tally[1], new


def _head_strides(t: torch.Tensor, H: int) -> tuple[int, int, int]:
    """(batch, head, key) strides of [B, H or 1, S'], 0 along a broadcast head axis."""
    return t.stride(0), (t.stride(1) if t.shape[1] == H else 0), t.stride(2)


def handles(run, a: dict) -> bool:
    """Whether this call is in the kernel's scope (see the module docstring); the mask is
    checked once its view is made (:func:`decide`)."""
    return (a["query"].shape[-2] == 1 and taken_calls.in_scope(run, a, MAX_KEYS)
            and run.config.granularity == "head" and run.masker.rule in ("last_row", "all_rows"))


def decide(run, layer: int, a: dict, chunk: int):
    """``_Run._decide`` for a one-row call in scope: the same decision (keys blocked, this
    pass's sinks and choice, the masked output) from :func:`masked_decode`, with the run's
    state (last pass's choice, the all_rows history, the stats) kept as the package keeps
    it. None where the mask is out of scope."""
    mask = taken_calls.key_only_view(run, a, chunk)
    if mask is None:
        return None
    sc = taken_calls.scores_of(a, mask)
    previous, n_previous = taken_calls.previous_choice(run, layer, sc)
    history = None
    if run.masker.rule == "all_rows":
        old = run.history.get(layer)
        if old is not None and old.mass.shape[:2] == (sc.batch, sc.heads) \
                and old.mass.shape[-1] + 1 == sc.n_k:
            history = old
        else:  # start over, as _Run._with_history does: no rows before this one
            history = Detection(sc.query.new_zeros(sc.batch, sc.heads, 0, dtype=torch.float32),
                                mask.rows.new_zeros(sc.batch, 1, 0))
    out, *selected, new = masked_decode(sc, eps=run.config.eps, k=run.config.top_k,
                                        previous=previous, history=history)
    if new is not None:
        run.history[layer] = new
    return taken_calls.decision(run, layer, sc, out, selected, previous, n_previous, NAME)


def installed():
    """A block within which every intercepted one-row call in scope is decided by the
    kernel; the others, and every call where it is not in scope, by the package as before."""
    return taken_calls.taken_by(handles, decide)
