"""Train the whole zoo (ARM, LLaDA-style, Dream-style, llada_sink) in several seeds on one GPU.

    python -m lm_eval_sinkmask.zoo.gpu_zoo --out runs/zoo2 --seeds 0,1,2 --minutes 10

One process per (seed, chain) shares the GPU: ``arm`` then ``dream`` (Dream-style models are
adapted from the same seed's ARM), ``llada``, ``llada_sink``. The step counts are fixed before
training, the same for every seed: a short probe times each model's step with all processes
running at once, and the budget (``--minutes`` of wall clock for the longest chain) is turned
into steps. A seed therefore changes initial weights and data order only; seeds trained in
separate sessions keep that by ``--plan``, the first session's ``plan.json``, whose step counts
the later ones take instead of probing again. Every process keeps
its whole training state under ``OUT/state`` and resumes from it, so a run cut off by a time
limit is continued by calling this again with the same arguments. Finally each checkpoint is
evaluated on the whole test splits through lm-eval (``sinkmask sweep``, unmasked, greedy).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from ..atomic_write import written_whole
from .install import FIELD_BEFORE

CHAINS = ("arm,dream", "llada", "llada_sink")


def _launch(args, seed: int, chain: str, extra: list[str], log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "lm_eval_sinkmask.zoo.train", "--device", args.device,
           "--size", args.size, "--seed", str(seed), "--models", chain,
           "--batch-size", str(args.batch_size), "--row-groups", str(args.row_groups),
           "--pool", str(args.pool),
           "--pool-gsm", str(args.pool_gsm), "--pool-code", str(args.pool_code),
           "--warmup", str(args.warmup), "--lr-arm", str(args.lr_arm),
           "--lr-llada", str(args.lr_llada), "--lr-dream", str(args.lr_dream),
           "--weight-decay", str(args.weight_decay), "--threads", "1", *extra]
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, stdout=log.open("a"), stderr=subprocess.STDOUT)


def _wait(procs: dict[str, subprocess.Popen]) -> None:
    codes = {name: p.wait() for name, p in procs.items()}
    failed = {n: c for n, c in codes.items() if c}
    if failed:
        raise SystemExit(f"training processes failed: {failed} (see the logs)")


def probe(args, out: Path) -> dict[str, float]:
    """Seconds per step of each model, every chain of every seed running at once."""
    # The dream chain is probed by its ARM; Dream-style steps are taken to cost what llada's
    # do (same answer-region width, fewer parameters), which errs on the slow side.
    procs = {f"{chain}-seed{s}": _launch(args, s, chain.split(",")[0],
                                         ["--probe", str(args.probe_steps),
                                          "--out", str(out / "probe")],
                                         out / "logs" / f"probe-{chain}-seed{s}.log")
             for s in args.seeds for chain in CHAINS}
    _wait(procs)
    times: dict[str, float] = {}
    for log in (out / "logs").glob("probe-*.log"):
        for name, sec in re.findall(r"^PROBE (\S+) ([0-9.]+)$", log.read_text(), re.M):
            times[name] = max(times.get(name, 0.0), float(sec))  # the slowest seed
    return times


def step_counts(times: dict[str, float], minutes: float, arm_share: float) -> dict[str, int]:
    """Turn the budget into steps: llada and llada_sink (the same recipe, so the same steps)
    fill it; arm then dream share it (``arm_share`` for the ARM)."""
    budget = minutes * 60
    llada = int(budget / max(times["llada"], times["llada_sink"]))
    return {"arm": int(arm_share * budget / times["arm"]),
            "dream": int((1 - arm_share) * budget / times.get("dream", times["llada"])),
            "llada": llada}


# the arguments that make the recipe: a plan's steps are reused only under the same ones
RECIPE = ("size", "batch_size", "warmup", "lr_arm", "lr_llada", "lr_dream", "weight_decay",
          "pool_gsm", "pool_code", "arm_share")
# what a plan made before a recipe argument existed was trained with (as text, as plans keep it)
RECIPE_BEFORE = {"weight_decay": str(FIELD_BEFORE["weight_decay"])}


def recipe_change(args, earlier: dict) -> dict[str, list[str]]:
    """{argument: [earlier plan's value, this run's]} for each :data:`RECIPE` argument that
    differs (as text, as plans keep them)."""
    made = {k: earlier["args"].get(k, RECIPE_BEFORE.get(k)) for k in RECIPE}
    now = {k: str(getattr(args, k)) for k in RECIPE}
    return {k: [made[k], now[k]] for k in RECIPE if made[k] != now[k]}


def earlier_plan(args, earlier_file: Path, trial: bool = False) -> dict:
    """The step counts of an earlier run (its ``plan.json``), so that a seed trained in another
    session trains the same steps as the seeds before it; refused under another recipe. A
    ``trial`` (a lever trial: the same steps, a setting changed on purpose) takes them anyway
    and its plan names what differs, so ``zoo.install`` refuses to install the trial as a
    seed (and its cards record the recipe, which a sweep pooling seeds checks)."""
    earlier = json.loads(Path(earlier_file).read_text())
    differ = recipe_change(args, earlier)
    if differ and not trial:
        raise SystemExit(f"{earlier_file} was made under another recipe (earlier, now): {differ}")
    return {"seconds_per_step": earlier["seconds_per_step"], "steps": earlier["steps"],
            "steps_from": str(earlier_file), **({"recipe_changed": differ} if trial else {}),
            "args": _args_as_text(args)}


def _args_as_text(args) -> dict[str, str]:
    """The run's arguments as plans keep them (compared by :func:`recipe_change`)."""
    return {k: str(v) for k, v in vars(args).items()}


def step_plan(args, out: Path) -> dict:
    """The step counts, fixed once per run: those it started with (a resumed run), else an
    earlier run's (``--plan``, or ``--steps-from`` for a trial of another recipe), else the
    probe's."""
    plan_file = out / "plan.json"
    if plan_file.exists():
        return json.loads(plan_file.read_text())
    if args.plan and args.steps_from:
        raise SystemExit("--plan and --steps-from both name the step counts: give one")
    if args.plan or args.steps_from:
        plan = earlier_plan(args, args.plan or args.steps_from, trial=bool(args.steps_from))
    else:
        times = probe(args, out)
        plan = {"seconds_per_step": times,
                "steps": step_counts(times, args.minutes, args.arm_share),
                "args": _args_as_text(args)}
    with written_whole(plan_file) as tmp:  # read back by every restart
        tmp.write_text(json.dumps(plan, indent=1))
    return plan


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--minutes", type=float, default=10.0,
                    help="wall-clock budget of the longest chain, turned into steps")
    ap.add_argument("--arm-share", type=float, default=0.4)
    ap.add_argument("--size", default="v2")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--row-groups", type=int, default=2,
                    help="groups of rows of similar length each batch runs as (zoo.train "
                         "--row-groups): how the steps are computed, not the recipe, so "
                         "seeds trained with other groupings still pool")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--lr-arm", type=float, default=2e-3)
    ap.add_argument("--lr-llada", type=float, default=2e-3)
    ap.add_argument("--lr-dream", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01, help="zoo.train --weight-decay")
    ap.add_argument("--pool-gsm", type=int, default=800_000)
    ap.add_argument("--pool-code", type=int, default=50_000)
    ap.add_argument("--probe-steps", type=int, default=20)
    ap.add_argument("--plan", type=Path, default=None, metavar="PLAN_JSON",
                    help="take the step counts of this earlier run's plan.json (no probe); "
                         "refused under another recipe")
    ap.add_argument("--steps-from", type=Path, default=None, metavar="PLAN_JSON",
                    help="a lever trial: the step counts of this plan.json under a recipe "
                         "that differs from its own (e.g. --weight-decay), which plan.json "
                         "records")
    ap.add_argument("--quick-eval", default="100,50", metavar="GSM,CODE",
                    help="test problems each training run checks its model on")
    ap.add_argument("--eval-batch-size", type=int, default=64)
    ap.add_argument("--eval-jobs", type=int, default=6)
    ap.add_argument("--eval-limit", type=int, default=None,
                    help="test problems per task (default: the whole splits)")
    ap.add_argument("--device", default="cuda", help="cpu only for a smoke test")
    ap.add_argument("--workers", type=int, default=16, help="processes building the pool")
    args = ap.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.pool = Path(args.out) / "pool.pt"
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():  # before the pool's minutes of work, not after
            raise SystemExit(f"--device {args.device}: torch {torch.__version__} sees no CUDA "
                             "device here; this recipe is for a GPU (--device cpu for a "
                             "smoke test)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def stamp(msg):
        print(f"[gpu_zoo {time.time() - t0:6.0f}s] {msg}", flush=True)

    from . import pool
    pool.load_or_build(args.pool, args.pool_gsm, args.pool_code, workers=args.workers)
    stamp(f"pool ready: {args.pool}")

    plan = step_plan(args, out)
    stamp(f"plan: {plan}")

    steps = plan["steps"]
    check_gsm, check_code = args.quick_eval.split(",")
    procs = {}
    for s in args.seeds:
        for chain in CHAINS:
            if all((out / f"seed{s}" / m / "train_info.json").exists() for m in chain.split(",")):
                continue
            extra = ["--out", str(out / f"seed{s}"), "--resume-dir", str(out / "state"),
                     "--steps-arm", str(steps["arm"]), "--steps-dream", str(steps["dream"]),
                     "--steps-llada", str(steps["llada"]), "--save-dtype", "float16",
                     "--eval-gsm", check_gsm, "--eval-code", check_code, "--log-every", "200"]
            procs[f"{chain}-seed{s}"] = _launch(args, s, chain, extra,
                                                out / "logs" / f"{chain}-seed{s}.log")
    stamp(f"training {len(procs)} processes")
    _wait(procs)
    stamp("training done")

    # The seeded sweep layout (cells/<model>/seed<S>/...), which `zoo.report --cells` reads.
    models = ",".join(f"{m}={out / 'seed{seed}' / m}" for m in ("arm", "llada", "dream",
                                                                 "llada_sink"))
    subprocess.run([sys.executable, "-m", "lm_eval_sinkmask.cli", "sweep", "--models", models,
                    "--seeds", ",".join(map(str, args.seeds)),
                    "--tasks", "mini_gsm_sinkmask,mini_code_sinkmask", "--top-k", "0",
                    "--batch-size", str(args.eval_batch_size), "--device", args.device,
                    "--jobs", str(args.eval_jobs), "--allow-code-execution",
                    *(["--limit", str(args.eval_limit)] if args.eval_limit else []),
                    "--out", str(out / "eval")], check=True)
    stamp("evaluation done")
    (out / "DONE").write_text("ok\n")


if __name__ == "__main__":
    main()
