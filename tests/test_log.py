"""Every logger of the package sits under lm-eval's ``lm_eval`` logger, so that lm-eval's
--verbosity and line format apply to our warnings (a logger outside it prints them bare and
drops INFO lines)."""

import importlib
import logging
import pkgutil

import lm_eval_sinkmask
from lm_eval_sinkmask.log import ROOT, module_logger


def test_every_module_logger_is_under_lm_evals_logger():
    found = {}
    for info in pkgutil.walk_packages(lm_eval_sinkmask.__path__, "lm_eval_sinkmask."):
        if info.name.endswith("__main__"):
            continue
        logger = getattr(importlib.import_module(info.name), "logger", None)
        if isinstance(logger, logging.Logger):
            found[info.name] = logger.name
    assert len(found) >= 7, found  # config, intercept, fused_mass, masking_lm, sandbox, ...
    assert {name: logged for name, logged in found.items()
            if not logged.startswith(ROOT + ".")} == {}


def test_a_module_logger_is_named_after_its_module():
    assert module_logger("lm_eval_sinkmask.zoo.train").name == "lm_eval.sinkmask.zoo.train"
    logging.getLogger("lm_eval")  # lm-eval's, made once lm_eval is imported
    chain, logger = [], module_logger("lm_eval_sinkmask.intercept")
    while logger is not None:
        chain.append(logger.name)
        logger = logger.parent
    assert "lm_eval" in chain


def test_below_error_only_the_first_process_logs(monkeypatch, caplog):
    """Under accelerate launch every rank read the same model_args, and the top_k=0 warning
    (like every other about settings or tasks) printed once per process."""
    from lm_eval_sinkmask.config import SinkMaskConfig

    caplog.set_level(logging.INFO, logger=ROOT)
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        SinkMaskConfig.pop_from({"top_k": 0, "eps": 2})
        module_logger("lm_eval_sinkmask.sweep").error("rank %s error", rank)
    warned = [r for r in caplog.records if "masking is off" in r.getMessage()]
    assert len(warned) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        "rank 0 error", "rank 1 error"]
