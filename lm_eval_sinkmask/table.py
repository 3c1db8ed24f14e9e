"""Table 1 from a sweep folder (docs/method.md section 9): Markdown, CSV and a plot of accuracy vs K.

Rows are task x {Unmasked, K=1, K=5, K=10} (whatever K the sweep ran), columns are models, each
cell ``mean ± stderr (Δ vs unmasked ± its paired stderr)`` read from the ``cell.json`` and the
per-problem samples that :mod:`sweep` wrote next to lm-eval's results (:mod:`paired`). Nothing
here runs a model; the same folder always renders the same Markdown and CSV.

A sweep over several training seeds (``sweep --seeds``) or several draws of the random-key
control (``sweep --mask-seeds``) shows in each cell the mean over those runs, the spread across
them and the mean lm-eval standard error, and the drop from K=0 computed run by run
(:mod:`seed_stats`); with one run per cell the table is the plain one above. Sweeps of one
grid run on different seeds into separate folders make one such table together
(``sinkmask table OUT --pool A --pool B``), their cells read where they lie.
"""

from __future__ import annotations

import json
import math
import os
import sys
import zlib
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import paired, seed_stats, versus
from .cell_claims import folder_locked
from .cell_score import metric_score
from .sweep_plan import cell_records, check_pairs, mixed_settings
from .table_layout import (K_NOTE, PAIRED_NOTE, delta_se, in_table_order, input_notes, layout,
                           metric_and_sample_notes, model_label, row_label, write_csv)
from .text_format import fixed, signed_with_se

ZOO_NOTE = "tiny zoo: test-bed checkpoints of a few million parameters, not the paper's 7-8B models"
# in a pooled table's folder: the sweep folders it reads (relative to it) and its title
POOLED = "pooled.json"


@dataclass(frozen=True)
class Entry:
    model: str
    kind: str
    task: str
    k: int
    metric: str
    value: float
    stderr: float | None
    n: int | None
    seed: int | None = None  # training seed (sweeps with --seeds)
    draw: int | None = None  # mask_seed of a random-control draw (sweeps with --mask-seeds)
    checkpoint: str | None = None  # digest of the checkpoint's files (provenance)
    task_inputs: tuple | None = None  # (version, config digest, documents digest) of the task
    task_code: str | None = None  # digest of the task's function sources (None: older cells)
    package_code: str | None = None  # digest of lm-eval-sinkmask's code (None: older cells)
    # doc_id -> score, from lm-eval's samples (None without them): for the paired stderr of Δ
    per_doc: Mapping[int, float] | None = field(default=None, compare=False, repr=False)


def is_zoo(record: dict) -> bool:
    """A cell made from one of the project's tiny zoo checkpoints."""
    from .zoo import identify

    path = str(record.get("model_path", "")).replace("\\", "/")
    return "lm_eval_sinkmask/zoo/checkpoints" in path or identify(path) is not None or str(record.get("model_type")).startswith("sinkmask_")


def sweep_json(folder: Path) -> Path:
    """The folder's ``sweep.json``; a clear error where there is none (e.g. the README's
    ``sinkmask table`` run before its sweep)."""
    path = folder / "sweep.json"
    if not path.is_file():
        raise ValueError(f"{folder} is not a sweep folder (no sweep.json): `sinkmask sweep --out "
                         f"{folder} ...` fills one, then `sinkmask table {folder}` renders it")
    return path


def load(folder: Path, metrics: dict[str, str] | None = None) -> tuple[dict, list[Entry], bool]:
    """(grid, entries, made_from_zoo) of a sweep folder: every finished cell of the grid's
    seeds, with ``metrics`` (task -> metric) in place of a cell's primary metric. A folder
    whose cells are not one experiment (other inputs, package versions or settings) is
    refused: its table would put two experiments' numbers side by side. The folder of a pooled
    table (``render(..., pool=...)``) gives the pooled cells of the sweep folders it names."""
    pooled = _pooled(folder)
    if pooled is not None:
        grid, entries, zoo = load_pooled(_sources(folder, pooled), metrics)
        return ({**grid, "title": pooled["title"]} if pooled.get("title") else grid), entries, zoo
    read = _read(Path(folder), metrics)
    _check_one_experiment([read], "this folder is")
    return read.grid, read.entries, read.zoo


def load_pooled(folders: list[Path], metrics: dict[str, str] | None = None
                ) -> tuple[dict, list[Entry], bool]:
    """(grid, entries, made_from_zoo) of several sweep folders that ran one grid on different
    training seeds (say one folder per seed, swept on different days or machines), read where
    they lie: one table over all their seeds, as if a single ``sweep --seeds`` had made them.

    Refused unless every folder is a ``--seeds`` sweep of the same grid (models and their
    model_args, tasks, K, eps, limit, random-key draws) over seeds no other folder has, and
    unless their cells are one experiment together (one checkpoint per model and seed, one
    version of each task, of this package's code and of the libraries that move a number)."""
    grids = [(Path(f), json.loads(sweep_json(Path(f)).read_text())) for f in folders]
    _refuse_unpoolable(grids)  # before any cell is read: a cell's own refusal says less
    reads = [_read(f, metrics) for f, _ in grids]
    _check_one_experiment(reads, "these folders are")
    titles = {r.grid.get("title") for r in reads}
    grid = {**reads[0].grid, "seeds": sorted(s for r in reads for s in r.grid["seeds"])}
    grid.pop("title", None)
    if len(titles) == 1 and None not in titles:  # a title naming one folder's seed is dropped
        grid["title"] = titles.pop()
    return grid, [e for r in reads for e in r.entries], any(r.zoo for r in reads)


def _refuse_unpoolable(grids: list[tuple[Path, dict]]) -> None:
    """Sweep folders (folder, its sweep.json) that are not one grid on separate seeds."""
    first, first_grid = grids[0]
    seeds: list[int] = []
    for folder, grid in grids:
        if not grid.get("seeds"):
            raise ValueError(f"{folder} is not a sweep over training seeds (no --seeds): "
                             "pooling folders is for one grid run on different seeds")
        # a folder swept before sweep.json kept its columns' settings is compared without them
        # (its cells' own settings are, by the checks of one experiment)
        skipped = {"seeds", "title"}
        if "columns" not in first_grid or "columns" not in grid:
            skipped.add("columns")
        differ = sorted(k for k in set(first_grid) | set(grid) if k not in skipped
                        and first_grid.get(k) != grid.get(k))
        if differ:
            raise ValueError(f"{folder} ran another grid than {first} "
                             f"({', '.join(differ)} differ), so their cells are not one table")
        again = sorted(set(seeds) & set(grid["seeds"]))
        if again:
            raise ValueError(f"training seed(s) {again} of {folder} are also in another folder: "
                             "a seed's cells must come from one folder")
        seeds += grid["seeds"]


@dataclass
class _Folder:
    """What :func:`_read` found in one sweep folder, before the checks across its cells."""
    folder: Path
    grid: dict
    entries: list[Entry]
    zoo: bool
    requests: list[dict]
    versions: list[dict | None]
    runs: list[dict | None]


def _read(folder: Path, metrics: dict[str, str] | None) -> _Folder:
    grid = json.loads(sweep_json(folder).read_text())
    read = _Folder(folder, grid, [], False, [], [], [])
    for record_path in cell_records(folder / "cells"):  # any depth: seed and draw folders
        _read_cell(read, record_path, grid, metrics)
    return read


def in_grid(grid: dict, req: dict, cell: Path) -> bool:
    """Whether a cell's request is one of the grid's runs. sweep.json may be narrowed by hand
    to fewer training seeds or random-key draws than its folder's cells hold: the others stay
    out of the table, as if never run (a draw left in would be pooled under the header's
    count of draws). A draw where sweep.json names none is refused: its column would not
    know how many runs it has."""
    seeds, draws, draw = grid.get("seeds"), grid.get("mask_seeds"), req.get("mask_seed")
    if draw is not None and draws is None:
        raise ValueError(f"{cell} is draw mask_seed={draw} of a sweep --mask-seeds, but the "
                         "folder's sweep.json names no mask_seeds: restore them there")
    seed = req.get("checkpoint_seed")  # recorded on a seed axis only
    if seed is not None and seeds is None:
        raise ValueError(f"{cell} is training seed {seed} of a sweep --seeds, but the folder's "
                         "sweep.json names no seeds: restore them there")
    return (seeds is None or seed in seeds) and (draw is None or draw in draws)


# what a damaged (truncated, not JSON, not gzip, not UTF-8) cell.json or samples file raises
UNREADABLE = (json.JSONDecodeError, UnicodeDecodeError, OSError, EOFError, zlib.error)


@contextmanager
def _reading(cell: Path, *also: type[Exception]):
    """A damaged file of ``cell`` (:data:`UNREADABLE`, and ``also``: KeyError where cell.json's
    keys are read) named in one line; kept to the reading, so that a mistake in what is computed
    from the files stays a traceback instead of passing for a damaged cell."""
    try:
        yield
    except (*UNREADABLE, *also) as e:
        raise ValueError(f"{cell}: its cell.json or samples could not be read "
                         f"({type(e).__name__}: {e}): damaged, or written by another version "
                         "of lm-eval-sinkmask; rerun that cell (delete its folder, rerun the "
                         "sweep)") from e


def _read_cell(read: _Folder, record_path: Path, grid: dict,
               metrics: dict[str, str] | None) -> None:
    """One ``cell.json`` (and its samples, for the paired errors) into ``read``."""
    cell = record_path.parent
    with _reading(cell, KeyError):
        record = json.loads(record_path.read_text())
        req = record["request"]
    if not in_grid(grid, req, cell):
        return
    read.requests.append(req)
    read.versions.append(record.get("versions"))
    read.runs.append(record.get("run"))
    with _reading(cell, KeyError):  # cell.json's keys (lm-eval's results for --metric)
        metric, value, stderr = record["metric"], record["value"], record["stderr"]
        results = checked_results(cell, record)
        wanted = (metrics or {}).get(req["task"])
        if wanted and wanted != metric:
            metric, value, stderr = _from_lm_eval(cell, results, wanted)
        entry = entry_of(record, measured=(metric, value, stderr))
    with _reading(cell):  # the samples, scored as read: a KeyError would be the scoring's
        per_doc = paired.read_per_document(cell, req["task"], metric, value,
                                           record.get("results_files"))
    read.zoo |= is_zoo(record)
    read.entries.append(replace(entry, per_doc=per_doc))


def _check_one_experiment(reads: list[_Folder], scope: str) -> None:
    """The checks that make a table one experiment, over the cells of every folder read."""
    check_one_input_each([e for r in reads for e in r.entries], scope)
    check_one_record_each([e for r in reads for e in r.entries], scope)
    check_one_version_each([v for r in reads for v in r.versions], scope)
    mixed = mixed_settings([q for r in reads for q in r.requests])
    if mixed:
        raise ValueError("\n".join(mixed) + f"\nso {scope} not one table")
    for r in reads:
        warn_mixed_runs(r.folder, r.runs)


def entry_of(record: dict, kind: str | None = None, measured: tuple | None = None) -> Entry:
    """A sweep cell's ``cell.json`` as an :class:`Entry`: ``kind`` when the record lacks one,
    ``measured`` (metric, value, stderr) in place of its primary numbers."""
    req = record["request"]
    metric, value, stderr = measured or (record["metric"], record["value"], record["stderr"])
    return Entry(model=req["model"], kind=kind or record["kind"], task=req["task"],
                 k=req["top_k"], metric=metric, value=value, stderr=stderr, n=record.get("n"),
                 seed=req.get("checkpoint_seed"), draw=req.get("mask_seed"),
                 **recorded_inputs(record))


def recorded_inputs(record: dict) -> dict[str, str | tuple | None]:
    """A cell's input digests as ``Entry`` holds them (checkpoint, task_inputs, task_code,
    package_code); None for those the cell predates."""
    inputs = record.get("inputs") or {}
    task = inputs.get("task") or {}
    return {"checkpoint": inputs.get("checkpoint"),
            "task_inputs": (task.get("version"), task.get("config"), task.get("docs")) if task else None,
            "task_code": task.get("code"), "package_code": inputs.get("package_code")}


def check_one_input_each(entries: list[Entry], scope: str = "this folder is") -> None:
    """One checkpoint per (model, seed), one task version (and code) per task and one version of
    lm-eval-sinkmask's code: a folder whose cells disagree (filled by hand from two runs, or
    swept again after a code change into a copy) would give a table of two experiments."""
    seen: dict[tuple, set] = {}
    for e in entries:
        if e.checkpoint is not None:
            seen.setdefault(("checkpoint of", e.model, e.seed), set()).add(e.checkpoint)
        if e.task_inputs is not None:
            seen.setdefault(("task", e.task, None), set()).add(e.task_inputs)
        if e.task_code is not None:  # cells made before the code digest are not compared
            seen.setdefault(("task code of", e.task, None), set()).add(e.task_code)
        if e.package_code is not None:  # likewise
            seen.setdefault(("code of", "lm-eval-sinkmask", None), set()).add(e.package_code)
    for (what, name, seed), found in seen.items():
        if len(found) > 1:
            at = "" if seed is None else f" seed {seed}"
            raise ValueError(f"the cells disagree on the {what} {name}{at}: {sorted(map(str, found))}; "
                             f"they come from different runs, so {scope} not one table")


def check_one_record_each(entries: list[Entry], scope: str = "this folder is") -> None:
    """One cell.json per run of a cell: a copy of a cell folder (``k1_old``) would otherwise
    stand in for the run it copies, or be pooled beside it, whichever is read last."""
    seen: set[tuple] = set()
    for e in entries:
        run = (e.model, e.task, e.k, e.seed, e.draw)
        if run in seen:
            raise ValueError(
                f"{e.model} on {e.task} at K={e.k} (training seed {e.seed}, draw {e.draw}) has "
                f"two cell.json records, so {scope} not one table: keep the cell folder the "
                "sweep wrote and move the other out of cells/")
        seen.add(run)


# the packages whose version can change a cell's number (python's cannot, by itself)
NUMBER_PACKAGES = ("lm_eval", "transformers", "torch", "lm-eval-sinkmask")


def check_one_version_each(versions: list[dict | None], scope: str = "this folder is") -> None:
    """One version of each package in ``NUMBER_PACKAGES`` across the cells (those that record
    them): a sweep extended after an upgrade would give drops between two libraries' numbers."""
    for package in NUMBER_PACKAGES:
        found = {v[package] for v in versions if v and v.get(package) is not None}
        if len(found) > 1:
            raise ValueError(f"the cells ran on different {package} versions {sorted(found)}; they "
                             f"come from different installs, so {scope} not one table")


def warn_mixed_runs(folder: Path, runs: list[dict | None]) -> None:
    """One line on stderr when the cells (those that record how they ran) ran with different
    batch sizes, process counts or on different devices: not an error, since batching and
    kernels move a number at float-noise level only, but worth knowing when two cells differ by
    a hair."""
    mixed = []
    for key, what in (("batch_size", "batch sizes"), ("processes", "process counts"),
                      ("device", "devices"), ("gpu", "GPUs")):
        found = {r[key] for r in runs if r and r.get(key) is not None}
        if len(found) > 1:
            ordered = sorted(found, key=lambda v: (isinstance(v, str), v))  # 8 < 32 < "auto"
            mixed.append(f"{what} {ordered}")
    if mixed:
        print(f"warning: the cells of {folder} ran with different {' and '.join(mixed)}; these "
              "are not part of a cell's identity (a resume reuses cells across them), and they can "
              "move a number at float-noise level", file=sys.stderr)


def lm_eval_results(cell: Path, task: str, named: list[str] | None = None) -> dict | None:
    """``task``'s entry of lm-eval's results file in ``cell``. A sweep's cell.json names the
    files lm-eval wrote beside it (``named``): that results file is read, and a named file the
    folder no longer holds is refused, since its numbers (or the samples behind the paired
    errors) would silently drop out of the check. A cell.json that names none (fixtures
    written before sweeps kept the list) is read with the folder's newest results file, or
    None where it has none."""
    if named is not None:
        gone = [name for name in named if not (cell / name).is_file()]
        if gone:
            raise ValueError(f"{cell}: cell.json names {', '.join(gone)}, which the folder no "
                             "longer holds: rerun that cell (delete its folder, rerun the sweep)")
        found = [cell / name for name in named if name.startswith("results")]
    else:
        found = sorted(cell.glob("results*.json"))
    return json.loads(found[-1].read_text())["results"][task] if found else None


def checked_results(cell: Path, record: dict) -> dict | None:
    """The cell's lm-eval results (:func:`lm_eval_results`), once cell.json's ``record`` is
    found to copy them: where they differ (cell.json edited by hand, or another run's results
    file copied in), a report would show a number no run made. A folder without the results
    file is left to cell.json."""
    results = lm_eval_results(cell, record["request"]["task"], record.get("results_files"))
    if results is not None:
        _check_copied(cell, results, record["metric"], record["value"], record["stderr"])
    return results


def _check_copied(cell: Path, results: dict, metric: str, value: float,
                  stderr: float | None) -> None:
    _, found_value, found_stderr = _from_lm_eval(cell, results, metric)
    if not (_same(value, found_value) and _same(stderr, found_stderr)):
        raise ValueError(
            f"{cell}: cell.json says {metric} = {value} ± {stderr}, but lm-eval's results file "
            f"beside it says {found_value} ± {found_stderr}: the folder was edited or mixed "
            "with another run's files; rerun that cell (delete its folder, rerun the sweep)")


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) or (math.isnan(a) and math.isnan(b))


def _from_lm_eval(cell: Path, results: dict | None, metric: str) -> tuple[str, float, float | None]:
    """(metric, value, stderr) of ``metric`` in the cell's lm-eval ``results``: a metric other
    than the one cell.json keeps (``sinkmask table --metric``), or that one, to check it."""
    if results is None:
        raise SystemExit(f"{cell}: no lm-eval results*.json to read --metric {metric} from")
    if metric not in results:
        raise SystemExit(f"{cell}: no metric {metric!r}; it has {sorted(results)}")
    score = metric_score(results, metric)
    return metric, score["value"], score["stderr"]


def title_of(grid: dict, zoo: bool, title: str | None = None) -> str:
    """``title``, else the sweep's ``--title``, else the default; a zoo table says so in it."""
    title = title or grid.get("title") or (
        "Accuracy under attention-sink masking (top-K Eq. 3 sinks masked, "
        f"eps = {grid.get('eps', 3):g})")
    return with_zoo_note(title, zoo)


def with_zoo_note(title: str, zoo: bool) -> str:
    if zoo and "tiny zoo" not in title.lower():
        title = f"{title} [{ZOO_NOTE}]"
    return title


def _index(entries: list[Entry]) -> dict[tuple[str, str, int], Entry]:
    """(model, task, K) -> the one run of a plain table's cell; a second run is refused, not
    shown in the first one's place."""
    idx: dict[tuple[str, str, int], Entry] = {}
    for e in entries:
        key = (e.model, e.task, e.k)
        if key in idx:
            runs = " and ".join(f"(training seed {r.seed}, draw {r.draw})" for r in (idx[key], e))
            raise ValueError(f"{e.model} on {e.task} at K={e.k} has two runs, {runs}, where "
                             "sweep.json names one run per cell: its seeds and mask_seeds must "
                             "name the runs the folder's cells hold")
        idx[key] = e
    return idx


def rows(grid: dict, entries: list[Entry]) -> list[dict]:
    """Long-form rows (the CSV), in the table's order; missing cells are left out."""
    idx = _index(entries)
    out = []
    for task, k, m, e in in_table_order(grid, idx):
        base = idx.get((m["name"], task, 0))
        delta = e.value - base.value if base is not None else None
        out.append({
            "task": task, "setting": row_label(k), "top_k": k, "model": m["name"],
            "kind": m["kind"], "metric": e.metric, "value": e.value,
            "stderr": e.stderr, "delta_vs_unmasked": delta,
            "delta_se": delta_se(base, e) if k != 0 else None, "n": e.n,
        })
    return out


def markdown(grid: dict, entries: list[Entry], title: str, digits: int = 2,
             comparisons: list | None = None) -> str:
    """The table (over seeds when the sweep has several), then the paired differences of the
    sweep's ``versus`` pairs (:mod:`versus`; ``comparisons`` when already computed), if any."""
    text = (seed_stats.markdown(grid, entries, title, digits) if seed_stats.multi_run(grid)
            else _single_run_markdown(grid, entries, title, digits))
    if comparisons is None:
        comparisons = versus.compare(grid, entries)
    extra = versus.markdown_lines(grid, comparisons, digits)
    return text + "\n".join(extra) + "\n" if extra else text


def _single_run_markdown(grid: dict, entries: list[Entry], title: str, digits: int) -> str:
    idx = _index(entries)

    def text_of(model: str, task: str, k: int):
        e = idx.get((model, task, k))
        if e is None:
            return None
        text = f"{fixed(e.value, digits)} ± {fixed(e.stderr, digits)}"
        base = idx.get((model, task, 0))
        if k != 0 and base is not None:
            text += f" ({signed_with_se(e.value - base.value, delta_se(base, e), digits)})"
        return text, e.metric

    lines, metrics = layout(grid, title, text_of)
    ns = sorted({e.n for e in entries if e.n is not None})
    lines += ["",
              "Cells: mean ± standard error from lm-eval; in parentheses the absolute change from "
              f"the unmasked run (K=0) ± {PAIRED_NOTE}. {K_NOTE}",
              *metric_and_sample_notes(grid, metrics, ns, "Samples per cell")]
    if grid.get("seeds"):
        lines.append(f"Training seed: {grid['seeds'][0]}.")
    if grid.get("mask_seeds"):
        lines.append(f"Random keys (mask_target=random) drawn with mask_seed {grid['mask_seeds'][0]}.")
    lines += input_notes(grid, entries)
    return "\n".join(lines) + "\n"


def csv_text(grid: dict, entries: list[Entry]) -> str:
    if seed_stats.multi_run(grid):
        return seed_stats.csv_text(grid, entries)
    fields = ["task", "setting", "top_k", "model", "kind", "metric", "value", "stderr",
              "delta_vs_unmasked", "delta_se", "n"]
    return write_csv(fields, rows(grid, entries))


def plot(grid: dict, entries: list[Entry], title: str, path: Path) -> Path:
    """Accuracy vs K, one panel per task (:func:`_task_panel`), every model in one legend under
    the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    multi = seed_stats.multi_run(grid)
    idx = seed_stats.aggregate(grid, entries) if multi else _index(entries)
    notes = seed_stats.draw_notes(grid, entries)
    tasks = grid["tasks"]
    width = max(7.0, 5.2 * len(tasks))
    # legend columns as many as fit the width (about 0.05 in per character at 8 pt, plus the
    # marker), at most five
    label_inches = 0.6 + 0.05 * max(len(model_label(m, notes)) for m in grid["models"])
    legend_cols = max(1, min(len(grid["models"]), 5, int(0.95 * width / label_inches)))
    legend_rows = -(-len(grid["models"]) // legend_cols)
    height = 4.6 + 0.22 * legend_rows
    fig, axes = plt.subplots(1, len(tasks), figsize=(width, height), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        _task_panel(ax, grid, task, idx, multi, notes)
    # one legend under the panels: inside them it hid the curves it names
    labelled = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            labelled.setdefault(label, handle)
    fig.legend(labelled.values(), labelled.keys(), loc="lower center", ncol=legend_cols,
               fontsize=8, frameon=False)
    fig.suptitle(_wrap(title + _runs_caption(grid), int(12 * width)), fontsize=10)
    fig.tight_layout(rect=(0, 0.22 * legend_rows / height + 0.02, 1, 1))
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return path


def _task_panel(ax, grid: dict, task: str, idx: dict, multi: bool, notes: dict[str, str]) -> None:
    """One task's curves: ARMs dashed (squares), DLMs solid (circles); over runs the mean with
    the across-run std and each run as a dot (``idx`` holds :class:`seed_stats.RunsCell`),
    else lm-eval's value and stderr (``idx`` holds :class:`Entry`)."""
    ks = sorted(grid["ks"])
    # the second column of a --versus pair (a random control, a baseline) is drawn dotted in
    # the first one's colour, so each comparison reads as one colour
    partner = {b: a for a, b in grid.get("versus") or []}
    metric, colours = None, {}
    for j, m in enumerate(grid["models"]):
        pts = [(i, idx[(m["name"], task, k)]) for i, k in enumerate(ks) if (m["name"], task, k) in idx]
        if not pts:
            continue
        metric = metric or pts[0][1].metric
        arm = m["kind"] == "arm"
        # over runs: the mean with the across-run std, models dodged so the bars stay apart
        dodge = 0.04 * (j - (len(grid["models"]) - 1) / 2) if multi else 0.0
        x = [i + dodge for i, _ in pts]
        style = {"linestyle": "--" if arm else "-"}
        if partner.get(m["name"]) in colours:
            style = {"linestyle": ":", "color": colours[partner[m["name"]]],
                     "markerfacecolor": "none"}
        line = ax.errorbar(x, [e.mean if multi else e.value for _, e in pts],
                           yerr=[(e.std if multi else e.stderr) or 0 for _, e in pts],
                           capsize=3, marker="s" if arm else "o",
                           linewidth=2.2 if arm else 1.6, label=model_label(m, notes), **style)
        colours[m["name"]] = line[0].get_color()
        if multi:
            runs = [(xi, v) for xi, (_, e) in zip(x, pts) for v in e.values.values()]
            ax.plot([xi for xi, _ in runs], [v for _, v in runs], linestyle="none",
                    marker=".", alpha=0.35, color=line[0].get_color())
    ax.set_xticks(range(len(ks)), [f"{k}\n(unmasked)" if k == 0 else str(k) for k in ks])
    ax.set_xlabel("K: top-K sinks masked per layer and head")
    ax.set_ylabel(f"accuracy ({metric or 'primary metric'})")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(task)
    ax.grid(alpha=0.3)


def _runs_caption(grid: dict) -> str:
    """What the plotted points are over several runs, for the figure's title; nothing for a
    sweep with one run per cell."""
    if not seed_stats.multi_run(grid):
        return ""
    if not grid.get("mask_seeds"):
        return (f" - mean over seeds {', '.join(map(str, grid['seeds']))}; error bars: std "
                "across seeds; dots: single seeds")
    seeds = grid.get("seeds") or []
    seeds = f"seed{'s' * (len(seeds) > 1)} {seed_stats.seeds_text(seeds)} x " if seeds else ""
    return (f" - mean over runs ({seeds}mask_seed {seed_stats.seeds_text(grid['mask_seeds'])}"
            " for random keys); error bars: std across runs; dots: single runs")


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def render(folder: Path, title: str | None = None, metrics: dict[str, str] | None = None,
           digits: int = 2, figure: bool = True, versus_pairs: list | None = None,
           pool: list[Path] | None = None) -> dict[str, Path]:
    """Write ``table.md``, ``table.csv`` and ``accuracy_vs_k.png`` into ``folder``, and
    ``versus.csv`` for the sweep's ``--versus`` pairs (``versus_pairs`` replaces them).

    ``folder`` is a sweep folder, or, with ``pool``, the folder of one table over those sweep
    folders' seeds (:func:`load_pooled`): it keeps their paths and the title in ``pooled.json``
    (a title given once is kept), so rendering it again later needs only ``folder``.

    From the cells done so far: sweeps still running in ``folder`` add theirs as they finish.
    Renders hold the folder's lock, so two at once (sweeps sharing the folder ending together)
    do not interleave their writes, and the later one, which saw more cells, is the one kept."""
    folder = Path(folder)
    if pool:
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / "sweep.json").is_file():
            raise ValueError(f"{folder} is a sweep folder: a pooled table goes into a folder of its own")
        sources = [Path(os.path.relpath(Path(p).resolve(), folder.resolve())).as_posix()
                   for p in pool]
        path = folder / POOLED
        with folder_locked(folder):  # another render of this pool reads or writes it too
            before = path.read_text() if path.is_file() else None  # put back if this pool fails
            if title is None and before is not None:  # a title given once is kept
                title = json.loads(before).get("title")
            path.write_text(json.dumps({"sources": sources, "title": title}, indent=1) + "\n")
            try:
                return _render(folder, title, metrics, digits, figure, versus_pairs)
            except BaseException:  # a refused pool (a typo in a source) or a failed render
                # leaves the last good one, which the tables still show (written last)
                if before is None:
                    path.unlink()
                else:
                    path.write_text(before)
                raise
    if pooled_sources(folder) is None:
        sweep_json(folder)  # says what the folder lacks, before a lock file is made in it
    with folder_locked(folder):
        return _render(folder, title, metrics, digits, figure, versus_pairs)


def _pooled(folder: Path) -> dict | None:
    """A pooled table's ``pooled.json`` (its sources and title), or None for a sweep folder."""
    path = Path(folder) / POOLED
    return json.loads(path.read_text()) if path.is_file() else None


def pooled_sources(folder: Path) -> list[Path] | None:
    """The sweep folders a pooled table's folder reads, or None for a sweep folder."""
    pooled = _pooled(folder)
    return None if pooled is None else _sources(folder, pooled)


def _sources(folder: Path, pooled: dict) -> list[Path]:
    return [Path(folder) / p for p in pooled["sources"]]


def _check_metric_tasks(metrics: dict[str, str], tasks: set[str]) -> None:
    """A metric override for a task the table does not hold (a typo in its name) would leave
    the task it was meant for on its default metric, with no word said."""
    unknown = sorted(set(metrics) - tasks)
    if unknown:
        raise SystemExit(f"--metric names task(s) {', '.join(unknown)} with no finished cell "
                         f"here; the table's tasks: {', '.join(sorted(tasks))}")


def _render(folder: Path, title: str | None, metrics: dict[str, str] | None, digits: int,
            figure: bool, versus_pairs: list | None) -> dict[str, Path]:
    grid, entries, zoo = load(folder, metrics)
    if not entries:
        where = pooled_sources(folder) or [folder]
        raise SystemExit(f"no finished cells under {', '.join(f'{p}/cells' for p in where)}")
    _check_metric_tasks(metrics or {}, {e.task for e in entries})
    if versus_pairs is not None:
        check_pairs(versus_pairs, [m["name"] for m in grid["models"]])
        grid = {**grid, "versus": versus_pairs}
    title = title_of(grid, zoo, title)
    out = {"markdown": folder / "table.md", "csv": folder / "table.csv"}
    comparisons = versus.compare(grid, entries)
    texts = {"markdown": markdown(grid, entries, title, digits, comparisons),
             "csv": csv_text(grid, entries)}
    if comparisons:
        out["versus"] = folder / "versus.csv"
        texts["versus"] = write_csv(versus.FIELDS, versus.csv_rows(comparisons))
    # the texts are written last, once the figure is drawn: a render that fails leaves the
    # folder's last tables (and a failed --pool the pooled.json that made them)
    if figure:
        out["figure"] = plot(grid, entries, title, folder / "accuracy_vs_k.png")
    for key, text in texts.items():
        out[key].write_text(text)
    return out


__all__ = ["render", "markdown", "csv_text", "load", "load_pooled", "is_zoo"]
