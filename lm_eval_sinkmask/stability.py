"""Sink stability: does the main sink stay put across the steps of one generation?

"One Token Is Enough" argues that DLM sinks move from one denoising step to the next and that
this makes inference fragile. These pure NumPy functions measure it per (layer, head) from what
a sink trace keeps (``sink_trace``): for each step t, the main sink's position ``pos[t]`` and the
share of attention it receives ``share[t]``.

Definitions (T steps; arrays are [T, ...] with any trailing (layer, head) dimensions):

- Main sink: the top-scoring key, if it is an Eq. 3 sink at the trace's eps (docs/method.md section 2); else the
  step has no sink, written as position ``NO_SINK`` (-1) and share NaN.
- Share: the average attention a valid query gives the key, ``mass_j / rows_j`` = s_j / |K| in
  the Eq. 3 score's uniform-share units; in (0, 1], and 1/|K| for a key getting a uniform share.
- ``keep_rate``: over the consecutive step pairs (t, t+1) in which *both* steps have a sink, the
  fraction whose sink sits at the same position. A step without a sink breaks the chain: the
  pairs touching it are skipped, not counted as moves, and the steps around a gap are not
  compared with each other. NaN when no pair qualifies (fewer than two consecutive sink steps).
- ``distinct_positions``: how many different positions the main sink takes over the steps that
  have one (0 when no step does).
- ``main_share``: the mean share over the steps that have a sink (NaN when none do).

A sink that never moves scores keep_rate 1 and 1 distinct position; one that moves at every
step scores keep_rate 0 (and as many positions as steps when it never returns).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .text_format import or_na

NO_SINK = -1


def main_sink(
    top_pos: np.ndarray, top_score: np.ndarray, n_keys: np.ndarray, is_sink: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Position and share of each step's main sink: ``(pos, share)``, both shaped like is_sink.

    top_pos, top_score: [T, ...] the top key's position and Eq. 3 score; n_keys: [T] the number
    of valid keys |K| of each step (scores are |K| * share); is_sink: [T, ...] bool, whether the
    top key passes Eq. 3. Steps without a sink get ``NO_SINK`` and NaN.
    """
    n = np.asarray(n_keys, np.float64).reshape((-1,) + (1,) * (np.ndim(top_score) - 1))
    share = np.asarray(top_score, np.float64) / np.maximum(n, 1)
    pos = np.where(is_sink, top_pos, NO_SINK).astype(np.int64)
    return pos, np.where(is_sink, share, np.nan)


def kept_pairs(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per trailing index: ``(kept, pairs)``, the step pairs (t, t+1) with a sink at both steps,
    and how many of them keep the same position. [T, ...] -> two int arrays [...]."""
    pos = np.asarray(pos)
    both = (pos[1:] != NO_SINK) & (pos[:-1] != NO_SINK)
    return (both & (pos[1:] == pos[:-1])).sum(axis=0), both.sum(axis=0)


def keep_rate(pos: np.ndarray) -> np.ndarray:
    """Fraction of the qualifying step pairs whose main sink stays put; NaN without any pair."""
    return _rate(*kept_pairs(pos))


def _rate(kept: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """kept / pairs, NaN where there is no pair."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pairs > 0, kept / np.maximum(pairs, 1), np.nan)


def distinct_positions(pos: np.ndarray) -> np.ndarray:
    """How many different positions the main sink takes over its steps: [T, ...] -> [...]."""
    pos = np.asarray(pos)
    flat = pos.reshape(pos.shape[0], -1)
    counts = [len(np.unique(col[col != NO_SINK])) for col in flat.T]
    return np.array(counts, np.int64).reshape(pos.shape[1:])


def main_share(share: np.ndarray) -> np.ndarray:
    """Mean share of attention on the main sink over the steps that have one (NaN: none)."""
    share = np.asarray(share, np.float64)
    n = np.isfinite(share).sum(axis=0)
    total = np.where(np.isfinite(share), share, 0.0).sum(axis=0)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def head_stability(pos: np.ndarray, share: np.ndarray) -> dict[str, np.ndarray]:
    """All per-(layer, head) numbers from ``main_sink``'s output: [T, L, H] -> {name: [L, H]}.

    ``sink_steps`` and ``pairs`` say how much evidence each number rests on.
    """
    kept, pairs = kept_pairs(pos)
    return {
        "keep_rate": _rate(kept, pairs),
        "distinct_positions": distinct_positions(pos),
        "main_share": main_share(share),
        "sink_steps": (np.asarray(pos) != NO_SINK).sum(axis=0),
        "pairs": pairs,
        "kept": kept,
    }


def _nanmean(x: np.ndarray) -> float | None:
    x = np.asarray(x, np.float64)
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else None


def aggregate(per_head: dict[str, np.ndarray], scored: np.ndarray | None = None) -> dict[str, Any]:
    """One model-level summary of ``head_stability``: means over (layer, head), NaN ignored.

    Per-head means weigh every head alike; ``pooled_keep_rate`` instead weighs every step pair
    alike (heads that have a sink more often count more). Means with nothing to average are None.
    ``scored`` ([L, H] bool, default all): the heads whose attention was scored at all; the
    others (layers left out with ``layers=``) are not counted among the ``heads``.
    """
    has_sink = per_head["sink_steps"] > 0
    scored = np.ones(has_sink.shape, bool) if scored is None else np.asarray(scored, bool)
    pairs, kept = int(per_head["pairs"].sum()), int(per_head["kept"].sum())
    return {
        "keep_rate": _nanmean(per_head["keep_rate"]),
        "pooled_keep_rate": kept / pairs if pairs else None,
        "distinct_positions": _nanmean(per_head["distinct_positions"][has_sink]),
        "main_share": _nanmean(per_head["main_share"]),
        "heads": int(scored.sum()),
        "heads_with_sink": int(has_sink.sum()),
        "heads_with_pairs": int((per_head["pairs"] > 0).sum()),
        "pairs": pairs,
        "kept": kept,
    }


def to_json(per_head: dict[str, np.ndarray]) -> dict[str, list]:
    """Per-head arrays as nested lists for JSON, NaN written as None (JSON has no NaN)."""
    out = {}
    for name, a in per_head.items():
        if np.issubdtype(a.dtype, np.floating):
            out[name] = [[None if not np.isfinite(v) else round(float(v), 6) for v in row] for row in a]
        else:
            out[name] = a.astype(int).tolist()
    return out


def position_share(
    top_pos: np.ndarray, top_score: np.ndarray, n_keys: np.ndarray, pos: int
) -> np.ndarray:
    """Share of attention on key ``pos`` where it is among the kept top keys, NaN elsewhere.

    top_pos, top_score: [T, ..., N] (N kept keys per step); n_keys: [T]. Outside the top N the
    trace only bounds the share (by the N-th score), so a fixed position one wants at every step
    (the extra sink token) should be watched by the recorder instead (``watch_score``).
    """
    top_pos = np.asarray(top_pos)
    hit = top_pos == pos
    score = np.where(hit, np.asarray(top_score, np.float64), 0.0).sum(-1)
    n = np.asarray(n_keys, np.float64).reshape((-1,) + (1,) * (top_pos.ndim - 2))
    return np.where(hit.any(-1), score / np.maximum(n, 1), np.nan)


def line(block: dict[str, Any]) -> str:
    """One line of a trace's ``stability`` block, for the terminal."""
    g = block["aggregate"]
    return (f"sink stability (eps={block['eps']:g}): keep rate {or_na(g['keep_rate'])} per head "
            f"({g['heads_with_pairs']}/{g['heads']} heads with a sink at consecutive steps; pooled "
            f"{g['kept']}/{g['pairs']} pairs = {or_na(g['pooled_keep_rate'])}), "
            f"{or_na(g['distinct_positions'], '.1f')} distinct positions, "
            f"main sink share {or_na(g['main_share'], '.3f')} ({g['heads_with_sink']} heads with a sink)")
