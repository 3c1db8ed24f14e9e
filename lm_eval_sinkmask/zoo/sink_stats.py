"""Statistics over a checkpoint's traced generations: how many Eq. 3 sinks each (layer, head)
has, which tokens and positions they sit on, and whether their value vectors are small.

Pure functions over the arrays a saved trace holds (``sink_trace``); the zoo report
(``zoo.report``) reads the traces and renders these numbers.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ..seed_stats import sample_std


def position_label(pos: int, prompt_length: int, key_offset: int = 0,
                   n_tokens: int | None = None) -> str:
    """Positions comparable across prompts: BOS, counted back from the prompt's end, or
    forward into the generated answer. ``pos`` is a key position, ``key_offset`` the keys
    before the first text token (an extra sink token at the start); a key outside the
    ``n_tokens`` text tokens is the extra sink token."""
    i = pos - key_offset
    if i < 0 or (n_tokens is not None and i >= n_tokens):
        return "sink token"
    if i == 0:
        return "0 (BOS)"
    if i < prompt_length:
        return f"prompt end {i - prompt_length}"
    return f"answer +{i - prompt_length}"


def sink_summary(n_sinks: np.ndarray, top_pos: np.ndarray, is_sink: np.ndarray,
                 token_at, prompt_length: int, key_offset: int = 0,
                 n_tokens: int | None = None, scored: np.ndarray | None = None
                 ) -> dict[str, Any]:
    """One traced generation: sinks per (layer, head) and where they sit.

    n_sinks: [T, L, H] Eq. 3 sinks per step; top_pos / is_sink: [T, L, H, n] the recorded top
    keys and which of them are sinks; ``token_at(step, pos)`` names the token a key held at
    that step (a DLM's canvas changes as it is decoded); positions as :func:`position_label`.
    """
    tokens, positions = Counter(), Counter()
    for t, l, h, i in zip(*np.nonzero(is_sink)):
        pos = int(top_pos[t, l, h, i])
        tokens[token_at(int(t), pos)] += 1
        positions[position_label(pos, prompt_length, key_offset, n_tokens)] += 1
    return {**pair_counts(n_sinks, scored), "tokens": tokens, "positions": positions}


def pair_counts(n_sinks: np.ndarray, scored: np.ndarray | None = None) -> dict[str, Any]:
    """One traced generation's (layer, head) pairs with a sink, from its [T, L, H] Eq. 3 sink
    counts per step: a pair has one when it averages at least one sink per step. Only the
    ``scored`` pairs ([L, H] bool, :meth:`Trace.scored_heads`; all when None) count: a trace
    of ``layers=`` holds zeros, not "no sink", for the others. JSON-ready: all the sink bar
    needs of a generation."""
    per_pair = n_sinks.mean(axis=0)  # [L, H]: mean sinks per step
    scored = np.ones(per_pair.shape, dtype=bool) if scored is None else np.asarray(scored, bool)
    has = per_pair >= 1
    return {
        "mean_sinks_per_pair": float(per_pair[scored].mean()),
        "pairs": int(scored.sum()),
        "pairs_with_sink": int((has & scored).sum()),
        # per layer, first to last: the share of its scored heads with at least one sink on
        # average (None for a layer the trace did not score)
        "share_by_layer": [float(h[s].mean()) if s.any() else None for h, s in zip(has, scored)],
    }


def combine(summaries: list[dict[str, Any]], top: int = 5) -> dict[str, Any]:
    """Several generations of one model: means of the per-generation numbers, pooled counts,
    and value norms pooled over every generation that recorded them."""
    from ..sink_trace import value_norm_summary

    tokens, positions = Counter(), Counter()
    for s in summaries:
        tokens.update(s["tokens"])
        positions.update(s["positions"])
    total = max(sum(tokens.values()), 1)
    share = lambda c: [[k, round(v / total, 3)] for k, v in c.most_common(top)]  # noqa: E731
    values = [s.get("values") for s in summaries]
    pooled = None
    if values and all(v is not None for v in values):  # (relative norms, is_sink, eps) each
        pooled = value_norm_summary(np.concatenate([v[0] for v in values]),
                                    np.concatenate([v[1] for v in values]), values[0][2])
    return {
        **pair_shares(summaries),
        "top_tokens": share(tokens),
        "top_positions": share(positions),
        "value_norms": pooled,
    }


def pair_shares(counts: list[dict[str, Any]]) -> dict[str, Any]:
    """Several generations' :func:`pair_counts` (or summaries holding them): the mean share of
    pairs with a sink, its standard error and range, sinks per pair, the share by layer."""
    shares = [c["pairs_with_sink"] / c["pairs"] for c in counts]
    by_layer = [c.get("share_by_layer") for c in counts]
    return {
        "generations": len(counts),
        "mean_sinks_per_pair": float(np.mean([c["mean_sinks_per_pair"] for c in counts])),
        "share_of_pairs_with_sink": float(np.mean(shares)),
        # how precisely the generations traced pin the mean down (None below two generations)
        "share_stderr": _stderr(shares),
        # the lowest and highest generation's share: how much the mean rests on the prompts traced
        "share_range": [float(min(shares)), float(max(shares))],
        # where the pairs with a sink sit: the mean over generations, layer by layer
        "share_by_layer": (_layer_means(by_layer)
                           if all(b is not None for b in by_layer) else None),
    }


def _layer_means(by_layer: list[list[float | None]]) -> list[float | None]:
    """Each layer's mean share over the generations that scored it (None where none did)."""
    means = []
    for shares in zip(*by_layer):
        scored = [x for x in shares if x is not None]
        means.append(float(np.mean(scored)) if scored else None)
    return means


def _stderr(values: list[float]) -> float | None:
    """Standard error of a mean over generations: sample standard deviation / sqrt(n)."""
    sd = sample_std(values)
    return None if sd is None else sd / len(values) ** 0.5


def low_norm_verdict(block: dict[str, Any] | None) -> str:
    """Do the sinks have low-norm values? "yes" when the median sink's value norm is below
    ``low_below`` (0.5) of its head's median, "lower, not low" when it is below 0.8 of the
    non-sink top keys' median, "no" otherwise."""
    if block is None or not block["sinks"]["n"]:
        return "n/a"
    med, other = block["sinks"]["median"], block["other_top_keys"]["median"]
    if med < block["low_below"]:
        return "yes"
    if other is not None and med < 0.8 * other:
        return "lower, not low"
    return "no"
