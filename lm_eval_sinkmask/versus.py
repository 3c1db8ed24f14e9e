"""Two columns of Table 1 compared on the same problems: ``--versus A:B``.

Some questions are about two columns, not about one column's drop: do the sinks cost more than
as many random keys (``llada`` vs ``llada_random``, ``mask_target=random``), does a twin with an
extra sink token do better than its baseline? Both columns score the same problems at each K,
so the difference A - B gets the paired standard error of the per-problem differences
(:mod:`paired`), which the two cells' own standard errors would overstate. Over training
seeds, the difference is taken within each seed (seed s of A against seed s of B) and reported
as mean ± standard deviation across seeds, with the mean per-seed paired standard error.
Pure arithmetic on :class:`table.Entry` records.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from . import paired
from .seed_stats import missing_seeds, multi_seed, sample_std, spread_text


def parse_versus(text: str | None) -> list[list[str]]:
    """``"A:B,C:D"`` -> ``[["A", "B"], ["C", "D"]]`` (lists: the pairs go into sweep.json)."""
    pairs = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        a, sep, b = part.strip().partition(":")
        if not sep or not a or not b or a == b:
            raise ValueError(f"--versus takes MODEL:MODEL pairs of two different models, got {part!r}")
        pairs.append([a, b])
    return pairs


def check_pairs(pairs: list[list[str]], models: list[str]) -> None:
    """Every name in ``pairs`` is one of the sweep's ``models``."""
    unknown = sorted({name for pair in pairs for name in pair} - set(models))
    if unknown:
        raise ValueError(f"--versus names {unknown}, which the sweep does not have; its models "
                         f"are {models}")


@dataclass(frozen=True)
class Comparison:
    """A minus B at one (task, K), per seed (None: a sweep without --seeds)."""

    a: str
    b: str
    task: str
    k: int
    diffs: dict  # seed -> A's value minus B's
    ses: dict  # seed -> paired standard error of that difference (None without samples)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.diffs.values())

    @property
    def std(self) -> float | None:
        return sample_std(self.diffs.values())

    @property
    def se_mean(self) -> float | None:
        return paired.mean_se(self.ses.values())


def compare(grid: dict, entries) -> list[Comparison]:
    """The comparisons of ``grid["versus"]`` for every task and K where both models have cells
    of the same seeds, in the table's order."""
    by = {(e.model, e.task, e.k, e.seed): e for e in entries}
    seeds = grid.get("seeds") or [None]
    out = []
    for a, b in grid.get("versus") or []:
        for task in grid["tasks"]:
            for k in sorted(grid["ks"]):
                both = [s for s in seeds if (a, task, k, s) in by and (b, task, k, s) in by]
                if not both:
                    continue
                ea = {s: by[(a, task, k, s)] for s in both}
                eb = {s: by[(b, task, k, s)] for s in both}
                out.append(Comparison(a, b, task, k,
                                      diffs={s: ea[s].value - eb[s].value for s in both},
                                      ses={s: paired.paired_se(eb[s].per_doc, ea[s].per_doc)
                                           for s in both}))
    return out


def markdown_lines(grid: dict, comparisons: list[Comparison], digits: int) -> list[str]:
    """The "paired differences" section under the table (nothing without comparisons)."""
    from .table import row_label, signed_with_se

    if not comparisons:
        return []
    multi = multi_seed(grid)
    pairs = [tuple(p) for p in grid["versus"]]
    cell = {(c.a, c.b, c.task, c.k): c for c in comparisons}

    def text(c: Comparison) -> str:
        if not multi:
            [se] = c.ses.values()
            return signed_with_se(c.mean, se, digits)
        return (spread_text(c.mean, c.std, c.se_mean, digits, sign=True)
                + missing_seeds(len(c.diffs), len(grid["seeds"])))

    lines = ["", "## Paired differences on the same problems", "",
             "| Task | Sinks masked | " + " | ".join(f"{a} − {b}" for a, b in pairs) + " |",
             "|---|---|" + ":---:|" * len(pairs)]
    for task in grid["tasks"]:
        first = True
        for k in sorted(grid["ks"]):
            row = [cell.get((a, b, task, k)) for a, b in pairs]
            if not any(row):
                continue
            lines.append(f"| {task if first else ''} | {row_label(k)} | "
                         + " | ".join("-" if c is None else text(c) for c in row) + " |")
            first = False
    if multi:
        lines += ["", "Each cell: the first model's value minus the second's, taken within each "
                  "training seed, mean ± standard deviation across seeds; in parentheses the "
                  "mean per-seed paired standard error (the standard error of the per-problem "
                  "differences)."]
    else:
        lines += ["", "Each cell: the first model's value minus the second's on the same "
                  "problems ± the paired standard error (the standard error of the per-problem "
                  "differences)."]
    return lines


def csv_rows(comparisons: list[Comparison]) -> list[dict]:
    """One row per comparison and seed (seed empty for a sweep without --seeds)."""
    return [{"task": c.task, "top_k": c.k, "a": c.a, "b": c.b, "seed": s,
             "difference": c.diffs[s], "paired_se": c.ses[s]}
            for c in comparisons for s in c.diffs]


FIELDS = ["task", "top_k", "a", "b", "seed", "difference", "paired_se"]
