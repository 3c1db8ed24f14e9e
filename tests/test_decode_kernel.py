"""The one-launch decoding-step candidate (benchmarks/decode_kernel.py), run by Triton's
interpreter on the CPU against the package's intercept.

As in test_select_kernel, the cases run in one child process (this file as a script, under
``TRITON_INTERPRET=1``) that prints one JSON line per case. Each case runs the same passes
twice, through the package's intercept as the CPU runs it and with the kernel installed, and
compares every attention call (scores, sinks, chosen and blocked keys), the stats and the
model's final logits. Model cases: a tiny Llama decoding with its KV cache (GQA through
``enable_gqa``, left padding through the model's own mask, both ARM rules, both detect
modes, bfloat16). Synthetic cases: one-row SDPA calls with a float bias (finite values added
to the scores, the dtype's minimum for padding), bool masks, a padding query row, top_k 1,
top_k above the keys, and a row whose every visible key is blocked.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.interpreted import compared_with_the_package, interpreted_results, print_results

ROOT = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed, so the decoding kernel was NOT checked "
                "(pip install -e '.[test]' installs it on Linux x86-64)", allow_module_level=True)

MODEL_CASES = ["last_row", "all_rows", "last_row_padded", "all_rows_padded", "last_row_current",
               "all_rows_bf16"]
SYNTHETIC_CASES = ["float_bias", "bool_mask_gqa", "padding_row", "k1", "k_above_keys",
                   "all_visible_blocked", "bf16_current"]


@pytest.fixture(scope="module")
def interpreted():
    return interpreted_results(__file__, ROOT / "benchmarks")


@pytest.mark.parametrize("case", MODEL_CASES + SYNTHETIC_CASES)
def test_the_kernel_decides_what_the_package_decides(interpreted, case):
    r = interpreted[case]
    assert r["kernel_calls"] == r["taken_calls"] > 0, r  # every one-row call took the kernel
    assert r["same_sinks"] and r["same_chosen"] and r["same_blocked"] and r["same_stats"], r
    # relative to max(|score|, 1); the first layer's calls see the same inputs both ways
    assert r["first_layer_scores_max_diff"] <= 1e-5, r
    # later layers' inputs differ by the rounding of the earlier outputs in bfloat16
    assert r["scores_max_diff"] <= (1e-3 if case == "all_rows_bf16" else 1e-5), r
    assert r["output_max_diff"] <= r["output_tol"], r
    assert r["blocked"] > 0, r  # the case masked something
    if case in MODEL_CASES:
        assert r["same_tokens"], r


# -- the child process ------------------------------------------------------------------------


def _model_case(name: str):
    """(model, rule, detect, run: () -> final logits) of a tiny Llama decoding 5 tokens."""
    import torch

    from tests import tiny

    model = tiny.build("llama")
    if "bf16" in name:
        model = model.to(torch.bfloat16)
    ids = torch.randint(5, 40, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 12, dtype=torch.long)
    if "padded" in name:
        mask[1, :3] = 0
        mask[2, :1] = 0

    def run():
        prompt = 7
        out = model(ids[:, :prompt], attention_mask=mask[:, :prompt] if "padded" in name else None,
                    use_cache=True)
        for t in range(prompt, ids.shape[1]):
            m = mask[:, :t + 1] if "padded" in name else None
            out = model(ids[:, t:t + 1], attention_mask=m, past_key_values=out.past_key_values,
                        use_cache=True)
        return out.logits.float()

    rule = "all_rows" if name.startswith("all_rows") else "last_row"
    return model, rule, "current" if name.endswith("current") else "previous", run


class _Attention:
    """A model of one SDPA call per layer, for the synthetic cases: ``passes`` passes over
    fixed q/k/v with sinks planted at a few keys, one key more each pass (a KV cache)."""

    def __init__(self, name: str):
        import torch

        g = torch.Generator().manual_seed(5)
        B, H, Hk, D, S = 3, 4, 4, 16, 40
        if "gqa" in name:
            Hk = 2
        self.dtype = torch.bfloat16 if "bf16" in name else torch.float32
        self.q = torch.randn(B, H, 4, D, generator=g)
        self.k = torch.randn(B, Hk, S + 4, D, generator=g)
        self.k[:, :, [0, 5, 9, 17, 30]] += 2.5 * self.q[:, ::H // Hk].mean(dim=2, keepdim=True)
        self.v = torch.randn(B, Hk, S + 4, D, generator=g)
        self.gqa = Hk != H
        self.name, self.S = name, S
        keep = torch.ones(B, S + 4, dtype=torch.bool)
        keep[1, :6] = False  # left padding
        if name == "all_visible_blocked":  # element 2 sees three keys, all of them sinks
            keep[2] = False
            keep[2, [0, 5, 9]] = True
        self.keep = keep

    def mask(self, n_k: int):
        import torch

        keep = self.keep[:, None, None, :n_k]
        if self.name in ("bool_mask_gqa", "k1", "k_above_keys", "all_visible_blocked"):
            return keep
        bias = torch.linspace(-0.5, 0.5, n_k).expand(keep.shape).to(self.dtype)
        return bias.masked_fill(~keep, torch.finfo(self.dtype).min)

    def run(self):
        import torch
        import torch.nn.functional as F

        outs = []
        for step in range(4):
            n_k = self.S + step
            q = self.q[:, :, step:step + 1].to(self.dtype)
            if self.name == "padding_row":  # element 1's row sees no key: a pad query row
                m = self.mask(n_k).clone()
                m[1] = torch.finfo(self.dtype).min
            else:
                m = self.mask(n_k)
            outs.append(F.scaled_dot_product_attention(
                q, self.k[:, :, :n_k].to(self.dtype), self.v[:, :, :n_k].to(self.dtype),
                attn_mask=m, enable_gqa=self.gqa))
        return torch.cat(outs, dim=2).float()


def _synthetic_case(name: str):
    import torch

    att = _Attention(name)
    model = torch.nn.Module()
    model.forward = lambda: att.run()  # the masker hooks the module's forward passes
    return model, "last_row", "current" if name.endswith("current") else "previous", model


def _results():
    import decode_kernel

    for name in MODEL_CASES + SYNTHETIC_CASES:
        if name in MODEL_CASES:
            model, rule, detect, run = _model_case(name)
            top_k, tol = 2, (3e-2 if "bf16" in name else 1e-4)
        else:
            model, rule, detect, run = _synthetic_case(name)
            top_k = {"k1": 1, "k_above_keys": 60, "all_visible_blocked": 5}.get(name, 3)
            tol = 2e-2 if "bf16" in name else 1e-5
        # eps < 0 admits keys below the others' mean: every key a sink, so element 2 of
        # all_visible_blocked has each key it sees blocked, and keeps its scores
        eps = -10.0 if name == "all_visible_blocked" else 0.0
        yield compared_with_the_package(name, decode_kernel.installed, decode_kernel.NAME,
                                        model, rule, detect, run, top_k=top_k, eps=eps,
                                        tol=tol, takes=lambda query: query.shape[-2] == 1)


if __name__ == "__main__":
    print_results(_results())
