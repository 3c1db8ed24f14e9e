"""The log-sum-exp reuse candidate (benchmarks/lse_reuse.py), run by Triton's interpreter on
the CPU against the package's intercept.

As in test_select_kernel, the cases run in one child process (this file as a script, under
``TRITON_INTERPRET=1``) that prints one JSON line per case. Each case runs the same passes
twice, through the package's intercept as the CPU runs it and with the candidate installed,
and compares every attention call (scores, sinks, chosen and blocked keys), the stats and the
final outputs. The candidate takes every call after the first pass (the first masks its own
choice, which only detection knows). Model cases: the tiny LLaDA (float bias, left padding;
per-layer granularity; bfloat16) and the tiny Dream (its K repeated to the query's heads
before SDPA, unpadded: its padded mask depends on the row). Synthetic cases: DLM-shaped calls
(as many query rows as keys, two query tiles) with a bool mask, a float bias with finite
values, no mask, and an element whose every visible key is blocked (it keeps its scores, so
nothing is added back). Scope cases, left to the package: a GQA call (``enable_gqa``, which
the memory-efficient kernel does not take), detect=current, and a process that turned SDPA's
kernel off (as LLaDA-8B's code turns off the memory-efficient one; on the CPU, flash).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.interpreted import compared_with_the_package, interpreted_results, print_results

ROOT = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed, so the log-sum-exp reuse was NOT checked "
                "(pip install -e '.[test]' installs it on Linux x86-64)", allow_module_level=True)

PASSES = 3
MODEL_CASES = ["llada", "llada_per_layer", "llada_bf16", "dream"]
SYNTHETIC_CASES = ["bool_mask", "float_bias", "no_mask", "all_visible_blocked"]
SCOPE_CASES = ["gqa", "llada_current", "llada_kernel_off"]


@pytest.fixture(scope="module")
def interpreted():
    return interpreted_results(__file__, ROOT / "benchmarks")


@pytest.mark.parametrize("case", MODEL_CASES + SYNTHETIC_CASES)
def test_the_candidate_decides_what_the_package_decides(interpreted, case):
    r = interpreted[case]
    # every call after the first pass, whose calls mask their own choice
    assert r["kernel_calls"] == r["calls"] * (PASSES - 1) // PASSES > 0, r
    assert r["same_sinks"] and r["same_stats"] and r["first_layer_same_chosen"], r
    # relative to max(|score|, 1); the first layer's calls see the same inputs both ways
    assert r["first_layer_scores_max_diff"] <= 1e-5, r
    if case.endswith("bf16"):  # later layers' inputs differ by the rounding of the earlier
        assert r["scores_max_diff"] <= 1e-3, r  # outputs, enough to flip a bf16 near-tie
    else:
        assert r["same_chosen"] and r["same_blocked"] and r["scores_max_diff"] <= 1e-5, r
    assert r["output_max_diff"] <= r["output_tol"] and r["same_tokens"], r
    assert r["blocked"] > 0, r  # the case masked something


def test_an_element_whose_every_visible_key_is_blocked_keeps_its_scores(interpreted):
    r = interpreted["all_visible_blocked"]
    assert r["kept_elements"] > 0, r  # the case has such an element, and it matched above


@pytest.mark.parametrize("case", SCOPE_CASES)
def test_calls_out_of_scope_stay_with_the_package(interpreted, case):
    r = interpreted[case]
    assert r["kernel_calls"] == 0 < r["calls"] and r["output_max_diff"] == 0.0, r
    assert r["same_chosen"] and r["same_blocked"], r


def test_the_row_lse_patch_is_undone_after_each_call():
    """Each call patches fused_mass's kernels by hand (not with mock.patch): left in place,
    the fused path's later calls in the process (bench_masking's other variants, timed after
    c_lse) would launch the fix with a stale log-sum-exp instead of the row pass."""
    import torch

    from lm_eval_sinkmask import fused_mass

    import lse_reuse

    package = fused_mass._kernels
    with lse_reuse._row_lse_from(torch.zeros(1, 2, 3), torch.zeros(1, 2, 16, dtype=torch.int32)):
        assert isinstance(fused_mass._kernels().row_lse_kernel, lse_reuse._FixLaunch)
    assert fused_mass._kernels is package


# -- the child process ------------------------------------------------------------------------


def _model_case(name: str):
    """(model, detect, run: () -> final logits) of PASSES passes of a tiny DLM over a batch
    of three (LLaDA's left-padded), with SDPA's kernel turned off for ``..._kernel_off``."""
    import torch

    from tests.interpreted import tiny_dlm_passes

    kind = name.split("_")[0]
    model, passes = tiny_dlm_passes(kind, bf16=name.endswith("bf16"), padded=kind == "llada",
                                    passes=PASSES)

    def run():
        torch.backends.cuda.enable_flash_sdp(not name.endswith("kernel_off"))
        try:
            return passes()
        finally:
            torch.backends.cuda.enable_flash_sdp(True)

    return model, "current" if name.endswith("current") else "previous", run


def _synthetic_case(name: str):
    from tests.interpreted import synthetic_passes

    model, run, att = synthetic_passes(name, passes=PASSES)
    return model, "previous", run, att


def _elements_keeping_their_scores(model, run, seen) -> int:
    """Calls after the first pass in which element 2 has every key it sees blocked in every
    head, under the package (top_k 5, eps -10: every key a sink)."""
    from tests.interpreted import _intercepted

    cfg = dict(top_k=5, eps=-10.0, detect="previous", granularity="head")
    events = _intercepted(model, "all", cfg, run, None, lambda query: True)[0]
    return sum(bool((e.blocked[2] | ~seen).all()) for e in events if e.forward_pass > 1)


def _results():
    import lse_reuse

    for name in MODEL_CASES + SYNTHETIC_CASES + SCOPE_CASES:
        if name in SYNTHETIC_CASES or name == "gqa":
            model, detect, run, att = _synthetic_case(name)
            top_k, tol = (5, 1e-5)
        else:
            model, detect, run = _model_case(name)
            top_k, tol = 2, (3e-2 if name.endswith("bf16") else 1e-4)
        # eps < 0 admits keys below the others' mean: every key a sink, so element 2 of
        # all_visible_blocked has each key it sees blocked, and keeps its scores
        eps = -10.0 if name == "all_visible_blocked" else 0.0
        result = compared_with_the_package(
            name, lse_reuse.installed, lse_reuse.NAME, model, "all", detect, run, top_k=top_k,
            eps=eps, tol=tol, takes=lambda query: True,
            granularity="layer" if name.endswith("per_layer") else "head")
        if name == "all_visible_blocked":
            result["kept_elements"] = _elements_keeping_their_scores(model, run,
                                                                     att.mask[2, 0, 0])
        yield result


if __name__ == "__main__":
    print_results(_results())
