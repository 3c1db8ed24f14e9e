"""The zoo report card as Markdown (``report.md``): every checkpoint with its bars, each model
across seeds, the sinks traced and their value norms.

It renders what :func:`zoo.report.read_report` returns (``build_report``'s report with the
cells it read) and computes nothing itself.
"""

from __future__ import annotations

from typing import Any

from .data import N_TEST_GSM
from ..text_format import or_na
from .report import EPS, GEN_LENGTH, SINK_BAR, SPLIT_SIZE, TARGETS, TASKS
from .sink_stats import low_norm_verdict


def _verdict_text(verdict: str | None, bar: str, n: int | None = None, size: int = 0) -> str:
    if verdict is None:
        return "-"
    if verdict == "partial":
        return f"not judged (n={n} of {size})"
    return f"{'met' if verdict == 'met' else '**not met**'} (>= {bar})"


def _spread_text(s: dict[str, Any] | None, pct: bool = False) -> str:
    if s is None:
        return "-"
    spec = ".0%" if pct else ".3f"
    f = lambda x: format(x, spec)  # noqa: E731
    std = or_na(s["std"], spec)
    return f"{f(s['mean'])} ± {std} ({f(s['min'])}-{f(s['max'])}, n={s['seeds']})"


def markdown(report: dict[str, Any]) -> str:
    """The report card: every checkpoint, each model across seeds, the sinks traced."""
    seeds = ",".join(str(s) for s in sorted({c["seed"] for c in report["checkpoints"]})) or "0"
    cells = "".join(f" --cells {c}" for c in report.get("cells_read", []))
    lines = [
        "# Tiny zoo report card",
        "",
        "Tiny models on synthetic tasks (a test bed, **not a claim about 8B models**). "
        "Regenerate with `python -m lm_eval_sinkmask.zoo.report --out results/zoo --seeds "
        f"{seeds}{cells}` (`--cells DIR` reads unmasked cells computed elsewhere, e.g. on a GPU; "
        "without it they are computed here).",
    ]
    lines += _checkpoint_section(report["checkpoints"])
    lines += _summary_section(report["summary"])
    lines += _sink_section(report["checkpoints"])
    return "\n".join(lines) + "\n"


def _accuracy_text(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    dtype = f", {r['dtype']}" if r.get("dtype") else ""
    se = or_na(r["stderr"], ".3f")
    return f"{r['value']:.3f} ± {se} (n={r['n']}{dtype})"


def _checkpoint_section(checkpoints: list[dict[str, Any]]) -> list[str]:
    """One row per (model, seed): accuracy with its bars, the share of pairs with a sink."""
    lines = [
        "",
        "## Every checkpoint (unmasked, greedy, whole test splits, through lm-eval)",
        "",
        "mini_gsm: exact match (strict); mini_code: pass@1 in the sandbox; ± lm-eval's standard "
        "error. DLM sampler settings: the family defaults (LLaDA: blocks of 32, steps = "
        "gen_length, low-confidence remasking; Dream: steps = gen_length, alg entropy); "
        f"gen_length = the task's max_gen_toks ({' / '.join(map(str, GEN_LENGTH.values()))}). "
        "Bars: mini_gsm "
        + ", ".join(f"{m} >= {t[0]:.2f}" for m, t in TARGETS.items())
        + "; mini_code " + ", ".join(f"{m} >= {t[1]:.2f}" for m, t in TARGETS.items())
        + f"; sinks in at least {SINK_BAR:.0%} of the (layer, head) pairs of every DLM. "
        "A bar is judged only on the whole split. Pairs with a sink: the share of (layer, "
        f"head) pairs with at least one Eq. 3 sink (eps = {EPS:g}) on average over a generation's "
        f"steps, the mean over the {GEN_LENGTH['mini_gsm_sinkmask']}-token mini_gsm "
        "generations of every test problem (unmasked, greedy) ± its standard error; the "
        "share varies by tens of points from one prompt to another, so the first few prompts "
        "are no fair sample of the split.",
        "",
        "| model | seed | recipe | mini_gsm | bar | mini_code | bar | pairs with a sink | bar |",
        "|---|---:|---|---|---|---|---|---:|---|",
    ]
    for c in checkpoints:
        name = c["model"]
        cells = []
        for i, task in enumerate(TASKS):
            r = c["accuracy"].get(task)
            bar = TARGETS.get(name, (None, None))[i]
            cells += [_accuracy_text(r), _verdict_text(c["bars"][task], f"{bar:.2f}" if bar else "",
                                                       r and r["n"], SPLIT_SIZE[task])]
        split = c.get("split_shares")
        share = "-" if split is None else bar_share_text(split)
        sink_bar = _verdict_text(c["bars"]["sinks"], f"{SINK_BAR:.0%}",
                                 split and split["generations"], N_TEST_GSM)
        lines.append(f"| {name} | {c['seed']} | {c.get('recipe', '-')} | " + " | ".join(cells)
                     + f" | {share} | {sink_bar} |")
    weights = {f"{c['model']}@{c['seed']}": r["checkpoint"] for c in checkpoints
               for r in c["accuracy"].values() if r.get("checkpoint")}
    if weights:
        lines += ["", "Weights the accuracy cells ran on (sha256 of the model files, first 12 hex "
                  "digits): " + ", ".join(f"{k} `{d.split(':')[-1][:12]}`"
                                          for k, d in weights.items()) + "."]
    return lines


def bar_share_text(shares: dict[str, Any]) -> str:
    """``54.3% ± 0.8% (n=300)``: the sink bar's share over the test split's generations."""
    se = "" if shares["share_stderr"] is None else f" ± {shares['share_stderr']:.1%}"
    return f"{shares['share_of_pairs_with_sink']:.1%}{se} (n={shares['generations']})"


def _summary_section(summary: dict[str, Any]) -> list[str]:
    """One row per model: its spread across seeds and how many checkpoints met each bar."""
    lines = [
        "",
        "## Per model, across seeds",
        "",
        "Mean ± sample standard deviation across seeds (n - 1 denominator), then min-max and "
        "the number of seeds; bars met: checkpoints meeting the bar / checkpoints judged "
        "(whole split evaluated; for the sink bar, every problem's generation traced). "
        "Seeds trained under different recipes (model size, steps x batch) are never pooled: "
        "one row per recipe.",
        "",
        "| model | recipe | checkpoints | mini_gsm | mini_code | pairs with a sink | "
        "mini_gsm bar met | mini_code bar met | sink bar met |",
        "|---|---|---:|---|---|---|---|---|---|",
    ]
    for s in summary.values():
        met = [("-" if judged == 0 else f"{m}/{judged}") for m, judged in s["bars_met"].values()]
        lines.append(f"| {s['model']} | {s['recipe']} | {s['checkpoints']} | "
                     f"{_spread_text(s.get(TASKS[0]))} | "
                     f"{_spread_text(s.get(TASKS[1]))} | "
                     f"{_spread_text(s.get('share_of_pairs_with_sink'), pct=True)} | "
                     + " | ".join(met) + " |")
    return lines


def _sink_section(checkpoints: list[dict[str, Any]]) -> list[str]:
    """One row per traced (checkpoint, query rule): how many sinks, which tokens, where."""
    def fmt(pairs):  # newlines and tabs as escapes, so a token cannot break the table
        return ", ".join(f"`{k.encode('unicode_escape').decode()}` {v:.0%}" for k, v in pairs)

    lines = [
        "",
        f"## Sinks (eps = {EPS:g}, {GEN_LENGTH['mini_gsm_sinkmask']}-token mini_gsm generations, unmasked)",
        "",
        "From the full traces of the first test problems' generations (the sink bar above "
        "reads every problem's). Sinks per pair: mean number of Eq. 3 sinks per (layer, "
        "head) per step. Pairs with a sink: the share of (layer, head) pairs with at least "
        "one sink on average over a generation's steps, the mean over the generations ± its standard error (the sample "
        "standard deviation over generations / sqrt(generations); in parentheses the lowest "
        "and highest generation's share). Tokens and positions: how often each is among the sinks "
        "(of the 5 top-scoring keys recorded per step, layer and head), pooled over the "
        "generations; positions count back from the prompt's end (`Answer:` ends it) or "
        "forward into the answer. By layer: the share of each layer's heads with a sink, "
        "first layer to last, in percent.",
        "",
        "| model (query rule) | seed | generations | sinks per pair | pairs with a sink | "
        "by layer | most common sink tokens | most common sink positions |",
        "|---|---:|---:|---:|---:|---|---|---|",
    ]
    for c in checkpoints:
        for label, s in c["sinks"].items():
            lines.append(f"| {label} | {c['seed']} | {s['generations']} | "
                         f"{s['mean_sinks_per_pair']:.2f} | {share_text(s)} | "
                         f"{by_layer_text(s.get('share_by_layer'))} | "
                         f"{fmt(s['top_tokens'])} | {fmt(s['top_positions'])} |")
    lines += value_norm_section({f"{label} seed {c['seed']}": s for c in checkpoints
                                 for label, s in c["sinks"].items()})
    return lines


def by_layer_text(shares: list[float | None] | None) -> str:
    """A sink bar's shares by layer, first to last, in percent ("-": a layer not scored)."""
    if shares is None:
        return "-"
    return " ".join("-" if x is None else f"{100 * x:.0f}" for x in shares)


def share_text(sinks: dict[str, Any]) -> str:
    """The share of pairs with a sink, with its standard error and the range over generations
    where recorded."""
    text = f"{sinks['share_of_pairs_with_sink']:.0%}"
    if sinks.get("share_stderr") is not None:
        text += f" ± {sinks['share_stderr']:.0%}"
    if sinks.get("share_range"):
        lo, hi = sinks["share_range"]
        text += f" ({lo:.0%}-{hi:.0%})"
    return text


def value_norm_section(sinks: dict[str, dict[str, Any]]) -> list[str]:
    """report.md's answer to "do sinks have low-norm values?", one row per traced model."""
    lines = [
        "",
        "## Do sinks have low-norm values? (same traces)",
        "",
        "Each recorded sink's value vector norm divided by the median value norm of its head's "
        "keys at that step (1 = a typical key), pooled over the generations; main sink: the "
        "top-scoring key when it is a sink; for contrast, the recorded top keys that are not "
        "sinks. Low-norm values: yes when the median sink is below 0.5x its head's median.",
        "",
        "| model (query rule) | sinks | sinks: median (IQR) | below 0.5x | main sink: median | "
        "non-sink top keys: median | low-norm values? |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    for label, s in sinks.items():
        b = s.get("value_norms")
        if b is None:
            lines.append(f"| {label} | - | traces predate value norms: rerun the report | | | | n/a |")
            continue
        q, m, o = b["sinks"], b["main_sinks"], b["other_top_keys"]
        f = or_na  # ".2f"
        lines.append(f"| {label} | {q['n']} | {f(q['median'])} ({f(q['q25'])}-{f(q['q75'])}) | "
                     f"{or_na(q['share_low'], '.0%')} | "
                     f"{f(m['median'])} | {f(o['median'])} | {low_norm_verdict(b)} |")
    return lines
