"""The package's one-launch decoding kernel (lm_eval_sinkmask/decode_step.py), run by Triton's
interpreter on the CPU against the package's CPU path; and ``detect_backend=auto``'s
first-use check of it.

As in test_select_kernel, the interpreted cases run in one child process (this file as a
script, under ``TRITON_INTERPRET=1``) that prints one JSON line per case. Each case runs the
same passes twice, through the intercept as the CPU runs it (materialized) and with
``detect_backend=fused`` (one-row calls in the kernel, the prefill's calls on the fused
path), and compares every attention call (scores, sinks, chosen and blocked keys), the stats
and the model's final logits. Model cases: a tiny Llama decoding with its KV cache (GQA
through ``enable_gqa``, left padding through the model's own mask, both ARM rules, both
detect modes, bfloat16). Synthetic cases: one-row SDPA calls with a float bias (finite values
added to the scores, the dtype's minimum for padding), bool masks, a padding query row, top_k
1, top_k above the keys, and a row whose every visible key is blocked. The auto cases run
``detect_backend=auto`` as on CUDA: each kernel variant's first call by parts and checked,
the rest in the kernel. The edge cases call the kernel once on a hand-made row and hold it to
Eq. 3 on a float64 softmax: an element that sees one key, a valid key no row sees, and
all_rows history rows that see no key or weigh 0. The fallback tests (in this process, the kernel replaced by a broken
one) show a variant that fails its check going by parts for the rest of the process.
"""

from __future__ import annotations

import importlib.util
import logging
from contextlib import contextmanager, nullcontext
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from lm_eval_sinkmask import decode_step, fused_mass, intercept, metric
from lm_eval_sinkmask.attention_view import MaskView
from lm_eval_sinkmask.config import SinkMaskConfig
from lm_eval_sinkmask.intercept import SinkMasker
from tests.interpreted import compared_with_the_package, interpreted_results, print_results

ROOT = Path(__file__).resolve().parents[1]

MODEL_CASES = ["last_row", "all_rows", "last_row_padded", "all_rows_padded", "last_row_current",
               "all_rows_bf16"]
SYNTHETIC_CASES = ["float_bias", "bool_mask_gqa", "padding_row", "k1", "k_above_keys",
                   "all_visible_blocked", "bf16_current", "custom_scale"]
AUTO_CASES = ["auto_last_row_padded", "auto_all_rows"]

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="Triton is not installed, so the decoding kernel was NOT checked "
           "(pip install -e '.[test]' installs it on Linux x86-64)")


@pytest.fixture(scope="module")
def interpreted():
    return interpreted_results(__file__, ROOT / "benchmarks")


@needs_triton
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


@needs_triton
@pytest.mark.parametrize("case", AUTO_CASES)
def test_auto_checks_each_variant_once_then_takes_the_kernel(interpreted, case):
    r = interpreted[case]
    assert r["checked"] and all(r["checked"]), r  # every variant passed its check
    # each variant's first call went by parts (counted "fused"), every other one-row call
    # took the kernel
    assert r["kernel_calls"] == r["taken_calls"] - len(r["checked"]) > 0, r
    assert r["same_sinks"] and r["same_chosen"] and r["same_blocked"] and r["same_stats"], r
    assert r["same_tokens"] and r["output_max_diff"] <= r["output_tol"], r
    assert not r["warnings"], r


# an element that sees one key (|K| = 1: no sink, Eq. 3), a valid token that the mask hides
# from the row (outside K), and under all_rows a row that sees no key or weighs 0 (padding):
# such rows add nothing to the history
EDGE_CASES = ["one_visible_key", "valid_key_no_row_sees", "history_row_sees_no_key",
              "history_row_of_weight_0"]


@needs_triton
@pytest.mark.parametrize("case", EDGE_CASES)
def test_the_kernel_selects_and_accumulates_as_eq3_says_on_the_edges(interpreted, case):
    """One call in the kernel against metric.select_sinks on the float64 softmax of the same
    row, and under all_rows the history it returns against the earlier rows' mass and row
    counts plus this row's."""
    r = interpreted[case]
    assert r["scores_max_diff"] <= 1e-5, r
    assert r["same_sinks"] and r["same_chosen"] and r["same_counts"], r
    assert r["history_max_diff"] <= 1e-5 and r["same_history_rows"], r


# -- auto's fallback, in this process: the kernel replaced by one that fails ---------------------


@contextmanager
def _as_on_cuda(kernel):
    """The intercept as on CUDA for detect_backend=auto (the fused path; the fused mass by its
    torch algorithm, as Triton does not run here), one-row calls in scope, and ``kernel`` in
    place of :func:`decode_step.masked_decode`."""
    resolve = fused_mass.resolve
    with mock.patch.object(fused_mass, "resolve", lambda backend, device: "fused"
                           if backend == "auto" else resolve(backend, device)), \
            mock.patch.object(fused_mass, "checked_column_mass",
                              lambda q, k, w, **kw: fused_mass.column_mass(q, k, w, **kw)), \
            mock.patch.object(decode_step, "takes", lambda config, rule, extra, q, k:
                              q.shape[-2] == 1), \
            mock.patch.object(decode_step, "masked_decode", kernel), \
            mock.patch.object(decode_step, "CHECKED", {}):
        yield


def _decoded_tokens(backend: str, kernel=None):
    """(generated ids, stats, variants checked) of the tiny Llama decoding 6 tokens greedily, masked under the
    last_row rule, with ``kernel`` in place of the decoding kernel (as on CUDA) where given."""
    from tests import tiny

    model = tiny.build("llama")
    ids = torch.randint(5, 40, (2, 8), generator=torch.Generator().manual_seed(3))
    masker = SinkMasker(SinkMaskConfig(top_k=2, eps=0.0, detect_backend=backend), rule="last_row")
    with torch.no_grad(), (_as_on_cuda(kernel) if kernel else nullcontext()), \
            masker.attach(model) as stats:
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        checked = dict(decode_step.CHECKED)  # the block's own record (_as_on_cuda)
    return out, stats, checked


def _broken_scores(sc, *, eps, k, previous, history):
    """A kernel whose scores are wrong: what auto's check must catch."""
    n = sc.n_k
    B, H = sc.batch, sc.heads
    z = torch.zeros(B, H, n, dtype=torch.bool)
    calls.append(1)
    return decode_step.Decoded(torch.zeros(B, H, 1, sc.value.shape[-1], dtype=sc.dtype),
                               torch.full((B, H, n), 7.0), z, z, torch.tensor(0),
                               torch.tensor(0), None)


def _wrong_choice(sc, *, eps, k, previous, history):
    """Right scores, sinks and output, the chosen keys one place off (a miscompiled top-k
    loop): only auto's check of the selection itself sees it. (Every key is visible in
    :func:`_decoded_tokens`' runs: no padding.)"""
    calls.append(1)
    q = sc.query.float()[:, :, 0]
    group = sc.heads // sc.key.shape[1]
    key, value = (t.float().repeat_interleave(group, dim=1) for t in (sc.key, sc.value))
    logits = torch.einsum("bhd,bhsd->bhs", q, key) * (sc.scale or q.shape[-1] ** -0.5)
    scores = logits.shape[-1] * logits.softmax(dim=-1)
    sinks = metric.find_sinks(scores, torch.ones_like(scores, dtype=torch.bool), eps)
    right = metric.top_k_sinks(scores, sinks, k)
    blocked = right if previous is None else F.pad(previous, (0, right.shape[-1] - previous.shape[-1]))
    out = logits.masked_fill(blocked, float("-inf")).softmax(dim=-1)[:, :, None] @ value
    chosen = right.roll(1, dims=-1)
    return decode_step.Decoded(out.to(sc.dtype), scores, sinks, chosen, sinks.sum(), chosen.sum(),
                               None)


def _raising(sc, **kw):
    calls.append(1)
    raise RuntimeError("no kernel image is available for execution on the device")


calls: list = []


@pytest.mark.parametrize("kernel", [_broken_scores, _wrong_choice, _raising],
                         ids=["wrong_scores", "wrong_choice", "raises"])
def test_a_variant_that_fails_its_check_goes_by_parts_from_then_on(kernel, caplog):
    calls.clear()
    ref, ref_stats, _ = _decoded_tokens("fused")  # by parts (no Triton here)
    with caplog.at_level(logging.WARNING, logger=intercept.logger.name):
        got, stats, checked = _decoded_tokens("auto", kernel)
    assert torch.equal(got, ref)  # the same tokens as the fused path by parts
    assert (stats.sinks_detected, stats.keys_masked) == (ref_stats.sinks_detected,
                                                         ref_stats.keys_masked)
    assert decode_step.NAME not in stats.detection  # no call took the broken kernel
    assert checked and not any(checked.values())
    assert len(calls) == len(checked)  # asked once per variant, never again
    warned = [r for r in caplog.records if "first-use check" in r.getMessage()]
    assert len(warned) == len(checked) and "fused path from now on" in warned[0].getMessage()


def test_detect_backend_fused_takes_the_kernel_unchecked_and_raises():
    calls.clear()
    with pytest.raises(RuntimeError, match="no kernel image"):
        _decoded_tokens("fused", _raising)


def test_the_selection_check_holds_the_kernel_to_eq3_on_its_own_scores():
    scores = torch.tensor([[[3.0, 1.0, 1.0, 1.0, 0.5]]])  # [B, H, Sk]; key 4 is padding
    valid, rows = torch.tensor([[True] * 4 + [False]]), torch.ones(1, 1, 5, dtype=torch.long)
    sinks = torch.tensor([[[True, False, False, False, False]]])

    def decoded(sinks, chosen, n_sinks=None, n_chosen=None):
        return decode_step.Decoded(None, scores, sinks, chosen, sinks.sum() if n_sinks is None
                                   else torch.tensor(n_sinks), chosen.sum() if n_chosen is None
                                   else torch.tensor(n_chosen), None)

    assert decode_step.misselected(decoded(sinks, sinks), rows, valid, 0.0, 1) is None
    assert "sinks" in decode_step.misselected(decoded(~sinks & valid, sinks), rows, valid, 0.0, 1)
    assert "chosen" in decode_step.misselected(decoded(sinks, ~sinks), rows, valid, 0.0, 1)
    assert "counts" in decode_step.misselected(decoded(sinks, sinks, n_sinks=2), rows, valid,
                                               0.0, 1)
    # eps 2: key 0 scores exactly its threshold, 3 = (1 + 1 + 1) / 3 + 2, and is no sink; a
    # kernel that rounded the other way is not told off for it
    assert decode_step.misselected(decoded(sinks, sinks), rows, valid, 2.0, 1) is None
    none = torch.zeros_like(sinks)
    assert decode_step.misselected(decoded(none, none), rows, valid, 2.0, 1) is None
    # a key that no row sees is outside K whatever it scores
    assert "sinks" in decode_step.misselected(decoded(sinks, sinks), torch.zeros_like(rows),
                                              valid, 0.0, 1)


class _PrefillThenStep(torch.nn.Module):
    """A prefill whose mask has a head axis, then one decoding step with a key-only mask."""

    def forward(self, step: bool):
        g = torch.Generator().manual_seed(0)
        B, H, D, P = 2, 2, 16, 6
        q, k = torch.randn(B, H, P + 1, D, generator=g), torch.randn(B, H, P + 1, D, generator=g)
        v = torch.randn(B, H, P + 1, D, generator=g)
        if step:
            mask = torch.ones(B, 1, 1, P + 1, dtype=torch.bool)
            return F.scaled_dot_product_attention(q[:, :, P:], k, v, attn_mask=mask)
        mask = torch.ones(P, P, dtype=torch.bool).tril().expand(B, H, P, P).clone()
        mask[1, 1, :, 0] = False  # one head of one element sees no BOS
        return F.scaled_dot_product_attention(q[:, :, :P], k[:, :, :P], v[:, :, :P], attn_mask=mask)


def test_an_all_rows_history_with_a_head_axis_goes_by_parts():
    """The kernel reads the history's rows without a head axis: a step after a prefill whose
    mask had one is decided by parts (it raised in the kernel before)."""
    model = _PrefillThenStep()
    outs = {}
    for name, kernel in (("parts", None), ("kernel", _raising)):
        calls.clear()
        masker = SinkMasker(SinkMaskConfig(top_k=1, eps=0.0, detect_backend="fused"),
                            rule="all_rows")
        with torch.no_grad(), (_as_on_cuda(kernel) if kernel else nullcontext()), \
                masker.attach(model) as stats:
            outs[name] = [model(False), model(True)]
        assert not calls and decode_step.NAME not in stats.detection
    assert all(torch.equal(a, b) for a, b in zip(outs["parts"], outs["kernel"]))


def test_only_calls_whose_keys_it_may_choose_from_take_the_kernel(monkeypatch):
    """The kernel masks the top-k sinks of all keys: a random control, a per-layer choice or
    keys never to be chosen (the extra sink token) go by parts, whatever the device."""
    monkeypatch.setattr(fused_mass, "triton_runs_on", lambda device: True)
    monkeypatch.setattr(decode_step, "_kernels", lambda: object())
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8)
    sinks = SinkMaskConfig(top_k=1)
    assert decode_step.takes(sinks, "last_row", None, q, k)
    assert decode_step.takes(sinks, "all_rows", None, q, k)
    for config, rule, excluded in [
            (SinkMaskConfig(top_k=1, mask_target="random"), "last_row", None),
            (SinkMaskConfig(top_k=1, granularity="layer"), "last_row", None),
            (sinks, "last_row", torch.zeros(1, 5, dtype=torch.bool)),
            (sinks, "all", None)]:
        assert not decode_step.takes(config, rule, excluded, q, k), (config, rule, excluded)
    assert not decode_step.takes(sinks, "last_row", None, torch.randn(1, 2, 2, 8), k)


def test_each_top_k_is_a_variant_of_its_own():
    """A sweep runs its K cells in one process: each K's first call is checked on its own."""
    from lm_eval_sinkmask.attention_view import MaskView, Scores

    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8)
    sc = Scores(q, k, k, MaskView(None, False, 1, 1, 5, q.device, None, "last_row", 256), None,
                False)
    assert decode_step.Variant.of(sc, None, None, 1) != decode_step.Variant.of(sc, None, None, 2)


def test_kernels_launch_on_their_tensors_device():
    """Triton launches on the current CUDA device: a model spread over several GPUs
    (device_map) must not launch a layer's kernel on another layer's device."""
    assert isinstance(fused_mass.on_device(torch.device("cpu")), type(nullcontext()))
    with mock.patch.object(torch.cuda, "device", lambda device: ("entered", device)):
        with mock.patch.object(torch.cuda, "device_count", lambda: 2):
            assert fused_mass.on_device(torch.device("cuda", 1)) == ("entered",
                                                                    torch.device("cuda", 1))
        with mock.patch.object(torch.cuda, "device_count", lambda: 1):  # nothing to switch
            assert isinstance(fused_mass.on_device(torch.device("cuda", 0)), type(nullcontext()))


@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("triton") is None,
                    reason="no CUDA device with Triton here: the compiled kernel is checked on a "
                           "GPU machine (the interpreter checks the same kernel above)")
@pytest.mark.parametrize("rule", ["last_row", "all_rows"])
def test_on_cuda_the_kernel_decodes_what_the_path_by_parts_decodes(rule):
    """The compiled kernel on the GPU, through transformers' generate with left padding: the
    tokens and every call's chosen keys of the path by parts (float32; eps 0.1 keeps a random
    model's uniform rows, whose scores tie at the threshold, out of the choice)."""
    from tests import tiny

    model = tiny.build("llama").cuda()
    ids = torch.randint(5, 40, (3, 10), generator=torch.Generator().manual_seed(2)).cuda()
    mask = torch.ones_like(ids)
    mask[1, :3] = 0

    def decoded(by_parts: bool):
        events = []
        masker = SinkMasker(SinkMaskConfig(top_k=2, eps=0.1, detect_backend="fused"), rule=rule,
                            observers=[events.append])
        parts = mock.patch.object(decode_step, "takes", lambda *a: False) if by_parts \
            else nullcontext()
        with torch.no_grad(), parts, masker.attach(model) as stats:
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
        return out, [e.chosen for e in events], stats

    (ref, ref_chosen, ref_stats), (got, chosen, stats) = decoded(True), decoded(False)
    assert stats.detection.get(decode_step.NAME, 0) > 0 and decode_step.NAME not in \
        ref_stats.detection
    assert torch.equal(got, ref) and ref_stats.keys_masked > 0
    assert all(torch.equal(a, b) for a, b in zip(ref_chosen, chosen, strict=True))
    assert (stats.sinks_detected, stats.keys_masked) == (ref_stats.sinks_detected,
                                                         ref_stats.keys_masked)


@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("triton") is None,
                    reason="no CUDA device with Triton here: the compiled kernel's tie break is "
                           "checked on a GPU machine")
def test_on_cuda_the_kernel_breaks_score_ties_towards_the_lower_position():
    """Two sinks of equal scores (the same key at two positions) and top_k 1: the compiled
    kernel chooses the lower position, as metric.top_k_sinks' stable sort does (argmax's
    fast tie break on hardware may return either)."""
    from lm_eval_sinkmask.attention_view import Scores

    device = torch.device("cuda")
    B, H, D, S = 2, 4, 16, 200
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, 1, D, generator=g)
    k = torch.randn(B, H, S, D, generator=g)
    strong = k[:, :, 0] + 3 * q[:, :, 0]
    for j in (37, 150):  # the same key twice: equal logits, mass and scores to the bit
        k[:, :, j] = strong
    q, k = q.to(device), k.to(device)
    view = MaskView(None, False, B, 1, S, device, None, "last_row", 256)
    got = decode_step.masked_decode(Scores(q, k, k, view, None, False), eps=0.0, k=1,
                                    previous=None, history=None)
    assert torch.equal(got.scores[..., 37], got.scores[..., 150])
    assert got.sinks[..., 37].all() and got.sinks[..., 150].all()
    assert got.chosen[..., 37].all() and not got.chosen[..., 150].any()


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
                attn_mask=m, enable_gqa=self.gqa,
                scale=0.7 if self.name == "custom_scale" else None))
        return torch.cat(outs, dim=2).float()


def _synthetic_case(name: str):
    import torch

    att = _Attention(name)
    model = torch.nn.Module()
    model.forward = lambda: att.run()  # the masker hooks the module's forward passes
    return model, "last_row", "current" if name.endswith("current") else "previous", model


def _results():
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
        yield compared_with_the_package(name, None, decode_step.NAME, model, rule, detect, run,
                                        top_k=top_k, eps=eps, tol=tol, versus_backend="fused",
                                        takes=lambda query: query.shape[-2] == 1)
    for name in AUTO_CASES:
        yield _auto_case(name)


def _auto_case(name: str) -> dict:
    """A model case under detect_backend=auto as CUDA runs it (resolved to the fused path)."""
    model, rule, detect, run = _model_case(name.removeprefix("auto_"))
    resolve = fused_mass.resolve
    decode_step.CHECKED.clear()

    @contextmanager
    def as_on_cuda():
        with mock.patch.object(fused_mass, "resolve", lambda backend, device: "fused"
                               if backend == "auto" else resolve(backend, device)):
            yield

    warnings = []
    handler = logging.Handler()
    handler.emit = warnings.append
    logging.getLogger("lm_eval_sinkmask").addHandler(handler)
    r = compared_with_the_package(name, as_on_cuda, decode_step.NAME, model, rule, detect, run,
                                  top_k=2, eps=0.0, tol=1e-4,
                                  takes=lambda query: query.shape[-2] == 1)
    logging.getLogger("lm_eval_sinkmask").removeHandler(handler)
    return dict(r, checked=list(decode_step.CHECKED.values()),
                warnings=[w.getMessage() for w in warnings])


def _edge_results():
    from lm_eval_sinkmask.attention_view import Detection, Scores
    from tests.test_fused_mass import softmax_mass

    B, H, D, S = 3, 2, 16, 12
    g = torch.Generator().manual_seed(7)
    q = torch.randn(B, H, 1, D, generator=g)
    k = torch.randn(B, H, S, D, generator=g)
    k[:, :, 2] += 3 * q[:, :, 0]  # a strong key: sinks exist
    v = torch.randn(B, H, S, D, generator=g)
    old_mass = torch.rand(B, H, S - 1, generator=g)
    old_rows = torch.randint(1, 4, (B, 1, S - 1), generator=g)

    one_key = torch.ones(B, 1, 1, S, dtype=torch.bool)
    one_key[1] = False
    one_key[1, ..., 7] = True
    hides_valid = torch.ones(B, 1, 1, S, dtype=torch.bool)
    hides_valid[0, ..., 5] = False  # hidden by the mask, valid by the model's 2-D mask
    no_key = torch.zeros(B, 1, 1, S)
    no_key[1] = torch.finfo(torch.float32).min  # element 1's row sees no key
    valid_but_last = torch.ones(B, S, dtype=torch.bool)
    valid_but_last[2, -1] = False  # element 2's row (the last token) is padding
    cases = {  # mask, token_valid, all_rows history
        "one_visible_key": (one_key, None, False),
        "valid_key_no_row_sees": (hides_valid, torch.ones(B, S, dtype=torch.bool), False),
        "history_row_sees_no_key": (no_key, None, True),
        "history_row_of_weight_0": (None, valid_but_last, True),
    }
    eps, top_k = 0.0, 2
    for name, (mask, token_valid, history) in cases.items():
        rule = "all_rows" if history else "last_row"
        view = MaskView(mask, False, B, 1, S, q.device, token_valid, rule, 256)
        hist = Detection(old_mass, old_rows) if history else None
        got = decode_step.masked_decode(Scores(q, k, v, view, None, False), eps=eps, k=top_k,
                                        previous=None, history=hist)
        # the reference: this row's float64 softmax, weighed as the metric weighs it
        mass, rows = softmax_mass(q, k, view.qw.view(B, 1), mask=mask), view.rows
        if history:
            mass = torch.nn.functional.pad(old_mass, (0, 1)) + mass
            rows = torch.nn.functional.pad(old_rows, (0, 1)) + rows
        seen = view.key_valid & (rows.amax(dim=1) > 0)
        scores, sinks, chosen = metric.select_sinks(mass, rows, seen, eps=eps, k=top_k,
                                                    per_layer=False)
        result = {"case": name,
                  "scores_max_diff": float((got.scores - scores).abs().max()),
                  "same_sinks": bool(torch.equal(got.sinks, sinks)),
                  "same_chosen": bool(torch.equal(got.chosen, chosen)),
                  "same_counts": (int(got.n_sinks), int(got.n_chosen)) == (int(sinks.sum()),
                                                                           int(chosen.sum())),
                  "history_max_diff": 0.0, "same_history_rows": True}
        if history:
            result.update(history_max_diff=float((got.history.mass - mass).abs().max()),
                          same_history_rows=bool(torch.equal(got.history.rows, rows)))
        yield result


if __name__ == "__main__":
    print_results(_results(), _edge_results())


def test_a_one_row_call_with_is_causal_is_out_of_the_kernels_scope():
    """SDPA's is_causal is aligned top-left: a one-row call over five keys sees key 0 only.
    The kernel reads a key-only mask and no is_causal, so such a call goes by parts."""
    def view(mask, causal):
        return MaskView(mask, causal, 2, 1, 5, torch.device("cpu"), None, "last_row", 256)

    key_pad = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    key_pad[1, ..., :2] = False
    assert decode_step.fits(view(None, False)) and decode_step.fits(view(key_pad, False))
    assert decode_step.fits(view(torch.zeros(2, 1, 1, 5), False))
    assert not decode_step.fits(view(None, True))
    assert not decode_step.fits(view(torch.ones(2, 4, 1, 5, dtype=torch.bool), False))  # head axis
