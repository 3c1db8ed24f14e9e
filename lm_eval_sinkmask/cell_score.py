"""The number a cell records from lm-eval's results for one task: which metric, its value and
lm-eval's standard error of it. The sweep records the primary one; ``sinkmask table --metric``
reads another from the same results by the same rule."""

from __future__ import annotations

from typing import Any


def primary_metric(task_results: dict[str, Any]) -> str | None:
    """The Table 1 metric of one task's lm-eval results: GSM8K-like tasks report exact_match
    under the strict-match filter ("#### N"; the paper does not say which filter it read, this
    is our choice), code tasks pass@1. ``sinkmask table --metric`` reads another."""
    keys = [k for k in task_results if "," in k and "_stderr" not in k]
    for prefix in ("exact_match,strict-match", "pass@1,", "exact_match,", "acc,"):
        for k in keys:
            if k.startswith(prefix):
                return k
    return keys[0] if keys else None


def metric_score(task_results: dict[str, Any], metric: str) -> dict[str, Any]:
    """``{"metric", "value", "stderr"}`` of ``metric`` (``name,filter``): its value and the
    standard error lm-eval keys as ``name_stderr,filter``; None where lm-eval has none to give
    (``"N/A"`` for a single sample)."""
    if metric not in task_results:
        raise KeyError(f"lm-eval's results hold no metric {metric!r}; they have {sorted(task_results)}")
    name, _, filt = metric.partition(",")
    stderr = task_results.get(f"{name}_stderr,{filt}")
    return {"metric": metric, "value": task_results[metric],
            "stderr": stderr if isinstance(stderr, (int, float)) else None}


def primary_score(task_results: dict[str, Any]) -> dict[str, Any]:
    """:func:`metric_score` of the :func:`primary_metric`, as a sweep cell records it."""
    metric = primary_metric(task_results)
    if metric is None:
        raise ValueError(f"lm-eval's results hold no metric: {sorted(task_results)}")
    return metric_score(task_results, metric)
