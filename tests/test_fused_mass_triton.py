"""The Triton kernels of fused_mass, run by Triton's interpreter on the CPU.

``TRITON_INTERPRET=1`` must be set before Triton compiles anything, so the checks run in one
child process (this file as a script) that prints one JSON line per case; the tests below read
them. The child compares the kernels with the torch implementation of the same algorithm
(``blocked_column_mass``) on every mask form, checks that a mask the same for every query row
(read as one row of keys per tile) gives the tile load's mass to the bit, and runs tiny models
through the intercept with the kernels against the materialised path. Small shapes: the interpreter steps every program
in numpy, a few seconds in all.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.interpreted import interpreted_results, print_results

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed, so the fused-mass kernels were NOT checked "
                "(pip install -e '.[test]' installs it on Linux x86-64)", allow_module_level=True)

UNIT_CASES = ["none", "float_key_bias", "float_per_row_with_dead_row", "float_1_1_S_S_bf16",
              "bool_per_row", "bool_per_head", "causal_top_left", "causal_offset",
              "causal_and_bool", "bool_key", "float_key_per_head", "causal_and_bool_key"]
# the mask forms whose entries do not depend on the query row (stride 0 along the rows): the
# kernels load them as one row of keys per tile
ROW_FREE = {"float_key_bias", "bool_key", "float_key_per_head", "causal_and_bool_key"}
MODEL_CASES = ["llada", "dream", "llama_all_rows_kv_cache", "llama_last_row_kv_cache"]


@pytest.fixture(scope="module")
def interpreted():
    return interpreted_results(__file__)


# every mask form in float32 MHA; GQA with bf16 inputs and the one-row (last_row) launch on
# the forms that differ most (the interpreter takes ~0.5 s per case)
VARIANTS = {"mha_fp32": UNIT_CASES,
            "gqa_bf16": ["none", "float_per_row_with_dead_row", "causal_and_bool",
                         "float_key_bias", "causal_and_bool_key"],
            "gqa_fp32_last_row": ["float_key_bias", "bool_per_head", "causal_offset"],
            "one_row_decoding": ["float_per_row_with_dead_row", "bool_per_head"],
            # rows from 1 on: a query tile's last row (16) sees the first key of a key tile, so
            # a causal key bound one key short would skip that tile
            "mha_fp32_from_row_1": ["causal_top_left", "causal_and_bool"]}


@pytest.mark.parametrize("case", [f"{c}/{v}" for v, cases in VARIANTS.items() for c in cases])
def test_kernels_match_the_torch_blocked_algorithm(interpreted, case):
    r = interpreted[case]
    assert r["kernels"] is True, "the child did not run the Triton kernels"
    assert r["max_abs"] <= 1e-5 * max(1.0, r["max_ref"]), r
    assert r["check_passed"], r


@pytest.mark.parametrize("case", [f"{c}/{v}" for v, cases in VARIANTS.items() for c in cases
                                  if c not in ("none", "causal_top_left", "causal_offset")])
def test_a_row_free_mask_is_read_as_one_row_with_the_tile_loads_mass(interpreted, case):
    """Row-free masks, and any mask of a one-row call (a decoding step), take the one-row
    load; it reads the values the tile load reads, so the mass is equal to the bit."""
    r = interpreted[case]
    name, variant = case.split("/")
    assert r["one_row_load"] == (name in ROW_FREE or variant == "one_row_decoding"), r
    assert r["same_as_tile_load"], r


@pytest.mark.parametrize("case", MODEL_CASES)
def test_intercept_with_the_kernels_masks_what_the_materialised_path_masks(interpreted, case):
    r = interpreted[case]
    assert r["kernels"] is True and r["calls"] > 0 and r["blocked"] > 0, r
    assert r["scores_max_abs"] <= 1e-5, r
    assert r["same_sinks"] and r["same_chosen"], r
    # LLaDA's padding bias is the same for every query row; Dream's padded mask also hides the
    # pad rows, so it is read row by row
    if case in ("llada", "dream"):
        assert (r["one_row_calls"] > 0) == (case == "llada"), r


# a row whose first key tile is all hidden (more left padding than one 16-key tile: the online
# LSE must rescale by a safe max, or the row turns NaN and then reads as dead), a float mask at
# exactly its hidden threshold ("at or below" hides), and a float16 mask over float32 queries
# (the threshold is the mask dtype's: float16's finfo.min hides)
EDGE_CASES = ["first_key_tile_hidden_bool", "first_key_tile_hidden_float", "mask_at_the_threshold",
              "fp16_mask_fp32_queries"]


@pytest.mark.parametrize("case", EDGE_CASES)
def test_kernels_match_the_torch_blocked_algorithm_on_the_mask_edges(interpreted, case):
    """The kernels against the torch blocked algorithm, and that one against a float64
    softmax, where a mask hides a whole key tile, sits at its threshold, or is float16."""
    r = interpreted[case]
    assert r["kernels"] is True, "the child did not run the Triton kernels"
    assert r["max_abs"] <= 1e-5 * max(1.0, r["max_ref"]), r
    assert r["ref_is_softmax"], r


# -- the child process ------------------------------------------------------------------------


def _unit_results():
    import torch

    from lm_eval_sinkmask import fused_mass
    from tests.test_fused_mass import _unit_cases

    B, H, Sq, Sk, D = 2, 2, 20, 40, 24  # D 24: the kernels pad head_dim to 32
    cases = _unit_cases(B, H, Sq, Sk)
    for variant, (gqa, dtype, first) in {"mha_fp32": (1, torch.float32, 0),
                                         "gqa_bf16": (2, torch.bfloat16, 0),
                                         "gqa_fp32_last_row": (2, torch.float32, Sq - 1),
                                         "one_row_decoding": (2, torch.bfloat16, 0),
                                         "mha_fp32_from_row_1": (1, torch.float32, 1)}.items():
        g = torch.Generator().manual_seed(1)
        q = torch.randn(B, H, Sq, D, generator=g).to(dtype)
        k = torch.randn(B, H // gqa, Sk, D, generator=g).to(dtype)
        w = (torch.rand(B, Sq, generator=g) > 0.2).float()
        w[:, :first] = 0
        for name in VARIANTS[variant]:
            kw = dict(cases[name], scale=D ** -0.5, first_row=first, block_m=16, block_n=16)
            # 16 x 16 tiles: several query and key tiles, so the online LSE and the causal
            # tile bounds are exercised
            qv, wv = q, w
            if variant == "one_row_decoding":  # the call of a step: its last row, causal
                qv, wv = q[:, :, -1:], w[:, -1:]
                kw.update(mask=kw["mask"][:, :, -1:], is_causal=True, causal_offset=Sk - 1)
            ref = fused_mass.blocked_column_mass(qv, k, wv, **kw)
            got = fused_mass.column_mass(qv, k, wv, use_triton=True, **kw)
            # detect_backend=auto's first-use check accepts the kernels (it would hand the
            # call to the materialised path, None, if they disagreed)
            checked = fused_mass.checked_column_mass(qv, k, wv, **kw)
            one_row, tiled = _with_the_tile_load(lambda: fused_mass.column_mass(
                qv, k, wv, use_triton=True, **kw))
            yield {"case": f"{name}/{variant}", "kernels": True,
                   "max_abs": float((got - ref).abs().max()), "max_ref": float(ref.abs().max()),
                   "check_passed": checked is not None and bool(torch.equal(checked, got)),
                   "one_row_load": one_row, "same_as_tile_load": bool(torch.equal(tiled, got))}


def _edge_results():
    import torch

    from lm_eval_sinkmask import fused_mass
    from lm_eval_sinkmask.attention_view import hidden_below
    from tests.test_fused_mass import softmax_mass

    B, H, Sq, Sk, D = 2, 2, 20, 40, 24
    g = torch.Generator().manual_seed(2)
    q = torch.randn(B, H, Sq, D, generator=g)
    k = torch.randn(B, H, Sk, D, generator=g)
    w = (torch.rand(B, Sq, generator=g) > 0.2).float()
    w[0, 3:5] = 1  # rows the masks below leave without a key: they must add nothing
    pad = torch.ones(B, 1, 1, Sk, dtype=torch.bool)
    pad[1, ..., :20] = False  # more than one 16-key tile of left padding
    at = torch.randn(B, 1, Sq, Sk, generator=g)
    at[0, :, 3] = hidden_below(torch.float32)  # a row whose every key sits at the threshold
    at[1, :, :, :5] = hidden_below(torch.float32)
    f16 = torch.randn(B, 1, Sq, Sk, generator=g).half()
    f16[0, :, 4] = torch.finfo(torch.float16).min  # a row that sees no key
    f16[1, ..., :3] = torch.finfo(torch.float16).min
    masks = {"first_key_tile_hidden_bool": pad,
             "first_key_tile_hidden_float": torch.zeros(B, 1, 1, Sk).masked_fill(
                 ~pad, torch.finfo(torch.float32).min),
             "mask_at_the_threshold": at, "fp16_mask_fp32_queries": f16}
    for name, mask in masks.items():
        kw = dict(mask=mask, scale=D ** -0.5, block_m=16, block_n=16)
        ref = fused_mass.blocked_column_mass(q, k, w, **kw)
        got = fused_mass.column_mass(q, k, w, use_triton=True, **kw)
        yield {"case": name, "kernels": True,
               "max_abs": float((got - ref).abs().max()), "max_ref": float(ref.abs().max()),
               "ref_is_softmax": bool(torch.allclose(ref, softmax_mass(q, k, w, mask=mask),
                                                     atol=1e-5, rtol=1e-5))}


def _with_the_tile_load(mass):
    """(whether the kernels would read the call's mask as one row, the call's mass with the
    mask read as [BLOCK_M, BLOCK_N] tiles whatever its form)."""
    from lm_eval_sinkmask import fused_mass

    flags, real = [], fused_mass.mask_has_rows
    fused_mass.mask_has_rows = lambda m, n_q: flags.append(real(m, n_q)) or True
    try:
        tiled = mass()
    finally:
        fused_mass.mask_has_rows = real
    return flags == [False], tiled


def _model_results():
    import torch

    from lm_eval_sinkmask import fused_mass
    from lm_eval_sinkmask.config import SinkMaskConfig
    from lm_eval_sinkmask.intercept import SinkMasker
    from tests import tiny

    used, rows = [], []
    real, real_rows = fused_mass._triton_column_mass, fused_mass.mask_has_rows

    def counted(*args):
        used.append(True)
        return real(*args)

    fused_mass._triton_column_mass = counted
    fused_mass.mask_has_rows = lambda m, n_q: rows.append(real_rows(m, n_q)) or rows[-1]
    for case in MODEL_CASES:
        model, rule, run = tiny.intercept_case(case)
        events = {}
        rows.clear()
        for backend in ("fused", "materialized"):
            used.clear()
            got = []
            cfg = SinkMaskConfig(top_k=2, eps=0.0, detect_backend=backend)
            with torch.no_grad(), SinkMasker(cfg, rule=rule, observers=[got.append]).attach(model):
                run()
            events[backend] = (got, bool(used))
        (fz, kernels), (mz, _) = events["fused"], events["materialized"]
        yield {"case": case, "kernels": kernels, "calls": len(fz), "one_row_calls": rows.count(False),
               "blocked": int(sum(int(e.blocked.sum()) for e in mz)),
               "scores_max_abs": max(float((a.scores - b.scores).abs().max()) for a, b in zip(fz, mz)),
               "same_sinks": len(fz) == len(mz) and all(torch.equal(a.sinks, b.sinks) for a, b in zip(fz, mz)),
               "same_chosen": all(torch.equal(a.chosen, b.chosen) for a, b in zip(fz, mz))}


if __name__ == "__main__":
    from lm_eval_sinkmask import fused_mass as _fm

    assert _fm.triton_runs_on(__import__("torch").device("cpu")), "Triton did not load"
    print_results(_unit_results(), _edge_results(), _model_results())
