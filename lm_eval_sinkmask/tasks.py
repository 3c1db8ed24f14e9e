"""Where our lm-eval task folder is: ``TASKS_DIR``.

The task YAMLs and their code live in the repository's top-level ``tasks/`` folder, which
lm-eval reads like any ``--include_path`` (each YAML names its code as ``!function
gsm8k.load_gsm8k``, a file next to it). One folder, three ways to reach it:

- a source checkout or ``pip install -e .``: the package is imported from the checkout, and
  ``tasks/`` sits next to it;
- ``pip install .``: the wheel carries a copy of ``tasks/`` inside the package, as ``_tasks/``
  (``[tool.hatch.build.targets.wheel.force-include]`` in pyproject.toml);
- ``lm_eval --include_path tasks`` from the checkout: lm-eval reads the folder directly.

The start-up hook (``_autoload``) adds ``TASKS_DIR`` to every ``TaskManager``; without it, pass
``--include_path`` with this path. Nothing heavy is imported here.
"""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CANDIDATES = (_PACKAGE / "_tasks", _PACKAGE.parent / "tasks")  # installed wheel; checkout


def find_tasks_dir() -> Path:
    for folder in _CANDIDATES:
        if (folder / "gsm8k_sinkmask.yaml").is_file():
            return folder
    raise FileNotFoundError(
        "lm-eval-sinkmask's task folder is missing: looked for gsm8k_sinkmask.yaml in "
        + " and ".join(str(c) for c in _CANDIDATES)
        + ". Reinstall the package (pip install .) or run from a full checkout."
    )


TASKS_DIR: Path = find_tasks_dir()


def task_module(name: str):
    """A code file of the task folder (``gsm8k``, ``humaneval``) as a module, the way lm-eval's
    ``!function`` loads it (a file next to the YAMLs, not a package module)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"sinkmask_task_{name}", TASKS_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def max_gen_toks(task: str) -> int:
    """The generation budget (``generation_kwargs.max_gen_toks``) that a task YAML of the folder
    sets itself: the one number the zoo's training region, traces and experiments must agree
    with, so they read it here rather than repeat it."""
    paths = sorted(TASKS_DIR.rglob(f"{task}.yaml"))
    if not paths:
        raise KeyError(f"no task YAML named {task}.yaml under {TASKS_DIR}")
    config = _read_yaml(paths[0])
    try:
        return int(config["generation_kwargs"]["max_gen_toks"])
    except (KeyError, TypeError):
        raise KeyError(f"{paths[0]} sets no generation_kwargs.max_gen_toks of its own") from None


def _read_yaml(path: Path) -> dict:
    """A task YAML of the folder as a dict; lm-eval's ``!function`` tags load as plain strings."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("!", lambda loader, tag, node: loader.construct_scalar(node))
    return yaml.load(path.read_text(), Loader=_Loader)


def requested_task_configs(tasks) -> dict:
    """Name -> YAML config (``include:`` resolved) of every task of the folder that ``tasks``
    (the --tasks list) names directly or through a tag; other tasks are lm-eval's to check."""
    requested = {t for t in tasks or () if isinstance(t, str)}
    if not requested:
        return {}
    found = {}
    for path in sorted(TASKS_DIR.rglob("*.yaml")):
        config = _read_yaml(path)
        while "include" in config:
            base = _read_yaml(path.parent / config.pop("include"))
            config = {**base, **config}
        name = config.get("task", path.stem)
        tags = config.get("tag") or ()
        if name in requested or requested & ({tags} if isinstance(tags, str) else set(tags)):
            found[name] = config
    return found


def check_data(tasks, configs: dict, metadata: dict | None = None) -> None:
    """Fail before any model loads when a requested GSM8K task, or a tag that holds one, has no
    data to read (see ``gsm8k.check_available``); a no-op for every other task. ``configs`` is
    ``requested_task_configs(tasks)``. A name in ``tasks`` that only starts like ours (a task
    lm-eval has not found yet) is checked too."""
    names = {t for t in tasks or () if isinstance(t, str)} | set(configs)
    if any(name.startswith("gsm8k_sinkmask") for name in names):
        task_module("gsm8k").check_available((metadata or {}).get("gsm8k_dir"))


__all__ = ["TASKS_DIR", "find_tasks_dir", "task_module", "max_gen_toks", "requested_task_configs",
           "check_data"]
