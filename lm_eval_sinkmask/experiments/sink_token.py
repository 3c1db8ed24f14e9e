"""Does one extra sink token help a diffusion LM? ("One Token Is Enough")

    python -m lm_eval_sinkmask.experiments.sink_token --limit-gsm 300   # installed seeds

Compares the zoo's LLaDA-style baseline (``zoo:llada``) with the same recipe retrained with an
extra sink token (``zoo:llada_sink``; the two differ in that token only), in every training
seed: seed S of one is paired with seed S of the other (same init and data order apart from
the token), and the report gives the gain per pair with its paired standard error (both models
scored the same problems) and its mean and spread across pairs, since one pair's gap can be
run-to-run luck:

1. accuracy: ``sinkmask sweep``'s cells on mini_gsm and mini_code at K = 0, 1, 5, 10 (the
   extra token among the sink candidates, the default ``sink_token=include``), and the masking
   ablation with it excluded (``sink_token=exclude``, model ``llada_sink_excl``) at K = 1, 5, 10;
2. sinks: unmasked ``sinkmask sinks`` traces of a few test prompts per model: sink stability
   (``stability.py``: does the main sink keep its position from one denoising step to the
   next), the share of attention on the extra token and on BOS, and how often the extra token
   is the main sink;
3. report: ``sink_token.md``, ``sink_token.csv``, ``summary.json`` and ``sink_token.png`` in
   ``--out`` (a sweep folder too: ``sinkmask table`` on it writes its own ``table.md`` beside
   them).

Resumable: finished sweep cells and traces are skipped on a rerun (``--report-only`` just
redraws). Tiny CPU models: a test bed, not a claim about 8B models.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from .. import paired
from ..seed_stats import sample_std
from ..tasks import max_gen_toks
from ..text_format import percent

TASKS = {"mini_gsm_sinkmask": "mini_gsm", "mini_code_sinkmask": "mini_code"}
KS = (0, 1, 5, 10)
# name -> (checkpoint, model_args, K values): the excluded variant needs no K = 0 (it is
# llada_sink's K = 0 exactly: nothing is masked)
MODELS = {
    "llada": ("zoo:llada", "", KS),
    "llada_sink": ("zoo:llada_sink", "sink_token=include", KS),
    "llada_sink_excl": ("zoo:llada_sink", "sink_token=exclude", KS[1:]),
}
LABELS = {
    "llada": "llada (baseline)",
    "llada_sink": "llada_sink, token among candidates",
    "llada_sink_excl": "llada_sink, token excluded",
}
TRACED = ("llada", "llada_sink")
GEN_LENGTH = {task: max_gen_toks(task) for task in TASKS}


# --------------------------------------------------------------------------- accuracy

def run_accuracy(out: Path, limits: dict[str, int | None], batch_size: int, tasks,
                 models, seeds: list[int] | None = None) -> None:
    """The sweep cells; ``seeds`` None is the older single-run layout (the embedded checkpoints)."""
    from ..sweep import run_sweep
    from ..sweep_plan import ModelSpec, SweepPlan

    for task in tasks:
        for name in models:
            path, args, ks = MODELS[name]
            plan = SweepPlan(models=[ModelSpec(name, path, "dlm", args)], tasks=[task],
                             ks=list(ks), out=out, limit=limits[task], batch_size=batch_size,
                             device="cpu", allow_code_execution=True, seeds=seeds)
            run_sweep(plan)


def _records(out: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(folder, cell.json) of the experiment's sweep cells as saved, in path order, each held
    to lm-eval's files beside it as ``sinkmask table`` holds its cells."""
    from ..table import checked_results

    cells = out / "cells"
    records = [(p.parent, json.loads(p.read_text())) for p in sorted(
        [*cells.glob("*/*/k*/cell.json"), *cells.glob("*/seed*/*/k*/cell.json")])]
    records = [(folder, r) for folder, r in records
               if r["request"]["model"] in MODELS and r["request"]["task"] in TASKS]
    for folder, r in records:
        checked_results(folder, r)
    return records


def per_document(records: list[tuple[Path, dict[str, Any]]]) -> dict[tuple, dict | None]:
    """(model, seed, task, K) -> each problem's score (lm-eval's samples), for paired errors."""
    return {(r["request"]["model"], r["request"].get("checkpoint_seed"), r["request"]["task"],
             r["request"]["top_k"]): paired.read_per_document(
                 folder, r["request"]["task"], r["metric"], r["value"], r.get("results_files"))
            for folder, r in records}


def read_cells(records: list[tuple[Path, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per cell of :func:`_records`: its accuracy, sample count and masking counters."""
    rows = []
    for _, r in records:
        req = r["request"]
        counters = (r.get("sinkmask") or {}).get("counters") or {}
        rows.append({"model": req["model"], "seed": req.get("checkpoint_seed"),
                     "task": req["task"], "k": req["top_k"],
                     "metric": r["metric"], "value": r["value"], "stderr": r["stderr"],
                     "n": r["n"], "limit": req["limit"], "seconds": r["seconds"],
                     "keys_masked": counters.get("keys_masked"),
                     "forward_passes": counters.get("forward_passes")})
    return rows


def input_lines(records: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """The report's footer naming the checkpoints and task versions the cells ran on; a folder
    whose cells disagree on them (two runs mixed) is refused, as ``sinkmask table`` refuses it."""
    from ..table import check_one_input_each, entry_of
    from ..table_layout import input_notes

    entries = [entry_of(r, kind="dlm") for _, r in records]
    check_one_input_each(entries)
    return input_notes({"models": [{"name": m} for m in MODELS], "tasks": list(TASKS)}, entries)


# ------------------------------------------------------------------------------ sinks

def trace_prompts(n: int) -> list[tuple[str, str]]:
    from ..zoo import data

    gsm = [("mini_gsm_sinkmask", data.gsm_prompt(d)) for d in data.mini_gsm_test()[:n]]
    code = [("mini_code_sinkmask", data.code_prompt(d)) for d in data.mini_code_test()[:n]]
    return gsm + code


def run_traces(out: Path, n_prompts: int, seeds: list[int] | None = None) -> None:
    """One unmasked traced generation per (model, seed, prompt), saved under out/traces/."""
    from ..provenance import checkpoint_digest
    from ..sink_trace import Trace, trace_generation
    from ..sweep_plan import seed_path

    for name in TRACED:
        for seed in seeds or [None]:
            path = seed_path(MODELS[name][0], seed)
            digest = checkpoint_digest(path)
            root = out / "traces" / name / ("" if seed is None else f"seed{seed}")
            for i, (task, prompt) in enumerate(trace_prompts(n_prompts)):
                folder = root / f"{TASKS[task]}_{i % n_prompts}"
                if Trace.stands(folder, gen_length=GEN_LENGTH[task], checkpoint=digest):
                    continue  # done, with this generation length and these weights
                # watch keys 0 and 1: BOS and the next token (baseline), or the extra sink
                # token (position 0, "start") and BOS (llada_sink)
                trace = trace_generation(path, prompt, kind="dlm", gen_length=GEN_LENGTH[task],
                                         device="cpu", name=name, watch=(0, 1))
                trace.save(folder)
                print(f"traced {path} {folder.name}: {trace.meta['stability']['aggregate']}",
                      flush=True)


def _mean(values) -> float | None:
    v = [x for x in values if x is not None and math.isfinite(x)]
    return float(np.mean(v)) if v else None


def trace_summary(out: Path) -> dict[str, dict[str, Any]]:
    """Per model: stability numbers and attention shares, averaged over its traces."""
    from ..sink_trace import Trace

    summary = {}
    for name in TRACED:
        root = out / "traces" / name  # one run's traces, or one folder per seed
        folders = sorted([*root.glob("*/meta.json"), *root.glob("seed*/*/meta.json")])
        if not folders:
            continue
        per_trace = []
        for meta in folders:
            trace = Trace.load(meta.parent)
            agg = trace.meta.get("stability", trace.stability())["aggregate"]
            pos, _ = trace.main_sink()
            has = pos >= 0
            offset = trace.key_offset  # 1: the extra token leads the keys, BOS follows it
            sink_pos = 0 if offset else None
            bos_pos = offset
            per_trace.append({
                "keep_rate": agg["keep_rate"],
                "pooled_keep_rate": agg["pooled_keep_rate"],
                "distinct_positions": agg["distinct_positions"],
                "main_share": agg["main_share"],
                "heads_with_sink": agg["heads_with_sink"] / max(agg["heads"], 1),
                "extra_share": (float(np.nanmean(trace.share_on_position(sink_pos)))
                                if sink_pos is not None else None),
                "bos_share": float(np.nanmean(trace.share_on_position(bos_pos))),
                "main_is_extra": (float((pos[has] == sink_pos).mean())
                                  if sink_pos is not None and has.any() else None),
                "main_is_bos": float((pos[has] == bos_pos).mean()) if has.any() else None,
            })
        summary[name] = {k: _mean(t[k] for t in per_trace) for k in per_trace[0]}
        summary[name]["traces"] = len(per_trace)
    return summary


# ----------------------------------------------------------------------------- report

def _stability_text(value: float | None, pct: bool) -> str:
    """A stability aggregate: a share in percent (``96.4%``) or a count (``1.25``)."""
    if value is None:
        return "-"
    return percent(value) + "%" if pct else f"{value:.2f}"


STABILITY_COLUMNS = [
    ("keep_rate", "main sink keeps its position (per-head mean)"),
    ("pooled_keep_rate", "... pooled over step pairs"),
    ("distinct_positions", "distinct main-sink positions per head"),
    ("main_share", "attention share of the main sink"),
    ("heads_with_sink", "heads with a sink"),
    ("extra_share", "attention share of the extra token"),
    ("bos_share", "attention share of BOS"),
    ("main_is_extra", "main sink = extra token (of steps and heads with a sink)"),
    ("main_is_bos", "main sink = BOS (of steps and heads with a sink)"),
]


def across_seeds(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(model, task, K) -> mean over seeds as ``value``, the sample std across seeds as
    ``stderr`` (what the plot's error bars show), lm-eval's mean stderr as ``se``."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["task"], r["k"]), []).append(r)
    return {key: {"value": statistics.fmean(r["value"] for r in g),
                  "stderr": sample_std(r["value"] for r in g),
                  "se": _mean(r["stderr"] for r in g), "seeds": len(g)}
            for key, g in groups.items()}


# (label, model with the token, K values): each is compared with llada at the same K and seed
GAINS = [("llada_sink - llada", "llada_sink", KS),
         ("llada_sink, token excluded - llada", "llada_sink_excl", KS[1:])]


def paired_gains(rows: list[dict[str, Any]], per_doc: dict | None = None) -> list[dict[str, Any]]:
    """The token's gain per seed pair (llada_sink@S minus llada@S, same task and K; a run
    without seeds is one pair, seed None), with its mean, sample std, min and max across pairs,
    the number of pairs where it is positive, and per pair the paired standard error of the gain
    over the problems both scored (from ``per_doc``, :func:`per_document`)."""
    by = {(r["model"], r["seed"], r["task"], r["k"]): r["value"] for r in rows}
    seeds = sorted({r["seed"] for r in rows}, key=lambda s: -1 if s is None else s)
    per_doc = per_doc or {}
    out = []
    for task in TASKS:
        for label, model, ks in GAINS:
            for k in ks:
                diffs = {s: by[(model, s, task, k)] - by[("llada", s, task, k)] for s in seeds
                         if (model, s, task, k) in by and ("llada", s, task, k) in by}
                if not diffs:
                    continue
                d = list(diffs.values())
                ses = {s: paired.paired_se(per_doc.get(("llada", s, task, k)),
                                           per_doc.get((model, s, task, k))) for s in diffs}
                out.append({"task": task, "comparison": label, "k": k, "per_seed": diffs,
                            "per_seed_se": ses, "se_mean": paired.mean_se(ses.values()),
                            "mean": statistics.fmean(d),
                            "std": sample_std(d),
                            "min": min(d), "max": max(d), "pairs": len(d),
                            "pairs_with_gain": sum(x > 0 for x in d)})
    return out


def _gain_lines(gains: list[dict[str, Any]], seeds: list[int]) -> list[str]:
    lines = ["## Does the gain survive seeds? (paired by seed, percentage points)", "",
             "Each seed of llada_sink against the same seed of llada (same init and data order "
             "apart from the token): the difference per pair ± its paired standard error (both "
             "scored the same problems: the standard error of the per-problem differences), "
             "then the mean ± sample standard deviation (n - 1) across pairs, the mean paired "
             "standard error, and the pairs where llada_sink is ahead. A spread across pairs "
             "well above the paired standard errors is the training runs disagreeing.", "",
             "| task | comparison | K | " + " | ".join(f"seed {s}" for s in seeds)
             + " | mean ± std | paired se (mean) | pairs with a gain |",
             "|---|---|---|" + "---|" * len(seeds) + "---|---|---|"]
    for g in gains:
        std, se = percent(g["std"], missing="n/a"), percent(g["se_mean"], missing="n/a")
        lines.append(f"| {TASKS[g['task']]} | {g['comparison']} | {g['k']} | "
                     + " | ".join(percent(g["per_seed"].get(s), g["per_seed_se"].get(s), sign=True) for s in seeds)
                     + f" | {percent(g['mean'], sign=True)} ± {std} | {se} | {g['pairs_with_gain']} of {g['pairs']} |")
    for g in gains:
        if g["comparison"] == GAINS[0][0] and g["k"] == 0:
            held = "in every pair" if g["pairs_with_gain"] == g["pairs"] else (
                f"in {g['pairs_with_gain']} of {g['pairs']} pairs only")
            lines.append(f"\nUnmasked {TASKS[g['task']]}: llada_sink is ahead {held} (mean "
                         f"{percent(g['mean'], sign=True)} ± {percent(g['std'], missing='n/a')} "
                         "percentage points).")
    return lines + [""]


def _single_gain_lines(gains: list[dict[str, Any]]) -> list[str]:
    """One training run per arm: the gain ± its paired standard error, which covers the
    problems' sampling only (not what another training run would do)."""
    lines = ["## The token's gain on the same problems (one training run each, percentage points)",
             "", "llada_sink minus llada on the same problems ± the paired standard error (the "
             "standard error of the per-problem differences). It measures the sampling of the "
             "problems only: whether another training run of either model would keep the gap "
             "takes several seeds (`--seeds 0,1,2`).", "",
             "| task | comparison | K | gain ± paired se |", "|---|---|---|---|"]
    lines += [f"| {TASKS[g['task']]} | {g['comparison']} | {g['k']} | "
              f"{percent(g['mean'], g['se_mean'], sign=True)} |" for g in gains]
    return lines + [""]


def write_report(out: Path) -> dict[str, Any]:
    """``sink_token.md``, ``sink_token.csv``, ``summary.json`` and ``sink_token.png`` from what
    ``out`` holds alone (cells and traces), so ``--report-only`` redraws it without running
    anything. Named after the experiment, since ``out`` is a sweep folder whose generic
    ``sinkmask table`` writes ``table.md`` and ``table.csv``: either would overwrite the other."""
    records = _records(out)
    rows = read_cells(records)
    stab = trace_summary(out)
    seeds = sorted({r["seed"] for r in rows if r["seed"] is not None})
    multi = len(seeds) > 1
    cell = across_seeds(rows) if multi else {(r["model"], r["task"], r["k"]): r for r in rows}
    spread = (f"mean over the {len(seeds)} training seeds ({', '.join(map(str, seeds))}) ± "
              "their sample standard deviation, with lm-eval's mean stderr (se)") if multi else (
              "mean ± stderr (lm-eval's)")
    lines = ["# Extra sink token: llada vs llada_sink (tiny zoo)", "",
             "Tiny models (synthetic tasks): a test bed, not a claim about "
             f"8B models. Accuracy in %, {spread}, greedy, project's block "
             "sampler (block 32, steps = gen_length).", ""]
    lines += _accuracy_lines(rows, cell, multi)
    missing = missing_cells(rows, seeds or [None])
    if missing:
        lines += ["**Not in this folder yet** (the numbers above leave these cells out; run "
                  "them with `--models`/`--tasks`, then redraw): " + "; ".join(missing) + ".",
                  ""]
    gains = paired_gains(rows, per_document(records))
    if gains:
        lines += _gain_lines(gains, seeds) if multi else _single_gain_lines(gains)
    if stab:
        lines += _sink_lines(stab)
    notes = input_lines(records)
    if notes:
        lines += notes + [""]
    (out / "sink_token.md").write_text("\n".join(lines))
    with (out / "sink_token.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["model"])
        w.writeheader()
        w.writerows(rows)
    summary = {"accuracy": rows, "sinks": stab, "paired_gains": gains}
    if multi:
        summary["seeds"] = seeds
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    draw(out, cell, stab, seeds if multi else None)
    return summary


def missing_cells(rows: list[dict[str, Any]], seeds: list[int | None]) -> list[str]:
    """The experiment's cells (every model, task and K, for each seed the folder holds) that
    ``rows`` lack, grouped per model and task: 'model task K=1,5 (seed 2)'. Why: the work is
    split over processes by ``--models``, and a report drawn before every process has run
    would otherwise pass for a whole one (a model with no cell drops out of the tables)."""
    have = {(r["model"], r["task"], r["k"], r["seed"]) for r in rows}
    out = []
    for name, (_, _, ks) in MODELS.items():
        for task, short in TASKS.items():
            for seed in seeds:
                lacking = [k for k in ks if (name, task, k, seed) not in have]
                if lacking:
                    where = "" if seed is None else f" (seed {seed})"
                    out.append(f"{name} {short} K={','.join(map(str, lacking))}{where}")
    return out


def _accuracy_lines(rows: list[dict[str, Any]], cell: dict, multi: bool) -> list[str]:
    """One accuracy table per task: a row per model, a column per K (``cell``: one run's
    numbers, or over seeds :func:`across_seeds`)."""
    lines = []
    for task, short in TASKS.items():
        n = {r["n"] for r in rows if r["task"] == task}
        metric = {r["metric"] for r in rows if r["task"] == task}
        lines += [f"## {short} ({', '.join(map(str, sorted(metric)))}; n = "
                  f"{', '.join(map(str, sorted(n)))})", "",
                  "| model | " + " | ".join(f"K={k}" for k in KS) + " |",
                  "|---|" + "---|" * len(KS)]
        for name in MODELS:
            cells = [cell.get((name, task, k)) for k in KS]
            if not any(cells):
                continue
            lines.append(f"| {LABELS[name]} | " + " | ".join(
                _fmt_cell(c, multi) if c else "(= K=0 above)" if k == 0 else "-"
                for c, k in zip(cells, KS)) + " |")
        lines.append("")
    return lines


def _sink_lines(stab: dict[str, dict[str, Any]]) -> list[str]:
    """The traced models side by side, a row per stability number (:data:`STABILITY_COLUMNS`)."""
    lines = ["## Sinks in unmasked generations (eps = 3, means over traced prompts)", "",
             "| | " + " | ".join(stab) + " |", "|---|" + "---|" * len(stab)]
    for key, label in STABILITY_COLUMNS:
        pct = key not in ("distinct_positions",)
        lines.append(f"| {label} | " + " | ".join(
            _stability_text(stab[m].get(key), pct) for m in stab) + " |")
    return lines + ["", "Traced prompts per model: " + ", ".join(
        f"{m} {s['traces']}" for m, s in stab.items()) + " (half mini_gsm, half mini_code)."
        " Shares are the mean attention a valid query row gives the key (uniform share "
        "= 1/|K|), averaged over steps, layers and heads.", ""]


def _fmt_cell(c: dict[str, Any], multi: bool) -> str:
    if not multi:
        return percent(c["value"], c["stderr"])
    std = percent(c["stderr"], missing="n/a")
    se = "" if c["se"] is None else f"; se {percent(c['se'])}"
    return f"{percent(c['value'])} ± {std} ({c['seeds']} seeds{se})"


# colour and line style per model: the token's two variants share llada_sink's colour
STYLES = {"llada": ("C0", "o-"), "llada_sink": ("C3", "s-"), "llada_sink_excl": ("C3", "^--")}


def draw(out: Path, cell: dict, stab: dict, seeds: list[int] | None = None) -> Path:
    """``sink_token.png``: accuracy vs K per task, then the traced sink numbers side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (task, short) in zip(axes, TASKS.items()):
        _accuracy_panel(ax, cell, task, short)
    axes[0].legend(fontsize=8)
    _sink_panel(axes[2], stab)
    over = (f"; accuracy: mean over seeds {', '.join(map(str, seeds))}, error bars: std across "
            "seeds") if seeds else ""
    fig.suptitle("Extra sink token on the tiny zoo (LLaDA-style models; not a claim about 8B "
                 f"models{over})", fontsize=10)
    fig.tight_layout()
    path = out / "sink_token.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _accuracy_panel(ax, cell: dict, task: str, short: str) -> None:
    """One task's accuracy vs K per model; the excluded variant starts from llada_sink's K=0,
    which is its own (nothing is masked there)."""
    for name in MODELS:
        pts = [(k, cell[(name, task, k)]) for k in KS if (name, task, k) in cell]
        if name == "llada_sink_excl" and ("llada_sink", task, 0) in cell:
            pts = [(0, cell[("llada_sink", task, 0)])] + pts
        if not pts:
            continue
        x = np.arange(len(KS))[[KS.index(k) for k, _ in pts]]
        y = np.array([100 * c["value"] for _, c in pts])
        e = np.array([100 * (c["stderr"] or 0) for _, c in pts])
        color, style = STYLES[name]
        ax.errorbar(x, y, yerr=e, fmt=style, color=color, capsize=3, label=LABELS[name])
    ax.set_xticks(range(len(KS)), [f"K={k}" for k in KS])
    ax.set_title(f"{short}: accuracy vs sinks masked")
    ax.set_ylabel("accuracy (%)")
    ax.grid(alpha=0.3)


def _sink_panel(ax, stab: dict) -> None:
    """The traced models' stability and attention shares as grouped bars."""
    keys = [("keep_rate", "main sink\nkeeps position"), ("main_share", "share of\nmain sink"),
            ("extra_share", "share of\nextra token"), ("bos_share", "share of\nBOS")]
    traced = [m for m in TRACED if m in stab]
    for j, name in enumerate(traced):
        vals = [100 * (stab[name].get(k) or 0) for k, _ in keys]
        ax.bar(np.arange(len(keys)) + 0.38 * (j - 0.5), vals, width=0.38,
               color=STYLES[name][0], label=name)
    ax.set_xticks(range(len(keys)), [label for _, label in keys], fontsize=8)
    ax.set_ylabel("%")
    ax.set_title("sinks, unmasked generations (eps = 3)")
    if traced:
        ax.legend(fontsize=8)
    else:  # a report drawn before any trace exists says so instead of an empty panel
        ax.text(0.5, 0.5, "no traces yet", ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3, axis="y")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/sink_token_v2",
                    help="the folder it resumes and reports into [%(default)s: the committed "
                         "pairs of the zoo v2]")
    ap.add_argument("--limit-gsm", type=int, default=100, help="mini_gsm problems [%(default)s]")
    ap.add_argument("--limit-code", type=int, default=100, help="mini_code problems [%(default)s]")
    ap.add_argument("--tasks", default=",".join(TASKS), help="subset of the tasks to run now")
    ap.add_argument("--models", default=",".join(MODELS),
                    help="subset of the models to run now (e.g. to split the work over two "
                         "processes; the report always covers everything saved)")
    ap.add_argument("--trace-prompts", type=int, default=4,
                    help="traced prompts per task and model [%(default)s]")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seeds", default=None,
                    help="training seeds: seed S of llada is paired with seed S of llada_sink "
                         "(empty: only the embedded checkpoints, the older single-run layout) "
                         "[every seed installed: 0, and those in zoo_seeds/]")
    ap.add_argument("--skip-traces", action="store_true")
    ap.add_argument("--report-only", action="store_true", help="only redraw from what is saved")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not a.report_only:
        limits = {"mini_gsm_sinkmask": a.limit_gsm, "mini_code_sinkmask": a.limit_code}
        tasks = [t for t in a.tasks.split(",") if t]
        models = [m for m in a.models.split(",") if m]
        unknown = sorted(set(tasks) - set(TASKS)) + sorted(set(models) - set(MODELS))
        if unknown:
            raise SystemExit(f"unknown task(s)/model(s) {unknown}; choose from "
                             f"{list(TASKS)} and {list(MODELS)}")
        from ..sweep_plan import parse_seeds, seed_path
        from ..zoo import installed_seeds
        from ..zoo.install import check_seeds_share_a_recipe

        try:
            seeds = (installed_seeds(("llada", "llada_sink")) if a.seeds is None
                     else parse_seeds(a.seeds))
            # a missing seed fails before anything runs; the report pools every pair saved in
            # --out, so the pairs of earlier runs must share the recipe too
            for name in sorted({*models, *TRACED}):
                check_seeds_share_a_recipe(
                    name, lambda seed, path=MODELS[name][0]: seed_path(path, seed),
                    seeds or [None], out)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        run_accuracy(out, limits, a.batch_size, tasks, models, seeds)
        if not a.skip_traces:
            run_traces(out, a.trace_prompts, seeds)
    write_report(out)
    print((out / "sink_token.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
