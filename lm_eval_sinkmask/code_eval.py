"""pass@k by executing tests in the sandbox: an offline stand-in for ``evaluate``'s code_eval.

lm-eval scores one document at a time, which would run programs one after another. So the
task's last filter calls :func:`execute` on every (program, test) pair of the task at once
(in parallel, with a progress bar) and the per-document metric :func:`pass_at_k` then finds
its outcomes in a small in-process memo (it runs the program itself on a miss, so it is also
correct when called alone). Filters run only after lm-eval's ``unsafe_code`` check passed.
The filter then calls :func:`warn_if_mostly_infrastructure`: outcomes' status and detail do
not reach lm-eval's results, so a run failing on timeouts or missing modules says so there.

Reuse from another task: a filter that returns programs and calls ``execute(pairs)``, plus
``metric: !function lm_eval_sinkmask.code_eval.pass_at_k`` with ``k: [1]`` and
``doc_to_target`` giving the test code.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections import Counter
from math import comb
from typing import Sequence

from lm_eval_sinkmask.sandbox import Limits, Outcome, run_programs

TIMEOUT_ENV = "SINKMASK_CODE_TIMEOUT"  # seconds per program, default Limits.timeout_s (10)

_MEMO_MAX = 100_000
_memo: dict[str, Outcome] = {}

# Above this share of failures not caused by the answer's own logic, a warning says so.
INFRASTRUCTURE_SHARE_TO_WARN = 0.5
_INFRASTRUCTURE_MARKS = (
    "ModuleNotFoundError", "ImportError", "'NoneType' object is not callable",
    "sandbox",
)

logger = logging.getLogger(__name__)


def timeout_from_env() -> float:
    """Seconds per program from ``SINKMASK_CODE_TIMEOUT``: refused unless a positive finite
    number, since '0' would time every program out and score 0 without an error."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return Limits.timeout_s
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(
            f"{TIMEOUT_ENV}={raw!r} is not a positive number of seconds; set it like "
            f"{TIMEOUT_ENV}=3 (the reference protocol) or unset it for the default "
            f"{Limits.timeout_s:g}"
        )
    return seconds


def default_limits() -> Limits:
    timeout = timeout_from_env()
    return Limits(timeout_s=timeout, cpu_s=max(1, math.ceil(timeout)))


def execute(
    pairs: Sequence[tuple[str, str]], limits: Limits | None = None, progress: bool = True
) -> list[Outcome]:
    """Outcomes of ``(program, test)`` pairs, running in parallel those not yet run."""
    limits = limits or default_limits()
    keys = [_key(program, test) for program, test in pairs]
    found = {key: _memo[key] for key in keys if key in _memo}
    todo = {key: pair for key, pair in zip(keys, pairs) if key not in found}
    if todo:
        outcomes = run_programs(list(todo.values()), limits, progress=progress, desc="tests")
        found.update(zip(todo.keys(), outcomes))
        if len(_memo) + len(todo) > _MEMO_MAX:
            _memo.clear()
        _memo.update(zip(todo.keys(), outcomes))
    return [found[key] for key in keys]


def is_infrastructure_failure(outcome: Outcome) -> bool:
    """A failure the answer's logic likely did not cause: a timeout, a missing module, a
    function the seatbelt removed, a sandbox error."""
    if outcome.passed:
        return False
    return outcome.status == "timeout" or any(m in outcome.detail for m in _INFRASTRUCTURE_MARKS)


def warn_if_mostly_infrastructure(outcomes: Sequence[Outcome]) -> str | None:
    """Log (and return) a warning when most failures look like the machine's, not the model's:
    the score then measures the sandbox (timeout too short, a module missing), not the code."""
    failures = [o for o in outcomes if not o.passed]
    infrastructure = [o for o in failures if is_infrastructure_failure(o)]
    if not failures or len(infrastructure) / len(failures) < INFRASTRUCTURE_SHARE_TO_WARN:
        return None
    (commonest, count), = Counter(o.detail for o in infrastructure).most_common(1)
    message = (
        f"{len(infrastructure)} of {len(failures)} failed programs "
        f"({len(infrastructure) / len(failures):.0%}) failed for reasons outside their logic "
        f"(timeouts, missing modules, removed functions, sandbox errors); commonest: "
        f"{commonest!r} ({count}x). The score may measure the machine, not the model: check "
        f"{TIMEOUT_ENV} and the Python environment the sandbox runs."
    )
    logger.warning(message)
    return message


def pass_at_k(
    references: list[str], predictions: list[list[str]], k: int | Sequence[int] = (1,)
) -> dict[str, float]:
    """lm-eval metric: ``references=[test]``, ``predictions=[[program, ...]]`` for one doc.

    With n programs of which c pass, pass@k is the unbiased estimator of Chen et al. (2021);
    for greedy decoding (n = 1) pass@1 is simply pass or fail.
    """
    ks = [k] if isinstance(k, int) else list(k)
    (test,) = references
    (programs,) = predictions
    if isinstance(programs, str):
        programs = [programs]
    outcomes = execute([(p, test) for p in programs], progress=False)
    n, c = len(outcomes), sum(o.passed for o in outcomes)
    return {f"pass@{kk}": estimate_pass_at_k(n, c, kk) for kk in ks if kk <= n}


def estimate_pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k): the chance that one of k draws from n samples passes."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def _key(program: str, test: str) -> str:
    return hashlib.sha256(f"{len(program)}:{program}\0{test}".encode()).hexdigest()
