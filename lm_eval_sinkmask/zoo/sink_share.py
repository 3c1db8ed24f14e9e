"""Judge freshly trained DLM checkpoints by the zoo's sink bar before installing them.

    python -m lm_eval_sinkmask.zoo.sink_share runs/a/llada runs/b/llada --traces 8

A recipe search (``zoo.train`` with another ``--weight-decay``, say) ends in checkpoint folders
that the report card cannot read until they are installed as zoo seeds. This traces each one
exactly as the report does (unmasked mini_gsm generations of the task's length, eps = 3, the
first test prompts) and prints the share of (layer, head) pairs with at least one sink on
average over a generation's steps, the mean over the generations with its standard error, by
layer, beside the recipe fields that tell the runs apart. Runs that differ in one setting are
best compared on the same prompts (the prompts move every model's share the same way); the
bar itself is judged on the whole test split (``--traces 300``), as the report judges it.
Traces are kept under ``--out``, one folder per checkpoint content (the layout of the report's
``--trace-cache``), so a rerun with more ``--traces`` only traces the new prompts.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .data import N_TEST_GSM
from .install import training_card
from .report import EPS, GEN_LENGTH, SINK_BAR
from .report_markdown import by_layer_text
from .sink_stats import pair_shares
from .split_shares import cache_folder, generation_counts

TASK = "mini_gsm_sinkmask"


def sink_share(checkpoint: str, traces: int, out: Path, device: str = "cpu") -> dict[str, Any]:
    """The report's share of pairs with a sink (:func:`zoo.sink_stats.pair_shares`) of
    ``checkpoint`` over its first ``traces`` mini_gsm test generations, tracing those not saved
    under ``out`` yet (the layout of the report's ``--trace-cache``)."""
    from ..provenance import checkpoint_digest
    from . import data

    header = {"checkpoint": checkpoint_digest(checkpoint), "gen_length": GEN_LENGTH[TASK],
              "eps": EPS}
    folder = cache_folder(out, header["checkpoint"])
    return pair_shares([
        generation_counts(checkpoint, data.gsm_prompt(doc), header=header, model_args="",
                          device=device, name=str(checkpoint), cache=folder / f"gsm_{i}")
        for i, doc in enumerate(data.mini_gsm_test()[:traces])])


def row(checkpoint: str, stats: dict[str, Any]) -> str:
    info = training_card(checkpoint) or {}
    share, err = stats["share_of_pairs_with_sink"], stats["share_stderr"]
    spread = "" if err is None else f" ± {err:.1%}"
    layers = by_layer_text(stats["share_by_layer"] or [])
    if stats["generations"] < N_TEST_GSM:  # judged, as the report judges, on the whole split
        verdict = f"not judged (n={stats['generations']} of {N_TEST_GSM})"
    else:
        verdict = "met" if share >= SINK_BAR else "**not met**"
    return (f"| {checkpoint} | {info.get('seed', '?')} | {info.get('lr', '?')} "
            f"| {info.get('weight_decay', '?')} "
            f"| {info.get('steps', '?')} x {info.get('batch_size', '?')} "
            f"| {info.get('final_loss', '?')} | {stats['generations']} | {share:.1%}{spread} "
            f"| {layers} | {verdict} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoints", nargs="+", help="DLM checkpoint folders (zoo.train --out/NAME)")
    ap.add_argument("--traces", type=int, default=8,
                    help="mini_gsm generations traced per checkpoint [%(default)s]; the report "
                         "card judges the bar on all 300 (the first few prompts are no fair "
                         "sample of the split, but the same prompts serve to compare runs)")
    ap.add_argument("--out", type=Path, default=Path("runs/sink_share"),
                    help="where the traces are kept [%(default)s]")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.traces < 1:
        ap.error("--traces must be at least 1")
    missing = [c for c in args.checkpoints if not (Path(c) / "config.json").is_file()]
    if missing:
        ap.error(f"not checkpoint folders (no config.json): {missing}")
    print(f"Pairs with a sink (bar: at least {SINK_BAR:.0%}), eps = {EPS:g}, unmasked "
          f"{GEN_LENGTH[TASK]}-token mini_gsm generations; by layer, first to last, in percent.\n")
    print("| checkpoint | seed | peak lr | weight decay | steps x batch | final loss "
          "| generations | pairs with a sink | by layer | bar |")
    print("|---|---:|---:|---:|---|---:|---:|---|---|---|")
    for checkpoint in args.checkpoints:
        print(row(checkpoint, sink_share(checkpoint, args.traces, args.out, args.device)),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
