"""What a sweep cell ran on, by content rather than by name.

``zoo:llada`` and ``mini_gsm_sinkmask`` are names. Retraining a checkpoint or editing a task
YAML keeps the name, so a resumed sweep that compared names only would put cells made with the
old weights or the old prompt next to new ones in one table. Each cell therefore records
digests of its inputs, and a resume reuses a done cell only when they still match:

- the checkpoint: sha256 over the files that define the model (weights, config, tokenizer,
  remote code; not the model card or a training log), or, for a hub name, the commit of its
  cached snapshot;
- the task: its version, a sha256 of lm-eval's resolved config (functions by their source),
  a sha256 of the source files that define those functions (a helper they call in the same
  file changes the prompt or the score as much as the function itself), and a sha256 of every
  document of its dataset (test and few-shot splits alike).

Hashing runs at about 1.5 GB/s: a few milliseconds for the zoo, about 10 s for an 8B model
in bf16, once per checkpoint per sweep.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

_CHUNK = 16 << 20
# files that describe a checkpoint without changing what it computes: model cards, pictures,
# the zoo's training log (train_info.json, amended when a trained checkpoint is installed)
_NOT_MODEL = (".md", ".png", ".jpg", ".gitattributes", "train_info.json")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def folder_digest(folder: Path) -> str:
    """sha256 over (relative name, content sha256) of every model-defining file below ``folder``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel.startswith(".") or "/." in rel or rel.endswith(_NOT_MODEL):
            continue
        digest.update(f"{rel}\0{file_sha256(path)}\n".encode())
    return "sha256:" + digest.hexdigest()


def checkpoint_digest(path: str) -> str | None:
    """The identity of a checkpoint's content; None when it cannot be read here (a hub name
    that is not in the local cache yet)."""
    from .masking_lm import resolve_pretrained

    resolved = Path(resolve_pretrained(path)).expanduser()
    if resolved.is_dir():
        return folder_digest(resolved)
    try:  # a hub name: its cached snapshot folder is named by the commit
        from huggingface_hub import snapshot_download

        snapshot = snapshot_download(str(path), local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached, not a repo id: nothing to compare yet
        return None
    return "git:" + Path(snapshot).name


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=_stable, ensure_ascii=False)


def _stable(obj: Any) -> str:
    """A value json cannot hold, as text that is the same in every process: a function by its
    source (lm-eval leaves some in the config, e.g. a filter's ``filter_fn``), anything else by
    its repr without memory addresses."""
    if callable(obj):
        try:
            return inspect.getsource(obj)
        except (OSError, TypeError):
            return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(obj))


def code_digest(config: Any) -> str:
    """sha256 over the contents of the source files that define the functions in ``config``
    (a task's prompt, loader, filters, metrics; by content, not by place)."""
    files = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif callable(value):
            try:
                files.add(inspect.getsourcefile(getattr(value, "func", value)))
            except TypeError:  # a builtin: no source file
                pass

    walk(config)
    shas = sorted(file_sha256(Path(f)) for f in files if f and Path(f).is_file())
    return "sha256:" + hashlib.sha256("\n".join(shas).encode()).hexdigest()


def task_digest(task) -> dict[str, Any]:
    """``{"version", "config", "code", "docs"}`` of a built lm-eval task.

    The config leaves out where things lie, whose content the documents' digest covers, so a
    task folder that moves keeps its digest: ``metadata`` other than the version (lm-eval puts
    the YAML's absolute path there, and ``--metadata`` may carry local paths such as a GSM8K
    folder) and the local files or folder a dataset is read from (``dataset_kwargs``'
    ``data_files`` and ``data_dir``).
    """
    config = task.config.to_dict()
    metadata = config.pop("metadata", None) or {}
    if isinstance(config.get("dataset_kwargs"), dict):
        config["dataset_kwargs"] = {k: v for k, v in config["dataset_kwargs"].items()
                                    if k not in ("data_files", "data_dir")}
    version = metadata.get("version") if isinstance(metadata, dict) else None
    docs = hashlib.sha256()
    dataset = getattr(task, "dataset", None) or {}
    for split in sorted(dataset):
        docs.update(f"split {split}\n".encode())
        for row in dataset[split]:
            docs.update(_canonical(row).encode() + b"\n")
    return {
        "version": version,
        "config": "sha256:" + hashlib.sha256(_canonical(config).encode()).hexdigest(),
        "code": code_digest(task.config.to_dict(keep_callable=True)),
        "docs": "sha256:" + docs.hexdigest(),
    }


class InputDigests:
    """The digests of a sweep's checkpoints and tasks, each computed once."""

    def __init__(self, task_manager):
        self.task_manager = task_manager
        self._checkpoints: dict[str, str | None] = {}
        self._tasks: dict[str, dict[str, Any]] = {}

    def checkpoint(self, path: str) -> str | None:
        if self._checkpoints.get(path) is None:  # None is retried: a download may have run
            self._checkpoints[path] = checkpoint_digest(path)
        return self._checkpoints[path]

    def task(self, name: str) -> dict[str, Any]:
        if name not in self._tasks:
            self._tasks[name] = task_digest(self.task_manager.load([name])["tasks"][name])
        return self._tasks[name]

    def for_cell(self, path: str, task: str) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint(path), "task": self.task(task)}


def changed_inputs(done: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """What differs between a done cell's recorded inputs and today's, in words; [] when the
    cell may be reused. A checkpoint that cannot be read here (None) is not compared, nor the
    task's code where the done cell predates its digest."""
    if done is None:
        return ["the cell records no input digests (made by an older lm-eval-sinkmask)"]
    out = []
    if now["checkpoint"] is not None and done.get("checkpoint") != now["checkpoint"]:
        out.append(f"checkpoint {done.get('checkpoint')} -> {now['checkpoint']}")
    old_task, new_task = done.get("task") or {}, now["task"]
    for key in ("version", "config", "docs"):
        if old_task.get(key) != new_task.get(key):
            out.append(f"task {key} {old_task.get(key)} -> {new_task.get(key)}")
    if "code" in old_task and old_task["code"] != new_task.get("code"):
        out.append(f"task code {old_task['code']} -> {new_task.get('code')}")
    return out
