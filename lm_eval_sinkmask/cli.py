"""``sinkmask``: the sweep, Table 1, and the sink traces and figures.

    sinkmask sweep   --models llada=GSAI-ML/LLaDA-8B-Instruct,llama=arm:meta-llama/Llama-3.1-8B-Instruct \
                     --tasks gsm8k_sinkmask,humaneval_sinkmask --top-k 0,1,5,10 --out results/paper
    sinkmask table   results/paper
    sinkmask sinks   --model PATH --prompt "..." --out figs/llada
    sinkmask figures figs/llada          # redraw from the saved trace
    sinkmask args    [--model dlm_sinkmask]   # every model argument, its default and meaning

Heavy imports (torch, lm-eval) happen inside the subcommands, so ``sinkmask --help`` is quick.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from .config import ARM_RULES  # light: no torch, no lm-eval
from .model_args import MODELS
from .sweep_plan import SET_BY_SWEEP  # light too

_SWEEP_SETS = ", ".join(SET_BY_SWEEP)


def _sweep(a: argparse.Namespace) -> int:
    from .log import process_rank
    from .sweep import run_sweep
    from .sweep_plan import (SweepPlan, cell_records, check_run_counts, parse_ks, parse_models,
                             parse_seeds, parse_tasks)
    from .versus import parse_versus

    check_run_counts(a.max_cells, a.jobs)  # before parse_models reads every checkpoint's config
    seeds = parse_seeds(a.seeds)
    models = parse_models(a.models, seeds=seeds)
    _check_one_recipe_per_model(models, seeds, Path(a.out))
    plan = SweepPlan(
        models=_with_model_args(models, a.model_args_for or []),
        tasks=parse_tasks(a.tasks),
        ks=parse_ks(a.top_k),
        out=Path(a.out),
        eps=a.eps,
        limit=_lm_eval_limit(a.limit),
        model_args_extra=a.model_args_extra,
        arm_rule=a.arm_rule,
        batch_size=int(a.batch_size) if str(a.batch_size).isdigit() else a.batch_size,
        device=a.device,
        num_fewshot=a.num_fewshot,
        apply_chat_template=a.apply_chat_template,
        include_path=a.include_path or [],
        allow_code_execution=a.allow_code_execution,
        seed=a.seed,
        seeds=seeds,
        mask_seeds=parse_seeds(a.mask_seeds, "--mask-seeds"),
        versus=parse_versus(a.versus),
        title=a.title,
    )
    run_sweep(plan, max_cells=a.max_cells, jobs=a.jobs)
    if a.no_table or process_rank() != 0:  # under accelerate launch, rank 0 writes the table
        return 0
    if not cell_records(Path(a.out) / "cells"):
        # other sweeps sharing the folder hold every cell: the one that finishes last tables it
        print(f"no finished cell in {a.out} yet: table not written (`sinkmask table {a.out}` "
              "writes it)", file=sys.stderr)
        return 0
    # the table command's own arguments, so that each of its options keeps its default
    return _table(build_parser().parse_args(
        ["table", str(a.out)] + ([f"--title={a.title}"] if a.title is not None else [])))


def _check_one_recipe_per_model(models: list, seeds: list[int] | None, out: Path) -> None:
    """A seed axis pools runs of one experiment: each model's seeds, with those the folder
    already holds, must share their training recipe (zoo checkpoints record it)."""
    from .zoo.install import check_seeds_share_a_recipe

    if not seeds:
        return
    for m in models:
        check_seeds_share_a_recipe(m.name, m.path_for_seed, seeds, out)


def _with_model_args(models: list, items: list[str]) -> list:
    """``--model-args-for NAME:ARGS`` onto the named models; repeats for one model add up."""
    per_model = {}
    for item in items:
        name, sep, args = item.partition(":")
        if not sep or name not in {m.name for m in models}:
            raise SystemExit(f"--model-args-for takes NAME:ARGS with NAME one of the --models, got {item!r}")
        per_model[name] = f"{per_model[name]},{args}" if name in per_model else args
    return [dataclasses.replace(m, args=per_model.get(m.name, "")) for m in models]


def _lm_eval_limit(limit: float | None) -> int | float | None:
    """``--limit 5`` as lm-eval's count 5, not 5.0; a fraction below 1 stays a float."""
    return None if limit is None else (int(limit) if float(limit).is_integer() and limit >= 1 else limit)


def _table(a: argparse.Namespace) -> int:
    from .table import render
    from .versus import parse_versus

    metrics = dict(a.metric or [])
    pairs = None if a.versus is None else parse_versus(a.versus)
    out = render(Path(a.folder), title=a.title, metrics=metrics, digits=a.digits, versus_pairs=pairs,
                 pool=a.pool)
    print(out["markdown"].read_text())
    print("wrote " + ", ".join(str(p) for p in out.values()))
    return 0


def _sinks(a: argparse.Namespace) -> int:
    import numpy as np

    from . import stability
    from .sink_trace import check_heads, parse_heads, trace_generation, value_norm_line

    # fail on a typo, or a head the checkpoint has not, before loading the model
    check_heads(a.model, parse_heads(a.heads), a.model_args)
    trace = trace_generation(
        a.model, a.prompt, kind=a.kind, gen_length=a.gen_length, steps=a.steps, eps=a.eps,
        top_k=a.top_k, topn=a.topn, full_steps=a.full_steps, model_args=a.model_args,
        device=a.device, chat=a.chat, name=a.name, watch=_positions(a.watch),
    )
    folder = trace.save(Path(a.out))
    print(f"completion: {trace.meta['completion']!r}")
    print(stability.line(trace.meta["stability"]))
    print(value_norm_line(trace.meta["value_norms"]))
    for p in trace.meta["watch_positions"]:
        share = trace.share_on_position(p)
        print(f"attention share on position {p}: mean {np.nanmean(share):.3f} over steps, layers and heads"
              if np.isfinite(share).any() else f"attention share on position {p}: position not in the sequence")
    _print_figures(folder, a.heads)
    return 0


def _positions(text: str | None) -> list[int]:
    try:
        return [int(x) for x in (text or "").split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--watch takes comma-separated key positions, got {text!r}") from None


def _figures(a: argparse.Namespace) -> int:
    from . import stability
    from .sink_trace import Trace, value_norm_line

    trace = Trace.load(Path(a.folder))
    print(stability.line(trace.meta.get("stability") or trace.stability()))  # version-1 traces lack it
    print(value_norm_line(trace.value_norms()))  # None before version 3
    _print_figures(Path(a.folder), a.heads)
    return 0


def _print_figures(folder: Path, heads: str | None) -> None:
    """Draw a trace folder's figures and say where each went."""
    from .figures import draw_all

    for name, path in draw_all(folder, heads).items():
        print(f"{name}: {path}")


def _args(a: argparse.Namespace) -> int:
    from . import model_args

    if a.markdown:
        print(model_args.markdown())
        return 0
    print("\n\n".join(model_args.text(m) for m in ([a.model] if a.model else model_args.MODELS)))
    return 0


def _non_negative(text: str) -> int:
    """An argparse type: an integer >= 0 (``--digits -1`` would fail in a format string)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"takes an integer >= 0, got {text!r}")
    return value


def _task_metric(text: str) -> tuple[str, str]:
    """``--metric TASK=METRIC`` as (task, metric)."""
    task, sep, metric = text.partition("=")
    if not (sep and task and metric):
        raise argparse.ArgumentTypeError(f"takes TASK=METRIC, e.g. gsm8k_sinkmask=exact_match,"
                                         f"flexible-extract; got {text!r}")
    return task, metric


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sinkmask", description=__doc__.split("\n")[0].replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("sweep", help="models x tasks x K through lm-eval, resumable")
    s.add_argument("--models", required=True,
                   help="name=path or name=kind:path (kind arm or dlm; default from config.model_type), comma-separated")
    s.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    s.add_argument("--top-k", default="0,1,5,10", help="K values (0 = unmasked) [%(default)s]")
    s.add_argument("--out", required=True,
                   help="output folder (reuse it to resume; several sweeps, e.g. one per GPU with "
                        "CUDA_VISIBLE_DEVICES, can share it: each skips the cells the others run)")
    s.add_argument("--limit", type=float, default=None, help="lm-eval --limit (count, or fraction < 1)")
    s.add_argument("--eps", type=float, default=3.0, help="Eq. 3 threshold [%(default)s]")
    s.add_argument("--model-args-extra", default="",
                   help="model_args appended for every model, e.g. dtype=bfloat16 (not "
                        f"{_SWEEP_SETS} or arm_rule: the sweep's options set those)")
    s.add_argument("--model-args-for", action="append", metavar="NAME:ARGS",
                   help="model_args for one model, e.g. llada:block_length=32 (repeatable; "
                        f"repeats for one model add up; not {_SWEEP_SETS})")
    s.add_argument("--arm-rule", default="last_row", choices=ARM_RULES,
                   help="ARM query rule, see docs/method.md section 5 [%(default)s]")
    s.add_argument("--batch-size", default=1, help="lm-eval batch size [%(default)s]")
    s.add_argument("--device", default=None, help="e.g. cpu, cuda:0 (default: cuda when available, else cpu)")
    s.add_argument("--num-fewshot", type=int, default=None,
                   help="lm-eval --num_fewshot (default: each task's own)")
    s.add_argument("--apply-chat-template", action="store_true", help="lm-eval's chat templating (instruct models)")
    s.add_argument("--include-path", action="append", help="extra task folder (repeatable)")
    s.add_argument("--allow-code-execution", action="store_true",
                   help="run tasks that execute model-written code (HumanEval-like), in the sandbox")
    s.add_argument("--seed", type=int, default=0, help="lm-eval's sampling seeds [%(default)s]")
    s.add_argument("--seeds", default=None, metavar="S,S,...",
                   help="training seeds: run every model once per checkpoint seed (zoo:NAME -> "
                        "zoo:NAME@S; other paths take a {seed} placeholder); the table shows "
                        "the mean and spread across seeds. Seeds whose checkpoints record "
                        "different training recipes are refused")
    s.add_argument("--mask-seeds", default=None, metavar="D,D,... or D-D",
                   help="draws of the random-key control: run every mask_target=random model's "
                        "masked cells once per mask_seed; the table shows the mean and spread "
                        "across draws")
    s.add_argument("--jobs", type=int, default=1,
                   help="cells run at once, each in its own process (CPU sweeps; set "
                        "OMP_NUM_THREADS=1 so each takes one core) [%(default)s]")
    s.add_argument("--max-cells", type=int, default=None, help="stop after this many new cells")
    s.add_argument("--title", default=None,
                   help="the table's title, kept in sweep.json for later `sinkmask table` runs")
    s.add_argument("--versus", default=None, metavar="A:B,...",
                   help="pairs of models whose difference A - B the table gives per task and K, "
                        "with its paired standard error (e.g. llada:llada_random)")
    s.add_argument("--no-table", action="store_true", help="do not render the table at the end")
    s.set_defaults(func=_sweep)

    t = sub.add_parser("table", help="Table 1 (Markdown, CSV, PNG) from a sweep folder")
    t.add_argument("folder", help="a sweep folder, or with --pool the folder for the pooled table")
    t.add_argument("--pool", action="append", type=Path, metavar="DIR",
                   help="sweep folders of one grid run on different training seeds (repeatable): "
                        "one table over all their seeds, written into FOLDER, which remembers them")
    t.add_argument("--title", default=None)
    t.add_argument("--metric", action="append", type=_task_metric, metavar="TASK=METRIC",
                   help="override a task's metric, e.g. gsm8k_sinkmask=exact_match,flexible-extract")
    t.add_argument("--digits", type=_non_negative, default=2, help="decimals shown [%(default)s]")
    t.add_argument("--versus", default=None, metavar="A:B,...",
                   help="model pairs whose difference A - B to give (default: the sweep's --versus)")
    t.set_defaults(func=_table)

    k = sub.add_parser("sinks", help="trace one generation's sinks and draw Figs. 3, 5, 7, 10, stability, value norms")
    k.add_argument("--model", required=True, help="checkpoint path or hub id")
    k.add_argument("--prompt", required=True)
    k.add_argument("--out", required=True)
    k.add_argument("--kind", choices=["arm", "dlm"], default=None, help="default: from config.model_type")
    k.add_argument("--name", default=None, help="model name in titles (default: folder name)")
    k.add_argument("--gen-length", type=int, default=64, help="tokens to generate [%(default)s]")
    k.add_argument("--steps", type=int, default=None, help="DLM denoising steps (default: gen length)")
    k.add_argument("--eps", type=float, default=3.0, help="Eq. 3 threshold used in the figures [%(default)s]")
    k.add_argument("--top-k", type=int, default=0, help="trace a run with top-K sinks masked [unmasked]")
    k.add_argument("--topn", type=int, default=5, help="top keys kept per (step, layer, head) [%(default)s]")
    k.add_argument("--full-steps", type=int, default=8, help="steps whose full score vectors are kept (Fig. 10; at least 1) [%(default)s]")
    k.add_argument("--heads", default=None, help="layer:head pairs for Fig. 7, e.g. 0:1,3:2 (default: most sink-heavy)")
    k.add_argument("--model-args", default="",
                   help="more model_args, e.g. block_length=32,trust_remote_code=True (not the ones "
                        "the trace sets: pretrained, top_k, eps, gen_length, steps, device, "
                        "batch_size, granularity)")
    k.add_argument("--device", default=None)
    k.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    k.add_argument("--watch", default=None, metavar="POSITIONS",
                   help="key positions whose attention share is kept at every step, e.g. 0 (extra sink token)")
    k.set_defaults(func=_sinks)

    f = sub.add_parser("figures", help="redraw the figures from a saved trace")
    f.add_argument("folder")
    f.add_argument("--heads", default=None)
    f.set_defaults(func=_figures)

    g = sub.add_parser("args", help="every model argument of dlm_sinkmask / arm_sinkmask, with default and meaning")
    g.add_argument("--model", choices=MODELS, default=None, help="one model (default: both)")
    g.add_argument("--markdown", action="store_true", help="the README's tables instead")
    g.set_defaults(func=_args)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except ValueError as e:  # bad user input: one line, not a traceback
        print(f"sinkmask: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader stopped early (`sinkmask args | head`): nothing wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141  # as a shell reports a command ended by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
