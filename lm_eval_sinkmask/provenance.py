"""What a sweep cell ran on, by content rather than by name.

``zoo:llada`` and ``mini_gsm_sinkmask`` are names. Retraining a checkpoint or editing a task
YAML keeps the name, and so does fixing a sampler while the package version stays 0.1.0, so a
resumed sweep that compared names only would put cells made with the old weights, prompt or
code next to new ones in one table. Each cell therefore records digests of its inputs, and a
resume reuses a done cell only when they still match:

- the checkpoint: sha256 over the files that define the model (weights, config, tokenizer,
  remote code; not the model card or a training log), or, for a hub name, the commit of its
  cached snapshot at the ``revision`` the cell's model_args ask for;
- the task: its version, a sha256 of lm-eval's resolved config (functions by their source),
  a sha256 of the source files that define those functions (a helper they call in the same
  file changes the prompt or the score as much as the function itself; the task folder's
  Python files are all such files), and a sha256 of every document of its dataset (test and
  few-shot splits alike);
- the package code: a sha256 over lm-eval-sinkmask's own modules (masking, detection,
  samplers, likelihood, the zoo's modeling, the sweep itself ...), each by its syntax tree, so
  a comment, a docstring or a reflowed line changes nothing and a code change does. Left out,
  by name: the modules no cell imports (:data:`NOT_CELL_CODE`: reports, figures, the CLI,
  zoo training), so polishing a table does not invalidate a sweep. Beside it, the code an
  unmasked cell's number can come from (:func:`unmasked_code_digest`): less the modules that
  only a masked attention call runs (:data:`MASKING_ONLY`: detection, Eq. 3, its kernels) and
  those that keep the record (:data:`RECORD_KEEPING`), so that a faster detection kernel
  leaves the unmasked baselines that reports read (the zoo's report card) standing.

A done cell that predates a digest is not compared on it. Hashing runs at about 1.5 GB/s: a
few milliseconds for the zoo, about 10 s for an 8B model in bf16, once per checkpoint per
sweep; the package's code, about 0.3 s at the start, then about 5 ms at each cell's end (a
file is parsed again only where its stat changed).
"""

from __future__ import annotations

import ast
import functools
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

PACKAGE_ROOT = Path(__file__).resolve().parent
# Modules of the package that no sweep cell imports, so they cannot change its numbers
# (tests/test_provenance_code.py runs cells and checks): what renders reports, figures and CLI
# output (``sinkmask table`` and ``figures``, Table 1's statistics), what records sink traces
# and runs experiments (their outputs are not cells), and what trains and installs the zoo
# (its product is a checkpoint, which has its own digest). A name covers its submodules.
NOT_CELL_CODE = (
    "cli", "table", "table_layout", "figures", "text_format", "versus", "paired", "seed_stats",
    "stability", "sink_trace", "experiments",
    "zoo.report", "zoo.report_markdown", "zoo.sink_stats", "zoo.install", "zoo.train",
    "zoo.training_loop", "zoo.objectives",
    "zoo.batches", "zoo.pool", "zoo.gpu_zoo", "zoo.quick_eval", "zoo.save_checkpoint",
    "zoo.sink_embedding", "zoo.tokenizer", "zoo.sink_share", "zoo.split_shares",
)
# Modules whose code runs only inside a masked attention call (top_k > 0): detection (the
# materialised sweep, the fused kernels, FlexAttention, the one-row decoding kernel), the Eq. 3
# selection and the masked output's pieces. An unmasked cell runs the intercept up to its
# test of top_k, which hands the call to the model's own attention, so no number of it comes
# from these (tests run unmasked cells of every family and check; their module level only
# defines and imports).
MASKING_ONLY = ("attention_view", "chunked_attention", "compiled_tail", "flex_mass", "fused_mass",
                "_mass_kernels", "decode_step", "_decode_kernels", "metric")
# Modules that record what a cell ran on, claim its folder and write its files: they decide
# whether a cell is reused and where it lies, never a number in it.
RECORD_KEEPING = ("provenance", "cell_claims", "atomic_write")


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


def checkpoint_digest(path: str, revision: str | None = None) -> str | None:
    """The identity of a checkpoint's content; None when it cannot be read here (a hub name
    that is not in the local cache yet, at ``revision``: a branch, tag or commit, main when
    None)."""
    from .zoo import resolve_pretrained

    resolved = Path(resolve_pretrained(path)).expanduser()
    if resolved.is_dir():
        return folder_digest(resolved)
    try:  # a hub name: its cached snapshot folder is named by the commit
        from huggingface_hub import snapshot_download

        snapshot = snapshot_download(str(path), revision=revision, local_files_only=True)
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
    """sha256 over the source files that define the functions in ``config`` (a task's prompt,
    loader, filters, metrics; by content, not by place). A Python file counts by its
    :func:`syntax_text`, as the package's modules do: an edited comment or docstring in a
    task's scorer leaves its committed cells standing."""
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
    shas = sorted(_syntax_digest(Path(f)) if f.endswith(".py") else file_sha256(Path(f))
                  for f in files if f and Path(f).is_file())
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


def module_name(path: Path, root: Path) -> str:
    """``zoo/report.py`` below ``root`` -> ``zoo.report``; a package's ``__init__.py``, its name."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def not_cell_code(name: str) -> bool:
    """Whether module ``name`` (``zoo.report``, relative to the package) is in, or below one
    in, :data:`NOT_CELL_CODE`."""
    return any(name == x or name.startswith(x + ".") for x in NOT_CELL_CODE)


def code_files(root: Path) -> list[Path]:
    """The Python files below ``root`` (the package, or a copy of it) that a cell can run."""
    return sorted(p for p in root.rglob("*.py") if not not_cell_code(module_name(p, root)))


def syntax_text(source: str) -> str:
    """The syntax tree of ``source`` as text: comments, docstrings (any statement that is only a
    string) and layout do not show. So that Pythons 3.10 to 3.13 give the same text, unset
    fields are left out (3.12 adds ``type_params``) and so are empty pieces of an f-string
    (3.12.0 and 3.12.1 add some)."""
    def text(node: Any) -> str:
        if isinstance(node, list):
            return "[" + ",".join(text(n) for n in node if not _only_a_string(n)) + "]"
        if not isinstance(node, ast.AST):
            return repr(node)
        fields = ",".join(f"{name}={text(value)}" for name, value in ast.iter_fields(node)
                          if value is not None and value != [])
        return f"{type(node).__name__}({fields})"

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            node.values = [v for v in node.values
                           if not (isinstance(v, ast.Constant) and v.value == "")]
    return text(tree)


def _only_a_string(node: Any) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def package_code_digest(root: Path = PACKAGE_ROOT, leave_out: tuple[str, ...] = ()) -> str:
    """sha256 over (relative name, sha256 of its :func:`syntax_text`) of every :func:`code_files`
    module below ``root`` but those named in ``leave_out``: the code a cell runs, wherever the
    package lies."""
    digest = hashlib.sha256()
    for path in code_files(root):
        if module_name(path, root) in leave_out:
            continue
        digest.update(f"{path.relative_to(root).as_posix()}\0{_syntax_digest(path)}\n".encode())
    return "sha256:" + digest.hexdigest()


# path -> (its stat when read, sha256 of its syntax text)
_SYNTAX_DIGESTS: dict[Path, tuple[tuple[int, ...], str]] = {}


def _syntax_digest(path: Path) -> str:
    """sha256 of a module's :func:`syntax_text`, parsed again only where the file changed (by
    its stat): a sweep reads the package's code again after every cell, and parsing it all
    takes about 0.4 s."""
    st = path.stat()
    stamp = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
    known = _SYNTAX_DIGESTS.get(path)
    if known is None or known[0] != stamp:
        text = syntax_text(path.read_text(encoding="utf-8"))
        known = _SYNTAX_DIGESTS[path] = (stamp, hashlib.sha256(text.encode()).hexdigest())
    return known[1]


def unmasked_code_digest(root: Path = PACKAGE_ROOT) -> str:
    """:func:`package_code_digest` of the modules an unmasked cell's number can come from: all
    of them but :data:`MASKING_ONLY` and :data:`RECORD_KEEPING`."""
    return package_code_digest(root, MASKING_ONLY + RECORD_KEEPING)


@functools.cache
def installed_code_digest() -> str:
    """:func:`package_code_digest` of this package, once per process."""
    return package_code_digest()


@functools.cache
def installed_unmasked_code_digest() -> str:
    """:func:`unmasked_code_digest` of this package, once per process."""
    return unmasked_code_digest()


def code_digests(on_disk: bool = False) -> dict[str, str]:
    """The two code digests a cell records: the package's, and the part an unmasked cell's
    number can come from. As this process first read them, or ``on_disk`` as they are now: a
    module first imported later (the Triton kernels are, at the first masked attention call)
    runs the code on disk then, not the code this process started with."""
    if on_disk:
        return {"package_code": package_code_digest(), "unmasked_code": unmasked_code_digest()}
    return {"package_code": installed_code_digest(),
            "unmasked_code": installed_unmasked_code_digest()}


# model_args that load files beside the checkpoint, each changing the answers: an adapter or
# delta retrained in place, or a tokenizer folder edited, keeps its path
LOADED_WITH = ("peft", "delta", "tokenizer")


def loaded_with_digests(loaded_with: dict[str, str], revision: str | None,
                        digest=checkpoint_digest) -> dict[str, str | None]:
    """name -> digest of what model_args load beside the checkpoint (name -> path), at the
    checkpoint's revision, as HFLM loads them."""
    return {name: digest(source, revision) for name, source in loaded_with.items()}


class InputDigests:
    """The digests of a sweep's checkpoints (and what model_args load with them), tasks and
    package code, each computed once."""

    def __init__(self, task_manager):
        self.task_manager = task_manager
        self._checkpoints: dict[tuple[str, str | None], str | None] = {}
        self._tasks: dict[str, dict[str, Any]] = {}

    def checkpoint(self, path: str, revision: str | None = None) -> str | None:
        if self._checkpoints.get((path, revision)) is None:  # retried: a download may have run
            self._checkpoints[(path, revision)] = checkpoint_digest(path, revision)
        return self._checkpoints[(path, revision)]

    def task(self, name: str) -> dict[str, Any]:
        if name not in self._tasks:
            self._tasks[name] = task_digest(self.task_manager.load([name])["tasks"][name])
        return self._tasks[name]

    def for_cell(self, path: str, task: str, revision: str | None = None,
                 loaded_with: dict[str, str] | None = None) -> dict[str, Any]:
        """``loaded_with``: what the cell's model_args load beside the checkpoint
        (:data:`LOADED_WITH`), name -> path, which HFLM loads at the checkpoint's revision."""
        inputs = {"checkpoint": self.checkpoint(path, revision), "task": self.task(task),
                  **code_digests()}
        if loaded_with:
            inputs["loaded_with"] = loaded_with_digests(loaded_with, revision, self.checkpoint)
        return inputs


def changed_inputs(done: dict[str, Any] | None, now: dict[str, Any],
                   unmasked: bool = False) -> list[str]:
    """What differs between a done cell's recorded inputs and today's, in words; [] when the
    cell may be reused. A checkpoint that cannot be read here (None) is not compared, nor a
    file model_args load with it that either side could not read, nor the
    task's code or the package code where the done cell predates its digest (or ``now`` has
    none). ``unmasked`` (a top_k=0 cell, read where only its number matters): the package code
    is compared on ``unmasked_code`` where both record it."""
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
    # what model_args load beside the checkpoint: compared where both sides could hash it (a
    # hub tokenizer not cached at a sweep's start is the one the cell downloaded)
    old_loaded, new_loaded = done.get("loaded_with") or {}, now.get("loaded_with") or {}
    for name in sorted(set(old_loaded) & set(new_loaded)):
        old, new = old_loaded[name], new_loaded[name]
        if old is not None and new is not None and old != new:
            out.append(f"{name} {old} -> {new}")
    key = "unmasked_code" if unmasked and done.get("unmasked_code") and now.get("unmasked_code") \
        else "package_code"
    old_code, new_code = done.get(key), now.get(key)
    if old_code is not None and new_code is not None and old_code != new_code:
        what = "the code of an unmasked run" if key == "unmasked_code" else "package code"
        out.append(f"{what} {old_code} -> {new_code} (lm-eval-sinkmask's code changed since "
                   "this cell ran)")
    return out
