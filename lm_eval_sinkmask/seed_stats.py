"""Table 1 over seeds: one table cell from several runs of the same cell.

A run is one training seed's checkpoint (``sweep --seeds``) and, for a random-control column
(``mask_target=random``), one draw of its random keys (``sweep --mask-seeds``). A single
training run's accuracy moves with its init and data order by more than some of the effects the
table is about, and a single draw of random keys can be lucky, so each table cell reports: the
mean over its runs, the sample standard deviation across them (n - 1 in the denominator; with
three runs a rough spread, reported next to the min-max in the CSV), the mean of lm-eval's
per-run standard errors (the sampling error of the problems), and the change from the unmasked
run computed within each run (masked run minus the unmasked run of the same seed; K=0 masks
nothing, so it has no draws), with its own mean and standard deviation across runs and the mean
of its per-run paired standard errors (:mod:`paired`). A spread across runs well above the
standard errors is the runs disagreeing, not the problems' sampling. Pure arithmetic on
:class:`table.Entry` records.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .paired import mean_se
from .table_layout import (K_NOTE, delta_se, in_table_order, input_notes, layout,
                           metric_and_sample_notes, row_label, write_csv)
from .text_format import spread

Run = tuple[int | None, int | None]  # (training seed, mask draw); None where the sweep lacks that axis


def run_of(entry) -> Run:
    return (entry.seed, entry.draw)


def run_order(run: Run) -> tuple[int, int]:
    return tuple(-1 if x is None else x for x in run)


def run_label(run: Run) -> str:
    """``seed1``, ``draw3``, ``seed1_draw3``; ``undrawn`` for the run with neither (in a sweep
    over draws alone: the unmasked cells and the columns that mask sinks)."""
    seed, draw = run
    parts = ([] if seed is None else [f"seed{seed}"]) + ([] if draw is None else [f"draw{draw}"])
    return "_".join(parts) or "undrawn"


@dataclass(frozen=True)
class RunsCell:
    """One (model, task, K) over the runs that finished it."""

    model: str
    kind: str
    task: str
    k: int
    metric: str
    values: dict[Run, float]  # run -> lm-eval's value
    stderrs: dict[Run, float | None]  # run -> lm-eval's standard error
    deltas: dict[Run, float]  # run -> value minus the same seed's K=0 value
    delta_ses: dict[Run, float | None]  # run -> paired standard error of that run's delta
    ns: tuple[int, ...]  # distinct sample counts

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values.values())

    @property
    def std(self) -> float | None:
        return sample_std(self.values.values())

    @property
    def stderr_mean(self) -> float | None:
        """Mean lm-eval standard error of the runs; None unless every run has one."""
        return mean_se(self.stderrs.values())

    @property
    def delta_mean(self) -> float | None:
        return statistics.fmean(self.deltas.values()) if self.deltas else None

    @property
    def delta_std(self) -> float | None:
        return sample_std(self.deltas.values())

    @property
    def delta_se_mean(self) -> float | None:
        """Mean paired standard error of the per-run deltas; None unless every run has one."""
        return mean_se(self.delta_ses.values())


def sample_std(values) -> float | None:
    """Standard deviation with n - 1 in the denominator; None below two values."""
    values = list(values)
    return statistics.stdev(values) if len(values) >= 2 else None


def multi_run(grid: dict) -> bool:
    """A sweep with several runs of some cell: more than one training seed or more than one
    draw (one run per cell renders as the plain table)."""
    return len(grid.get("seeds") or []) > 1 or len(grid.get("mask_seeds") or []) > 1


def drawn_models(entries) -> set[str]:
    """The models whose masked cells ran once per draw (``sweep --mask-seeds``)."""
    return {e.model for e in entries if e.draw is not None}


def draw_notes(grid: dict, entries) -> dict[str, str]:
    """model -> ``8 draws`` for the columns that ran over several draws (headers, legends)."""
    draws = grid.get("mask_seeds") or []
    return {m: f"{len(draws)} draws" for m in drawn_models(entries)} if len(draws) > 1 else {}


def runs_wanted(grid: dict, drawn: bool, k: int) -> int:
    """How many runs a (model, K) cell has once the sweep is complete."""
    n_seeds = len(grid.get("seeds") or [None])
    return n_seeds * (len(grid["mask_seeds"]) if drawn and k != 0 else 1)


def run_unit(grid: dict) -> str:
    """What the table counts runs in: seeds, or runs where draws multiply them."""
    return "runs" if grid.get("mask_seeds") else "seeds"


def aggregate(grid: dict, entries) -> dict[tuple[str, str, int], RunsCell]:
    """(model, task, K) -> :class:`RunsCell`, over the entries of the grid's seeds. A run's
    delta is taken against the unmasked cell of the same run, or (a draw) of the same seed."""
    seeds = set(grid.get("seeds") or [None])
    by_cell: dict[tuple[str, str, int], dict[Run, object]] = {}
    for e in entries:
        if e.seed in seeds:
            by_cell.setdefault((e.model, e.task, e.k), {})[run_of(e)] = e
    out = {}
    for key, runs in by_cell.items():
        model, task, k = key
        unmasked = by_cell.get((model, task, 0), {})
        order = sorted(runs, key=run_order)
        base = {r: b for r in order
                if (b := unmasked.get(r) or unmasked.get((r[0], None))) is not None}
        out[key] = RunsCell(
            model=model, kind=runs[order[0]].kind, task=task, k=k, metric=runs[order[0]].metric,
            values={r: runs[r].value for r in order},
            stderrs={r: runs[r].stderr for r in order},
            deltas={r: runs[r].value - b.value for r, b in base.items()},
            delta_ses={r: delta_se(b, runs[r]) if k != 0 else None for r, b in base.items()},
            ns=tuple(sorted({runs[r].n for r in order if runs[r].n is not None})),
        )
    return out


def missing_runs(have: int, want: int, unit: str) -> str:
    """`` [2 of 3 seeds]`` when a cell lacks runs, else nothing."""
    return f" [{have} of {want} {unit}]" if have < want else ""


def cell_text(cell: RunsCell, want: int, unit: str, digits: int) -> str:
    """``mean ± std (se x); Δ mean ± std (se y)``: lm-eval's se for the value, the paired se
    for Δ (:func:`text_format.spread`), ``[2 of 3 seeds]`` when runs are missing."""
    text = spread(cell.mean, cell.std, cell.stderr_mean, digits)
    if cell.k != 0 and cell.deltas:
        text += "; Δ " + spread(cell.delta_mean, cell.delta_std, cell.delta_se_mean, digits,
                                sign=True)
        if len(cell.deltas) < len(cell.values):  # a run whose unmasked cell is missing
            text += f" [Δ: {len(cell.deltas)} of {len(cell.values)} {unit}]"
    return text + missing_runs(len(cell.values), want, unit)


def seeds_text(seeds: list[int]) -> str:
    """``0-7`` for a contiguous list, else ``0, 2, 5``."""
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def runs_note(grid: dict) -> str:
    """The footer sentence saying what a cell averages over."""
    seeds, draws = grid.get("seeds") or [], grid.get("mask_seeds")
    steps = (" the mean of lm-eval's per-{u} standard errors; Δ: the change from the unmasked "
             "run (K=0), computed within each {u}, mean ± standard deviation across {u}s, in "
             "parentheses the mean of its per-{u} paired standard errors (the standard error of "
             "the per-problem differences; where lm-eval's samples are kept).")
    if not draws:
        return (f"Cells: mean over {len(seeds)} training seeds ({', '.join(map(str, seeds))}) ± "
                "the sample standard deviation across seeds (n - 1 denominator), in parentheses"
                + steps.format(u="seed"))
    trained = ("" if not seeds else f" of training seed {seeds[0]}" if len(seeds) == 1
               else f" of each of {len(seeds)} training seeds ({', '.join(map(str, seeds))})")
    return ("Cells: mean over runs ± the sample standard deviation across runs (n - 1 "
            "denominator; a single run shows none), in parentheses" + steps.format(u="run")
            + f" Runs: the checkpoint{trained}; "
            + ("a column marked 'draws'" if len(draws) > 1 else "a random-key column")
            + " (mask_target=random) "
            f"runs each masked cell once per draw of its random keys (mask_seed "
            f"{seeds_text(draws)}), its unmasked cell once, as K=0 masks nothing.")


def markdown(grid: dict, entries, title: str, digits: int = 2) -> str:
    idx = aggregate(grid, entries)
    drawn, unit = drawn_models(entries), run_unit(grid)

    def text_of(model: str, task: str, k: int):
        c = idx.get((model, task, k))
        if c is None:
            return None
        return cell_text(c, runs_wanted(grid, model in drawn, k), unit, digits), c.metric

    lines, metrics = layout(grid, title, text_of, draw_notes(grid, entries))
    ns = sorted({n for c in idx.values() for n in c.ns})
    lines += ["",
              f"{runs_note(grid)} {K_NOTE} Per-run values and min-max: table.csv.",
              *metric_and_sample_notes(grid, metrics, ns, f"Samples per cell and {unit[:-1]}"),
              *input_notes(grid, entries)]
    return "\n".join(lines) + "\n"


def runs_of_grid(grid: dict) -> list[Run]:
    """Every run of a sweep that gets CSV columns of its own, in order: each seed's (or, over
    draws alone, the undrawn run's), then each seed's draws; none in a sweep with no axes,
    whose one run the aggregate columns are."""
    seeds, draws = grid.get("seeds") or [None], grid.get("mask_seeds") or []
    if seeds == [None] and not draws:
        return []
    return [(s, None) for s in seeds] + [(s, d) for s in seeds for d in draws]


PER_RUN = ("value", "stderr", "delta", "delta_se")  # the CSV's columns for each run


def per_run_columns(run: Run) -> list[str]:
    """``value_seed0_draw3``, ``stderr_seed0_draw3``, ...: one run's CSV columns."""
    return [f"{what}_{run_label(run)}" for what in PER_RUN]


def _distinct(values) -> str:
    """``0;1;2``: the distinct values that are not None, in order."""
    return ";".join(str(v) for v in dict.fromkeys(values) if v is not None)


def csv_rows(grid: dict, entries) -> list[dict]:
    """One row per table cell: the aggregates, then every run's value, stderr and Δ."""
    out = []
    for task, k, m, c in in_table_order(grid, aggregate(grid, entries)):
        row = {
            "task": task, "setting": row_label(k), "top_k": k, "model": m["name"],
            "kind": m["kind"], "metric": c.metric, "seeds": _distinct(s for s, _ in c.values),
            "mean": c.mean, "std": c.std,
            "min": min(c.values.values()), "max": max(c.values.values()),
            "stderr_mean": c.stderr_mean, "delta_mean": c.delta_mean,
            "delta_std": c.delta_std, "delta_se_mean": c.delta_se_mean,
            "n": ";".join(map(str, c.ns)),
        }
        if grid.get("mask_seeds"):
            row["draws"] = _distinct(d for _, d in c.values)
        for r in runs_of_grid(grid):
            per_run = (c.values, c.stderrs, c.deltas, c.delta_ses)
            row.update(zip(per_run_columns(r), (of_run.get(r) for of_run in per_run)))
        out.append(row)
    return out


def csv_text(grid: dict, entries) -> str:
    fields = ["task", "setting", "top_k", "model", "kind", "metric", "seeds",
              *(["draws"] if grid.get("mask_seeds") else []), "mean", "std", "min", "max",
              "stderr_mean", "delta_mean", "delta_std", "delta_se_mean", "n"]
    for r in runs_of_grid(grid):
        fields += per_run_columns(r)
    return write_csv(fields, csv_rows(grid, entries))
