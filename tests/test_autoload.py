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
