"""pass@k by executing tests in the sandbox: an offline stand-in for ``evaluate``'s code_eval.

lm-eval scores one document at a time, which would run programs one after another. So the
task's last filter calls :func:`execute` on every (program, test) pair of the task at once
(in parallel, with a progress bar) and the per-document metric :func:`pass_at_k` then finds
its outcomes in a small in-process memo (it runs the program itself on a miss, so it is also
correct when called alone). Filters run only after lm-eval's ``unsafe_code`` check passed.

Reuse from another task: a filter that returns programs and calls ``execute(pairs)``, plus
``metric: !function lm_eval_sinkmask.code_eval.pass_at_k`` with ``k: [1]`` and
``doc_to_target`` giving the test code.
"""

from __future__ import annotations

import hashlib
import os
from math import comb
from typing import Sequence

from lm_eval_sinkmask.sandbox import Limits, Outcome, run_programs

TIMEOUT_ENV = "SINKMASK_CODE_TIMEOUT"  # seconds per program, default 10

_MEMO_MAX = 100_000
_memo: dict[str, Outcome] = {}


def default_limits() -> Limits:
    timeout = float(os.environ.get(TIMEOUT_ENV, Limits.timeout_s))
    return Limits(timeout_s=timeout, cpu_s=max(1, int(timeout)))


def execute(
    pairs: Sequence[tuple[str, str]], limits: Limits | None = None, progress: bool = True
) -> list[Outcome]:
    """Outcomes of ``(program, test)`` pairs, running in parallel those not yet run under
    these limits (a program that timed out at 1 s may pass at 10 s)."""
    limits = limits or default_limits()
    keys = [_key(program, test, limits) for program, test in pairs]
    todo = {key: pair for key, pair in zip(keys, pairs) if key not in _memo}
    ran = dict(zip(todo, run_programs(list(todo.values()), limits, progress=progress,
                                      desc="tests"))) if todo else {}
    outcomes = [ran[key] if key in ran else _memo[key] for key in keys]
    if len(_memo) + len(ran) > _MEMO_MAX:  # a bound on memory: forget the older outcomes
        _memo.clear()
    _memo.update(ran)
    return outcomes


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


def _key(program: str, test: str, limits: Limits) -> str:
    return hashlib.sha256(f"{limits!r}\0{len(program)}:{program}\0{test}".encode()).hexdigest()
