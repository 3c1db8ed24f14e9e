"""Table 1 over training seeds: one table cell from the same cell of every seed's checkpoint.

A single training run's accuracy moves with its init and data order by more than some of the
effects the table is about, so a sweep with ``--seeds`` runs every checkpoint seed and each table
cell reports: the mean over seeds, the sample standard deviation across seeds (n - 1 in the
denominator; with three seeds a rough spread, reported next to the min-max in the CSV), the
mean of lm-eval's per-seed standard errors (the sampling error of the problems), and the change
from the unmasked run computed within each seed (masked seed s minus unmasked seed s), with its
own mean and standard deviation across seeds and the mean of its per-seed paired standard errors
(:mod:`paired`). A spread across seeds well above the standard errors is the seeds disagreeing,
not the problems' sampling. Pure arithmetic on :class:`table.Entry` records.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .paired import mean_se


@dataclass(frozen=True)
class SeedCell:
    """One (model, task, K) over the seeds that finished it."""

    model: str
    kind: str
    task: str
    k: int
    metric: str
    values: dict[int, float]  # seed -> lm-eval's value
    stderrs: dict[int, float | None]  # seed -> lm-eval's standard error
    deltas: dict[int, float]  # seed -> value minus the same seed's K=0 value
    delta_ses: dict[int, float | None]  # seed -> paired standard error of that seed's delta
    ns: tuple[int, ...]  # distinct sample counts

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values.values())

    @property
    def std(self) -> float | None:
        return sample_std(self.values.values())

    @property
    def stderr_mean(self) -> float | None:
        known = [s for s in self.stderrs.values() if s is not None]
        return statistics.fmean(known) if known else None

    @property
    def delta_mean(self) -> float | None:
        return statistics.fmean(self.deltas.values()) if self.deltas else None

    @property
    def delta_std(self) -> float | None:
        return sample_std(self.deltas.values())

    @property
    def delta_se_mean(self) -> float | None:
        """Mean paired standard error of the per-seed deltas; None unless every seed has one."""
        return mean_se(self.delta_ses.values())


def sample_std(values) -> float | None:
    """Standard deviation with n - 1 in the denominator; None below two values."""
    values = list(values)
    return statistics.stdev(values) if len(values) >= 2 else None


def multi_seed(grid: dict) -> bool:
    """A sweep with more than one training seed (one seed renders as the plain table)."""
    return len(grid.get("seeds") or []) > 1


def aggregate(grid: dict, entries) -> dict[tuple[str, str, int], SeedCell]:
    """(model, task, K) -> :class:`SeedCell`, over the entries of the grid's seeds."""
    from .table import delta_se

    seeds = set(grid.get("seeds") or [])
    by_cell: dict[tuple[str, str, int], dict[int, object]] = {}
    for e in entries:
        if e.seed in seeds:
            by_cell.setdefault((e.model, e.task, e.k), {})[e.seed] = e
    out = {}
    for key, per_seed in by_cell.items():
        model, task, k = key
        base = by_cell.get((model, task, 0), {})
        first = per_seed[min(per_seed)]
        order = sorted(per_seed)
        out[key] = SeedCell(
            model=model, kind=first.kind, task=task, k=k, metric=first.metric,
            values={s: per_seed[s].value for s in order},
            stderrs={s: per_seed[s].stderr for s in order},
            deltas={s: per_seed[s].value - base[s].value for s in order if s in base},
            delta_ses={s: delta_se(base[s], per_seed[s]) for s in order if s in base},
            ns=tuple(sorted({per_seed[s].n for s in order if per_seed[s].n is not None})),
        )
    return out


def spread_text(mean: float | None, std: float | None, se: float | None, digits: int,
                sign: bool = False) -> str:
    """``mean ± std (se x)``: ± the spread across seeds, se the mean per-seed standard error
    (left out where there is none)."""
    from .table import _fmt

    text = f"{_fmt(mean, digits, sign=sign)} ± {_fmt(std, digits)}"
    return text if se is None else f"{text} (se {_fmt(se, digits)})"


def missing_seeds(have: int, want: int) -> str:
    """`` [2 of 3 seeds]`` when a cell lacks seeds, else nothing."""
    return f" [{have} of {want} seeds]" if have < want else ""


def cell_text(cell: SeedCell, n_seeds: int, digits: int) -> str:
    """``mean ± std (se x); Δ mean ± std (se y)``: lm-eval's se for the value, the paired se
    for Δ (:func:`spread_text`), ``[2 of 3 seeds]`` when seeds are missing."""
    text = spread_text(cell.mean, cell.std, cell.stderr_mean, digits)
    if cell.k != 0 and cell.deltas:
        text += "; Δ " + spread_text(cell.delta_mean, cell.delta_std, cell.delta_se_mean, digits,
                                     sign=True)
    return text + missing_seeds(len(cell.values), n_seeds)


def markdown(grid: dict, entries, title: str, digits: int = 2) -> str:
    from .table import input_notes, layout, metric_and_sample_notes

    idx = aggregate(grid, entries)
    seeds = grid["seeds"]

    def text_of(model: str, task: str, k: int):
        c = idx.get((model, task, k))
        return None if c is None else (cell_text(c, len(seeds), digits), c.metric)

    lines, metrics = layout(grid, title, text_of)
    ns = sorted({n for c in idx.values() for n in c.ns})
    lines += ["",
              f"Cells: mean over {len(seeds)} training seeds ({', '.join(map(str, seeds))}) ± "
              "the sample standard deviation across seeds (n - 1 denominator), in parentheses "
              "the mean of lm-eval's per-seed standard errors; Δ: the change from the unmasked "
              "run (K=0), computed within each seed, mean ± standard deviation across seeds, in "
              "parentheses the mean of its per-seed paired standard errors (the standard error "
              "of the per-problem differences; where lm-eval's samples are kept). K=k masks the "
              "k highest-scoring Eq. 3 sinks per layer and head (the paper's eps0/eps1/eps2 "
              "columns are K=1/5/10). Per-seed values and min-max: table.csv.",
              *metric_and_sample_notes(grid, metrics, ns, "Samples per cell and seed"),
              *input_notes(grid, entries)]
    return "\n".join(lines) + "\n"


def csv_rows(grid: dict, entries) -> list[dict]:
    """One row per table cell: the aggregates, then every seed's value, stderr and Δ."""
    from .table import in_table_order, row_label

    out = []
    for task, k, m, c in in_table_order(grid, aggregate(grid, entries)):
        row = {
            "task": task, "setting": row_label(k), "top_k": k, "model": m["name"],
            "kind": m["kind"], "metric": c.metric,
            "seeds": ";".join(map(str, c.values)), "mean": c.mean, "std": c.std,
            "min": min(c.values.values()), "max": max(c.values.values()),
            "stderr_mean": c.stderr_mean, "delta_mean": c.delta_mean,
            "delta_std": c.delta_std, "delta_se_mean": c.delta_se_mean,
            "n": ";".join(map(str, c.ns)),
        }
        for s in grid["seeds"]:
            row[f"value_seed{s}"] = c.values.get(s)
            row[f"stderr_seed{s}"] = c.stderrs.get(s)
            row[f"delta_seed{s}"] = c.deltas.get(s)
            row[f"delta_se_seed{s}"] = c.delta_ses.get(s)
        out.append(row)
    return out


def csv_text(grid: dict, entries) -> str:
    from .table import write_csv

    fields = ["task", "setting", "top_k", "model", "kind", "metric", "seeds", "mean", "std",
              "min", "max", "stderr_mean", "delta_mean", "delta_std", "delta_se_mean", "n"]
    for s in grid["seeds"]:
        fields += [f"value_seed{s}", f"stderr_seed{s}", f"delta_seed{s}", f"delta_se_seed{s}"]
    return write_csv(fields, csv_rows(grid, entries))
