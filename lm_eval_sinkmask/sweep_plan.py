"""What a Table 1 sweep runs and where each cell lives (docs/method.md section 9).

A sweep is models x tasks x K: ``--models name=path,...`` (the kind, ARM or DLM, given or read
off the checkpoint's config), each cell one lm-eval run of one model at one K on one task, in
the folder ``DIR/cells/<model>/<task>/k<K>/`` (:class:`Cell`; :mod:`sweep` runs it).
``DIR/sweep.json`` records the grid (model order, tasks, K) that ``sinkmask table`` lays out.

A seed axis (``--seeds 0,1,2``) runs every model once per training seed: ``zoo:llada`` becomes
``zoo:llada@S`` and any other path names its seed with a ``{seed}`` placeholder
(``/ckpt/llada-s{seed}``). Its cells live one level deeper, ``DIR/cells/<model>/seed<S>/<task>/k<K>/``,
and ``sweep.json`` lists the seeds; without the axis the layout is the one above.

A draw axis (``--mask-seeds 0-7``) repeats the random-key control: every model with
``mask_target=random`` runs each masked cell (K > 0) once per ``mask_seed``, so the table can
give the control's mean and spread over independent draws rather than one draw's luck. Those
cells live under ``.../<model>[/seed<S>]/draw<D>/<task>/k<K>/``; K=0 masks nothing, draws
nothing, and runs once.
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .checkpoint_checks import check_local_folder
from .provenance import LOADED_WITH, changed_inputs

KINDS = ("arm", "dlm")
MODEL_CLASS = {"arm": "arm_sinkmask", "dlm": "dlm_sinkmask"}


@dataclass(frozen=True)
class ModelSpec:
    """One column of the table: ``name=path``, ``name=kind:path`` (kind arm or dlm)."""

    name: str
    path: str
    kind: str  # "arm" or "dlm"
    args: str = ""  # model_args for this model only (``--model-args-for name:...``)

    @property
    def model_class(self) -> str:
        return MODEL_CLASS[self.kind]

    def path_for_seed(self, seed: int | None) -> str:
        return seed_path(self.path, seed)


SEED_PLACEHOLDER = "{seed}"


def seed_path(path: str, seed: int | None) -> str:
    """The checkpoint of one training seed: ``zoo:NAME`` -> ``zoo:NAME@S``, ``{seed}`` replaced.

    ``seed`` None (no seed axis) returns ``path`` unchanged. A path that names no seed is an
    error: running one checkpoint once per "seed" would report a spread of zero.
    """
    if seed is None:
        return path
    if SEED_PLACEHOLDER in path:
        return path.replace(SEED_PLACEHOLDER, str(seed))
    if path.startswith("zoo:") and "@" not in path:
        return f"{path}@{seed}"
    raise ValueError(
        f"with --seeds every model path must name its seed: use zoo:NAME (without @S) or a "
        f"{SEED_PLACEHOLDER} placeholder, e.g. /ckpt/llada-s{SEED_PLACEHOLDER}; got {path!r}"
    )


def requested_revision(model_args: dict[str, Any]) -> str | None:
    """The checkpoint revision parsed model_args ask for (None: the default branch)."""
    revision = model_args.get("revision")
    return None if revision is None else str(revision)


def loaded_with(model_args: dict[str, Any]) -> dict[str, str]:
    """What parsed model_args load beside the checkpoint (:data:`provenance.LOADED_WITH`),
    name -> path, for the sweep to hash with it."""
    return {name: str(model_args[name]) for name in LOADED_WITH if model_args.get(name)}


def parse_seeds(text: str | None, option: str = "--seeds") -> list[int] | None:
    """``0,1,2`` or ``0-2`` (or a mix, ``0-3,7``) -> [0, 1, 2]; None or empty -> None (no axis)."""
    if text is None or not text.strip():
        return None
    seeds: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            first, dash, last = part.partition("-")
            if dash and int(last) < int(first):
                raise ValueError(part)  # 3-1 would be an empty range, silently
            seeds += list(range(int(first), int(last) + 1)) if dash else [int(part)]
    except ValueError:
        seeds = []
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"{option} needs distinct integers >= 0 (e.g. 0,1,2 or 0-7), got {text!r}")
    return seeds


def parse_models(text: str, kind_of=None, seeds: list[int] | None = None) -> list[ModelSpec]:
    """``llada=GSAI-ML/LLaDA-8B-Instruct,llama=arm:meta-llama/...``; the kind, when not given,
    comes from the checkpoint's ``config.model_type`` (:func:`infer_kind`).

    With ``seeds``, every seed's checkpoint is resolved now (a missing zoo seed fails here,
    before any weights load) and must be of the same kind."""
    kind_of = kind_of or infer_kind
    specs: list[ModelSpec] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, target = item.partition("=")
        if not sep or not name or not target:
            raise ValueError(f"--models entries are name=path or name=kind:path, got {item!r}")
        if "/" in name or "\\" in name or name in (".", ".."):
            raise ValueError(f"model name {name!r} names its folder under cells/: no / or \\, "
                             "not . or ..")
        kind, sep, path = target.partition(":")
        if not sep or kind not in KINDS:  # a plain path (a Windows drive letter is not a kind)
            kind, path = None, target
        kinds = {_kind_or_check(kind, seed_path(path, s), kind_of) for s in seeds or [None]}
        if len(kinds) > 1:
            raise ValueError(f"the seeds of {name!r} are of different kinds {sorted(kinds)}")
        kind = kinds.pop()
        if any(s.name.casefold() == name.casefold() for s in specs):  # one folder on macOS
            raise ValueError(f"model name {name!r} given twice (names differing only in case "
                             "share a folder on a case-insensitive file system)")
        specs.append(ModelSpec(name, path, kind))
    if not specs:
        raise ValueError("--models is empty")
    return specs


def _kind_or_check(kind: str | None, path: str, kind_of) -> str:
    """The given kind (a zoo reference is still resolved and a local folder must exist, so a
    missing seed or a mistyped path fails now, not at its column's first cell), or the one read
    off the checkpoint."""
    if kind is None:
        return kind_of(path)
    if path.startswith("zoo:"):
        from .zoo import resolve_pretrained

        resolve_pretrained(path)
    else:
        check_local_folder(path)
    return kind


def model_type_of(path: str) -> str | None:
    """The ``model_type`` a checkpoint's config.json declares (``path``: a folder, hub repo or
    zoo: reference), read from the raw dict, so remote-code checkpoints need no
    ``trust_remote_code`` here."""
    from .checkpoint_checks import read_config
    from .zoo import resolve_pretrained

    return read_config(resolve_pretrained(path), {}).get("model_type")


def infer_kind(path: str) -> str:
    """"dlm" when ``config.model_type`` belongs to a diffusion family (families.py), else "arm"."""
    from .families import family_for

    try:  # (read_config refuses a local folder that is not there)
        model_type = model_type_of(path)
    except OSError as e:  # an unknown hub id, no network, no config.json: one line, not three
        reason = str(e).strip().split("\n")[0].split(". ")[0] or type(e).__name__
        raise ValueError(f"cannot read the kind of {path!r} off its config.json ({reason}): "
                         "--models takes a checkpoint folder, a hub id or zoo:NAME, each as "
                         "name=PATH or, with its kind, name=arm:PATH or name=dlm:PATH") from None
    try:
        family_for(model_type)
        return "dlm"
    except ValueError:
        return "arm"


def parse_ks(text: str) -> list[int]:
    try:
        ks = [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        ks = []
    if not ks or any(k < 0 for k in ks) or len(set(ks)) != len(ks):
        raise ValueError(f"--top-k needs distinct integers >= 0, got {text!r}")
    return ks


def parse_tasks(text: str) -> list[str]:
    """``--tasks``: none at all would sweep nothing and say nothing; a task named twice would
    run its cells twice into the same folders."""
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    if not tasks or len(set(tasks)) != len(tasks):
        raise ValueError(f"--tasks needs distinct task names, got {text!r}")
    return tasks


def check_run_counts(max_cells: int | None, jobs: int) -> None:
    """How many cells a sweep runs now and at once: ``max_cells`` is a slice of the cells to
    do, so -1 would run every cell but the last; checked before any checkpoint's config is
    read."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if max_cells is not None and max_cells < 1:
        raise ValueError(f"max_cells must be >= 1, got {max_cells}")


def check_limit(limit: int | float | None) -> None:
    """lm-eval reads ``--limit`` as a count (>= 1) or a fraction (< 1) of each task; zero, a
    negative or an infinite one would fail (or score nothing) only inside the first cell, and
    a count with a fraction (2.5) would run its whole part while the record kept 2.5."""
    if limit is None:
        return
    if not (math.isfinite(limit) and limit > 0):
        raise ValueError(f"--limit is a count of problems (>= 1) or a fraction of them (0 < f < 1), "
                         f"got {limit:g}")
    if limit >= 1 and limit != int(limit):
        raise ValueError(f"--limit {limit:g} would run {int(limit)} problems of each task: give a "
                         "whole count, or a fraction below 1")


def check_pairs(pairs: list[list[str]], models: list[str]) -> None:
    """Every name in ``pairs`` (``--versus``) is one of the sweep's ``models``.

    Here, not in :mod:`versus`: checking a plan then imports none of the modules that render
    reports (:mod:`versus` brings :mod:`seed_stats`, :mod:`paired` and :mod:`text_format`), so
    they can stay out of a cell's package-code digest (:data:`provenance.NOT_CELL_CODE`)."""
    unknown = sorted({name for pair in pairs for name in pair} - set(models))
    if unknown:
        raise ValueError(f"--versus names {unknown}, which the sweep does not have; its models "
                         f"are {models}")


# model_args the sweep gives every cell, and the option that sets each: the checkpoint first in
# its model_args, top_k and eps last, batch size and device beside them (lm-eval passes both)
SET_BY_SWEEP = {"pretrained": "--models", "top_k": "--top-k", "eps": "--eps",
                "batch_size": "--batch-size", "device": "--device"}


@dataclass
class SweepPlan:
    models: list[ModelSpec]
    tasks: list[str]
    ks: list[int]
    out: Path
    eps: float = 3.0
    limit: int | float | None = None
    model_args_extra: str = ""  # appended to every model's model_args
    arm_rule: str = "last_row"
    batch_size: int | str = 1
    device: str | None = None
    num_fewshot: int | None = None
    apply_chat_template: bool = False
    include_path: list[str] = field(default_factory=list)
    allow_code_execution: bool = False
    seed: int = 0
    seeds: list[int] | None = None  # training seeds of every model (None: no seed axis)
    mask_seeds: list[int] | None = None  # draws of the random control (None: no draw axis)
    versus: list[list[str]] = field(default_factory=list)  # [A, B]: A - B under the table
    title: str | None = None  # the table's title (kept in sweep.json for later renders)

    def __post_init__(self) -> None:
        check_pairs(self.versus, [m.name for m in self.models])
        check_limit(self.limit)
        if self.num_fewshot is not None and self.num_fewshot < 0:  # lm-eval would run 0-shot
            raise ValueError(f"--num-fewshot is a number of examples (>= 0), "
                             f"got {self.num_fewshot}")
        self._refuse_set_by_sweep()
        if self.mask_seeds is None:
            return
        drawn = [m for m in self.models if self.draws_random_keys(m)]
        if not drawn:
            raise ValueError("--mask-seeds repeats the draws of mask_target=random models, and no "
                             "model has mask_target=random (e.g. --model-args-for "
                             "NAME:mask_target=random)")
        fixed = [m.name for m in drawn if "mask_seed" in self._args_of(m)]
        if fixed:
            raise ValueError(f"{fixed} set mask_seed themselves; with --mask-seeds the sweep sets "
                             "it per draw (drop it from their model args)")

    def _refuse_set_by_sweep(self) -> None:
        """What the sweep gives every cell, given again in the model args, would run otherwise
        than recorded or fail: each cell's model_args end with its top_k and the sweep's eps,
        which override a second value without a word (an eps ablation run as
        ``--model-args-extra eps=1.5`` would run, and be recorded, at the default eps); they
        begin with the column's checkpoint, which a second one would override (the cell would
        run another checkpoint than the one the sweep hashed and recorded); and lm-eval hands
        the model the batch size and device besides, which a second value makes a TypeError
        at the first cell."""
        from lm_eval.utils import simple_parse_args_string

        given = [("--model-args-extra", self.model_args_extra)] + [
            (f"--model-args-for {m.name}", m.args) for m in self.models]
        clashes = [f"{name} in {where}" for where, args in given
                   for name in simple_parse_args_string(args) if name in SET_BY_SWEEP]
        if clashes:
            raise ValueError("; ".join(clashes) + ": the sweep gives every cell its own ("
                             + ", ".join(f"{k} from {v}" for k, v in SET_BY_SWEEP.items())
                             + "), and a second value would override it, be overridden or "
                             "fail. Give it with that option instead")
        if "arm_rule" in simple_parse_args_string(self.model_args_extra):
            # it would override --arm-rule, which every ARM cell's model_args begin with
            raise ValueError("arm_rule in --model-args-extra: --arm-rule sets every ARM "
                             "column's query rule (one column's: --model-args-for "
                             "NAME:arm_rule=...)")

    def _args_of(self, model: ModelSpec) -> dict[str, Any]:
        """The model_args that ``model`` adds to every cell (the sweep's, then its own), as
        lm-eval parses them (the last value given for a key wins)."""
        from lm_eval.utils import simple_parse_args_string

        return simple_parse_args_string(f"{self.model_args_extra},{model.args}")

    def draws_random_keys(self, model: ModelSpec) -> bool:
        """Whether ``model`` masks random keys (``mask_target=random``), i.e. has draws."""
        return self._args_of(model).get("mask_target") == "random"

    def draws_of(self, model: ModelSpec, k: int) -> list[int | None]:
        """The mask seeds a (model, K) cell runs with: every draw for a random-control model
        at K > 0, else one run (None: the model's own mask_seed)."""
        if self.mask_seeds is None or k == 0 or not self.draws_random_keys(model):
            return [None]
        return self.mask_seeds

    def cells(self) -> list[Cell]:
        return [Cell(self, m, t, k, s, d) for m in self.models for s in self.seeds or [None]
                for t in self.tasks for k in self.ks for d in self.draws_of(m, k)]

    def grid(self) -> dict[str, Any]:
        grid = {
            "models": [asdict(m) for m in self.models],
            "tasks": self.tasks,
            "ks": self.ks,
            "eps": self.eps,
            "limit": self.limit,
            "columns": self.column_settings(),
        }
        if self.seeds is not None:
            grid["seeds"] = self.seeds
        if self.mask_seeds is not None:
            grid["mask_seeds"] = self.mask_seeds
        if self.versus:
            grid["versus"] = self.versus
        if self.title:
            grid["title"] = self.title
        return grid

    def column_settings(self) -> dict[str, dict[str, Any]]:
        """Model name -> what every cell of its column shares (:func:`shared_settings`), kept in
        sweep.json so that a sweep starting in the folder with other settings is refused when
        it merges its grid, before its first cell."""
        return {m.name: shared_settings(Cell(self, m, "", 0).request()) for m in self.models}


@dataclass
class Cell:
    plan: SweepPlan
    model: ModelSpec
    task: str
    k: int
    seed: int | None = None  # training seed of the checkpoint (None: no seed axis)
    draw: int | None = None  # mask_seed of a random-control draw (None: no draw axis)

    @property
    def folder(self) -> Path:
        model = self.plan.out / "cells" / self.model.name
        if self.seed is not None:
            model = model / f"seed{self.seed}"
        if self.draw is not None:
            model = model / f"draw{self.draw}"
        return model / self.task / f"k{self.k}"

    @property
    def label(self) -> str:
        """``llada@1 draw 3``: the model and, on those axes, its seed and draw."""
        seed = "" if self.seed is None else f"@{self.seed}"
        draw = "" if self.draw is None else f" draw {self.draw}"
        return f"{self.model.name}{seed}{draw}"

    @property
    def path(self) -> str:
        """This cell's checkpoint (the model's path for this cell's seed)."""
        return self.model.path_for_seed(self.seed)

    @property
    def model_args(self) -> str:
        """Exactly what lm-eval parses; ``top_k``/``eps`` last so nothing extra overrides them."""
        parts = [f"pretrained={self.path}"]
        if self.model.kind == "arm":
            parts.append(f"arm_rule={self.plan.arm_rule}")
        parts += [self.plan.model_args_extra, self.model.args]
        if self.draw is not None:
            parts.append(f"mask_seed={self.draw}")
        parts += [f"top_k={self.k}", f"eps={self.plan.eps:g}"]
        return ",".join(p for p in parts if p)

    @functools.cached_property
    def parsed_model_args(self) -> dict[str, Any]:
        """:attr:`model_args` as lm-eval parses them (read-only: parsed once per cell)."""
        from lm_eval.utils import simple_parse_args_string

        return simple_parse_args_string(self.model_args)

    @property
    def revision(self) -> str | None:
        """The checkpoint revision this cell's model_args ask for (None: the default branch)."""
        return requested_revision(self.parsed_model_args)

    @property
    def loaded_with(self) -> dict[str, str]:
        """What this cell's model_args load beside the checkpoint, name -> path."""
        return loaded_with(self.parsed_model_args)

    def request(self) -> dict[str, Any]:
        """What identifies this cell's run; a done cell with a different request is an error."""
        request = {
            "model": self.model.name,
            "model_class": self.model.model_class,
            "model_args": self.model_args,
            "task": self.task,
            "top_k": self.k,
            "limit": self.plan.limit,
            "num_fewshot": self.plan.num_fewshot,
            "apply_chat_template": self.plan.apply_chat_template,
            "seed": self.plan.seed,
        }
        if self.seed is not None:  # only on a seed axis: older cells keep their exact request
            request["checkpoint_seed"] = self.seed
        if self.draw is not None:  # likewise only on a draw axis
            request["mask_seed"] = self.draw
        return request

    def record(self) -> dict[str, Any] | None:
        path = self.folder / "cell.json"
        return json.loads(path.read_text()) if path.exists() else None

    def is_done(self, inputs: dict[str, Any]) -> bool:
        """True when this cell was run with the same request on the same ``inputs`` (the
        digests of the checkpoint and what the model_args load with it, the task and the
        package code, :mod:`provenance`); a done cell that differs in any is an error rather
        than a cell to reuse or to overwrite. How it ran (batch size, device) is not
        compared."""
        record = self.record()
        if record is None:
            return False
        if record["request"] != self.request():
            raise SystemExit(
                f"{self.folder} was run with different settings:\n  done: {record['request']}\n"
                f"  now:  {self.request()}\n{RERUN_HELP}"
            )
        changed = changed_inputs(record.get("inputs"), inputs)
        if changed:
            raise SystemExit(
                f"{self.folder} was run on other inputs than {self.path} (and what its "
                f"model_args load with it), {self.task} and lm-eval-sinkmask's code are now:\n  "
                + "\n  ".join(changed) + f"\n{RERUN_HELP}"
            )
        return True


RERUN_HELP = "Use another --out folder (or delete that cell) to rerun it with the new settings."


def cell_records(cells: Path) -> list[Path]:
    """Every ``cell.json`` below ``cells`` (any depth: seed and draw folders), sorted. Unlike
    ``rglob``, a folder that disappears during the walk (another sweep sharing the folder starts
    a half-written cell afresh) is passed over instead of failing."""
    return sorted(Path(root) / "cell.json" for root, _, files in os.walk(cells)
                  if "cell.json" in files)


def merge_grids(old: dict, new: dict) -> dict:
    """The grid of a folder swept again, perhaps wider: earlier models, tasks and K stay in the
    layout, once :func:`refuse_unmergeable` found nothing to refuse."""
    def union(a, b, key=lambda x: x):
        seen = {key(x) for x in a}
        return list(a) + [x for x in b if key(x) not in seen]

    refuse_unmergeable(old, new)
    merged = dict(new)
    for axis in ("seeds", "mask_seeds"):
        if axis in new:
            merged[axis] = sorted(set(old[axis]) | set(new[axis]))
    merged["models"] = union(old.get("models", []), new["models"], key=lambda m: m["name"])
    merged["tasks"] = union(old.get("tasks", []), new["tasks"])
    merged["ks"] = sorted(set(old.get("ks", [])) | set(new["ks"]))
    limits = task_limits(old) | task_limits(new)  # equal where both name a task
    shared = set(limits.values())
    merged["limit"] = shared.pop() if len(shared) == 1 else limits
    if old.get("versus") or new.get("versus"):
        merged["versus"] = union(old.get("versus", []), new.get("versus", []), key=tuple)
    if "columns" in old or "columns" in new:
        merged["columns"] = {**(old.get("columns") or {}), **(new.get("columns") or {})}
    if "title" in old and "title" not in new:
        merged["title"] = old["title"]
    return merged


def refuse_unmergeable(old: dict, new: dict) -> None:
    """Refuse what would put two experiments under one name: a folder that would mix the
    layouts with and without a seed or draw axis, a column whose path, kind, model args or
    shared settings (``columns``: sweeps started at once merge here, under the folder's lock)
    change, another eps, another --limit for a task already swept."""
    for axis, option in (("seeds", "--seeds"), ("mask_seeds", "--mask-seeds")):
        if (axis in old) != (axis in new):
            with_axis = "with" if axis in old else "without"
            raise SystemExit(f"this folder was swept {with_axis} {option}; use another --out "
                             "folder rather than mixing the two layouts")
    recorded = {m["name"]: m for m in old.get("models", [])}
    for model in new["models"]:
        before = recorded.get(model["name"], model)
        if before != model:
            raise SystemExit(f"column {model['name']!r} was swept as {before} and is now {model}: "
                             f"give the new one another name, or use another --out folder")
    if old.get("eps", new["eps"]) != new["eps"]:
        raise SystemExit(f"this folder was swept at eps {old['eps']:g}, not {new['eps']:g}: "
                         "use another --out folder")
    old_columns = old.get("columns") or {}  # none in a sweep.json older than the key
    for name, settings in (new.get("columns") or {}).items():
        before = old_columns.get(name, settings)
        if before != settings:
            raise SystemExit(f"column {name!r} mixes settings: {settings_differ(before, settings)} "
                             "(swept here before with the first): use another --out folder")
    limits = task_limits(old)
    for task, limit in task_limits(new).items():
        if limits.setdefault(task, limit) != limit:
            raise SystemExit(f"{task} was swept here with --limit {limits[task]}, not {limit}: "
                             "use another --out folder")


def task_limits(grid: dict) -> dict[str, int | float | None]:
    """task -> the ``--limit`` its cells ran with; a grid stores one number when the tasks
    share it, else one per task."""
    limit = grid.get("limit")
    if isinstance(limit, dict):
        return dict(limit)
    return {task: limit for task in grid.get("tasks", [])}


# model_args that differ along a column's axes (seed, K, draw): the rest is the column's own
AXIS_ARGS = ("pretrained", "top_k", "mask_seed")


def shared_settings(request: dict[str, Any]) -> dict[str, Any]:
    """What every cell of one column shares: its request less the task, the axes (K, training
    seed, draw) and the per-task ``limit``."""
    args = [a for a in request.get("model_args", "").split(",") if a.partition("=")[0] not in AXIS_ARGS]
    shared = {k: v for k, v in request.items()
              if k not in ("task", "top_k", "limit", "checkpoint_seed", "mask_seed", "model_args")}
    return {**shared, "model_args": ",".join(args)}


def mixed_settings(requests: list[dict[str, Any]]) -> list[str]:
    """One line per column whose cells ran with different settings (``shared_settings``, and
    the limit within each task): such a column would average two experiments."""
    settings_of: dict[str, dict[str, Any]] = {}
    limit_of: dict[tuple[str, str], Any] = {}
    problems = set()
    for request in requests:
        model, task = request["model"], request["task"]
        settings, limit = shared_settings(request), request.get("limit")
        first = settings_of.setdefault(model, settings)
        if first != settings:
            problems.add(f"column {model!r} mixes settings: {settings_differ(first, settings)}")
        first = limit_of.setdefault((model, task), limit)
        if first != limit:
            problems.add(f"column {model!r} ran {task} with --limit {first} and {limit}")
    return sorted(problems)


def settings_differ(first: dict[str, Any], then: dict[str, Any]) -> dict[str, list]:
    """setting -> [first value, then value], for the settings in which two columns differ."""
    return {k: [first.get(k), then.get(k)] for k in sorted({*first, *then})
            if first.get(k) != then.get(k)}
