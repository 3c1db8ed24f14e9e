"""The one-launch Triton selection candidate (benchmarks/select_kernel.py), run by Triton's
interpreter on the CPU against the package's selection.

As in test_fused_mass_triton, ``TRITON_INTERPRET=1`` must be set before Triton compiles
anything, so the checks run in one child process (this file as a script) that prints one JSON
line per case; the tests below read them. Unit cases feed both selections the same masses and
key counts (padding, causal row counts, heads with their own counts, granularity=layer, K from
0 to more than the keys, ties); model cases run tiny models through the intercept with either
selection and compare every call's sinks and chosen keys.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.interpreted import interpreted_results, print_results

ROOT = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed, so the selection kernel was NOT checked "
                "(pip install -e '.[test]' installs it on Linux x86-64)", allow_module_level=True)

UNIT_CASES = ["bidirectional_padded", "causal_rows", "per_head_rows", "per_layer",
              "per_layer_causal", "k0", "k_above_keys", "eps0_many_sinks", "ties",
              "one_valid_key"]
MODEL_CASES = ["llada", "dream", "llama_last_row_kv_cache", "llama_all_rows_kv_cache",
               "llada_per_layer"]
# the call path (variant c_call): the kernel also writes the output's mask, the model's SDPA
# makes the output; three passes of a batch of three (LLaDA's two of them left-padded, its
# bias a float mask; Dream unpadded, its K repeated to the query's heads before SDPA), and
# DLM-shaped calls whose K has half the query's heads, given to SDPA with enable_gqa
CALL_CASES = ["call_llada", "call_dream", "call_llada_per_layer", "call_llada_current",
              "call_llada_bf16", "call_dream_per_row_mask", "call_gqa"]


@pytest.fixture(scope="module")
def interpreted():
    return interpreted_results(__file__, ROOT / "benchmarks")


@pytest.mark.parametrize("case", UNIT_CASES)
def test_the_kernel_selects_what_the_package_selects(interpreted, case):
    r = interpreted[case]
    assert r["scores_max_rel"] <= 1e-6, r
    assert r["same_sinks"] and r["same_chosen"] and r["same_counts"], r
    assert r["chosen"] > 0 or case == "k0", r  # the case chose something
    assert r["sinks"] > r["chosen"] or case in ("k_above_keys", "one_valid_key"), r  # and left some
    if case == "ties":
        assert r["chose_lower_of_ties"], r


@pytest.mark.parametrize("case", MODEL_CASES)
def test_the_intercept_masks_the_same_keys_with_the_kernel(interpreted, case):
    r = interpreted[case]
    assert r["kernel_calls"] == r["calls"] > 0 and r["blocked"] > 0, r
    assert r["same_sinks"] and r["same_chosen"], r


@pytest.mark.parametrize("case", [c for c in CALL_CASES if c != "call_dream_per_row_mask"])
def test_the_call_path_decides_what_the_package_decides(interpreted, case):
    r = interpreted[case]
    assert r["kernel_calls"] == r["taken_calls"] == r["calls"] > 0, r  # it took every call
    assert r["same_sinks"] and r["same_stats"] and r["first_layer_same_chosen"], r
    assert r["first_layer_scores_max_diff"] <= 1e-5, r
    if case.endswith("bf16"):  # later layers' inputs differ by the rounding of the earlier
        # outputs (here the package's comes from float32 probabilities, the kernel's from
        # SDPA), enough to flip a near-tie among bf16 logits in the top-k
        assert r["scores_max_diff"] <= 1e-3, r
    else:
        assert r["same_chosen"] and r["same_blocked"] and r["scores_max_diff"] <= 1e-5, r
    assert r["output_max_diff"] <= r["output_tol"] and r["same_tokens"], r
    assert r["blocked"] > 0, r


def test_the_call_path_leaves_a_per_row_mask_to_the_package(interpreted):
    """Dream's padded mask hides pad query rows too (it depends on the row): not in scope."""
    r = interpreted["call_dream_per_row_mask"]
    assert r["kernel_calls"] == 0 < r["calls"] and r["output_max_diff"] == 0.0, r


def test_a_call_of_max_keys_keys_is_in_scope_and_not_one_more(monkeypatch):
    """taken_calls.in_scope: at most MAX_KEYS keys, the limit itself included (the kernel
    refuses only n_k > MAX_KEYS). In this process, with no kernel run."""
    from types import SimpleNamespace

    import torch

    from lm_eval_sinkmask import fused_mass
    from lm_eval_sinkmask.config import SinkMaskConfig

    import select_kernel
    import taken_calls

    monkeypatch.setattr(fused_mass, "triton_runs_on", lambda device: True)
    run = SimpleNamespace(config=SinkMaskConfig(top_k=5),
                          masker=SimpleNamespace(excluded_keys=None))
    call = lambda keys: {"query": torch.zeros(1, 1, 2, 1),  # noqa: E731
                         "key": torch.zeros(1, 1, keys, 1)}
    assert taken_calls.in_scope(run, call(select_kernel.MAX_KEYS), select_kernel.MAX_KEYS)
    assert not taken_calls.in_scope(run, call(select_kernel.MAX_KEYS + 1), select_kernel.MAX_KEYS)


def test_the_output_mask_rows_start_aligned_for_cudas_kernel():
    """CUDA's memory-efficient attention reads the call path's additive mask as it is only
    where its rows start at multiples of 8 elements; any other it copies into a padded one on
    every call, GPU time that no check here would see."""
    import torch

    import select_kernel

    bias = select_kernel.output_mask_buffer(2, 3, 11, torch.bfloat16, "cpu")
    assert bias.shape == (2, 3, 11) and bias.stride(1) % 8 == 0 and bias.stride(0) % 8 == 0


# -- the child process ------------------------------------------------------------------------


def _unit_inputs(name: str, g):
    """(mass [B, H, Sk], rows [B, H or 1, Sk], key_valid [B, Sk], eps, k, per_layer)."""
    import torch

    B, H, Sq, Sk = 3, 4, 24, 40
    logits = torch.randn(B, H, Sq, Sk, generator=g)
    # six keys per (element, head) drawn to be sinks, of different strength, so that top-5
    # leaves one out; the scores of the rest stay near the uniform share
    heavy = torch.rand(B, H, Sk, generator=g).argsort(dim=-1)[..., :6]
    if name.startswith("per_layer"):  # the same keys in every head, as a layer's sinks are
        heavy = heavy[:, :1].expand(B, H, 6)
    logits += torch.zeros(B, H, Sk).scatter_(-1, heavy, torch.linspace(4.3, 5.0, 6).expand(B, H, 6))[:, :, None]
    attn = torch.softmax(logits, dim=-1)
    key_valid = torch.ones(B, Sk, dtype=torch.bool)
    key_valid[1, :7] = False  # left padding
    key_valid[2, -3:] = False  # right padding
    rows = torch.full((B, 1, Sk), float(Sq))
    eps, k, per_layer = 3.0, 4, False
    if "causal" in name:  # row i sees keys j <= i + Sk - Sq: the all_rows rule's row counts
        causal = torch.arange(Sk)[None, :] <= torch.arange(Sq)[:, None] + (Sk - Sq)
        attn = attn * causal
        rows = causal.sum(0).float().expand(B, 1, Sk).clone()
    if name == "per_head_rows":  # heads with their own masks
        rows = torch.randint(1, Sq + 1, (B, H, Sk), generator=g).float()
    if name.startswith("per_layer"):
        per_layer = True
    if name == "k0":
        k = 0
    if name == "k_above_keys":
        k = Sk + 3
    if name == "eps0_many_sinks":
        eps, k = 0.0, 3
    mass = attn.sum(dim=-2) * key_valid[:, None]
    if name == "ties":  # equal scores: the lower position must win, as a stable sort does
        mass[:, :, 10] = mass[:, :, 20] = mass[:, :, 30] = 12.0
        k = 2
    if name == "one_valid_key":  # no other keys to compare with: nothing is a sink
        key_valid[0] = False
        key_valid[0, 5] = True
    return mass.float(), rows, key_valid, eps, k, per_layer


def _unit_results():
    import torch

    import select_kernel
    from lm_eval_sinkmask import compiled_tail
    from lm_eval_sinkmask.metric import key_counts

    g = torch.Generator().manual_seed(3)
    for name in UNIT_CASES:
        mass, rows, key_valid, eps, k, per_layer = _unit_inputs(name, g)
        counts = key_counts(rows, key_valid, per_layer=per_layer, dtype=mass.dtype)
        ref = compiled_tail.select_and_count(mass, counts, eps=eps, k=k, per_layer=per_layer)
        got = select_kernel.select_and_count(mass, counts, eps=eps, k=k, per_layer=per_layer)
        rel = ((got[0] - ref[0]).abs() / ref[0].abs().clamp(min=1e-6)).max()
        result = {"case": name, "scores_max_rel": float(rel),
                  "same_sinks": bool(torch.equal(got[1], ref[1])),
                  "same_chosen": bool(torch.equal(got[2], ref[2])),
                  "same_counts": [int(got[3]), int(got[4])] == [int(ref[3]), int(ref[4])],
                  "sinks": int(ref[3]), "chosen": int(ref[4])}
        if name == "ties":
            result["chose_lower_of_ties"] = bool(got[2][..., 10].all() and got[2][..., 20].all()
                                                 and not got[2][..., 30].any())
        yield result


def _model_results():
    import torch

    import select_kernel
    from lm_eval_sinkmask import compiled_tail
    from lm_eval_sinkmask.config import SinkMaskConfig
    from lm_eval_sinkmask.intercept import SinkMasker
    from tests import tiny

    kernel_calls = []

    def counting(fn):
        def run(*args, **kwargs):
            kernel_calls.append(True)
            return fn(*args, **kwargs)
        return run

    def kernel_selector(device, unmaterialized, from_rows=False):  # the CUDA choice, on the CPU
        return counting(select_kernel.select_and_count_from_rows if from_rows
                        else select_kernel.select_and_count)

    package_selector = compiled_tail.selector
    for case in MODEL_CASES:
        model, rule, run = tiny.intercept_case(case)
        granularity = "layer" if case.endswith("per_layer") else "head"
        events = {}
        for which, chooser in (("kernel", kernel_selector), ("package", package_selector)):
            kernel_calls.clear()
            got = []
            compiled_tail.selector = chooser
            try:
                cfg = SinkMaskConfig(top_k=2, eps=0.0, granularity=granularity)
                with torch.no_grad(), SinkMasker(cfg, rule=rule, observers=[got.append]).attach(model):
                    run()
            finally:
                compiled_tail.selector = package_selector
            events[which] = (got, len(kernel_calls))
        (kz, n_kernel), (pz, _) = events["kernel"], events["package"]
        yield {"case": case, "calls": len(pz), "kernel_calls": n_kernel,
               "blocked": int(sum(int(e.blocked.sum()) for e in pz)),
               "same_sinks": len(kz) == len(pz) and all(torch.equal(a.sinks, b.sinks)
                                                        for a, b in zip(kz, pz)),
               "same_chosen": all(torch.equal(a.chosen, b.chosen) for a, b in zip(kz, pz))}


def _call_results():
    import select_kernel
    from tests.interpreted import compared_with_the_package, synthetic_passes, tiny_dlm_passes

    for case in CALL_CASES:
        kind = case.split("_")[1]
        if kind == "gqa":
            model, run, _ = synthetic_passes("gqa")
        else:  # tiny dream's padding mask depends on the row
            model, run = tiny_dlm_passes(kind, bf16=case.endswith("bf16"),
                                         padded=kind == "llada" or case.endswith("per_row_mask"))
        yield compared_with_the_package(
            case, select_kernel.call_path_installed, select_kernel.CALL_NAME, model, "all",
            "current" if case.endswith("current") else "previous", run, top_k=2, eps=0.0,
            tol=3e-2 if case.endswith("bf16") else 1e-4, takes=lambda query: True,
            granularity="layer" if case.endswith("per_layer") else "head")


if __name__ == "__main__":
    print_results(_unit_results(), _model_results(), _call_results())
