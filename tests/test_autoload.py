"""The start-up hook: cheap for every interpreter, effective for lm-eval."""

import subprocess
import sys


def run(code, **env):
    import os

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, check=True, timeout=300).stdout.split()


def test_interpreter_start_installs_only_the_finder():
    out = run("import sys; print('lm_eval_sinkmask._autoload' in sys.modules, "
              "any(m == 'torch' or m.startswith('lm_eval.') or m == 'lm_eval' for m in sys.modules))")
    assert out == ["True", "False"]


def test_models_register_after_lm_evals_own_and_can_be_switched_off():
    code = ("import lm_eval.models; from lm_eval.api.registry import model_registry; "
            "print('hf' in model_registry, 'dlm_sinkmask' in model_registry, 'arm_sinkmask' in model_registry)")
    assert run(code) == ["True", "True", "True"]
    assert run(code, LM_EVAL_SINKMASK_AUTOLOAD="0") == ["True", "False", "False"]


def test_get_model_on_an_empty_registry_still_finds_the_builtins():
    # the trap: lm-eval imports its models only while the registry is empty
    code = ("from lm_eval.api.registry import get_model; "
            "print(get_model('dlm_sinkmask').__name__, get_model('hf').__name__)")
    assert run(code) == ["DLMSinkMaskLM", "HFLM"]


def test_a_broken_plugin_leaves_lm_eval_working_and_says_why():
    # e.g. an install that lost its task folder: lm-eval's own tasks must still load, and the
    # user must learn why ours are missing
    import os

    code = ("import sys, warnings; sys.modules['lm_eval_sinkmask.tasks'] = None\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    from lm_eval.tasks import TaskManager\n"
            "print('loaded', TaskManager.__name__)\n"
            "print(*[str(w.message) for w in caught if 'lm-eval-sinkmask' in str(w.message)], sep='\\n')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded, *said = proc.stdout.splitlines()
    assert loaded == "loaded TaskManager"
    assert len(said) == 1 and "lm_eval.tasks.manager" in said[0] and "lm_eval_sinkmask.tasks" in said[0]


def test_a_failed_step_names_what_lm_eval_runs_without():
    # each step adds one thing; its warning names that thing, not every part of the plugin: a
    # failed data check leaves our models and tasks in place, a failed task folder our models
    import types
    import warnings

    from lm_eval_sinkmask import _autoload

    def broken(module):
        raise OSError("gone")

    said = {}
    for name in _autoload.AFTER_IMPORT:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _autoload.run_callback(broken, types.ModuleType(name))
        [warning] = caught
        said[name] = str(warning.message)
    assert "without its models (dlm_sinkmask, arm_sinkmask)" in said["lm_eval.models"]
    assert "without its task folder" in said["lm_eval.tasks.manager"]
    assert "data check" in said["lm_eval.evaluator"]
    assert not any("models and tasks" in text for text in said.values())
    assert all("OSError: gone" in text for text in said.values())


def test_the_task_folder_is_appended_once_after_the_users_paths(tmp_path):
    """Every TaskManager gets our folder after the paths the user gave, and not a second time
    when the user already gave it (spelt with a trailing slash or through a symlink)."""
    import os

    from lm_eval.tasks import TaskManager

    from lm_eval_sinkmask.tasks import TASKS_DIR

    own = tmp_path / "own"
    own.mkdir()
    manager = TaskManager(include_path=str(own), include_defaults=False)
    assert manager.include_path == [str(own), str(TASKS_DIR)]  # after the user's
    link = tmp_path / "tasks_link"
    os.symlink(TASKS_DIR, link)
    for given in (str(TASKS_DIR) + "/", str(link)):
        manager = TaskManager(include_path=[given], include_defaults=False)
        assert manager.include_path == [given]  # not a second time
