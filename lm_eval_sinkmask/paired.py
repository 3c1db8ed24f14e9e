"""The standard error of a change measured on the same problems (a paired difference).

Table 1's Δ compares one checkpoint unmasked and masked on the same problems, so the two
accuracies share most of their sampling noise: a problem the model finds easy tends to stay easy.
The uncertainty of Δ is that of the per-problem differences d_i = masked_i - unmasked_i,
se = sd(d) / sqrt(n) with n - 1 in sd (as lm-eval's own standard error of a mean). It is
what says whether a drop is more than noise, and it is usually well below the two cells'
standard errors combined. Pure arithmetic on per-document scores read from lm-eval's samples.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path


def per_document(samples: Iterable[dict], metric: str) -> dict[int, float] | None:
    """doc_id -> score of ``metric`` ("name,filter", lm-eval's key) in lm-eval sample records.

    None when the records cannot give a per-document mean: a non-numeric score (a corpus-level
    metric keeps tuples per document), a document scored twice, or no record of that filter.
    """
    name, _, filt = metric.partition(",")
    scores: dict[int, float] = {}
    for record in samples:
        if record.get("filter", "none") != filt or name not in record:
            continue
        value, doc = record[name], record.get("doc_id")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or doc in scores:
            return None
        scores[doc] = float(value)
    return scores or None


def read_per_document(cell: Path, task: str, metric: str, value: float,
                      named: list[str] | None = None) -> dict[int, float] | None:
    """The per-document scores of a sweep cell's lm-eval samples file, or None when there is no
    such file or its scores do not average to the cell's ``value`` (a metric whose aggregate is
    not the mean of its per-document scores has no paired standard error of this kind). The
    file is the one cell.json names (``named``, its ``results_files``), else the newest; it
    may be gzipped (``.jsonl.gz``), as the repository keeps its committed results."""
    files = sorted([*Path(cell).glob(f"samples_{task}_*.jsonl"),
                    *Path(cell).glob(f"samples_{task}_*.jsonl.gz")],
                   key=lambda f: f.name.removesuffix(".gz"))
    if named is not None:
        files = [f for f in files if f.name in named]
    if not files:
        return None
    opener = gzip.open if files[-1].suffix == ".gz" else open
    with opener(files[-1], "rt") as f:
        scores = per_document((json.loads(line) for line in f if line.strip()), metric)
    if scores is None or not math.isclose(statistics.fmean(scores.values()), value,
                                          rel_tol=1e-9, abs_tol=1e-12):
        return None
    return scores


def mean_se(ses: Iterable[float | None]) -> float | None:
    """The mean of several standard errors (one per run: training seed or draw), or None unless
    every one is known: a mean over the runs that kept their samples would describe other runs
    than the value it stands beside."""
    ses = list(ses)
    return statistics.fmean(ses) if ses and None not in ses else None


def paired_se(base: Mapping[int, float] | None, other: Mapping[int, float] | None) -> float | None:
    """Standard error of mean(other - base) over the documents both scored; None unless both
    scored the same documents (at least two)."""
    if not base or not other or set(base) != set(other) or len(base) < 2:
        return None
    diffs = [other[doc] - base[doc] for doc in sorted(base)]
    return statistics.stdev(diffs) / math.sqrt(len(diffs))
