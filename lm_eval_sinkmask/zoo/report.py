"""The tiny zoo's report card (issue 4): accuracy on the full test splits, and where the sinks are.

    python -m lm_eval_sinkmask.zoo.report --out results/zoo

1. Accuracy: the zoo's ARM, LLaDA-style and Dream-style checkpoints (``llada_sink`` has its
   own experiment, ``experiments/sink_token.py``), unmasked and greedy, on the whole mini_gsm (300) and
   mini_code (100) test splits, through the sweep (so through lm-eval and our model classes,
   scored by the same filters and sandbox as the real tasks); cells are resumable.
2. Sinks: a few mini_gsm generations traced through the intercept (``sink_trace``), eps = 3.
   DLMs score keys over all queries (docs/method.md section 2); the ARM is traced under both query rules (docs/method.md section 5)
   (``last_row``, the paper's, and ``all_rows``). Per model: the mean number of Eq. 3 sinks per
   (layer, head) per step, the share of (layer, head) pairs with at least one sink on average
   over a generation's steps, and the most common sink tokens and positions.
3. ``report.md`` and ``report.json`` in ``--out``.

Tiny CPU models on synthetic tasks: a test bed, not a claim about 8B models.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from . import ZOO_NAMES, checkpoint_path

TASKS = ("mini_gsm_sinkmask", "mini_code_sinkmask")
GEN_LENGTH = 128  # mini_gsm's max_gen_toks: the traced generations are mini_gsm answers
# issue 4's bars, unmasked: (mini_gsm exact match, mini_code pass@1)
TARGETS = {"arm": (0.80, 0.50), "dream": (0.50, 0.30), "llada": (0.20, 0.15)}
ARM_RULES = ("last_row", "all_rows")


# ------------------------------------------------------------------- sink statistics

def position_label(pos: int, prompt_length: int) -> str:
    """Positions comparable across prompts: BOS, counted back from the prompt's end, or
    forward into the generated answer."""
    if pos == 0:
        return "0 (BOS)"
    if pos < prompt_length:
        return f"prompt end {pos - prompt_length}"
    return f"answer +{pos - prompt_length}"


def sink_summary(n_sinks: np.ndarray, top_pos: np.ndarray, is_sink: np.ndarray,
                 token_at, prompt_length: int) -> dict[str, Any]:
    """One traced generation: sinks per (layer, head) and where they sit.

    n_sinks: [T, L, H] Eq. 3 sinks per step; top_pos / is_sink: [T, L, H, n] the recorded top
    keys and which of them are sinks; ``token_at(step, pos)`` names the token a key held at
    that step (a DLM's canvas changes as it is decoded).
    """
    per_pair = n_sinks.mean(axis=0)  # [L, H]: mean sinks per step
    tokens, positions = Counter(), Counter()
    for t, l, h, i in zip(*np.nonzero(is_sink)):
        pos = int(top_pos[t, l, h, i])
        tokens[token_at(int(t), pos)] += 1
        positions[position_label(pos, prompt_length)] += 1
    return {
        "mean_sinks_per_pair": float(per_pair.mean()),
        "pairs": int(per_pair.size),
        "pairs_with_sink": int((per_pair >= 1).sum()),
        "tokens": tokens,
        "positions": positions,
    }


def combine(summaries: list[dict[str, Any]], top: int = 5) -> dict[str, Any]:
    """Several generations of one model: means of the per-generation numbers, pooled counts."""
    tokens, positions = Counter(), Counter()
    for s in summaries:
        tokens.update(s["tokens"])
        positions.update(s["positions"])
    total = max(sum(tokens.values()), 1)
    share = lambda c: [[k, round(v / total, 3)] for k, v in c.most_common(top)]  # noqa: E731
    return {
        "generations": len(summaries),
        "mean_sinks_per_pair": float(np.mean([s["mean_sinks_per_pair"] for s in summaries])),
        "share_of_pairs_with_sink": float(np.mean([s["pairs_with_sink"] / s["pairs"]
                                                   for s in summaries])),
        "top_tokens": share(tokens),
        "top_positions": share(positions),
    }


# --------------------------------------------------------------------------- runners

def run_accuracy(out: Path, models: list[str], limit: int | None, jobs: int) -> None:
    from ..sweep import ModelSpec, SweepPlan, infer_kind, run_sweep

    specs = [ModelSpec(m, str(checkpoint_path(m)), infer_kind(str(checkpoint_path(m))))
             for m in models]
    plan = SweepPlan(models=specs, tasks=list(TASKS), ks=[0], out=out, limit=limit,
                     batch_size=32, device="cpu", allow_code_execution=True)
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


def trace_folder(out: Path, label: str) -> Path:
    """Where a variant's traces live: ``arm (last_row)`` -> ``traces/arm_last_row``."""
    return out / "traces" / label.replace(" (", "_").rstrip(")")


def run_traces(out: Path, models: list[str], n_prompts: int) -> None:
    from ..sink_trace import trace_generation
    from . import data

    prompts = [data.gsm_prompt(d) for d in data.mini_gsm_test()[:n_prompts]]
    for label, name, args in traced_variants(models):
        for i, prompt in enumerate(prompts):
            folder = trace_folder(out, label) / f"gsm_{i}"
            if (folder / "meta.json").exists():
                continue
            trace_generation(str(checkpoint_path(name)), prompt, gen_length=GEN_LENGTH,
                             model_args=args, device="cpu", name=label).save(folder)
            print(f"traced {label} {folder.name}", flush=True)


def trace_sinks(folder: Path, tokenizer) -> dict[str, Any]:
    from ..sink_trace import Trace

    trace = Trace.load(folder)
    is_sink = trace.top_are_sinks()
    inputs = trace.arrays.get("inputs")
    final = trace.meta["tokens"]

    def token_at(step: int, pos: int) -> str:
        if inputs is not None and pos < inputs.shape[1] and inputs[step, pos] >= 0:
            return tokenizer.decode([int(inputs[step, pos])])
        return final[pos] if pos < len(final) else "?"

    return sink_summary(trace["n_sinks"], trace["top_pos"], is_sink, token_at,
                        trace.meta["prompt_length"])


def read_accuracy(out: Path) -> dict[str, dict[str, dict[str, Any]]]:
    acc: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted((out / "cells").glob("*/*/k0/cell.json")):
        r = json.loads(path.read_text())
        acc.setdefault(r["request"]["model"], {})[r["request"]["task"]] = {
            "metric": r["metric"], "value": r["value"], "stderr": r["stderr"], "n": r["n"]}
    return acc


def write_report(out: Path, models: list[str]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    acc = read_accuracy(out)
    sinks = {}
    for label, name, _ in traced_variants(models):
        folders = sorted(trace_folder(out, label).glob("*/meta.json"))
        if folders:
            tok = AutoTokenizer.from_pretrained(checkpoint_path(name))
            sinks[label] = combine([trace_sinks(f.parent, tok) for f in folders])
    report = {"accuracy": acc, "targets": TARGETS, "sinks": sinks}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")

    def cell(model, task, i):
        r = acc.get(model, {}).get(task)
        if r is None:
            return "-"
        bar = TARGETS.get(model, (None, None))[i]
        mark = "" if bar is None else (" (target >= %.2f: %s)" % (bar, "met" if r["value"] >= bar else "**not met**"))
        return f"{r['value']:.3f} ± {r['stderr']:.3f} (n={r['n']}){mark}"

    def fmt(pairs):  # newlines and tabs as escapes, so a token cannot break the table
        return ", ".join(f"`{k.encode('unicode_escape').decode()}` {v:.0%}" for k, v in pairs)

    lines = [
        "# Tiny zoo report card",
        "",
        "Tiny CPU models on synthetic tasks (a test bed, **not a claim about 8B models**). "
        "Regenerate with `python -m lm_eval_sinkmask.zoo.report --out results/zoo`.",
        "",
        "## Accuracy (unmasked, greedy, whole test splits, through lm-eval)",
        "",
        "mini_gsm: exact match (strict); mini_code: pass@1 in the sandbox. DLM sampler settings: "
        "the family defaults (LLaDA: blocks of 32, steps = gen_length, low-confidence "
        "remasking; Dream: steps = gen_length, alg entropy); gen_length = the task's "
        "max_gen_toks (128 / 64).",
        "",
        "| model | mini_gsm | mini_code |",
        "|---|---|---|",
    ]
    for m in models:
        if m in acc:
            lines.append(f"| {m} | {cell(m, TASKS[0], 0)} | {cell(m, TASKS[1], 1)} |")
    lines += [
        "",
        f"## Sinks (eps = 3, {GEN_LENGTH}-token mini_gsm generations, unmasked)",
        "",
        "Sinks per pair: mean number of Eq. 3 sinks per (layer, head) per step. Pairs with a "
        "sink: the share of (layer, head) pairs with at least one sink on average over a "
        "generation's steps. Tokens and positions: how often each is among the sinks "
        "(of the 5 top-scoring keys recorded per step, layer and head), pooled over the "
        "generations; positions count back from the prompt's end (`Answer:` ends it) or "
        "forward into the answer.",
        "",
        "| model (query rule) | generations | sinks per pair | pairs with a sink | "
        "most common sink tokens | most common sink positions |",
        "|---|---:|---:|---:|---|---|",
    ]
    for label, s in sinks.items():
        lines.append(f"| {label} | {s['generations']} | {s['mean_sinks_per_pair']:.2f} | "
                     f"{s['share_of_pairs_with_sink']:.0%} | {fmt(s['top_tokens'])} | "
                     f"{fmt(s['top_positions'])} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/zoo")
    ap.add_argument("--models", default="arm,llada,dream",  # llada_sink: results/sink_token
                    help="models to run now; the report covers every model saved in --out")
    ap.add_argument("--limit", type=int, default=None,
                    help="test problems per task (default: the whole splits)")
    ap.add_argument("--traces", type=int, default=4, help="mini_gsm generations traced per model")
    ap.add_argument("--jobs", type=int, default=2, help="sweep cells run at once")
    ap.add_argument("--report-only", action="store_true", help="only rewrite the report")
    args = ap.parse_args(argv)
    out = Path(args.out)
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(ZOO_NAMES))
    if unknown:
        ap.error(f"unknown zoo models {unknown}; choose from {list(ZOO_NAMES)}")
    if not args.report_only:
        run_accuracy(out, models, args.limit, args.jobs)
        run_traces(out, models, args.traces)
    write_report(out, list(ZOO_NAMES))  # everything saved, not only what ran now
    print((out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
