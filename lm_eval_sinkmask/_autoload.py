"""Make ``lm_eval --model dlm_sinkmask`` and ``--tasks gsm8k_sinkmask`` work on the stock CLI.

lm-eval 0.4.13 has no plugin discovery for models or tasks, and ``get_model`` imports
``lm_eval.models`` only while the model registry is empty, so registering our models early
would hide every built-in one. Instead, ``lm_eval_sinkmask.pth`` (installed into
site-packages) imports this module at interpreter start; it only puts a finder on
``sys.meta_path`` (no torch, no lm_eval: a few hundred microseconds) that waits for lm-eval's
own modules and then, right after each has run:

- ``lm_eval.models``: registers our two models as lazy placeholders, next to the built-ins;
- ``lm_eval.tasks.manager``: appends our task folder to every ``TaskManager``'s include path
  (lm-eval's own tasks stay first and untouched);
- ``lm_eval.evaluator``: ``simple_evaluate`` checks our tasks' data (GSM8K's local copy),
  and for tasks that run generated code the ``--confirm_run_unsafe_code`` flag and
  ``SINKMASK_CODE_TIMEOUT``, before it builds the model, and warns when a task made for a
  chat template runs without ``--apply_chat_template``.

A step that fails warns and leaves lm-eval as it was (``run_callback``). Set
``LM_EVAL_SINKMASK_AUTOLOAD=0`` to turn it off.
"""

import os
import sys

MODELS = {
    "dlm_sinkmask": "lm_eval_sinkmask.dlm_model:DLMSinkMaskLM",
    "arm_sinkmask": "lm_eval_sinkmask.arm_model:ARMSinkMaskLM",
}


def register_models(_module=None) -> None:
    from lm_eval.api.registry import model_registry

    for name, target in MODELS.items():
        if name not in model_registry:
            model_registry.register(name, target=target)


def add_task_folder(module) -> None:
    from lm_eval_sinkmask.tasks import TASKS_DIR

    manager = module.TaskManager
    original_init = manager.__init__

    def __init__(self, *args, include_path=None, **kwargs):
        paths = [] if include_path is None else (
            list(include_path) if isinstance(include_path, (list, tuple)) else [include_path]
        )
        if not any(os.path.realpath(str(p)) == str(TASKS_DIR) for p in paths):
            paths.append(str(TASKS_DIR))
        original_init(self, *args, include_path=paths, **kwargs)

    __init__.__wrapped__ = original_init
    manager.__init__ = __init__


def check_task_data_first(module) -> None:
    """``simple_evaluate`` (the CLI's and the sweep's entry) checks our tasks' data before it
    loads the model: a missing GSM8K copy fails in a second, not after an 8B load."""
    import functools
    import inspect

    original = module.simple_evaluate
    signature = inspect.signature(original)

    @functools.wraps(original)
    def simple_evaluate(*args, **kwargs):
        from lm_eval_sinkmask.tasks import check_data, requested_task_configs

        given = signature.bind_partial(*args, **kwargs).arguments
        configs = requested_task_configs(given.get("tasks"))
        check_data(given.get("tasks"), configs, given.get("metadata"))
        check_code_tasks(given, configs)
        return original(*args, **kwargs)

    module.simple_evaluate = simple_evaluate


def check_code_tasks(given: dict, configs: dict) -> None:
    """Before the model loads: a requested task of our folder (``configs``, from
    ``tasks.requested_task_configs``) with ``unsafe_code`` needs the confirmation and a valid
    ``SINKMASK_CODE_TIMEOUT`` (lm-eval and our scorer would only find out after generating),
    and a task made for a chat template warns without one."""
    unsafe = sorted(name for name, config in configs.items() if config.get("unsafe_code"))
    if unsafe and not given.get("confirm_run_unsafe_code"):
        raise ValueError(
            f"Attempted to run task(s) {', '.join(unsafe)} which are marked as unsafe (they "
            "execute model-generated code). Set confirm_run_unsafe_code=True (lm_eval CLI: "
            "--confirm_run_unsafe_code) to run them.")
    if unsafe:
        from lm_eval_sinkmask.code_eval import TIMEOUT_ENV
        from lm_eval_sinkmask.sandbox import Limits, positive_seconds

        positive_seconds(TIMEOUT_ENV, os.environ.get(TIMEOUT_ENV), Limits.timeout_s)
    chat = sorted(name for name, config in configs.items()
                  if (config.get("metadata") or {}).get("needs_chat_template"))
    if chat and not given.get("apply_chat_template"):
        import warnings

        warnings.warn(
            f"{', '.join(chat)} asks the model for an answer in a chat turn; without "
            "--apply_chat_template (apply_chat_template=True) the model continues raw text "
            "and the score is not comparable. Add the flag, or use humaneval_sinkmask.",
            RuntimeWarning, stacklevel=3)


AFTER_IMPORT = {"lm_eval.models": register_models, "lm_eval.tasks.manager": add_task_folder,
                "lm_eval.evaluator": check_task_data_first}
# what lm-eval goes on without when the step after that module fails (the others still apply)
WITHOUT = {"lm_eval.models": "its models (" + ", ".join(MODELS) + ")",
           "lm_eval.tasks.manager": "its task folder (its tasks then need --include_path)",
           "lm_eval.evaluator": "its data check, unsafe-code check and chat-template warning "
                                  "before the model loads"}


def run_callback(callback, module) -> None:
    """Our part after lm-eval's module ran. A broken install of ours (say, its task folder
    lost) must not take lm-eval down with it: lm-eval carries on without what that step adds
    (:data:`WITHOUT`), and a warning says which and why."""
    try:
        callback(module)
    except Exception as error:
        import warnings  # here, not at the top: not every interpreter start loads it

        warnings.warn(
            f"lm-eval-sinkmask could not hook into {module.__name__} ({type(error).__name__}: "
            f"{error}); lm-eval runs without {WITHOUT.get(module.__name__, 'that step')}. "
            "Reinstall lm-eval-sinkmask, or set LM_EVAL_SINKMASK_AUTOLOAD=0 to silence this.",
            RuntimeWarning, stacklevel=2)


class _RunAfter:
    """Loader wrapper: executes the real module, then our callback on it."""

    def __init__(self, loader, callback):
        self.loader, self.callback = loader, callback

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        run_callback(self.callback, module)

    def __getattr__(self, name):  # get_code, get_source, is_package, ... for tools that ask
        return getattr(self.loader, name)


class _Finder:
    """Meta-path finder that only ever answers for the modules in AFTER_IMPORT."""

    def find_spec(self, name, path=None, target=None):
        callback = AFTER_IMPORT.get(name)
        if callback is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _RunAfter(spec.loader, callback)
                return spec
        return None


def install() -> None:
    if os.environ.get("LM_EVAL_SINKMASK_AUTOLOAD", "1") == "0":
        return
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
    # lm-eval may already be imported (e.g. this module imported by hand after it)
    for name, callback in AFTER_IMPORT.items():
        if name in sys.modules:
            run_callback(callback, sys.modules[name])


install()
