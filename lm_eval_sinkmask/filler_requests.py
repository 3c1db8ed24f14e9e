"""lm-eval's filler requests under several processes, answered without running them.

When a task's requests do not split evenly over the processes, lm-eval's evaluator gives each
process as many as the busiest one has by appending copies of its last request (the same
``Instance``, ``repeats`` times per copy) and throws their answers away. Run, they would add
their forward passes to the masking counters and their Monte Carlo errors to the likelihood
record, so a two-process run would report other totals than one process on the same
documents. The copies are recognised (the last request repeated more often than its
``repeats``), left out, and answered with the last real answer, which is what they would
have computed.
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
