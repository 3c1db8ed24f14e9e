"""The tiny zoo's report card: every checkpoint's accuracy on the whole test splits, and where its sinks are.

    python -m lm_eval_sinkmask.zoo.report --out results/zoo   # every installed seed

1. Accuracy: every zoo model (ARM, LLaDA-style, Dream-style and the extra-sink-token twin
   ``llada_sink``) in every training seed, unmasked and greedy, on the whole mini_gsm (300) and
   mini_code (100) test splits, through the sweep (so through lm-eval and our model classes,
   scored by the same filters and sandbox as the real tasks); cells are resumable. The cells
   may also come from elsewhere (``--cells DIR``, e.g. a ``sinkmask sweep --seeds 0,1,2
   --top-k 0`` folder computed on a GPU): any K=0 cell of a zoo checkpoint run with the
   family's default sampler counts.
2. Sinks: mini_gsm generations traced through the intercept (``sink_trace``), eps = 3. DLMs
   score keys over all queries; the ARM is traced under both query rules (``last_row``, the
   paper's, and ``all_rows``). The sink bar is judged like the accuracy bars, on the whole test
   split: every problem's generation, kept as a compact record (:mod:`zoo.split_shares`). The
   first few generations are kept whole, for the descriptive statistics: the mean number of
   Eq. 3 sinks per (layer, head) per step, the share of (layer, head) pairs with at least one
   sink on average over a generation's steps, and the most common sink tokens and positions.
3. Value norms: whether the sinks' value vectors are small ("One Token Is Enough" explains
   sinks that way): each recorded sink's value norm relative to the median of its head, pooled
   over the traced generations (traces of version 3 and later; older ones are retraced).
4. The bars each checkpoint is held to (:data:`TARGETS`, :data:`SINK_BAR`), met or not per
   checkpoint, and per model the mean and spread across seeds; ``report.md`` and
   ``report.json`` in ``--out``.

The statistics over a trace are :mod:`zoo.sink_stats`'s, the Markdown :mod:`zoo.report_markdown`'s.
Tiny models on synthetic tasks: a test bed, not a claim about 8B models.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
from pathlib import Path
from typing import Any

from ..config import ARM_RULES
from ..seed_stats import sample_std
from ..tasks import max_gen_toks
from . import ZOO_NAMES, checkpoint_path, identify, installed_seeds
from .data import N_TEST_CODE, N_TEST_GSM
from .install import RECIPE_FIELDS, recipe, recipe_label
from .sink_stats import combine, low_norm_verdict, sink_summary
from .split_shares import read_split_shares, run_split_shares

TASKS = ("mini_gsm_sinkmask", "mini_code_sinkmask")
SPLIT_SIZE = {"mini_gsm_sinkmask": N_TEST_GSM, "mini_code_sinkmask": N_TEST_CODE}  # whole test splits
GEN_LENGTH = {task: max_gen_toks(task) for task in TASKS}  # the traced generations are mini_gsm's
# the zoo v2 bars, unmasked, whole test splits: (mini_gsm exact match, mini_code pass@1)
TARGETS = {"arm": (0.90, 0.60), "dream": (0.60, 0.60), "llada": (0.50, 0.60),
           "llada_sink": (0.50, 0.60)}
# every DLM checkpoint must have sinks: at least this share of its (layer, head) pairs, on
# average over the generations of the whole mini_gsm test split
SINK_BAR = 0.5
EPS = 3.0  # Eq. 3's threshold for every trace the report makes
# model_args that leave an unmasked run's sampler at the family default (anything else, e.g.
# block_length=1, is another experiment and not read as the checkpoint's accuracy)
NEUTRAL_ARGS = {"pretrained", "top_k", "eps", "arm_rule", "sink_token", "dtype",
                "trust_remote_code", "detect", "granularity", "layers", "query_chunk"}


# --------------------------------------------------------------------------- runners

def run_accuracy(out: Path, models: list[str], seeds: list[int], limit: int | None, jobs: int,
                 device: str = "cpu", batch_size: int = 32) -> None:
    from ..sweep import run_sweep
    from ..sweep_plan import SweepPlan, parse_models

    specs = parse_models(",".join(f"{m}=zoo:{m}" for m in models), seeds=seeds)
    plan = SweepPlan(models=specs, tasks=list(TASKS), ks=[0], out=out, limit=limit,
                     batch_size=batch_size, device=device, allow_code_execution=True,
                     seeds=seeds)
    run_sweep(plan, jobs=jobs)


def traced_variants(models: list[str]) -> list[tuple[str, str, str]]:
    """(label, zoo name, model_args): the ARM once per query rule, every DLM once."""
    out = []
    for m in models:
        if m == "arm":
            out += [(f"arm ({rule})", m, f"arm_rule={rule}") for rule in ARM_RULES]
        else:
            out.append((m, m, ""))
    return out


def bar_variants(models: list[str]) -> list[tuple[str, str, str]]:
    """The traced variants the sink bar reads, one per model (:func:`main_label`)."""
    return [v for v in traced_variants(models) if v[0] == main_label(v[1])]


def main_label(name: str) -> str:
    """The traced variant whose sinks a checkpoint is judged by: the ARM's under the paper's
    query rule, a DLM's only one."""
    return "arm (last_row)" if name == "arm" else name


def traced_name(label: str) -> str:
    """The zoo name a traced variant belongs to: ``arm (all_rows)`` -> ``arm``."""
    return label.split(" (")[0]


def variant_folder(label: str) -> str:
    """A traced variant's folder name: ``arm (last_row)`` -> ``arm_last_row``."""
    return label.replace(" (", "_").rstrip(")")


def trace_folder(out: Path, label: str, seed: int) -> Path:
    """Where a variant's traces live: ``arm (last_row)``, seed 1 -> ``traces/arm_last_row/seed1``."""
    return out / "traces" / variant_folder(label) / f"seed{seed}"


def run_traces(out: Path, models: list[str], seeds: list[int], n_prompts: int,
               device: str = "cpu") -> None:
    from ..provenance import checkpoint_digest
    from ..sink_trace import Trace, trace_generation
    from . import data

    prompts = [data.gsm_prompt(d) for d in data.mini_gsm_test()[:n_prompts]]
    for label, name, args in traced_variants(models):
        for seed in seeds:
            for i, prompt in enumerate(prompts):
                folder = trace_folder(out, label, seed) / f"gsm_{i}"
                ref = f"zoo:{name}@{seed}"  # recorded as is: a name, not this machine's path
                if Trace.stands(folder, gen_length=GEN_LENGTH["mini_gsm_sinkmask"],
                                checkpoint=checkpoint_digest(ref), eps=EPS):
                    continue  # this trace version, this length, these weights
                trace_generation(ref, prompt,
                                 gen_length=GEN_LENGTH["mini_gsm_sinkmask"], eps=EPS,
                                 model_args=args, device=device,
                                 name=f"{label} seed {seed}").save(folder)
                print(f"traced {label} seed {seed} {folder.name}", flush=True)


# --------------------------------------------------------------------------- reading

def _args(model_args: str) -> dict[str, str]:
    return dict(a.split("=", 1) for a in model_args.split(",") if "=" in a)


def read_accuracy(folders: list[Path], current=None) -> dict[tuple[str, int], dict[str, dict[str, Any]]]:
    """(zoo name, seed) -> task -> the unmasked result, from the K=0 cells of sweep folders.

    A cell counts when its checkpoint is a zoo checkpoint (``zoo:NAME@S`` or a path to one,
    wherever it was computed) run with the family's default sampler, and when it ran on the
    checkpoint and task installed now, by this package's code: its recorded input digests must
    match ``current((name, seed), task)`` (default :func:`installed_inputs`), so cells of an
    earlier training of the same name, of an earlier task version, or made by other
    lm-eval-sinkmask code (cells that record its digest; for these unmasked cells, other code
    than the detection's, :func:`provenance.unmasked_code_digest`), are left out and listed. When two
    folders hold the same (checkpoint, task), the one with more problems wins, then the
    earlier folder.
    """
    from ..provenance import changed_inputs

    current = current or installed_inputs()
    acc: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    stale: list[str] = []
    for folder in folders:
        for path in sorted(Path(folder).glob("cells/**/k0/cell.json")):
            r = json.loads(path.read_text())
            req = r["request"]
            args = _args(req.get("model_args", ""))
            ckpt = identify(args.get("pretrained", r.get("model_path", "")))
            if ckpt is None or req["task"] not in TASKS or set(args) - NEUTRAL_ARGS:
                continue
            now = current(ckpt, req["task"])
            if now is None or changed_inputs(r.get("inputs"), now, unmasked=True):
                stale.append(str(path.parent))
                continue
            new = {"metric": r["metric"], "value": r["value"], "stderr": r["stderr"],
                   "n": r["n"], "cell": str(path.parent), "dtype": args.get("dtype"),
                   "checkpoint": now["checkpoint"]}
            old = acc.setdefault(ckpt, {}).get(req["task"])
            if old is None or (new["n"] or 0) > (old["n"] or 0):
                acc[ckpt][req["task"]] = new
    if stale:
        print(f"zoo report: left out {len(stale)} cell(s) not made on the installed checkpoint and "
              "task by this code (an earlier training or task version, other lm-eval-sinkmask "
              "code, or a seed not installed here):\n  "
              + "\n  ".join(stale), flush=True)
    return acc


def installed_inputs():
    """``((name, seed), task) -> input digests`` of the installed zoo checkpoint, the task and
    the package code as they are now (None: that seed is not installed)."""
    from lm_eval.tasks import TaskManager

    from ..provenance import InputDigests

    digests = InputDigests(TaskManager(include_defaults=False))

    def current(ckpt: tuple[str, int], task: str) -> dict[str, Any] | None:
        try:
            path = checkpoint_path(*ckpt)
        except ValueError:
            return None
        return digests.for_cell(str(path), task)

    return current


def trace_sinks(folder: Path, tokenizer) -> dict[str, Any]:
    """One saved trace's :func:`sink_summary`, plus its value norms for :func:`combine` to pool.
    A sink's token is read from the canvas at that step: a DLM's changes as it decodes."""
    from ..sink_trace import Trace

    trace = Trace.load(folder)
    is_sink = trace.top_are_sinks()
    inputs = trace.arrays.get("inputs")  # key positions, like top_pos

    def token_at(step: int, pos: int) -> str:
        if inputs is not None and pos < inputs.shape[1] and inputs[step, pos] >= 0:
            return tokenizer.decode([int(inputs[step, pos])])
        return trace.key_label(pos) or "?"

    summary = sink_summary(trace["n_sinks"], trace["top_pos"], is_sink, token_at,
                           trace.meta["prompt_length"], trace.key_offset,
                           len(trace.meta["tokens"]), trace.scored_heads())
    summary["values"] = ((trace["top_vnorm"], is_sink, trace.meta["eps"])
                         if "top_vnorm" in trace.arrays else None)
    return summary


def read_sinks(out: Path, models: list[str]) -> dict[tuple[str, int], dict[str, Any]]:
    """(traced variant label, seed) -> its combined sink statistics."""
    from transformers import AutoTokenizer

    sinks = {}
    for label, name, _ in traced_variants(models):
        traces = trace_folder(out, label, 0).parent
        seed_folders = sorted((int(p.name[4:]), p) for p in traces.glob("seed*")
                              if p.name[4:].isdigit())
        tok = None
        for seed, seed_folder in seed_folders:
            folders = sorted(seed_folder.glob("*/meta.json"))
            if folders:
                tok = tok or AutoTokenizer.from_pretrained(checkpoint_path(name))  # seeds share it
                sinks[(label, seed)] = combine([trace_sinks(f.parent, tok) for f in folders])
    return sinks


# --------------------------------------------------------------------------- verdicts

def accuracy_verdict(model: str, task: str, result: dict[str, Any] | None) -> str | None:
    """"met", "not met", "partial" (fewer problems than the whole split) or None (no bar/result)."""
    bar = TARGETS.get(model, (None, None))[TASKS.index(task)]
    if bar is None or result is None:
        return None
    if (result["n"] or 0) < SPLIT_SIZE[task]:
        return "partial"
    return "met" if result["value"] >= bar else "not met"


def sink_verdict(model: str, shares: dict[str, Any] | None) -> str | None:
    """Like :func:`accuracy_verdict`, from the share of pairs with a sink over the test split's
    generations (:func:`zoo.split_shares.read_split_shares`); the ARM has no sink bar."""
    if model == "arm" or shares is None:
        return None
    if shares["generations"] < N_TEST_GSM:
        return "partial"
    return "met" if shares["share_of_pairs_with_sink"] >= SINK_BAR else "not met"


def seed_summary(values: list[float]) -> dict[str, Any]:
    """Mean, sample standard deviation (n - 1; None below two values), min and max."""
    return {"mean": statistics.fmean(values), "std": sample_std(values),
            "min": min(values), "max": max(values), "seeds": len(values)}


def installed_recipe(name: str, seed: int) -> dict | None:
    """The training recipe of an installed zoo checkpoint (:func:`zoo.install.recipe`), None
    where it is not installed here or has no readable card."""
    try:
        return recipe(checkpoint_path(name, seed))
    except ValueError:  # not installed here, or a card that is not JSON
        return None


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 24 else hashlib.sha256(text.encode()).hexdigest()[:8]


def recipe_labels(found: list) -> list[str]:
    """One label per recipe in ``found`` (one model's checkpoints): :func:`recipe_label`, and
    where two different recipes share it, the fields that tell them apart, so that grouping by
    label never pools different recipes. A str passes as its own label; None is "unknown"."""
    def base(r):
        return "unknown" if r is None else r if isinstance(r, str) else recipe_label(r)

    labels = []
    for r in found:
        label = base(r)
        clash = [o for o in found if isinstance(o, dict) and o != r and base(o) == label]
        if isinstance(r, dict) and clash:
            fields = [f for f in RECIPE_FIELDS if any(o.get(f) != r.get(f) for o in clash)]
            label += ", " + ", ".join(f"{f} {_short(r.get(f))}" for f in fields)
        labels.append(label)
    return labels


def build_report(acc, sinks, models: list[str], recipe_of=installed_recipe,
                 shares=None) -> dict[str, Any]:
    """Checkpoint rows (model x seed, with their verdicts) and per-model spreads across seeds
    (one per training recipe: seeds of different recipes are not runs of one experiment).
    ``recipe_of(name, seed)``: the checkpoint's recipe dict, a label, or None; ``shares``: the
    sink bar's records over the test split, by (variant label, seed)."""
    checkpoints = checkpoint_rows(acc, sinks, models, shares or {})
    for name in {c["model"] for c in checkpoints}:
        rows = [c for c in checkpoints if c["model"] == name]
        for c, label in zip(rows, recipe_labels([recipe_of(name, c["seed"]) for c in rows])):
            c["recipe"] = label
    return {"checkpoints": checkpoints, "summary": model_summary(checkpoints, models),
            "targets": TARGETS, "sink_bar": SINK_BAR, "split_size": SPLIT_SIZE}


def checkpoint_rows(acc, sinks, models: list[str], shares) -> list[dict[str, Any]]:
    """One row per (model, seed) with an accuracy cell or a trace, in ``models`` order, then by
    seed: its results, its traced variants' sinks, its share of pairs with a sink over the test
    split and its verdict on each bar."""
    keys = sorted({k for k in acc if k[0] in models}
                  | {(traced_name(label), seed) for label, seed in (*sinks, *shares)},
                  key=lambda k: (models.index(k[0]) if k[0] in models else len(models), k[1]))
    checkpoints = []
    for name, seed in keys:
        results = acc.get((name, seed), {})
        stats = {label: sinks[(label, seed)] for label, _, _ in traced_variants([name])
                 if (label, seed) in sinks}
        bars = {task: accuracy_verdict(name, task, results.get(task)) for task in TASKS}
        split = shares.get((main_label(name), seed))
        bars["sinks"] = sink_verdict(name, split)
        checkpoints.append({"model": name, "seed": seed, "accuracy": results, "sinks": stats,
                            "split_shares": split, "bars": bars})
    return checkpoints


def model_summary(checkpoints: list[dict[str, Any]], models: list[str]) -> dict[str, Any]:
    """Per model with checkpoints, and per training recipe where its seeds ran several (keyed
    ``name (recipe)`` then): the spread across seeds of each task's accuracy and of the share of
    pairs with a sink, and per bar how many checkpoints met it of those judged."""
    summary = {}
    for name in models:
        recipes = list(dict.fromkeys(c.get("recipe") for c in checkpoints if c["model"] == name))
        for r in recipes:
            rows = [c for c in checkpoints if c["model"] == name and c.get("recipe") == r]
            key = name if len(recipes) == 1 else f"{name} ({r})"
            summary[key] = {"model": name, "recipe": r, **_spreads(rows, name)}
    return summary


def _spreads(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """One model's checkpoints of one recipe: the spreads and the bars met."""
    entry = {}
    for task in TASKS:
        values = [c["accuracy"][task]["value"] for c in rows if task in c["accuracy"]]
        if values:
            entry[task] = seed_summary(values)
    shares = [c["split_shares"]["share_of_pairs_with_sink"] for c in rows if c["split_shares"]]
    if shares:
        entry["share_of_pairs_with_sink"] = seed_summary(shares)
    entry["bars_met"] = {bar: [sum(c["bars"][bar] == "met" for c in rows),
                               sum(c["bars"][bar] in ("met", "not met") for c in rows)]
                         for bar in (*TASKS, "sinks")}  # [met, judged]
    entry["checkpoints"] = len(rows)
    return entry



def read_report(out: Path, models: list[str], cells: list[Path] = ()) -> dict[str, Any]:
    """The report of what ``out`` (and the ``cells`` folders) hold, as ``report.json`` keeps it."""
    acc = read_accuracy([out, *cells])
    sinks = read_sinks(out, models)
    report = build_report(acc, sinks, models, shares=installed_shares(out, models))
    report["cells_read"] = [str(c) for c in cells]  # for the report's regenerate line
    report["low_norm_values"] = {f"{label} seed {seed}": low_norm_verdict(v.get("value_norms"))
                                 for (label, seed), v in sinks.items()}
    return report


def installed_shares(out: Path, models: list[str]) -> dict[tuple[str, int], dict[str, Any]]:
    """The sink bar's records in ``out`` that were traced on the zoo checkpoints installed now
    (records of an earlier training of a name are left out and listed, as stale cells are)."""
    from ..provenance import checkpoint_digest

    shares, stale = {}, []
    for (label, seed), s in read_split_shares(out, bar_variants(models)).items():
        try:
            now = checkpoint_digest(f"zoo:{traced_name(label)}@{seed}")
        except ValueError:  # that seed is not installed here
            now = None
        if s["checkpoint"] == now:
            shares[(label, seed)] = s
        else:
            stale.append(f"{label} seed {seed}")
    if stale:
        print("zoo report: left out the sink records of checkpoints not installed now: "
              + ", ".join(stale), flush=True)
    return shares


def write_report(out: Path, models: list[str], cells: list[Path] = ()) -> dict[str, Any]:
    """Read ``out`` (and the ``cells`` folders), write ``report.md`` and ``report.json``."""
    from . import report_markdown  # it reads this module's bars

    report = read_report(out, models, cells)
    (out / "report.json").write_text(report_json(report))
    (out / "report.md").write_text(report_markdown.markdown(report))
    return report


def report_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    from ..sweep_plan import parse_seeds

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/zoo")
    ap.add_argument("--models", default=",".join(ZOO_NAMES),
                    help="models to run now; the report covers every zoo model saved in --out")
    ap.add_argument("--seeds", default=None,
                    help="training seeds to run now [every seed installed: 0, and those in "
                         "zoo_seeds/]")
    ap.add_argument("--limit", type=int, default=None,
                    help="test problems per task (default: the whole splits; bars are judged "
                         "only on whole splits)")
    ap.add_argument("--traces", type=int, default=16,
                    help="mini_gsm generations traced and kept whole per checkpoint, for the "
                         "sinks' tokens, positions and value norms [%(default)s]")
    ap.add_argument("--bar-generations", type=int, default=N_TEST_GSM,
                    help="mini_gsm generations the sink bar is judged on [the whole test split, "
                         "%(default)s]: the share of pairs with a sink varies by tens of points "
                         "from one prompt to another, and fewer leave the bar unjudged")
    ap.add_argument("--trace-cache", type=Path, default=None, metavar="DIR",
                    help="keep the full traces of the sink bar's generations here (outside the "
                         "results: about 200 KB each), and reuse those `zoo.sink_share --out DIR` "
                         "made")
    ap.add_argument("--jobs", type=int, default=2,
                    help="sweep cells, and checkpoints traced for the sink bar, run at once "
                         "[%(default)s] (on a CPU with OMP_NUM_THREADS=1: one core each)")
    ap.add_argument("--device", default="cpu", help="e.g. cuda for the accuracy cells and traces")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--cells", action="append", type=Path, default=[], metavar="DIR",
                    help="another sweep folder whose unmasked zoo cells the report reads "
                         "(e.g. computed on a GPU); repeatable")
    ap.add_argument("--skip-accuracy", action="store_true", help="run no accuracy cells")
    ap.add_argument("--skip-traces", action="store_true", help="trace nothing")
    ap.add_argument("--report-only", action="store_true", help="only rewrite the report")
    args = ap.parse_args(argv)
    if not 1 <= args.bar_generations <= N_TEST_GSM:
        ap.error(f"--bar-generations must be between 1 and the test split's {N_TEST_GSM}")
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    if args.traces < 0:
        ap.error("--traces must be at least 0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(ZOO_NAMES))
    if unknown:
        ap.error(f"unknown zoo models {unknown}; choose from {list(ZOO_NAMES)}")
    try:
        seeds = installed_seeds() if args.seeds is None else parse_seeds(args.seeds) or [0]
        for m in models if not args.report_only else []:  # a missing seed fails now
            for s in seeds:
                checkpoint_path(m, s)
    except ValueError as e:
        ap.error(str(e))
    missing = [str(c) for c in args.cells if not (c / "cells").is_dir()]
    if missing:
        ap.error(f"--cells folders without a cells/ subfolder: {missing}")
    if not args.report_only and not args.skip_accuracy:
        run_accuracy(out, models, seeds, args.limit, args.jobs, args.device, args.batch_size)
    if not args.report_only and not args.skip_traces:
        run_traces(out, models, seeds, args.traces, args.device)
        run_split_shares(out, bar_variants(models), seeds, GEN_LENGTH["mini_gsm_sinkmask"], EPS,
                         args.device, args.bar_generations, args.trace_cache, args.jobs)
    write_report(out, list(ZOO_NAMES), args.cells)  # everything saved, not only what ran now
    print((out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
