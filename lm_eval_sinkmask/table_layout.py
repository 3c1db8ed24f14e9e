"""The shape every rendering of Table 1 shares: its rows and labels, the header and footer
lines, the cells in table order, and CSV text. The single-run table (:mod:`table`), the
table over seeds and draws (:mod:`seed_stats`) and the paired comparisons (:mod:`versus`)
each fill it with their own cells; here so that none of them imports another to draw it.

Cells are read as :class:`table.Entry` (model, task, k, value, per-document scores, digests).
"""

from __future__ import annotations

import csv
import io

from . import paired
from .sweep_plan import task_limits

PAIRED_NOTE = ("its paired standard error (both runs scored the same problems: the standard error "
               "of the per-problem differences, shown where lm-eval's samples are kept)")
K_NOTE = ("K=k masks the k highest-scoring Eq. 3 sinks per layer and head (the paper's "
          "eps0/eps1/eps2 columns are K=1/5/10).")


def row_label(k: int) -> str:
    return "Unmasked" if k == 0 else f"K={k}"


def in_table_order(grid: dict, idx: dict):
    """(task, K, model dict, idx entry) of every cell present in ``idx``, in the CSV's order."""
    for task in grid["tasks"]:
        for k in sorted(grid["ks"]):
            for m in grid["models"]:
                e = idx.get((m["name"], task, k))
                if e is not None:
                    yield task, k, m, e


def delta_se(base, masked) -> float | None:
    """Paired standard error of ``masked.value - base.value`` (:mod:`paired`)."""
    return paired.paired_se(base.per_doc if base is not None else None, masked.per_doc)


def model_label(model: dict, notes: dict[str, str] | None = None) -> str:
    """``llada (DLM)``, or ``llada_random (DLM, 8 draws)`` with a note for that model."""
    note = (notes or {}).get(model["name"])
    return f"{model['name']} ({model['kind'].upper()}{f', {note}' if note else ''})"


def layout(grid: dict, title: str, text_of, notes: dict[str, str] | None = None
           ) -> tuple[list[str], dict[str, str]]:
    """The table's title, header and rows; ``text_of(model, task, k)`` gives a cell's
    (text, metric), or None for a cell not run; ``notes`` adds to a model's header (``8
    draws``). Returns the lines and each task's metric."""
    models = grid["models"]
    header = ["Task", "Sinks masked"] + [model_label(m, notes) for m in models]
    lines = [f"# {title}", "",
             "| " + " | ".join(header) + " |",
             "|" + "|".join(["---", "---"] + [":---:"] * len(models)) + "|"]
    metrics: dict[str, str] = {}
    for task in grid["tasks"]:
        for i, k in enumerate(sorted(grid["ks"])):
            cells = []
            for m in models:
                found = text_of(m["name"], task, k)
                if found is None:
                    cells.append("-")
                    continue
                metrics.setdefault(task, found[1])
                cells.append(found[0])
            lines.append("| " + " | ".join([task if i == 0 else "", row_label(k)] + cells) + " |")
    return lines, metrics


def metric_and_sample_notes(grid: dict, metrics: dict[str, str], ns: list[int],
                            label: str) -> list[str]:
    """The footer lines naming each task's metric and the samples per cell."""
    def g(n):
        return "none" if n is None else format(n, "g")

    limits = task_limits(grid)
    if len(set(limits.values())) > 1:  # tasks swept with their own --limit
        limit = " (--limit " + ", ".join(f"{g(n)} on {t}" for t, n in limits.items()) + ")"
    else:
        limit = f" (--limit {g(grid['limit'])})" if grid.get("limit") is not None else ""
    return ["Metrics: " + "; ".join(f"{t}: `{m}`" for t, m in metrics.items()) + ".",
            f"{label}: {', '.join(map(str, ns)) or 'n/a'}{limit}."]


def input_notes(grid: dict, entries: list) -> list[str]:
    """The footer lines naming what the cells ran on by digest (first 12 hex digits), so a
    table says which weights and which task version it shows; none for cells that predate the
    digests."""
    def short(digest: str | None) -> str:
        return "n/a" if digest is None else f"`{digest.split(':')[-1][:12]}`"

    order = {m["name"]: i for i, m in enumerate(grid["models"])}
    by_checkpoint: dict[str, list[str]] = {}
    for e in sorted(entries, key=lambda e: (e.seed or 0, order.get(e.model, len(order)))):
        label = e.model if e.seed is None else f"{e.model}@{e.seed}"
        names = by_checkpoint.setdefault(e.checkpoint, []) if e.checkpoint else None
        if names is not None and label not in names:
            names.append(label)
    tasks = {e.task: e.task_inputs for e in entries if e.task_inputs}
    lines = []
    if by_checkpoint:
        lines.append("Checkpoints (sha256 of the model files): " + "; ".join(
            f"{', '.join(names)} {short(d)}" for d, names in by_checkpoint.items()) + ".")
    if tasks:
        lines.append("Tasks: " + "; ".join(
            f"{t} v{v} (config {short(c)}, documents {short(d)})"
            for t, (v, c, d) in ((t, tasks[t]) for t in grid["tasks"] if t in tasks)) + ".")
    return lines


def write_csv(fields: list[str], rows: list[dict]) -> str:
    """CSV text; floats as repr (exact round trip), None as empty."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else repr(v) if isinstance(v, float) else v)
                         for k, v in row.items()})
    return buf.getvalue()
