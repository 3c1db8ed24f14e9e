"""Running a Table 1 sweep (:mod:`sweep_plan` says what and where) through lm-eval's Python API.

Each cell (model, task, K) is one ``lm_eval.simple_evaluate`` call with our model classes, and
leaves in its folder lm-eval's own results JSON and per-sample JSONL (written by lm-eval's
``EvaluationTracker``, as ``lm_eval --output_path`` does; the samples then gzipped, since a
sweep keeps hundreds of them: ``zcat`` reads them) and ``cell.json``: what was asked
(``request``: exact model_args, task, K, limit, seed), what it ran on (``inputs``: digests of
the checkpoint's files, of the task's config, code and documents, and of lm-eval-sinkmask's own
code, :mod:`provenance`), how it ran (``run``: lm-eval's batch size and the device), the
versions, the masking counters and the primary numbers. ``cell.json`` is written last and
atomically, so a cell counts as done only when everything else is on disk; a rerun skips done
cells, redoes a cell that a kill interrupted, and refuses a done cell whose request differs or
whose checkpoint, task or package code has changed since (a retrained ``zoo:llada`` keeps its
name, a fixed sampler keeps the version 0.1.0), also a done cell outside the cells it adds.
The digests are taken after the cell ran, and a cell whose inputs changed since the sweep began
stops it unrecorded, rather than sit beside cells made of the old ones. The batch size and the
device are not part of a cell's identity: a resume may use a bigger batch or another GPU
(padding and kernels move the numbers at float-noise level only), and ``sinkmask table`` warns
when a folder mixes them.
Cells run one after another, in parallel processes (``jobs``), or one at a time under
``accelerate launch``, each cell's requests split across the ranks.

Several sweeps can share one folder (one per GPU, each with its own ``CUDA_VISIBLE_DEVICES``,
or a restart while the old run goes on): a process claims a cell before running it
(:mod:`cell_claims`), skips a cell another live process holds and counts one that another
process finished meanwhile as done. A claim dies with its process, so a resume still redoes a
cell a kill cut short, and a process deletes only the folder of a cell it has claimed. Under
``accelerate launch`` every rank runs the same cell: rank 0 claims it and the ranks follow
its decision (and its list of cells), through the process group lm-eval would start anyway.
``sweep.json`` is merged and the table rendered under the folder's own lock.
"""

from __future__ import annotations

import difflib
import gc
import gzip
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch

from . import sdpa_backends
from .atomic_write import written_whole
from .cell_claims import claim, folder_locked
from .cell_score import primary_score
from .config import MASKING_OFF, logger as config_logger
from .hflm_args import placed_device
from .log import process_rank, world_size
from .provenance import (InputDigests, changed_inputs, checkpoint_digest, code_digests,
                         loaded_with_digests, task_digest)
from .sweep_plan import (RERUN_HELP, Cell, SweepPlan, cell_records, check_run_counts, loaded_with,
                         merge_grids, mixed_settings, model_type_of, refuse_unmergeable,
                         requested_revision)


def versions() -> dict[str, str]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("lm-eval-sinkmask", "lm_eval", "torch", "transformers", "accelerate"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def task_manager(plan: SweepPlan, done_tasks: tuple[str, ...] = ()):
    """One TaskManager for the whole sweep. Our folder (added by _autoload) and --include-path
    first; lm-eval's ~10k built-in YAMLs are indexed only when a task needs them (one of the
    plan's, or of the folder's ``done_tasks``, whose cells are checked against it)."""
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=plan.include_path or None, include_defaults=False)
    if not all(t in tm.all_tasks for t in [*plan.tasks, *done_tasks]):
        tm = TaskManager(include_path=plan.include_path or None)
    missing = [t for t in plan.tasks if t not in tm.all_tasks]
    if missing:
        guesses = [g for t in missing for g in difflib.get_close_matches(t, tm.all_tasks, n=1)]
        raise SystemExit(f"unknown task(s) {missing}"
                         + (f" (did you mean {', '.join(guesses)}?)" if guesses else "")
                         + "; a task of another folder needs it given with --include-path")
    return tm


def _task_config(tm, name: str) -> dict[str, Any]:
    """The YAML config the task manager indexed for task ``name`` ({} where it has none)."""
    return getattr(tm.task_index.get(name), "cfg", None) or {}


def unsafe_tasks(tm, tasks: list[str]) -> list[str]:
    """Tasks whose YAML sets ``unsafe_code`` (they execute model-written code)."""
    return [name for name in tasks if _task_config(tm, name).get("unsafe_code")]


def zero_shot_tasks(tm, tasks: list[str]) -> list[str]:
    """Tasks whose YAML sets ``num_fewshot: 0``: lm-eval ignores ``--num_fewshot`` for them."""
    return [name for name in tasks if _task_config(tm, name).get("num_fewshot") == 0]


@contextmanager
def _log_filtered(name: str, keep: Callable[[logging.LogRecord], bool]) -> Iterator[None]:
    """Drop the records of logger ``name`` that ``keep`` refuses, for the ``with`` block."""
    log = logging.getLogger(name)
    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


def _no_metadata_advice() -> AbstractContextManager[None]:
    """lm-eval advises ``--metadata`` whenever a task with its own dataset loader loads; a sweep
    has no such option and loads its tasks again in every cell, so the advice would only repeat."""
    return _log_filtered("lm_eval.api.task", lambda record: (
        "Custom kwargs can be passed to `--metadata`" not in record.getMessage()))


def _quiet_if_unmasked(k: int) -> AbstractContextManager[None]:
    """A K = 0 cell is its column's unmasked baseline and takes the column's masking settings
    (eps at least) on purpose: the model's warning that top_k=0 leaves them unread is dropped."""
    if k:
        return nullcontext()
    return _log_filtered(config_logger.name, lambda record: not getattr(record, MASKING_OFF, False))


def run_cell(cell: Cell, tm, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """One simple_evaluate call; writes lm-eval's files then ``cell.json`` (with ``inputs``, the
    digests of the checkpoint, task and package code it ran on). None on ranks > 0. The caller
    holds the cell's claim (:func:`claimed_run`): this starts its folder afresh."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker

    plan = cell.plan
    if process_rank() == 0:  # under accelerate launch only rank 0 touches the folder
        if cell.folder.exists():  # a previous run died inside this cell: start it afresh
            shutil.rmtree(cell.folder)
        cell.folder.mkdir(parents=True)
    unsafe = bool(unsafe_tasks(tm, [cell.task]))
    tracker = EvaluationTracker(output_path=str(cell.folder / "results.json"))
    device = cell_device(plan)
    started = time.time()
    # kept(): LLaDA's and MMaDA's code switch an SDPA kernel off process-wide (sdpa_backends)
    with _no_metadata_advice(), _quiet_if_unmasked(cell.k), sdpa_backends.kept():
        results = lm_eval.simple_evaluate(
            model=cell.model.model_class,
            model_args=cell.model_args,
            tasks=[cell.task],
            num_fewshot=plan.num_fewshot,
            batch_size=plan.batch_size,
            device=device,
            limit=plan.limit,
            log_samples=True,
            evaluation_tracker=tracker,
            apply_chat_template=plan.apply_chat_template,
            fewshot_as_multiturn=plan.apply_chat_template,
            task_manager=tm,
            confirm_run_unsafe_code=unsafe and plan.allow_code_execution,
            random_seed=plan.seed,
            numpy_random_seed=plan.seed,
            torch_random_seed=plan.seed,
            fewshot_random_seed=plan.seed,
        )
    # rank 0's look at what the cell ran on decides for every rank
    as_run = rank_zeros(None if results is None else inputs_as_run(cell, tm, results))
    changed = changed_since_start(inputs, as_run)
    if changed:  # no cell.json: the folder counts as interrupted
        raise SystemExit(inputs_changed_message(cell, changed))
    if results is None:  # accelerate rank > 0: rank 0 writes
        return None
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for name, task_samples in samples.items():
        tracker.save_results_samples(task_name=name, samples=task_samples)
    compress_samples(cell.folder)

    record = {
        "request": cell.request(),
        "inputs": as_run,
        "run": run_settings(plan.batch_size, device),
        "model_path": cell.path,
        "kind": cell.model.kind,
        **primary_score(results["results"][cell.task]),
        "n": results.get("n-samples", {}).get(cell.task, {}).get("effective"),
        "sinkmask": results.get("config", {}).get("sinkmask"),
        "model_type": _model_type(cell.path),
        "versions": versions(),
        "seconds": round(time.time() - started, 1),
        "results_files": sorted(p.name for p in cell.folder.iterdir()),
    }
    with written_whole(cell.folder / "cell.json") as tmp:
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def inputs_as_run(cell: Cell, tm, results: dict[str, Any]) -> dict[str, Any]:
    """The digests of what the cell ran on, taken after it ran: the checkpoint the model hashed
    as it loaded it (what its model_args load with it hashed again), the task loaded afresh
    and the package's code read from disk again (a module first imported during the cell, as
    the detection kernels are at its first masked call, or by a ``--jobs`` worker, ran what
    was there). Those taken at the sweep's start may no longer hold: weights retrained or a
    YAML or a module edited while the sweep runs keep every name."""
    reported = (results.get("config") or {}).get("sinkmask") or {}
    checkpoint = reported.get("checkpoint") or checkpoint_digest(cell.path, cell.revision)
    with _no_metadata_advice():
        task = task_digest(tm.load([cell.task])["tasks"][cell.task])
    as_run = {"checkpoint": checkpoint, "task": task, **code_digests(on_disk=True)}
    if cell.loaded_with:
        as_run["loaded_with"] = loaded_with_digests(cell.loaded_with, cell.revision)
    return as_run


def changed_since_start(start: dict[str, Any], as_run: dict[str, Any]) -> list[str]:
    """What differs between the digests taken at the sweep's start and those a cell ran on; a
    hub checkpoint that was not cached at the start (None) is the one the cell downloaded."""
    if start["checkpoint"] is None:
        start = {**start, "checkpoint": as_run["checkpoint"]}
    return changed_inputs(start, as_run)


def inputs_changed_message(cell: Cell, changed: list[str]) -> str:
    return (f"{cell.label} {cell.task} K={cell.k} ran on other inputs than this sweep started "
            f"with ({cell.path} or what its model_args load with it, {cell.task} or "
            "lm-eval-sinkmask's code changed while it ran):\n  "
            + "\n  ".join(changed) + f"\nThe sweep stopped without recording this cell, and the "
            f"cells done before the change in {cell.plan.out} hold the old inputs: finish the "
            "sweep in another --out folder, or restore the old inputs and rerun it here.")


def run_settings(batch_size: int | str, device: str) -> dict[str, Any]:
    """How a cell ran, beyond what identifies it: lm-eval's batch size, device and process
    count (accelerate splits the requests, so batches hold other rows), and on a GPU its name
    (``cuda`` alone would not tell an A100 from an H100)."""
    settings: dict[str, Any] = {"batch_size": batch_size, "device": device,
                                "processes": world_size()}
    if device.startswith("cuda"):
        settings["gpu"] = torch.cuda.get_device_name(torch.device(device))  # "cuda": the current one
    return settings


def compress_samples(folder: Path) -> None:
    """Replace lm-eval's ``samples_*.jsonl`` in ``folder`` by ``.jsonl.gz``: a tenth of the
    size, and the same bytes from the same samples (no timestamp in the gzip header)."""
    for plain in folder.glob("samples_*.jsonl"):
        packed = plain.with_name(plain.name + ".gz")
        with open(plain, "rb") as src, open(packed, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw,
                               mtime=0) as dst:
                shutil.copyfileobj(src, dst)
        plain.unlink()


def _model_type(path: str) -> str | None:
    try:
        return model_type_of(path)
    except Exception:  # noqa: BLE001 - informational only
        return None


def start_process_group() -> None:
    """Under ``accelerate launch``, the process group that lm-eval starts when it loads the
    first cell's model (its ``Accelerator``, with lm-eval's timeout), started now instead so
    the ranks can agree on the cells before that. Alone, nothing."""
    if world_size() == 1:
        return
    from datetime import timedelta

    import torch.distributed as dist
    from accelerate import PartialState

    if not dist.is_initialized():
        PartialState(timeout=timedelta(weeks=52))


def rank_zeros(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (``value`` itself when run alone): the ranks run the
    same cells in step, so what rank 0 finds on disk decides for all of them."""
    if world_size() == 1:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# what became of a cell this process meant to run (:func:`claimed_run`)
RAN, HELD, DONE_ELSEWHERE = "ran", "held", "done elsewhere"


def claimed_run(cell: Cell, inputs: dict[str, Any], run: Callable[[], dict[str, Any] | None]
                ) -> tuple[str, dict[str, Any] | None]:
    """``run()`` the cell under this process's claim on it: ``(RAN, its record)``; without
    running it, ``(HELD, None)`` when another live process holds the cell and
    ``(DONE_ELSEWHERE, None)`` when another finished it since this sweep looked."""
    held, decision = None, RAN
    try:
        if process_rank() == 0:  # under accelerate launch only rank 0 touches the folder
            held = claim(cell.folder)
            decision = HELD if held is None else DONE_ELSEWHERE if cell.is_done(inputs) else RAN
        decision = rank_zeros(decision)
        return (RAN, run()) if decision == RAN else (decision, None)
    finally:
        if held is not None:
            held.release()


def record_grid(out: Path, grid: dict[str, Any]) -> dict[str, Any]:
    """``grid`` merged into ``out/sweep.json`` (kept earlier models, tasks and K: a sweep can be
    extended by rerunning wider), written whole, under the folder's lock: sweeps starting at
    once each add their part instead of the last one's replacing the others'."""
    path = out / "sweep.json"
    with folder_locked(out):
        if path.exists():
            grid = merge_grids(json.loads(path.read_text()), grid)
        with written_whole(path) as tmp:
            tmp.write_text(json.dumps(grid, indent=2) + "\n")
    return grid


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def stale_cells(records: dict[Path, dict[str, Any]], digests: InputDigests) -> list[str]:
    """``path: what changed`` for each done cell (``cell.json`` path -> record) whose inputs
    differ from today's (:func:`todays_inputs`): a sweep that only adds cells to the folder
    refuses before it runs, rather than leave cells of two checkpoints or codes side by side."""
    stale = []
    for path, record in records.items():
        changed = changed_inputs(record.get("inputs"), todays_inputs(record, digests))
        if changed:
            stale.append(f"{path.parent}: " + "; ".join(changed))
    return stale


def todays_inputs(record: dict[str, Any], digests: InputDigests) -> dict[str, Any]:
    """Today's digests of a done cell's checkpoint (and what its model_args load with it),
    task and package code, as far as they can be taken here: a checkpoint that cannot be read
    is None (not compared), a task the task manager does not know keeps the digest the cell
    recorded."""
    from lm_eval.utils import simple_parse_args_string

    def readable(source: str, revision: str | None = None) -> str | None:
        try:
            return digests.checkpoint(source, revision)
        except Exception:  # noqa: BLE001 - e.g. a zoo seed not installed here: nothing to compare
            return None

    request = record["request"]
    args = simple_parse_args_string(request["model_args"])
    task = request["task"]
    known = task in digests.task_manager.all_tasks
    recorded = (record.get("inputs") or {}).get("task") or {}
    revision = requested_revision(args)
    today = {"checkpoint": readable(str(args["pretrained"]), revision),
             "task": digests.task(task) if known else recorded, **code_digests()}
    beside = loaded_with(args)
    if beside:
        today["loaded_with"] = loaded_with_digests(beside, revision, readable)
    return today


def cell_device(plan: SweepPlan) -> str:
    """The device every cell runs on: ``--device``, else ours (HFLM's own default is cuda,
    here or not)."""
    return plan.device or placed_device(None)


def refused_model_args(cells: list[Cell], *, running: bool) -> list[str]:
    """What each column's model class would refuse before loading weights, checked for every
    distinct model_args, with the batch size and device lm-eval adds to them, before the
    first cell: a typo in the last column fails now, not after hours of the others. The device
    only when cells are to run (``running``): a finished sweep's folder stays readable on a
    machine without its ``--device``."""
    from lm_eval.api.registry import get_model

    refused, seen = [], set()
    for cell in cells:
        key = (cell.model.model_class, cell.model_args)
        if key in seen:
            continue
        seen.add(key)
        added = {"batch_size": cell.plan.batch_size,
                 "device": cell_device(cell.plan) if running else None}
        try:
            with _quiet_if_unmasked(cell.k):
                get_model(cell.model.model_class).check_arg_string(cell.model_args, added)
        except (ValueError, OSError) as e:
            refused.append(f"{cell.label} ({cell.model.model_class}, {cell.model_args}): {e}")
    return refused


def _refuse_unrunnable(plan: SweepPlan, tm, cells: list[Cell], todo: list[int],
                       done: list[dict[str, Any]]) -> None:
    """What would stop a cell midway, or record it otherwise than it ran, refused before
    sweep.json records the grid (``done``: the requests of the folder's finished cells)."""
    mixed = mixed_settings(done + [cells[i].request() for i in todo])
    if mixed:
        raise SystemExit("\n".join(mixed) + f"\n{RERUN_HELP}")
    # every cell's model_args, as sweep.json records them all; the device only if any runs now
    refused = refused_model_args(cells, running=bool(todo))
    if refused:
        raise SystemExit("\n".join(refused))
    if plan.num_fewshot:  # cells recorded as N-shot would have run 0-shot
        fixed = zero_shot_tasks(tm, plan.tasks)
        if fixed:
            raise SystemExit(
                f"task(s) {fixed} set num_fewshot: 0 in their YAML, and lm-eval ignores "
                f"--num_fewshot for such a task: --num-fewshot {plan.num_fewshot} would run them "
                "0-shot. Sweep them without --num-fewshot (or in a sweep of their own).")
    blocked = unsafe_tasks(tm, sorted({cells[i].task for i in todo}))
    if blocked and not plan.allow_code_execution:
        raise SystemExit(
            f"task(s) {blocked} execute model-written code (in lm_eval_sinkmask's sandbox). "
            "Pass --allow-code-execution to run them."
        )


def run_sweep(
    plan: SweepPlan, *, max_cells: int | None = None, progress: bool = True, jobs: int = 1
) -> int:
    """Run every cell not already done; returns the number of cells run now.

    ``jobs`` > 1 runs that many cells at once, each in its own process (CPU sweeps: with
    ``OMP_NUM_THREADS=1`` every process is one core and the numbers do not depend on the
    thread count). ``max_cells`` stops after that many new cells (tests use it to simulate a
    kill); a cell that another process holds counts among them. Other sweeps may share
    ``plan.out``: a cell one of them runs is skipped, one it finished is done.
    """
    check_run_counts(max_cells, jobs)
    if jobs > 1 and world_size() > 1:
        raise SystemExit("--jobs > 1 and accelerate launch do not mix: use one or the other")
    grid_path = plan.out / "sweep.json"
    if grid_path.exists():  # a grid that cannot be merged fails now, before any hashing
        refuse_unmergeable(json.loads(grid_path.read_text()), plan.grid())

    # everything is checked before sweep.json records the grid: a typo stays out of the layout
    tm, cells, inputs, pending, done_requests = _survey(plan)
    todo = pending[:max_cells]
    _refuse_unrunnable(plan, tm, cells, todo, done_requests)
    plan.out.mkdir(parents=True, exist_ok=True)
    if process_rank() == 0:
        record_grid(plan.out, plan.grid())
    start_process_group()
    # another sweep in this folder may finish a cell between two ranks' looks: rank 0's list
    todo = rank_zeros(todo)
    outcomes = _run_cells(plan, tm, cells, inputs, todo, already=len(cells) - len(pending),
                          progress=progress, jobs=jobs)
    if outcomes[HELD] and progress and process_rank() == 0:
        print(f"{outcomes[HELD]} cell(s) were running in other processes; once those finish, "
              "rerun this sweep to pick up any they did not complete", flush=True)
    return outcomes[RAN]


def _survey(plan: SweepPlan) -> tuple[Any, list[Cell], list[dict[str, Any]], list[int],
                                      list[dict[str, Any]]]:
    """What the cells folder holds against the plan: (task manager, the plan's cells, each
    cell's input digests, the indices of the cells not done on those inputs, the requests of
    every done cell). A done cell outside the plan that ran on other inputs than the folder's
    now is refused: its numbers would sit beside the new ones in one table."""
    done = {p: json.loads(p.read_text()) for p in cell_records(plan.out / "cells")}
    tm = task_manager(plan, tuple(sorted({r["request"]["task"] for r in done.values()})))
    digests = InputDigests(tm)
    cells = plan.cells()
    with _no_metadata_advice():  # the task digests load every task once
        inputs = [digests.for_cell(c.path, c.task, c.revision, c.loaded_with) for c in cells]
        pending = [i for i, c in enumerate(cells) if not c.is_done(inputs[i])]
        planned = {c.folder / "cell.json" for c in cells}
        stale = stale_cells({p: r for p, r in done.items() if p not in planned}, digests)
    if stale:
        raise SystemExit("done cells of this folder outside this sweep ran on other inputs than "
                         "their checkpoint (and what their model_args load with it), task and "
                         "lm-eval-sinkmask's code are now:\n  "
                         + "\n  ".join(stale) + f"\n{RERUN_HELP}")
    return tm, cells, inputs, pending, [r["request"] for r in done.values()]


def _run_cells(plan: SweepPlan, tm, cells: list[Cell], inputs: list[dict[str, Any]],
               todo: list[int], *, already: int, progress: bool, jobs: int) -> dict[str, int]:
    """Run the cells ``todo`` (indices into ``cells``), here or ``jobs`` at a time in worker
    processes, under a progress bar that starts at the ``already`` done; returns how many
    were run, held by another process, or found done by one."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(cells), initial=already, desc="sweep cells", unit="cell",
               disable=not progress or process_rank() != 0, dynamic_ncols=True)
    outcomes = {RAN: 0, HELD: 0, DONE_ELSEWHERE: 0}

    def report(cell: Cell, outcome: tuple[str, dict[str, Any] | None]) -> None:
        what, record = outcome
        outcomes[what] += 1
        name = f"{cell.label:>10} {cell.task} K={cell.k}"
        if what == HELD:  # not done: another process is running it now
            bar.write(f"{name}: skipped, another process is running it")
            return
        bar.update(1)
        if what == DONE_ELSEWHERE:
            bar.write(f"{name}: done by another process")
        elif record is not None:
            bar.write(f"{name}: {record['metric']} = {record['value']:.4f} "
                      f"({record['seconds']:.0f}s)")

    with bar:
        if jobs == 1:
            for i in todo:
                cell = cells[i]
                bar.set_postfix_str(f"{cell.label} {cell.task} K={cell.k}")
                outcome = claimed_run(cell, inputs[i], partial(run_cell, cell, tm, inputs[i]))
                _free_memory()
                report(cell, outcome)
            return outcomes
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # spawn: a fresh interpreter per worker, nothing inherited from a forked torch
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context,
                                 initializer=_exit_with, initargs=(os.getpid(),)) as pool:
            futures = {pool.submit(_run_cell_job, plan, i, inputs[i]): cells[i] for i in todo}
            try:
                for future in as_completed(futures):
                    report(futures[future], future.result())
            except BaseException:  # e.g. inputs changed: start no further cell
                pool.shutdown(cancel_futures=True)
                raise
    return outcomes


def _exit_with(parent: int) -> None:
    """Ends a ``--jobs`` worker once the sweep that started it is gone. A sweep killed by a
    signal it cannot catch (SIGTERM, SIGKILL, the OOM killer, a scheduler's time limit) cannot
    stop its pool, and its workers would run the queued cells on, unseen, holding their claims
    and a model in memory, while a rerun skips those cells as another process's. A cell cut
    short this way is redone by the next run, as any killed cell is."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, name="sweep-parent-watch", daemon=True).start()


def _run_cell_job(plan: SweepPlan, index: int, inputs: dict[str, Any]
                  ) -> tuple[str, dict[str, Any] | None]:
    """One cell in a worker process of ``run_sweep(jobs=N)``, under that worker's claim."""
    cell = plan.cells()[index]
    return claimed_run(cell, inputs, lambda: run_cell(cell, task_manager(plan), inputs))
