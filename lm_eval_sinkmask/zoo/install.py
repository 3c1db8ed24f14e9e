"""Install a trained zoo (what ``gpu_zoo`` leaves in OUT) as the project's checkpoints.

    python -m lm_eval_sinkmask.zoo.install runs/zoo2 --seeds 0,1,2

Seed 0 replaces the checkpoints inside the package (``zoo:llada``), seeds >= 1 go to the
repository's ``zoo_seeds/<name>/seed<S>/`` (``zoo:llada@1``). Each OUT/seed<S>/<name>/ is
copied whole, model card and training log included, once these checks pass (otherwise nothing
is copied):

- every installed checkpoint has the content digest that its evaluation cells in OUT/eval
  recorded, so ``zoo.report --cells OUT/eval`` counts them (it leaves out cells of any other
  weights);
- the size budget: checkpoints inside the package <= 40 MB (every install carries them), all
  checkpoints in the repository <= 120 MB;
- the run trained the step counts of the seeds installed before it (``zoo_seeds/plan.json``,
  kept from the first installed run's ``plan.json``), under their recipe (each model's
  ``train_info.json``, :data:`RECIPE_FIELDS`, against the GPU-trained seeds it joins), and is
  no lever trial (``gpu_zoo --steps-from``, whose ``plan.json`` records the setting it
  changed): seeds arrive from separate GPU sessions, and a seed must differ from the others
  in initial weights and data order only.

Installing some seeds leaves the other installed seeds as they are, so each session's seed is
installed as it arrives. The same rule holds where seeds are pooled: :func:`check_one_recipe`
refuses to treat seeds trained under different recipes (the package's CPU-trained seed 0 beside
a GPU seed of another size) as runs of one experiment.

Seed 0 can be *staged* first (``--stage``: into ``zoo_seeds/staged_seed0/<name>/``) and
*promoted* into the package later (``--promote``). New package weights invalidate every
committed result made on the old ones, and rerunning those takes hours of CPU, more than the
session whose GPU trained seed 0 has left; staged, the weights are committed at once, the
results are rerun on them in later sessions (``tools/gpu_box/with_staged_seed0.sh``, which
runs a command in a worktree whose package holds the staged weights), and the promotion lands
with them.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from . import CHECKPOINTS_DIR, ZOO_NAMES, installed_seeds, seed_folders, seeds_dir

PACKAGE_BUDGET_MB = 40
REPO_BUDGET_MB = 120
PLAN_NAME = "plan.json"  # gpu_zoo's step plan, kept beside the seeds
STAGED_NAME = "staged_seed0"  # seed 0 awaiting promotion into the package, beside the seeds


# what a checkpoint's train_info.json says about how it was made, seed and hardware aside: two
# seeds of one model are runs of the same experiment only where all of these agree
RECIPE_FIELDS = ("arch", "params", "steps", "batch_size", "lr", "weight_decay", "gen_len",
                 "train_desc")
# what a card written before a field existed was trained with
FIELD_BEFORE = {"weight_decay": 0.01}


def training_card(checkpoint) -> dict | None:
    """A zoo checkpoint folder's training record (``train_info.json``; a field added since it
    was written reads as :data:`FIELD_BEFORE`), or None for a folder without one (not a zoo
    checkpoint)."""
    card = Path(checkpoint) / "train_info.json"
    if not card.is_file():
        return None
    try:
        return {**FIELD_BEFORE, **json.loads(card.read_text())}
    except ValueError as e:  # the one-line refusal names the card, not only the JSON position
        raise ValueError(f"{card}: not valid JSON ({e})") from None


def recipe(checkpoint) -> dict | None:
    """How a zoo checkpoint folder was trained (:data:`RECIPE_FIELDS` of its
    :func:`training_card`), or None for a folder without one."""
    info = training_card(checkpoint)
    return None if info is None else {field: info.get(field) for field in RECIPE_FIELDS}


def recipe_label(r: dict) -> str:
    """``4.2M params, 3301 steps x 512``: enough to tell the zoo's recipes apart in a table; a
    field the card lacks shows as ``?`` (the refusal that names it must not crash on it)."""
    def shown(field):
        value = r.get(field)
        return "?" if value is None else value

    params = r.get("params")
    size = f"{params / 1e6:.1f}M" if isinstance(params, (int, float)) else "?"
    return f"{size} params, {shown('steps')} steps x {shown('batch_size')}"


def check_one_recipe(name: str, checkpoints: dict) -> None:
    """Refuse to treat the seeds ``checkpoints`` ({seed: folder}) of model ``name`` as one
    experiment when their recipes differ: a mean over the CPU zoo v1 and a GPU seed, say, would
    pass a change of recipe off as spread across seeds. Folders without a recipe pass."""
    recipes = {s: r for s, path in sorted(checkpoints.items()) if (r := recipe(path))}
    if not recipes:
        return
    first_seed, first = next(iter(recipes.items()))
    for s, r in recipes.items():
        if r != first:
            fields = [f for f in RECIPE_FIELDS if r[f] != first[f]]
            raise ValueError(
                f"the seeds of {name!r} were trained under different recipes: seed {first_seed} "
                f"{recipe_label(first)}, seed {s} {recipe_label(r)} ({', '.join(fields)} differ). "
                "A spread over them would not be a spread over seeds: name seeds of one recipe"
            )


def check_seeds_share_a_recipe(name: str, path_for_seed, seeds: list, folder: Path) -> None:
    """:func:`check_one_recipe` over the ``seeds`` a run names and those ``folder`` already
    pools with them (its ``sweep.json``: a sweep extended into the folder renders all of them
    in one table). ``path_for_seed(seed)`` is the checkpoint reference (``zoo:NAME@S`` or a
    path); a named seed must resolve, an earlier one no longer installed here is skipped.
    ``seeds`` [None] (no seed axis) checks that one checkpoint alone."""
    from . import resolve_pretrained

    found = {s: resolve_pretrained(path_for_seed(s)) for s in seeds}
    grid = Path(folder) / "sweep.json"
    if None not in found and grid.is_file():  # seeds a sweep already ran in the folder
        earlier = json.loads(grid.read_text()).get("seeds") or []
        for s in sorted(set(earlier) - set(found)):
            try:
                found[s] = resolve_pretrained(path_for_seed(s))
            except ValueError:  # an earlier run's seed, not installed here
                continue
    check_one_recipe(name, found)


def megabytes(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def staged_dir(seeds_root: Path | None = None) -> Path:
    """Where a staged seed 0 waits for its promotion: beside the seeds, in ``staged_seed0/``."""
    return (seeds_root or seeds_dir()) / STAGED_NAME


def destination(name: str, seed: int, package: Path, seeds: Path, stage: bool = False) -> Path:
    if seed == 0:
        return staged_dir(seeds) / name if stage else package / name
    return seeds / name / f"seed{seed}"


def evaluated_digests(eval_dir: Path) -> dict[tuple[str, int], set[str]]:
    """(name, seed) -> the checkpoint digests that the K=0 cells of ``eval_dir`` recorded."""
    from . import identify

    out: dict[tuple[str, int], set[str]] = {}
    for path in eval_dir.glob("cells/**/k0/cell.json"):
        record = json.loads(path.read_text())
        ckpt = identify(record.get("model_path", ""))
        digest = (record.get("inputs") or {}).get("checkpoint")
        if ckpt is not None and digest:
            out.setdefault(ckpt, set()).add(digest)
    return out


def install(run: Path, seeds: list[int], names=ZOO_NAMES, package: Path = CHECKPOINTS_DIR,
            seeds_root: Path | None = None, stage: bool = False) -> list[str]:
    """Check, then copy; returns one line per installed checkpoint. Nothing is copied unless
    every checkpoint matches its evaluation cells and the result fits the budget. ``stage``:
    seed 0 goes to the staging folder, not the package (:func:`promote` moves it later)."""
    from ..provenance import checkpoint_digest

    seeds_root = seeds_root or seeds_dir()
    sources = {(n, s): run / f"seed{s}" / n for s in seeds for n in names}
    missing = [str(p) for p in sources.values() if not (p / "config.json").is_file()]
    if missing:
        raise SystemExit(f"not trained (no config.json): {missing}")
    evaluated = evaluated_digests(run / "eval")
    lines, problems = [], []
    for (name, seed), source in sources.items():
        digest = checkpoint_digest(str(source))  # a copy has the same digest
        seen = evaluated.get((name, seed), set())
        if digest not in seen:
            problems.append(f"{name}@{seed}: " + (f"evaluated on other weights {sorted(seen)}"
                                                  if seen else "no evaluation cell in OUT/eval"))
        target = destination(name, seed, package, seeds_root, stage)
        lines.append(f"{name}@{seed}: {source} -> {target} ({megabytes(source):.1f} MB, {digest})")
    shipped, total = sizes_after(sources, package, seeds_root, stage)
    lines.append(f"inside the package {shipped:.1f} MB (budget {PACKAGE_BUDGET_MB}), all "
                 f"{total:.1f} MB (budget {REPO_BUDGET_MB})")
    if shipped > PACKAGE_BUDGET_MB or total > REPO_BUDGET_MB:
        problems.append("over the size budget")
    problems += plan_mismatch(run, seeds_root) + recipe_mismatch(run, sources, package, seeds_root)
    if problems:
        raise SystemExit("\n".join(lines + ["nothing installed:"] + problems))
    for (name, seed), source in sources.items():
        _replace(destination(name, seed, package, seeds_root, stage), source)
    keep_plan(run, seeds_root)
    return lines


def _replace(target: Path, source: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)


def promote(names=ZOO_NAMES, package: Path = CHECKPOINTS_DIR,
            seeds_root: Path | None = None) -> list[str]:
    """Move the staged seed 0 (every one of ``names``) into the package, replacing what is
    there; refused, with nothing moved, unless all are staged and the package stays in its
    budget. Returns one line per promoted checkpoint."""
    from ..provenance import checkpoint_digest

    staged = staged_dir(seeds_root)
    missing = [n for n in names if not (staged / n / "config.json").is_file()]
    if missing:
        raise SystemExit(f"nothing promoted: not staged in {staged}: {missing}")
    shipped = megabytes(package) + sum(megabytes(staged / n) - _size(package / n) for n in names)
    lines = [f"{n}@0: {staged / n} -> {package / n} ({checkpoint_digest(str(staged / n))})"
             for n in names]
    lines.append(f"inside the package {shipped:.1f} MB (budget {PACKAGE_BUDGET_MB})")
    if shipped > PACKAGE_BUDGET_MB:
        raise SystemExit("\n".join(lines + ["nothing promoted: over the size budget"]))
    # every copy first, beside the package's folders: a copy that fails (a full disk) leaves the
    # package and the staging folder as they were, not some models promoted and one half-copied
    incoming = {n: package / f".{n}.promoted" for n in names}
    try:
        for n, copy in incoming.items():
            _replace(copy, staged / n)
    except BaseException:
        for copy in incoming.values():
            shutil.rmtree(copy, ignore_errors=True)
        raise
    for n, copy in incoming.items():
        if (package / n).exists():
            shutil.rmtree(package / n)
        copy.rename(package / n)
        shutil.rmtree(staged / n)
    if staged.is_dir() and not any(staged.iterdir()):
        staged.rmdir()
    return lines


def plan_mismatch(run: Path, seeds_root: Path) -> list[str]:
    """A problem line when ``run`` trained other step counts than the kept plan says."""
    kept, trained = seeds_root / PLAN_NAME, run / PLAN_NAME
    if not (kept.is_file() and trained.is_file()):
        return []
    kept_steps = json.loads(kept.read_text())["steps"]
    run_steps = json.loads(trained.read_text())["steps"]
    if kept_steps == run_steps:
        return []
    return [f"trained {run_steps} steps, the installed seeds {kept_steps} ({kept}); train "
            f"with gpu_zoo --plan {kept}"]


def recipe_mismatch(run: Path, sources: dict[tuple[str, int], Path], package: Path,
                    seeds_root: Path) -> list[str]:
    """Problem lines when ``run`` is a lever trial, or when a model's incoming seeds and the
    installed seeds they join (:func:`joined_seeds`) were trained under different recipes."""
    problems = []
    plan = run / PLAN_NAME
    changed = json.loads(plan.read_text()).get("recipe_changed") if plan.is_file() else None
    if changed:
        problems.append(f"{plan} records a lever trial (recipe_changed {changed}): its "
                        "checkpoints are not seeds of the zoo's recipe")
    for name in dict.fromkeys(n for n, _ in sources):
        incoming = {s: src for (n, s), src in sources.items() if n == name}
        try:
            check_one_recipe(name, {**joined_seeds(name, package, seeds_root), **incoming})
        except ValueError as e:
            problems.append(str(e))
    return problems


def joined_seeds(name: str, package: Path, seeds_root: Path) -> dict[int, Path]:
    """{seed: folder} of ``name``'s installed GPU seeds, which an incoming seed joins: every
    seed >= 1 under ``seeds_root``, and seed 0 staged or, failing that, in the package where
    it was trained on a GPU (the CPU-trained seed 0 it replaces last is no run of theirs)."""
    found = seed_folders(name, seeds_root)
    seed0 = next((f for f in (staged_dir(seeds_root) / name, package / name)
                  if (f / "config.json").is_file()), None)
    if seed0 is not None and trained_on_gpu(seed0):
        found[0] = seed0
    return found


def keep_plan(run: Path, seeds_root: Path) -> None:
    """The first installed run's plan.json becomes the plan later sessions train by."""
    kept, trained = seeds_root / PLAN_NAME, run / PLAN_NAME
    if trained.is_file() and not kept.is_file():
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(trained, kept)


def _size(folder: Path) -> float:
    return megabytes(folder) if folder.is_dir() else 0.0


def sizes_after(sources: dict[tuple[str, int], Path], package: Path, seeds_root: Path,
                stage: bool = False) -> tuple[float, float]:
    """(MB inside the package, MB of all checkpoints) once ``sources`` replace their targets
    (a staged seed 0 counts among the repository's checkpoints, not the package's)."""
    replaced = {destination(n, s, package, seeds_root, stage): src
                for (n, s), src in sources.items()}
    shipped = _size(package) + sum(_size(src) - _size(dst) for dst, src in replaced.items()
                                   if dst.parent == package)
    total = shipped + _size(seeds_root) + sum(_size(src) - _size(dst)
                                              for dst, src in replaced.items()
                                              if dst.parent != package)
    return shipped, total


# Seed 0 comes last: it replaces the CPU-trained checkpoints in the package that every
# committed result rests on, so it is staged, the results are rerun on it, then it is promoted.
GPU_SEED_ORDER = (1, 2, 0)


def trained_on_gpu(checkpoint: Path) -> bool:
    """Whether a checkpoint's model card names a GPU (the CPU zoo's cards name CPU threads or,
    older, nothing)."""
    card = checkpoint / "train_info.json"
    hardware = json.loads(card.read_text()).get("hardware", "") if card.is_file() else ""
    return bool(hardware) and "CPU" not in hardware


def next_gpu_seed(names=ZOO_NAMES, package: Path = CHECKPOINTS_DIR) -> int | None:
    """The seed the next GPU session trains (:data:`GPU_SEED_ORDER`), None once all three are
    installed: a seed >= 1 is in when every model has it (:func:`installed_seeds`), seed 0
    when every model in the package, or every staged one, was trained on a GPU."""
    done = set(installed_seeds(names)[1:])
    if any(all(trained_on_gpu(folder / name) for name in names)
           for folder in (package, staged_dir())):
        done.add(0)
    return next((s for s in GPU_SEED_ORDER if s not in done), None)


def main(argv: list[str] | None = None) -> int:
    from ..sweep_plan import parse_seeds

    ap = argparse.ArgumentParser(prog="python -m lm_eval_sinkmask.zoo.install",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, nargs="?",
                    help="gpu_zoo's --out folder (seed<S>/<name>/, eval/)")
    ap.add_argument("--next-seed", action="store_true",
                    help="print the seed the next GPU session trains (order 1, 2, 0), or "
                         "'none' when all three are installed, and install nothing")
    ap.add_argument("--stage", action="store_true",
                    help=f"install seed 0 into zoo_seeds/{STAGED_NAME}/, not the package, to "
                         "rerun the committed results on it before it replaces the package's")
    ap.add_argument("--promote", action="store_true",
                    help=f"move the staged seed 0 (zoo_seeds/{STAGED_NAME}/) into the package, "
                         "replacing its checkpoints, and install nothing else")
    ap.add_argument("--seeds", default="0,1,2", help="training seeds to install (default 0,1,2)")
    ap.add_argument("--models", default=",".join(ZOO_NAMES), help="zoo models to install")
    args = ap.parse_args(argv)
    if args.next_seed:
        seed = next_gpu_seed()
        print("none" if seed is None else seed)
        return 0
    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(ZOO_NAMES))
    if unknown:
        ap.error(f"unknown zoo models {unknown}; choose from {list(ZOO_NAMES)}")
    if args.promote:
        if args.run is not None or args.stage:
            ap.error("--promote takes no run folder and no --stage")
        if set(names) != set(ZOO_NAMES):  # results_next/ rests on every staged model at once
            ap.error("--promote moves every zoo model at once: leave --models out")
        print("\n".join(promote(names)))
        return 0
    if args.run is None:
        ap.error("the run folder is required (or --next-seed, --promote)")
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as e:
        ap.error(str(e))
    if args.stage and 0 not in (seeds or [0]):
        ap.error("--stage stages seed 0: name it in --seeds")
    print("\n".join(install(args.run, seeds or [0], names, stage=args.stage)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
