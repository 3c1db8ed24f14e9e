"""The package's loggers, children of lm-eval's ``lm_eval`` logger.

lm-eval sets up that logger alone (its ``--verbosity``, its line format, no propagation to
the root): a warning of ours under it reads like lm-eval's own, and its INFO lines show at
``--verbosity INFO``. A logger outside it would print warnings bare and drop INFO lines.

Under several processes (``accelerate launch``) every rank reads the same model_args and the
same tasks, so each warning about them would print once per process: below ERROR, only rank
0's records are kept.
"""

from __future__ import annotations

import logging
import os

ROOT = "lm_eval.sinkmask"


def process_rank() -> int:
    """This process's rank under ``accelerate launch`` or ``torchrun`` (0 when run alone)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """How many processes ``accelerate launch`` / torchrun started (1 when run alone)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


class _FirstRankOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or process_rank() == 0


_FIRST_RANK_ONLY = _FirstRankOnly()


def module_logger(module: str) -> logging.Logger:
    """The logger of package module ``module`` (its ``__name__``): ``lm_eval.sinkmask.<name>``."""
    logger = logging.getLogger(f"{ROOT}.{module.removeprefix('lm_eval_sinkmask.')}")
    logger.addFilter(_FIRST_RANK_ONLY)  # a second call adds nothing
    return logger
