"""lm-eval's filler requests under several processes, answered without running them.

When a task's requests do not split evenly over the processes, lm-eval's evaluator gives each
process as many as the busiest one has by appending copies of its last request (the same
``Instance``, ``repeats`` times per copy) and throws their answers away. Run, they would add
their forward passes to the masking counters and their Monte Carlo errors to the likelihood
record, so a two-process run would report other totals than one process on the same
documents. The copies are recognised (the last request repeated more often than its
``repeats``), left out, and answered with the last real answer, which is what they would
have computed. HFLM's rolling log-likelihood pads once more, below the requests: each process
runs as many windows as the busiest one, the extra ones copies of its first window
(:class:`PaddingWindows`).
"""

from __future__ import annotations

import functools


def filler_count(requests, world_size: int) -> int:
    """How many of ``requests`` at the end are lm-eval's filler copies (0 in one process)."""
    if world_size <= 1 or not requests:
        return 0
    last, run = requests[-1], 0
    for req in reversed(requests):
        if req is not last:
            break
        run += 1
    return max(0, run - (getattr(last, "repeats", None) or 1))


def without_filler(method):
    """Wrap a request entry point (``generate_until``, ``loglikelihood``, ...) so that it runs
    the real requests only and answers each filler copy with the last real answer."""

    @functools.wraps(method)
    def wrapped(self, requests, *args, **kwargs):
        filler = filler_count(requests, self.world_size)
        if not filler:
            return method(self, requests, *args, **kwargs)
        out = method(self, requests[:-filler], *args, **kwargs)
        return list(out) + [out[-1]] * filler

    return wrapped


class PaddingWindows:
    """HFLM's ``loglikelihood_rolling`` under several processes gives each process as many
    windows as the busiest one by appending copies of its first window (the same object) and
    throws their answers away. Fed the batches in the order HFLM runs them, this says how many
    windows of each are real: the copies come last, and no real window is that object twice."""

    def __init__(self) -> None:
        self.first = None

    def real(self, windows) -> int:
        """How many of this batch's ``windows``, from its start, are real."""
        start = 0
        if self.first is None and windows:
            self.first, start = windows[0], 1
        return len(windows) - sum(1 for w in windows[start:] if w is self.first)
