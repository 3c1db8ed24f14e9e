"""Two columns of Table 1 compared on the same problems: ``--versus A:B``.

Some questions are about two columns, not about one column's drop: do the sinks cost more than
as many random keys (``llada`` vs ``llada_random``, ``mask_target=random``), does a twin with an
extra sink token do better than its baseline? Both columns score the same problems at each K,
so the difference A - B gets the paired standard error of the per-problem differences
(:mod:`paired`), which the two cells' own standard errors would overstate. Over several runs
(training seeds, draws of a random control), the difference is taken within each run (seed s
of A against seed s of B; a column with draws against the other's run of the same seed, or of
the same draw if both have draws) and reported as mean ± standard deviation across runs, with
the mean per-run paired standard error.
Pure arithmetic on :class:`table.Entry` records.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from . import paired
from .seed_stats import (Run, drawn_models, missing_runs, multi_run, run_of, run_order, run_unit,
                         runs_wanted, sample_std)
from .table_layout import row_label
from .text_format import signed_with_se, spread


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


@dataclass(frozen=True)
class Comparison:
    """A minus B at one (task, K), per run (:data:`seed_stats.Run`: training seed, draw)."""

    a: str
    b: str
    task: str
    k: int
    diffs: dict[Run, float]  # run -> A's value minus B's
    ses: dict[Run, float | None]  # run -> paired standard error of that difference
    wanted: int = 1  # runs once the sweep is complete

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
    of the same runs, in the table's order."""
    by = {(e.model, e.task, e.k, run_of(e)): e for e in entries}
    drawn = drawn_models(entries)

    def cell(model: str, task: str, k: int, run: Run):
        """``model``'s cell of ``run``, or of the run's seed for a model without draws."""
        return by.get((model, task, k, run)) or by.get((model, task, k, (run[0], None)))

    out = []
    for a, b in grid.get("versus") or []:
        for task in grid["tasks"]:
            for k in sorted(grid["ks"]):
                runs = sorted({r for (m, t, kk, r) in by if m in (a, b) and t == task and kk == k},
                              key=run_order)
                pairs = {r: (ea, eb) for r in runs
                         if (ea := cell(a, task, k, r)) and (eb := cell(b, task, k, r))}
                if not pairs:
                    continue
                out.append(Comparison(
                    a, b, task, k,
                    diffs={r: ea.value - eb.value for r, (ea, eb) in pairs.items()},
                    ses={r: paired.paired_se(eb.per_doc, ea.per_doc)
                         for r, (ea, eb) in pairs.items()},
                    wanted=max(runs_wanted(grid, m in drawn, k) for m in (a, b))))
    return out


def markdown_lines(grid: dict, comparisons: list[Comparison], digits: int) -> list[str]:
    """The "paired differences" section under the table (nothing without comparisons)."""
    if not comparisons:
        return []
    multi = multi_run(grid)
    pairs = [tuple(p) for p in grid["versus"]]
    cell = {(c.a, c.b, c.task, c.k): c for c in comparisons}

    def text(c: Comparison) -> str:
        if not multi:
            [se] = c.ses.values()
            return signed_with_se(c.mean, se, digits)
        return (spread(c.mean, c.std, c.se_mean, digits, sign=True)
                + missing_runs(len(c.diffs), c.wanted, run_unit(grid)))

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
    if multi and grid.get("mask_seeds"):
        lines += ["", "Each cell: the first model's value minus the second's, taken within each "
                  "run (a column with draws against the other column's run of the same training "
                  "seed, or of the same draw where both have draws), mean ± standard deviation "
                  "across runs; in parentheses the mean per-run paired standard error (the "
                  "standard error of the per-problem differences)."]
    elif multi:
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
    """One row per comparison and run (seed and draw empty where the sweep has no such axis)."""
    return [{"task": c.task, "top_k": c.k, "a": c.a, "b": c.b, "seed": seed, "draw": draw,
             "difference": c.diffs[(seed, draw)], "paired_se": c.ses[(seed, draw)]}
            for c in comparisons for seed, draw in c.diffs]


FIELDS = ["task", "top_k", "a", "b", "seed", "draw", "difference", "paired_se"]
