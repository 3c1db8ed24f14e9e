"""The padding-mask candidate (benchmarks/key_row_mask.py), run by Triton's interpreter on the
CPU against the package's kernels.

The candidate reads the same mask entries as the package, only fewer times, so it must give
the same column mass to the bit: on every mask form of the fused-mass unit cases and three
more row-free ones (those take the new one-row load, the rest the package's tile load), in
float32 MHA and bfloat16 GQA, and through the intercept on the tiny padded LLaDA (a row-free
bias) and Dream (a mask per row), where every call's scores, sinks and choices must be the
package's. The cases run in one child
process (this file as a script, under ``TRITON_INTERPRET=1``), as in test_fused_mass_triton.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.interpreted import compared_with_the_package, interpreted_results, print_results
from tests.test_fused_mass_triton import UNIT_CASES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import key_row_mask  # noqa: E402

MODEL_CASES = ["llada", "dream"]
# mask forms whose entries do not depend on the query row (stride 0 along the rows)
ROW_FREE = {"float_key_bias", "bool_key", "float_key_per_head", "causal_and_bool_key"}
CASES = UNIT_CASES + sorted(ROW_FREE - set(UNIT_CASES))


def test_the_edits_apply_to_the_packages_kernels():
    text = key_row_mask.edited_source()
    assert text.count("MASK_ROWS: tl.constexpr") == 3 and "if MASK_ROWS:" in text


def test_adopting_the_edit_leaves_the_code_of_unmasked_runs_as_it_is(package_copy):
    """The kernels are masking-only code: moving the edit into the package would keep every
    unmasked cell (the zoo report's accuracy cells) current, and only masked ones stale."""
    from lm_eval_sinkmask import provenance

    (package_copy / "_mass_kernels.py").write_text(key_row_mask.edited_source())
    assert provenance.unmasked_code_digest(package_copy) == provenance.installed_unmasked_code_digest()
    assert provenance.package_code_digest(package_copy) != provenance.installed_code_digest()


def test_an_edit_that_no_longer_applies_raises(monkeypatch):
    monkeypatch.setattr(key_row_mask, "EDITS", key_row_mask.EDITS + (("no such text", "", 1),))
    with pytest.raises(RuntimeError, match="needs remaking"):
        key_row_mask.edited_source()


if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed, so the padding-mask candidate was NOT checked "
                "(pip install -e '.[test]' installs it on Linux x86-64)", allow_module_level=True)


@pytest.fixture(scope="module")
def interpreted():
    return interpreted_results(__file__, ROOT / "benchmarks")


@pytest.mark.parametrize("variant", ["mha_fp32", "gqa_bf16"])
@pytest.mark.parametrize("case", CASES)
def test_same_mass_to_the_bit_on_every_mask_form(interpreted, case, variant):
    r = interpreted[f"{case}/{variant}"]
    assert r["same"], r
    assert r["launches"] == 2  # both detection kernels ran edited
    assert r["one_row_load"] == (case in ROW_FREE), r


@pytest.mark.parametrize("variant", ["mha_fp32", "gqa_bf16"])
def test_a_decoding_steps_one_row_mask_is_read_as_one_row(interpreted, variant):
    r = interpreted[f"one_row/{variant}"]
    assert r["same"] and r["launches"] == 2 and r["one_row_load"], r


@pytest.mark.parametrize("case", MODEL_CASES)
def test_the_intercept_decides_what_the_package_decides(interpreted, case):
    r = interpreted[case]
    assert r["kernel_calls"] == r["calls"] > 0 and r["blocked"] > 0, r
    assert r["same_sinks"] and r["same_chosen"] and r["same_blocked"] and r["same_stats"], r
    assert r["scores_max_diff"] == 0.0 and r["output_max_diff"] == 0.0 and r["same_tokens"], r
    # LLaDA's padding bias is row-free; Dream's padded mask also hides the pad rows, per row
    assert (r["one_row_launches"] > 0) == (case == "llada"), r


def test_under_the_call_path_too(interpreted):
    """As gpu_hours --candidates stacks them: the call path's detection on the edited kernels,
    against the package on the CPU (its own selection, so scores to float32 rounding)."""
    r = interpreted["llada_call_path"]
    assert r["kernel_calls"] == r["calls"] > 0 and r["one_row_launches"] > 0, r
    assert r["same_sinks"] and r["same_chosen"] and r["same_blocked"] and r["same_stats"], r
    assert r["scores_max_diff"] <= 1e-5 and r["same_tokens"], r


# -- the child process ------------------------------------------------------------------------


def _unit_results():
    import torch

    from tests.test_fused_mass import _unit_cases

    B, H, Sq, Sk, D = 2, 2, 20, 40, 24
    cases = _unit_cases(B, H, Sq, Sk)
    g = torch.Generator().manual_seed(2)
    keys = torch.rand(B, 1, 1, Sk, generator=g) > 0.3
    cases.update({  # row-free masks beyond the float key bias: bool, with a head axis, causal
        "bool_key": {"mask": keys},
        "float_key_per_head": {"mask": torch.randn(B, H, 1, Sk, generator=g)},
        "causal_and_bool_key": {"is_causal": True, "causal_offset": Sk - Sq, "mask": keys}})
    for variant, (gqa, dtype) in {"mha_fp32": (1, torch.float32),
                                  "gqa_bf16": (2, torch.bfloat16)}.items():
        g = torch.Generator().manual_seed(1)
        q = torch.randn(B, H, Sq, D, generator=g).to(dtype)
        k = torch.randn(B, H // gqa, Sk, D, generator=g).to(dtype)
        w = (torch.rand(B, Sq, generator=g) > 0.2).float()
        for name in CASES:
            kw = dict(cases[name], scale=D ** -0.5, block_m=16, block_n=16)
            yield same_mass(f"{name}/{variant}", q, k, w, kw)
        # a decoding step: one query row, whose mask is one row whatever its strides
        last = {"mask": cases["float_per_row_with_dead_row"]["mask"][:, :, -1:], "scale": 0.2,
                "is_causal": True, "causal_offset": Sk - 1}
        yield same_mass(f"one_row/{variant}", q[:, :, -1:], k, w[:, -1:], last)


def same_mass(case, q, k, w, kw):
    import torch

    from lm_eval_sinkmask import fused_mass

    package = fused_mass.column_mass(q, k, w, use_triton=True, **kw)
    key_row_mask.LAUNCHES.clear()
    with key_row_mask.installed():
        got = fused_mass.column_mass(q, k, w, use_triton=True, **kw)
    launches = dict(key_row_mask.LAUNCHES)
    return {"case": case, "same": bool(torch.equal(package, got)),
            "launches": sum(launches.values()),
            "one_row_load": any(has and not rows for (_, has, rows) in launches)}


def _model_results():
    from tests.interpreted import tiny_dlm_passes

    for kind in MODEL_CASES:
        model, run = tiny_dlm_passes(kind, padded=True)
        key_row_mask.LAUNCHES.clear()
        r = compared_with_the_package(kind, key_row_mask.installed, "fused", model, "all",
                                      "previous", run, top_k=2, eps=0.0, tol=0.0,
                                      takes=lambda query: True, backend="fused")
        r["one_row_launches"] = one_row_launches()
        yield r
    yield _under_the_call_path()


def _under_the_call_path():
    from contextlib import ExitStack, contextmanager

    import select_kernel
    from tests.interpreted import tiny_dlm_passes

    @contextmanager
    def both():
        with ExitStack() as stack:
            stack.enter_context(key_row_mask.installed())
            stack.enter_context(select_kernel.call_path_installed())
            yield

    model, run = tiny_dlm_passes("llada", padded=True)
    key_row_mask.LAUNCHES.clear()
    r = compared_with_the_package("llada_call_path", both, select_kernel.CALL_NAME, model, "all",
                                  "previous", run, top_k=2, eps=0.0, tol=1e-4,
                                  takes=lambda query: True)
    r["one_row_launches"] = one_row_launches()
    return r


def one_row_launches() -> int:
    return sum(n for (_, has, rows), n in key_row_mask.LAUNCHES.items() if has and not rows)


if __name__ == "__main__":
    print_results(_unit_results(), _model_results())
