"""The sink metric (paper Eq. 3, docs/method.md section 2) as pure tensor functions.

Two kinds: the definitions (:func:`column_mass`, :func:`sink_scores`, :func:`find_sinks`,
:func:`select_sinks`), which the tests hold every faster path to, and the pieces the intercept
runs per call (:func:`key_counts` once per mask, :func:`select_counted`, :func:`top_k_sinks`),
which compose to exactly the definitions. Nothing here knows about models, hooks or lm-eval.

Shapes: a leading ``...`` is any batch of (batch element, head) dimensions; the last dimension
indexes keys.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def column_mass(attn: torch.Tensor, query_valid: torch.Tensor | None = None) -> torch.Tensor:
    """Sum of attention each key receives from the valid query rows: sum_{i in Q} A_ij.

    attn: [..., Sq, Sk] post-softmax probabilities (the model's own mask applied).
    query_valid: bool, broadcastable to [..., Sq]; rows outside Q contribute nothing.
    """
    if query_valid is not None:
        attn = attn * query_valid.unsqueeze(-1).to(attn.dtype)
    return attn.sum(dim=-2)


def visible_rows(visible: torch.Tensor, query_valid: torch.Tensor | None = None) -> torch.Tensor:
    """Number of valid query rows that can see each key: |{i in Q : i may attend to j}|.

    visible: bool [..., Sq, Sk], True where the model's mask lets row i attend to key j.
    """
    if query_valid is not None:
        visible = visible & query_valid.unsqueeze(-1)
    return visible.sum(dim=-2)


def sink_scores(mass: torch.Tensor, rows: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """Score of each key in units of the uniform attention share (docs/method.md section 2).

    s_j = |K| * mass_j / rows_j, where rows_j counts the valid query rows that can see key j.
    With bidirectional attention rows_j = |Q| for every valid key, which is
    (|K| / |Q|) * sum_{i in Q} A_ij and whose mean over valid keys is exactly 1. Under a causal
    mask it is the ``all_rows`` ARM rule, |K| * mean_{i >= j} A_ij; with a single query row it
    is |K| * A_last,j. Invalid keys (padding, or seen by no valid row) score 0.
    """
    n_keys = key_valid.sum(dim=-1, keepdim=True).to(mass.dtype)
    return _share_scores(mass, n_keys, rows.clamp(min=1).to(mass.dtype), ~(key_valid & (rows > 0)))


def _share_scores(mass, n_keys, rows, unseen):
    """|K| * mass / rows, 0 where ``unseen`` (counts already in the mass dtype)."""
    return (n_keys * mass / rows).masked_fill_(unseen, 0.0)


def find_sinks(scores: torch.Tensor, key_valid: torch.Tensor, eps: float) -> torch.Tensor:
    """Eq. 3: key j is a sink iff s_j > mean_{k in K, k != j} s_k + eps.

    With a single valid key there are no "other tokens" to compare with, so nothing is a sink.
    Returns a bool mask shaped like ``scores``.
    """
    scores = torch.where(key_valid, scores, torch.zeros_like(scores))
    n_keys = key_valid.sum(dim=-1, keepdim=True)
    others = (n_keys - 1).clamp(min=1).to(scores.dtype)
    return _above_the_others(scores, others, key_valid & (n_keys > 1), eps)


def _above_the_others(scores, others, several, eps):
    """Eq. 3's test of scores that are 0 outside K: ``others`` = max(|K| - 1, 1) in the
    scores' dtype, ``several``: in K, and K holds another key."""
    return several & (scores > sink_threshold(scores, others, eps))


def sink_threshold(scores: torch.Tensor, others: torch.Tensor, eps: float) -> torch.Tensor:
    """The score each key must exceed to be a sink (Eq. 3): the mean of the other keys' scores
    plus eps. ``scores`` are 0 outside K; ``others`` = max(|K| - 1, 1)."""
    total = scores.sum(dim=-1, keepdim=True)
    return (total - scores) / others + eps


class KeyCounts(NamedTuple):
    """What Eq. 3 needs of a call besides its mass: the keys K, the rows that see each key and
    the counts made of them. They depend on the mask alone, so the layers of a forward pass
    that share one mask share these (the intercept makes them once per pass: each op is a
    kernel launch on a GPU, and there are a dozen of them)."""

    unseen: torch.Tensor  # bool [B, H or 1, Sk]: not in K, or seen by no row of Q
    n_keys: torch.Tensor  # [B, 1, 1]: |K|, in the mass dtype
    rows: torch.Tensor  # [B, H or 1, Sk]: max(rows_j, 1), in the mass dtype
    others: torch.Tensor  # [B, 1, 1]: max(|K| - 1, 1), in the mass dtype
    several: torch.Tensor  # bool [B, 1, Sk]: in K, and K holds another key


def key_counts(rows: torch.Tensor, key_valid: torch.Tensor, *, per_layer: bool,
               dtype: torch.dtype = torch.float32) -> KeyCounts:
    """The :class:`KeyCounts` of rows [B, H or 1, Sk] and key_valid [B, Sk] for a mass of
    ``dtype``; ``per_layer`` as in :func:`select_sinks`."""
    if per_layer:
        rows = rows.amax(dim=1, keepdim=True)
    valid = key_valid.unsqueeze(1)
    n_keys = valid.sum(dim=-1, keepdim=True)
    return KeyCounts(~(valid & (rows > 0)), n_keys.to(dtype), rows.clamp(min=1).to(dtype),
                     (n_keys - 1).clamp(min=1).to(dtype), valid & (n_keys > 1))


def top_k_sinks(scores: torch.Tensor, is_sink: torch.Tensor, k: int) -> torch.Tensor:
    """The (at most) k sinks with the largest scores, as a bool mask shaped like ``scores``.

    Fewer than k sinks: all of them. Ties are broken towards the lower position (a stable
    sort), so the selection is deterministic across runs and devices.
    """
    if k <= 0:
        return torch.zeros_like(is_sink)
    k = min(k, scores.shape[-1])
    ranked = torch.where(is_sink, scores, torch.full_like(scores, float("-inf")))
    order = torch.sort(ranked, dim=-1, descending=True, stable=True).indices[..., :k]
    chosen = torch.zeros_like(is_sink)
    chosen.scatter_(-1, order, torch.gather(is_sink, -1, order))
    return chosen


def select_sinks(
    mass: torch.Tensor,
    rows: torch.Tensor,
    key_valid: torch.Tensor,
    *,
    eps: float,
    k: int,
    per_layer: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scores, all Eq. 3 sinks, and the top-k selected sinks for one attention call.

    mass: [B, H, Sk]; rows: [B, H or 1, Sk]; key_valid: [B, Sk]. With ``per_layer`` the
    attention is averaged over heads first (granularity=layer) and the results have a head
    dimension of 1; a key's row count is then the most rows any head gives it, which is every
    head's count when the heads share one mask (as in all four supported families: their
    masks have no head axis).
    """
    counts = key_counts(rows, key_valid, per_layer=per_layer, dtype=mass.dtype)
    return select_counted(mass, counts, eps=eps, k=k, per_layer=per_layer)


def select_counted(mass: torch.Tensor, counts: KeyCounts, *, eps: float, k: int,
                   per_layer: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`select_sinks` given the call's :class:`KeyCounts`: what is left of the
    selection per call when the counts are made once per pass. Bit for bit
    :func:`sink_scores`, :func:`find_sinks` and :func:`top_k_sinks` composed."""
    if per_layer:
        mass = mass.mean(dim=1, keepdim=True)
    scores = _share_scores(mass, counts.n_keys, counts.rows, counts.unseen)
    sinks = _above_the_others(scores, counts.others, counts.several, eps)
    return scores, sinks, top_k_sinks(scores, sinks, k)
