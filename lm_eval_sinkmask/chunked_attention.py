"""Attention recomputed query chunk by query chunk: the detection's column mass and, from the
same probabilities, the output with the blocked keys removed.

The materialised path: it holds one [B, H, chunk, Sk] block of float32 probabilities at a time,
never the whole S x S matrix. Used on a CPU (where it also makes the masked output) and
wherever the fused kernels of :mod:`fused_mass` do not apply.
"""

from __future__ import annotations

import torch

from .attention_view import Detection, Scores


# A row whose kept keys carry less than this share of its attention is recomputed with its
# own maximum: below it the kept keys' probabilities could have lost precision to underflow.
_UNDERFLOW_GUARD = 1e-12


def row_keeps_some(visible: torch.Tensor | None, b: torch.Tensor, n_k: int) -> torch.Tensor:
    """Whether each row can still see a key once the blocked keys b [B, H or 1, 1, Sk] are
    removed; [B, H or 1, rows or 1, 1]."""
    if visible is None:
        return b.sum(dim=-1, keepdim=True) < n_k
    return (visible > b).any(dim=-1, keepdim=True)  # on bools, > is "and not": one op


def _keep_factor(b: torch.Tensor, keeps: torch.Tensor, alive: torch.Tensor | None) -> torch.Tensor:
    """Float factor on the probabilities: 0 for blocked keys of rows that keep another key,
    and for rows seeing no key at all; 1 elsewhere."""
    keep = (~(b & keeps)).float()
    return keep if alive is None else keep * alive


def sweep(
    sc: Scores,
    chunk: int,
    *,
    blocked: torch.Tensor | None = None,
    output: bool = True,
) -> tuple[torch.Tensor | None, Detection]:
    """One pass over the query chunks of an attention call: detection, and optionally the
    masked output.

    Detection accumulates the unmasked attention mass each key receives from the metric's
    query rows Q (the mask view's), never keeping more than one chunk of probabilities alive.
    blocked: bool [B, H or 1, Sk], keys removed from the softmax of every row that can still
        see another key (docs/method.md section 3: a row whose every visible key is blocked
        keeps its scores).
    output: compute the attention output (the same scores serve detection and output).

    Per chunk: one score matmul, one softmax; the column mass is a [1 x rows] @ [rows x Sk]
    matmul, and the masked output zeroes the blocked keys of the same probabilities (a
    multiply: masked keys get exactly zero weight) and divides the [rows x Dv] result by the
    mass that is left.
    """
    out = None
    if output:
        # [B, H, Sq, Dv] laid out as [B, Sq, H, Dv], as SDPA returns it: the model's
        # transpose-and-reshape after the call is then a view, as after an unmasked call,
        # not a copy of the whole output per layer
        out = torch.empty(sc.batch, sc.n_q, sc.heads, sc.v.shape[-1],
                          device=sc.q.device).transpose(1, 2)
    m = sc.mask
    mass = torch.zeros(sc.batch, sc.heads, 1, sc.n_k, device=sc.q.device)
    # [B, H or 1, 1, Sk]; only the output uses it
    b = blocked.unsqueeze(-2) if blocked is not None and output else None
    keep = keeps = None
    if b is not None and m.key_only:
        keeps = row_keeps_some(m.key_visible, b, sc.n_k)
        keep = _keep_factor(b, keeps, m.key_alive)
    underflow = None
    for r0, r1 in sc.chunks(chunk):
        s, visible, alive = sc.logits(r0, r1)
        # rows seeing no key are finite here; the row factor ``alive`` gives them weight 0
        p = torch.softmax(s, dim=-1)
        del s
        w = m.qw[..., r0:r1]  # [B, 1, 1, rows]
        mass += (w if alive is None else w * alive.transpose(-1, -2)) @ p
        if out is None:
            del p  # free this chunk's block before the next one is allocated
            continue
        if b is None:
            o = p @ sc.v
            out[:, :, r0:r1] = o if alive is None else o.mul_(alive)
            del p
            continue
        keeps_c, keep_c = keeps, keep
        if keep_c is None:
            keeps_c = row_keeps_some(visible, b, sc.n_k)
            keep_c = _keep_factor(b, keeps_c, alive)
        p.mul_(keep_c)
        kept = p.sum(dim=-1, keepdim=True)
        out[:, :, r0:r1] = (p @ sc.v) / kept.clamp(min=torch.finfo(kept.dtype).tiny)
        low = ((kept < _UNDERFLOW_GUARD) & keeps_c).any()
        underflow = low if underflow is None else underflow | low
        del p  # free this chunk's block before the next one is allocated
    if underflow is not None and bool(underflow):
        # rare: a sink so dominant that the remaining keys underflowed next to it; redo those
        # chunks with the maximum of the kept keys (the textbook masked softmax)
        for r0, r1 in sc.chunks(chunk):
            s, visible, alive = sc.logits(r0, r1)
            keeps_c = keeps if keeps is not None else row_keeps_some(visible, b, sc.n_k)
            o = torch.softmax(s.masked_fill_(b & keeps_c, float("-inf")), dim=-1) @ sc.v
            out[:, :, r0:r1] = o if alive is None else o.mul_(alive)
    return (out.to(sc.dtype) if out is not None else None), Detection(mass.squeeze(-2), m.rows)
