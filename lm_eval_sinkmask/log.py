"""The package's loggers, children of lm-eval's ``lm_eval`` logger.

lm-eval sets up that logger alone (its ``--verbosity``, its line format, no propagation to
the root): a warning of ours under it reads like lm-eval's own, and its INFO lines show at
``--verbosity INFO``. A logger outside it would print warnings bare and drop INFO lines.
"""

from __future__ import annotations

import logging

ROOT = "lm_eval.sinkmask"


def module_logger(module: str) -> logging.Logger:
    """The logger of package module ``module`` (its ``__name__``): ``lm_eval.sinkmask.<name>``."""
    return logging.getLogger(f"{ROOT}.{module.removeprefix('lm_eval_sinkmask.')}")
