"""The sink metric (paper Eq. 3, docs/method.md section 2) as pure tensor functions.

The intercept feeds these with attention statistics it accumulates query-chunk by query-chunk;
nothing here knows about models, hooks or lm-eval.

Shapes: a leading ``...`` is any batch of (batch element, head) dimensions; the last dimension
indexes keys.
"""

from __future__ import annotations

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
    return _scores(mass, rows, key_valid, key_valid.sum(dim=-1, keepdim=True))


def _scores(mass, rows, key_valid, n_keys):
    """:func:`sink_scores` given |K| (``n_keys``), which the selection counts once for both
    the scores and the sinks."""
    seen = key_valid & (rows > 0)
    scores = n_keys.to(mass.dtype) * mass / rows.clamp(min=1).to(mass.dtype)
    return torch.where(seen, scores, torch.zeros_like(scores))


def find_sinks(scores: torch.Tensor, key_valid: torch.Tensor, eps: float) -> torch.Tensor:
    """Eq. 3: key j is a sink iff s_j > mean_{k in K, k != j} s_k + eps.

    With a single valid key there are no "other tokens" to compare with, so nothing is a sink.
    Returns a bool mask shaped like ``scores``.
    """
    scores = torch.where(key_valid, scores, torch.zeros_like(scores))
    return _sinks(scores, key_valid, key_valid.sum(dim=-1, keepdim=True), eps)


def _sinks(scores, key_valid, n_keys, eps):
    """:func:`find_sinks` of scores that are already 0 outside ``key_valid`` (as
    :func:`sink_scores` makes them), given |K|."""
    total = scores.sum(dim=-1, keepdim=True)
    others_mean = (total - scores) / (n_keys - 1).clamp(min=1).to(scores.dtype)
    return key_valid & (n_keys > 1) & (scores > others_mean + eps)


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

    mass, rows: [B, H, Sk]; key_valid: [B, Sk]. With ``per_layer`` the attention is averaged
    over heads first (granularity=layer) and the results have a head dimension of 1; a key's
    row count is then the most rows any head gives it, which is every head's count when the
    heads share one mask (as in all four supported families: their masks have no head axis).
    """
    if per_layer:
        mass = mass.mean(dim=1, keepdim=True)
        rows = rows.amax(dim=1, keepdim=True)
    key_valid = key_valid.unsqueeze(1)
    # the same as sink_scores then find_sinks, minus what those would redo here (each op is a
    # kernel launch on a GPU): |K| is counted once, and the scores are already 0 where
    # find_sinks would zero them
    n_keys = key_valid.sum(dim=-1, keepdim=True)
    scores = _scores(mass, rows, key_valid, n_keys)
    sinks = _sinks(scores, key_valid, n_keys, eps)
    return scores, sinks, top_k_sinks(scores, sinks, k)
