"""A decoding step's attention call (one query row) detected and masked in one Triton launch.

Why: with a KV cache every attention call of a decoding step has one query row, and the
fused path spends it on small launches (two detection kernels, the selection, the output
mask, a second SDPA call: 26 torch ops per call under last_row, 45 under all_rows). Timed on
an H200 (8B Llama shape), that made a masked decoding step cost 1.9-2.2 times the unmasked
one; this kernel, 1.2-1.3. With one row the whole call fits in one program per (batch
element, head) (:mod:`_decode_kernels`): the row's logits over all keys, whose softmax is the
column mass the ARM rules read, the Eq. 3 counts, scores, sinks and top-k, and the output
with the blocked keys left out; K and V are read once each, as by the unmasked call.

Scope (:func:`takes`, :func:`fits`; every other call goes the fused path): one query row, a
mask that does not depend on the row and has no head axis (none, key padding, a float bias),
``granularity=head``, ``mask_target=sinks``, no extra sink token left out, at most
:data:`MAX_KEYS` keys, the last_row or all_rows rule (the ARM's), and a device the Triton
kernels run on. The intercept keeps the run's state (last pass's choice, the all_rows history,
the counters) exactly as for the fused path.

Same arithmetic as the fused path in float32, not always the same bits (dot products and sums
run in another order): a key within an ulp or so of the threshold can fall the other way, and
in bfloat16 such a flip at one step changes the next steps' inputs. Under
``detect_backend=auto`` the first call of each kernel variant is therefore checked twice: its
sinks, chosen keys and counts against Eq. 3 and the top-k on its own scores
(:func:`misselected`), and its scores against the fused path's on the same inputs, its output
too where both removed the same keys (:func:`disagreement`): a key at the threshold may fall
either way, so a difference in the keys chosen alone is not a failure.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import fused_mass, metric
from .attention_view import Detection, MaskView, Scores, hidden_below, sdpa_scale

NAME = "fused_decode"  # the detection counter's name for the calls taken here
MAX_KEYS = 16384  # one program holds a row's keys in registers; longer rows take the fused path
BLOCK_N = 64  # keys per tile of the two passes over K and V
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# auto's first-use check: the scores are sums of float32 products in another order (~1e-6
# relative); the output is rounded to the call's dtype by both
SCORES_RTOL = SCORES_ATOL = 1e-3
# and its selection, on the kernel's own scores: a key this close to its Eq. 3 threshold may
# fall either way in another summation order
THRESHOLD_RTOL = 1e-5
OUTPUT_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def _kernels():
    """The decoding kernel's module (:mod:`_decode_kernels`), or None without Triton."""
    return fused_mass.triton_module("_decode_kernels")


def takes(config, rule: str, excluded_keys, query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether a call is in the kernel's scope by its settings and shapes (the mask is asked
    once its view is made: :func:`fits`); ``excluded_keys``: the masker's keys never chosen
    (the kernel chooses among all)."""
    return (query.shape[-2] == 1 and key.shape[-2] <= MAX_KEYS and query.dtype in DTYPES
            and rule in ("last_row", "all_rows") and config.granularity == "head"
            and config.mask_target == "sinks"
            and excluded_keys is None
            and fused_mass.triton_runs_on(query.device) and _kernels() is not None)


def fits(mask: MaskView) -> bool:
    """Whether the kernel reads the call's mask: the same for every query row, no head axis."""
    return (mask.key_only and mask.rows.shape[1] == 1
            and (mask.attn_mask is None or mask.attn_mask.shape[1] == 1))


class Decoded(NamedTuple):
    """One call's decision as the kernel made it."""

    out: torch.Tensor  # [B, H, 1, Dv] the masked output
    scores: torch.Tensor  # [B, H, Sk] Eq. 3 scores, sinks and the top-k of them
    sinks: torch.Tensor
    chosen: torch.Tensor
    n_sinks: torch.Tensor  # 0-dim counts
    n_chosen: torch.Tensor
    history: Detection | None  # all_rows: the layer's mass and rows with this row added


def masked_decode(sc: Scores, *, eps: float, k: int, previous: torch.Tensor | None,
                  history: Detection | None) -> Decoded:
    """The kernel's decision of one call in scope, in one launch (and one memset).

    previous: bool [B, H or 1, S'] with S' <= Sk, the keys to remove (last pass's choice;
    keys past S' are new and stay), or None to remove this call's own choice. history
    (all_rows only): the column mass [B, H, Sk - 1] and rows [B, 1, Sk - 1] of the layer's
    earlier rows (none: sizes 0); under last_row None."""
    q, k_, v, mask = sc.query, sc.key, sc.value, sc.mask
    B, H, _, D = q.shape
    n_k, dv = k_.shape[-2], v.shape[-1]
    dev = q.device
    scale = sdpa_scale(sc.scale, D)
    attn = mask.attn_mask
    m, below = key_mask_view(attn, B, H, n_k)
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
    kern = _kernels()
    with fused_mass.on_device(dev):
        kern.decode_kernel[(B * H,)](
            q, k_, v, m, weight, rows, valid, old_mass, old_rows, prev,
            out, scratch, scores, sinks, chosen, new_mass, new_rows, tally,
            q.stride(0), q.stride(1), q.stride(3), *k_.stride(), *v.stride(), *m.stride(),
            weight.stride(0), rows.stride(0), rows.stride(2), valid.stride(0), valid.stride(1),
            old_mass.stride(0), old_mass.stride(1), old_mass.stride(2),
            old_rows.stride(0), old_rows.stride(2), *_head_strides(prev, H),
            out.stride(0), out.stride(1), out.stride(3),
            H, H // k_.shape[1], n_k, n_old, n_prev, D, dv, float(scale), below, float(eps),
            HAS_MASK=attn is not None, MASK_BOOL=attn is not None and attn.dtype == torch.bool,
            HISTORY=history is not None,
            HAS_PREV=previous is not None, TOP_K=max(int(k), 0), BLOCK=fused_mass.block_of(n_k),
            BLOCK_N=BLOCK_N, BLOCK_D=fused_mass.block_of(D), BLOCK_DV=fused_mass.block_of(dv),
            **fused_mass.LAUNCH_OPTIONS)
    new = Detection(new_mass, new_rows) if history is not None else None
    return Decoded(out, scores, sinks, chosen, tally[0], tally[1], new)


def key_mask_view(mask, B, H, n_k):
    """(tensor [B, H, Sk] to read, the float mask's hidden_below) of a key-only model mask
    [B or 1, 1, 1, Sk], or (None, 0.0) where there is none."""
    if mask is None:
        return None, 0.0
    m = mask.expand(B, H, 1, n_k)[:, :, 0]
    if mask.dtype == torch.bool:
        return m.view(torch.uint8), 0.0
    return m, hidden_below(mask.dtype)


def _head_strides(t: torch.Tensor, H: int) -> tuple[int, int, int]:
    """(batch, head, key) strides of [B, H or 1, S'], 0 along a broadcast head axis."""
    return t.stride(0), (t.stride(1) if t.shape[1] == H else 0), t.stride(2)


# -- detect_backend=auto: each kernel variant checked on its first call -------------------------

class Variant(NamedTuple):
    """What makes the kernel compile to different code: the unit auto checks once."""

    device: torch.device
    dtype: torch.dtype
    mask_dtype: torch.dtype | None
    history: bool
    previous: bool
    top_k: int
    block: int  # keys held per program: the power of two at or above Sk
    head_dim: int
    value_dim: int
    gqa: bool

    @classmethod
    def of(cls, sc: Scores, previous, history, top_k: int) -> Variant:
        m = sc.mask.attn_mask
        return cls(sc.query.device, sc.dtype, None if m is None else m.dtype,
                   history is not None, previous is not None, top_k,
                   fused_mass.block_of(sc.n_k), sc.query.shape[-1],
                   sc.value.shape[-1], sc.key.shape[1] != sc.heads)


# variants auto has run in this process: True once the first call agreed with the fused path,
# False if it failed or disagreed (that variant's calls then take the fused path)
CHECKED: dict[Variant, bool] = {}


def disagreement(got: Decoded, scores: torch.Tensor, out: torch.Tensor | None) -> str | None:
    """How the kernel's decision of a call differs from the fused path's (its ``scores`` and
    its output ``out``), or None where they agree: the scores within float32 rounding, the
    outputs within the dtype's rounding. The caller passes ``out`` only where both removed
    the same keys: a key at the threshold may fall either way, so the chosen keys themselves
    are not compared."""
    if not torch.allclose(got.scores, scores, rtol=SCORES_RTOL, atol=SCORES_ATOL):
        return f"scores differ by up to {float((got.scores - scores).abs().max()):.3g}"
    if out is None:
        return None
    tol = OUTPUT_TOL[got.out.dtype]
    if not torch.allclose(got.out.float(), out.float(), rtol=tol, atol=tol):
        return f"outputs differ by up to {float((got.out.float() - out.float()).abs().max()):.3g}"
    return None


def misselected(got: Decoded, rows: torch.Tensor, key_valid: torch.Tensor, eps: float,
                k: int) -> str | None:
    """How the kernel's sinks, chosen keys and counts differ from Eq. 3 and the top-k applied
    to its own scores (:mod:`metric`), or None where they agree (a sink may differ only within
    rounding of its threshold). :func:`disagreement` compares the scores and, where the keys
    removed are the same, the output: neither sees a selection gone wrong by itself.
    rows: [B, 1, Sk] the query rows that see each key (all_rows: with the earlier steps');
    key_valid: [B, Sk]."""
    in_k = key_valid[:, None, :] & (rows > 0)
    scores = got.scores.masked_fill(~in_k, 0.0)
    n = in_k.sum(dim=-1, keepdim=True)
    threshold = metric.sink_threshold(scores, (n - 1).clamp(min=1), eps)
    tested = in_k & (n > 1)  # the keys Eq. 3 tests; no other key is a sink
    near = tested & ((scores - threshold).abs() <= THRESHOLD_RTOL * threshold.abs().clamp(min=1))
    if (((tested & (scores > threshold)) != got.sinks) & ~near).any():
        return "its sinks are not Eq. 3 of its scores"
    if not torch.equal(got.chosen, metric.top_k_sinks(got.scores, got.sinks, k)):
        return "its chosen keys are not the top-k of its sinks"
    if int(got.n_sinks) != int(got.sinks.sum()) or int(got.n_chosen) != int(got.chosen.sum()):
        return "its counts are not those of its keys"
    return None
