"""The fused detection paths (fused_mass, and flex_mass where said): the blocked two-pass
algorithm against the intercept's materialised probabilities, for every mask form the
intercept accepts.

On a CPU, ``detect_backend=fused`` runs the torch implementation of the kernels' algorithm
(the same tiles, the same two passes); the Triton kernels themselves are checked against it in
test_fused_mass_triton.py, under Triton's interpreter. ``detect_backend=flex`` runs flex's
eager implementation here (test_flex_mass.py has the rest of its tests).
"""

import math

import pytest
import torch

from lm_eval_sinkmask import flex_mass, fused_mass, intercept
from lm_eval_sinkmask.attention_view import MaskView, Scores
from lm_eval_sinkmask.config import SinkMaskConfig
from lm_eval_sinkmask.intercept import SinkMasker
from lm_eval_sinkmask.masking_stats import MaskingStats
from tests import tiny
from tests.test_intercept import SDPALayer

FLOAT_MIN = torch.finfo(torch.float32).min
# the paths that never hold the probabilities, each held against the materialised one
FUSED_BACKENDS = ["fused", pytest.param("flex", marks=pytest.mark.skipif(
    flex_mass.unavailable_reason() is not None, reason=f"detect_backend=flex was NOT checked: "
    f"{flex_mass.unavailable_reason()}"))]


def softmax_mass(q, k, w, scale=None, mask=None, is_causal=False, causal_offset=0):
    """sum_i w_i softmax(s_i) in float64, with every mask convention spelled out directly."""
    H = q.shape[1]
    k = k.repeat_interleave(H // k.shape[1], 1)
    s = (q.double() @ k.double().transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    n_q, n_k = s.shape[-2:]
    visible = torch.ones(n_q, n_k, dtype=torch.bool)
    if is_causal:
        visible = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + causal_offset
    if mask is not None:
        if mask.dtype == torch.bool:
            visible = visible & mask
        else:
            visible = visible & (mask > torch.finfo(mask.dtype).min / 2)
            s = s + mask.double()
    p = torch.softmax(s.masked_fill(~visible, -math.inf), -1).nan_to_num(0.0)
    return (p * w.double()[:, None, :, None]).sum(-2).float()


def _unit_cases(B=2, H=4, Sq=37, Sk=70):
    g = torch.Generator().manual_seed(0)
    bias = torch.randn(B, 1, Sq, Sk, generator=g)
    bias[1, :, :, :9] = FLOAT_MIN  # padded keys, LLaDA's additive form
    bias[0, :, 5] = FLOAT_MIN  # a row that sees no key
    rows = torch.rand(1, 1, Sq, Sk, generator=g) > 0.4
    cases = {
        "none": {},
        "float_key_bias": {"mask": bias[:, :, :1]},
        "float_per_row_with_dead_row": {"mask": bias},
        "float_1_1_S_S_bf16": {"mask": bias[:1].to(torch.bfloat16)},
        "bool_per_row": {"mask": rows},
        "bool_per_head": {"mask": torch.rand(B, H, Sq, Sk, generator=g) > 0.5},
        "causal_top_left": {"is_causal": True},
        "causal_offset": {"is_causal": True, "causal_offset": Sk - Sq},
        "causal_and_bool": {"is_causal": True, "causal_offset": 3, "mask": rows},
    }
    # masks the same for every query row beyond the float key bias (the fused kernels read
    # these as one row of keys): bool, with a head axis, with causal
    keys = torch.rand(B, 1, 1, Sk, generator=g) > 0.3
    cases.update({
        "bool_key": {"mask": keys},
        "float_key_per_head": {"mask": torch.randn(B, H, 1, Sk, generator=g)},
        "causal_and_bool_key": {"is_causal": True, "causal_offset": Sk - Sq, "mask": keys},
    })
    return cases


@pytest.mark.parametrize("case", list(_unit_cases()))
@pytest.mark.parametrize("gqa", [1, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("first_row", [0, 36])
def test_blocked_mass_is_the_weighted_softmax_column_sum(case, gqa, first_row):
    kw = _unit_cases()[case]
    g = torch.Generator().manual_seed(1)
    B, H, Sq, Sk, D = 2, 4, 37, 70, 24
    q = torch.randn(B, H, Sq, D, generator=g)
    k = torch.randn(B, H // gqa, Sk, D, generator=g)
    w = (torch.rand(B, Sq, generator=g) > 0.2).float()
    w[:, :first_row] = 0
    expected = softmax_mass(q, k, w, **kw)
    for bm, bn in ((64, 64), (16, 32), (7, 5)):  # tilings that split rows and keys unevenly
        got = fused_mass.blocked_column_mass(q, k, w, scale=D ** -0.5, first_row=first_row,
                                             block_m=bm, block_n=bn, **kw)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_column_mass_takes_the_calls_own_scale():
    """A model's own softmax scale (Gemma's query_pre_attn_scalar, muP) reaches the scores:
    the blocked tests above pass 1/sqrt(D) themselves, which a dropped scale would equal."""
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 4, 9, 16, generator=g), torch.randn(2, 2, 13, 16, generator=g)
    w = torch.ones(2, 9)
    for scale in (0.3, 1.0):
        got = fused_mass.column_mass(q, k, w, scale=scale, use_triton=False)
        torch.testing.assert_close(got, softmax_mass(q, k, w, scale=scale), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(fused_mass.column_mass(q, k, w, scale=0.3, use_triton=False),
                              softmax_mass(q, k, w))


def test_a_mask_has_rows_unless_every_query_row_reads_the_same_keys():
    """mask_has_rows reads the mask as given; it answers what the expanded [B, H, Sq, Sk] view
    the kernels read says (more than one row, and a stride along them)."""
    B, H, Sq, Sk = 2, 4, 37, 70
    masks = [c["mask"] for c in _unit_cases(B, H, Sq, Sk).values() if "mask" in c]
    masks += [torch.zeros(Sk), torch.zeros(Sq, Sk), torch.zeros(B, 1, 1, Sk).expand(B, H, Sq, Sk),
              torch.zeros(1, Sk).expand(Sq, Sk).bool()]
    for mask in masks:
        for n_q in (Sq, 2, 1):  # a call over all rows, a continuation of two, a decoding step
            m = mask if mask.shape[-2:-1] != (Sq,) or n_q == Sq else mask[..., -n_q:, :]
            expanded = fused_mass._mask_strides(m, B, H, n_q, Sk)[0]
            rows = expanded.shape[2] > 1 and expanded.stride(2) != 0
            assert fused_mass.mask_has_rows(m, n_q) == rows, (tuple(m.shape), m.stride(), n_q)
    assert fused_mass.mask_has_rows(masks[1], Sq)  # a bias per row
    assert not fused_mass.mask_has_rows(masks[0], Sq)  # LLaDA's padding bias [B, 1, 1, Sk]


# -- the intercept: fused detection against the materialised one -----------------------------


def _sdpa_forms():
    """SDPA arguments for every mask form, as (kwargs, key heads, query rows)."""
    g = torch.Generator().manual_seed(5)
    B, S = 2, 11
    pad = torch.ones(B, S, dtype=torch.bool)
    pad[1, :3] = False  # left padding on the second element
    key_only = pad[:, None, None, :]
    per_row = key_only & pad[:, None, :, None]  # Dream: pads neither attend nor are attended
    bias_rows = torch.randn(1, 1, S, S, generator=g)  # LLaDA-style [1, 1, S, S] float bias
    return {
        "none": ({}, 3, S),
        "bool_key": ({"attn_mask": key_only}, 3, S),
        "bool_key_expanded": ({"attn_mask": key_only.expand(B, 1, S, S)}, 3, S),
        "float_key_llada": ({"attn_mask": torch.zeros(B, 1, 1, S).masked_fill(~key_only, FLOAT_MIN)}, 3, S),
        "float_1_1_S_S": ({"attn_mask": bias_rows}, 3, S),
        "float_B_1_S_S": ({"attn_mask": bias_rows.masked_fill(~per_row, FLOAT_MIN)}, 3, S),
        "bool_per_row_dream": ({"attn_mask": per_row}, 3, S),
        "causal": ({"is_causal": True}, 3, S),
        "causal_kv_cache": ({"is_causal": True}, 3, 4),  # q_len < k_len (top-left, as SDPA)
        "bool_causal_2d": ({"attn_mask": torch.ones(S, S, dtype=torch.bool).tril()}, 3, S),
        "gqa": ({"enable_gqa": True}, 1, S),
        "gqa_bool_per_row": ({"enable_gqa": True, "attn_mask": per_row}, 1, S),
        "gqa_causal": ({"enable_gqa": True, "is_causal": True}, 1, S),
        "own_scale": ({"scale": 0.3}, 3, S),  # a model's own softmax scale, not 1/sqrt(D)
    }


def _events(backend, kwargs, kv_heads, n_q, *, rule="all", granularity="head", detect="previous",
            passes=3, extra_keys=None, sink_token="include", stats=None):
    torch.manual_seed(6)
    B, H, S, D = 2, 3, 11, 8
    k, v = torch.randn(B, kv_heads, S, D), torch.randn(B, kv_heads, S, D)
    k[:, :, 4] *= 4  # a strong key, so that sinks exist
    qs = [torch.randn(B, H, n_q, D) for _ in range(passes)]
    attn, events, outs = SDPALayer(None, k, v, **kwargs), [], []
    cfg = SinkMaskConfig(top_k=2, eps=0.0, detect=detect, granularity=granularity,
                         detect_backend=backend, sink_token=sink_token)
    m = SinkMasker(cfg, rule=rule, observers=[events.append])
    with torch.no_grad(), m.attach(attn) as run_stats:
        if stats is not None:
            stats.append(run_stats)
        for q in qs:
            attn.q = q
            if extra_keys is not None:
                m.set_extra_keys(extra_keys)
            outs.append(attn())
    return outs, events


def assert_same_detection(fused, materialized):
    (outs_f, ev_f), (outs_m, ev_m) = fused, materialized
    assert len(ev_f) == len(ev_m) > 0
    assert any(int(e.blocked.sum()) for e in ev_m), "nothing was masked: the test tests nothing"
    for a, b in zip(ev_f, ev_m, strict=True):
        torch.testing.assert_close(a.scores, b.scores, atol=1e-5, rtol=1e-5)
        assert torch.equal(a.sinks, b.sinks)
        assert torch.equal(a.chosen, b.chosen)
        assert torch.equal(a.blocked, b.blocked)
    for a, b in zip(outs_f, outs_m, strict=True):
        # rows that see no key are 0 on the CPU's output path; the fused SDPA kernel returns
        # what its mask form gives there (the intercept's GPU strategy, tested elsewhere)
        live = b.ne(0).any(dim=-1)
        torch.testing.assert_close(a[live], b[live], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
@pytest.mark.parametrize("form", list(_sdpa_forms()))
@pytest.mark.parametrize("rule", ["all", "last_row", "all_rows"])
def test_fused_detection_equals_the_materialised_one(form, rule, backend):
    kwargs, kv_heads, n_q = _sdpa_forms()[form]
    if rule == "all_rows" and n_q < 11:  # fewer rows than keys, with no earlier rows kept
        with pytest.raises(ValueError, match="does not extend the rows kept so far"):
            _events(backend, kwargs, kv_heads, n_q, rule=rule)
        return
    run = {b: _events(b, kwargs, kv_heads, n_q, rule=rule) for b in (backend, "materialized")}
    assert_same_detection(run[backend], run["materialized"])


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_all_rows_over_a_prefill_and_a_continuation_of_several_rows(backend):
    """A cached call of several rows after a prefill (a chunked prefill, or assisted
    decoding): its rows add to the history kept so far, the same on every backend."""
    torch.manual_seed(6)
    B, H, S, D = 2, 3, 11, 8
    q, k, v = torch.randn(B, H, S, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    k[:, :, 4] *= 4  # a strong key, so that sinks exist
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    steps = [(q[:, :, :7], k[:, :, :7], v[:, :, :7], causal[:7, :7]),
             (q[:, :, 7:], k, v, causal[7:])]  # 4 new rows over all 11 keys

    def run(name, calls):
        events, outs, attn = [], [], SDPALayer(None, None, None)
        cfg = SinkMaskConfig(top_k=2, eps=0.0, detect_backend=name)
        with torch.no_grad(), SinkMasker(cfg, rule="all_rows", observers=[events.append]).attach(attn):
            for qq, kk, vv, mask in calls:
                attn.q, attn.k, attn.v, attn.sdpa_kwargs = qq, kk, vv, {"attn_mask": mask}
                outs.append(attn())
        return outs, events

    fused, materialized = run(backend, steps), run("materialized", steps)
    assert_same_detection(fused, materialized)
    # the continuation scored keys over all 7 + 4 rows, as one uncached call over the 11 does
    # (detection reads unmasked attention, and these inputs do not depend on earlier masks)
    whole = run("materialized", [(q, k, v, causal)])[1][0].scores
    for events in (fused[1], materialized[1]):
        torch.testing.assert_close(events[-1].scores, whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
@pytest.mark.parametrize("form", ["none", "float_B_1_S_S", "causal", "gqa_bool_per_row"])
@pytest.mark.parametrize("detect", ["current", "previous"])
def test_fused_detection_per_layer_and_detect_modes(form, detect, backend):
    kwargs, kv_heads, n_q = _sdpa_forms()[form]
    run = {b: _events(b, kwargs, kv_heads, n_q, granularity="layer", detect=detect)
           for b in (backend, "materialized")}
    assert_same_detection(run[backend], run["materialized"])


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_fused_detection_with_the_extra_sink_token_excluded(backend):
    kwargs, kv_heads, n_q = _sdpa_forms()["float_key_llada"]
    extra = torch.zeros(2, 11, dtype=torch.bool)
    extra[:, 4] = True  # the strong key is the "extra sink token": scored, never chosen
    run = {b: _events(b, kwargs, kv_heads, n_q, extra_keys=extra, sink_token="exclude")
           for b in (backend, "materialized")}
    assert_same_detection(run[backend], run["materialized"])
    assert not any(bool(e.chosen[:, :, 4].any()) for e in run[backend][1])
    assert any(bool(e.sinks[:, :, 4].any()) for e in run[backend][1])


def _model_events(backend, kind, model, run, rule="all", **cfg):
    events = []
    config = SinkMaskConfig(top_k=2, eps=0.0, detect_backend=backend, **cfg)
    with torch.no_grad(), SinkMasker(config, rule=rule, observers=[events.append]).attach(model):
        logits = run()
    return [logits], events


def _padded_model_runs(kind, device="cpu", backends=("fused", "materialized")):
    """Both backends' (outputs, events, moved to the CPU) of one padded batch through a tiny
    model on ``device``."""
    from lm_eval_sinkmask.families import FAMILIES

    model = tiny.build(kind).eval().to(device)
    ids = torch.randint(5, 40, (3, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, :1] = 0
    kwargs = {"input_ids": ids, "attention_mask": mask}
    if kind == "dream":
        kwargs = FAMILIES["dream"].model_inputs(ids, mask)
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    rule = "all_rows" if kind == "llama" else "all"
    runs = {b: _model_events(b, kind, model, lambda: model(**kwargs).logits, rule=rule)
            for b in backends}
    cpu = lambda t: t.cpu()  # noqa: E731
    return {b: ([cpu(o) for o in outs],
                [type(e)(e.forward_pass, e.layer, *map(cpu, (e.scores, e.sinks, e.chosen, e.blocked)))
                 for e in events])
            for b, (outs, events) in runs.items()}


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
@pytest.mark.parametrize("kind", ["llama", "llada", "dream"])
def test_fused_detection_in_tiny_models_with_padding(kind, backend):
    """Padded keys and padded query rows as the models pass them (2-D mask to the model)."""
    run = _padded_model_runs(kind, backends=(backend, "materialized"))
    assert_same_detection(run[backend], run["materialized"])


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_fused_last_row_of_a_right_padded_batch(backend):
    """Right padding (lm-eval's log-likelihood batches) moves an element's last real row
    left of the call's last row: the paths that skip rows before the first row of Q must
    start at the earliest of them, or that element would score no key at all."""
    model = tiny.build("llama").eval()
    ids = torch.randint(5, 40, (2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0

    def run():
        return model(input_ids=ids, attention_mask=mask).logits

    got = {b: _model_events(b, "llama", model, run, rule="last_row")
           for b in (backend, "materialized")}
    assert all(bool(e.scores[1].sum() > 0) for e in got[backend][1])
    assert_same_detection(got[backend], got["materialized"])


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
@pytest.mark.parametrize("rule", ["last_row", "all_rows"])
@pytest.mark.parametrize("granularity", ["head", "layer"])
def test_fused_detection_across_kv_cached_decoding_steps(rule, granularity, backend):
    """Prefill then one-row steps with the KV cache: the all_rows counts carried across steps
    and the last_row rule on one query row give the same sinks on both paths."""
    model = tiny.build("llama").eval()
    ids = torch.randint(5, 40, (2, 9), generator=torch.Generator().manual_seed(0))

    def cached():
        out = model(ids[:, :5], use_cache=True)
        for t in range(5, 9):
            out = model(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
        return out.logits

    run = {b: _model_events(b, "llama", model, cached, rule=rule, granularity=granularity)
           for b in (backend, "materialized")}
    assert_same_detection(run[backend], run["materialized"])


def test_auto_keeps_the_materialised_path_on_cpu(monkeypatch):
    """The default (auto) never takes the fused path on a CPU: the tiny-zoo numbers stay
    those of the materialised sweep."""
    def refuse(*a, **k):
        raise AssertionError("fused detection used on CPU under detect_backend=auto")

    monkeypatch.setattr(fused_mass, "column_mass", refuse)
    kwargs, kv_heads, n_q = _sdpa_forms()["float_key_llada"]
    _, events = _events("auto", kwargs, kv_heads, n_q)
    assert events
    assert fused_mass.resolve("auto", torch.device("cpu")) == "materialized"
    assert fused_mass.resolve("fused", torch.device("cpu")) == "fused"
    assert fused_mass.resolve("materialized", torch.device("cuda")) == "materialized"


def _auto_on_a_gpu(monkeypatch, kernel):
    """detect_backend=auto as on a CUDA machine with Triton, with ``kernel`` standing in for
    the Triton column mass (whatever this environment's compiler would make of it)."""
    monkeypatch.setattr(fused_mass, "_CHECKED", {})
    monkeypatch.setattr(fused_mass, "resolve",
                        lambda backend, device: "fused" if backend == "auto" else backend)
    calls = []

    def column_mass(q, k, w, use_triton=None, scale=None, **kw):
        calls.append(use_triton)
        return kernel(q, k, w, scale=scale or q.shape[-1] ** -0.5, **kw)

    monkeypatch.setattr(fused_mass, "column_mass", column_mass)
    return calls


@pytest.mark.parametrize("fault", ["wrong", "raises"])
def test_auto_hands_a_failing_kernel_to_the_materialised_path(monkeypatch, caplog, fault):
    """auto picks the Triton kernels unasked, so their first call of each variant is checked
    against the torch reference: a kernel that disagrees or fails to build costs a warning,
    never a wrong sink, and that variant stays materialised (its kernel is not called again)."""
    def broken(q, k, w, **kw):
        if fault == "raises":
            raise RuntimeError("PTX assembly failed")
        return fused_mass.blocked_column_mass(q, k, w, **kw) * 1.5

    calls = _auto_on_a_gpu(monkeypatch, broken)
    form = _sdpa_forms()["causal"]
    stats = []
    with caplog.at_level("WARNING", logger=fused_mass.logger.name):
        auto = _events("auto", *form, stats=stats)
    assert calls == [True]
    warned = [r.getMessage() for r in caplog.records if "first-use check" in r.getMessage()]
    assert len(warned) == 1 and ("PTX" in warned[0] if fault == "raises" else "difference" in warned[0])
    assert stats[0].as_dict()["detection"] == {"materialized": 3}
    assert_same_detection(auto, _events("materialized", *form))


def test_auto_keeps_a_kernel_that_passes_its_check(monkeypatch):
    """A kernel that agrees with the reference serves every later call of its variant with no
    further reference computation; a new variant (here a bool mask) is checked once more."""
    calls = _auto_on_a_gpu(monkeypatch, fused_mass.blocked_column_mass)
    reference = []
    real = fused_mass.blocked_column_mass
    monkeypatch.setattr(fused_mass, "blocked_column_mass",
                        lambda *a, **k: reference.append(1) or real(*a, **k))
    stats = []
    causal = _events("auto", *_sdpa_forms()["causal"], stats=stats)
    assert calls == [True, None, None] and len(reference) == 1  # the first call's check
    assert stats[0].as_dict()["detection"] == {"fused": 3}
    assert_same_detection(causal, _events("materialized", *_sdpa_forms()["causal"]))
    _events("auto", *_sdpa_forms()["bool_per_row_dream"])
    assert calls[3:] == [True, None, None] and len(fused_mass._CHECKED) == 2


def test_counters_record_the_detection_path_that_ran():
    stats = []
    _events("materialized", *_sdpa_forms()["none"], stats=stats)
    _events("fused", *_sdpa_forms()["none"], stats=stats)
    merged = MaskingStats()
    for s in stats:
        merged.merge(MaskingStats.from_dict(s.as_dict()))
    assert merged.as_dict()["detection"] == {"fused": 3, "materialized": 3}


def test_merged_counters_are_the_sums_of_every_counter():
    """A run's report merges each request's counters: every field adds, layer by layer."""
    def stats(passes, calls, per_layer):
        return MaskingStats.from_dict({"forward_passes": passes, "attention_calls": calls,
                                       "detection": {"fused": calls}, "per_layer": per_layer})

    def layer(calls, sinks, keys, masked):
        return {"calls": calls, "sinks_detected": sinks, "keys_masked": keys,
                "calls_masked": masked}

    run = stats(1, 2, {"0": layer(2, 3, 4, 1)})
    run.merge(stats(2, 5, {"0": layer(3, 5, 7, 2), "1": layer(2, 1, 1, 1)}))
    assert run.as_dict() == {
        "forward_passes": 3, "attention_calls": 7, "sinks_detected": 9, "keys_masked": 12,
        "detection": {"fused": 7}, "per_layer": {"0": layer(5, 8, 11, 3), "1": layer(2, 1, 1, 1)}}


def test_detect_backend_is_validated_from_model_args():
    assert SinkMaskConfig.pop_from({"detect_backend": "fused"}).detect_backend == "fused"
    assert SinkMaskConfig().detect_backend == "auto"
    with pytest.raises(ValueError, match="detect_backend must be one of"):
        SinkMaskConfig.pop_from({"detect_backend": "flash"})
    assert "detect_backend" in SinkMaskConfig().as_dict()


def test_fused_path_makes_no_float32_copies_of_q_and_k():
    """The fused path reads the model's bf16 q and k as they are: the Scores float32 forms
    (and the GQA-expanded K) are never built."""
    q = torch.randn(1, 4, 6, 8, dtype=torch.bfloat16)
    k = torch.randn(1, 2, 6, 8, dtype=torch.bfloat16)
    mask = MaskView(None, False, 1, 6, 6, q.device, None, "all", 256)
    sc = Scores(q, k, k, mask, None, True)
    out, det, ran = intercept._detect(sc, 256, None, "fused")
    assert out is None and ran == "fused" and det.mass.shape == (1, 4, 6)
    assert not {"q", "kt", "v"} & set(vars(sc))


# -- the compiled selection of the fused CUDA path ----------------------------------------------


def test_selection_is_compiled_only_on_the_fused_cuda_path():
    from lm_eval_sinkmask import compiled_tail

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert compiled_tail.selector(cpu, True) is compiled_tail.select_and_count
    # the materialised path as it was: eager
    assert compiled_tail.selector(cuda, False) is compiled_tail.select_and_count
    assert compiled_tail.selector(cuda, True) is compiled_tail._COMPILED


def test_all_rows_counts_its_keys_inside_the_compiled_selection():
    """all_rows makes its key counts per call (its rows grow with the history): on the fused
    CUDA path they go into the compiled function with the rest of the selection, as all of
    select_sinks did before the counts were shared per pass, not ten eager launches before
    it; eager, the same results bit for bit as the counts made apart."""
    from lm_eval_sinkmask import compiled_tail
    from lm_eval_sinkmask.metric import key_counts

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert compiled_tail.selector(cuda, True, from_rows=True) is compiled_tail._COMPILED_FROM_ROWS
    assert compiled_tail._COMPILED_FROM_ROWS.eager is compiled_tail.select_and_count_from_rows
    for device, unmaterialized in ((cpu, True), (cuda, False)):
        assert compiled_tail.selector(device, unmaterialized, from_rows=True) \
            is compiled_tail.select_and_count_from_rows
    g = torch.Generator().manual_seed(0)
    mass, rows = torch.rand(2, 4, 30, generator=g) ** 4, torch.randint(0, 5, (2, 4, 30), generator=g)
    valid = torch.rand(2, 30, generator=g) > 0.1
    for per_layer in (False, True):
        got = compiled_tail.select_and_count_from_rows(mass, rows, valid, eps=0.5, k=2,
                                                       per_layer=per_layer)
        want = compiled_tail.select_and_count(mass, key_counts(rows, valid, per_layer=per_layer),
                                              eps=0.5, k=2, per_layer=per_layer)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_the_selection_counts_what_it_selected():
    """The two counts the stats keep per call come out of the selection (where compiling
    fuses their sums): select_sinks' own outputs, and their sums."""
    from lm_eval_sinkmask import compiled_tail
    from lm_eval_sinkmask.metric import key_counts, select_sinks

    g = torch.Generator().manual_seed(0)
    mass, rows = torch.rand(2, 4, 30, generator=g) ** 4, torch.full((2, 4, 30), 30)
    valid = torch.rand(2, 30, generator=g) > 0.1
    counts = key_counts(rows, valid, per_layer=False)
    scores, sinks, chosen, n_sinks, n_chosen = compiled_tail.select_and_count(
        mass, counts, eps=0.5, k=1, per_layer=False)
    want = select_sinks(mass, rows, valid, eps=0.5, k=1, per_layer=False)
    assert all(torch.equal(a, b) for a, b in zip((scores, sinks, chosen), want, strict=True))
    assert (int(n_sinks), int(n_chosen)) == (int(sinks.sum()), int(chosen.sum()))
    assert int(n_sinks) > int(n_chosen) > 0


@pytest.mark.slow
def test_compiled_selection_picks_exactly_the_eager_sinks():
    """torch.compile of the selection (here inductor's CPU backend; CUDA uses its Triton one)
    returns the eager scores, sinks, choices and counts bit for bit, across key counts (one
    dynamic graph) and with invalid keys and keys no row sees."""
    from lm_eval_sinkmask import compiled_tail
    from lm_eval_sinkmask.metric import key_counts

    compiled = compiled_tail._Compiled()
    from_rows = compiled_tail._Compiled(compiled_tail.select_and_count_from_rows)
    g = torch.Generator().manual_seed(0)
    for n_keys in (30, 31, 47):
        mass = torch.rand(2, 4, n_keys, generator=g) ** 4
        rows = torch.full((2, 4, n_keys), n_keys)
        rows[:, :, -3:] = 0
        valid = torch.ones(2, n_keys, dtype=torch.bool)
        valid[0, :2] = False
        counts = key_counts(rows, valid, per_layer=False)
        got = compiled(mass, counts, eps=0.5, k=3, per_layer=False)
        want = compiled_tail.select_and_count(mass, counts, eps=0.5, k=3, per_layer=False)
        assert not compiled.failed
        assert int(want[2].sum()) > 0
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
        # all_rows: the counts made inside the compiled function
        got = from_rows(mass, rows, valid, eps=0.5, k=3, per_layer=False)
        assert not from_rows.failed
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_selection_that_fails_to_compile_falls_back_to_eager_for_good(monkeypatch, caplog):
    """The fallback is remembered: the broken compiled function is tried once, warned about
    once, and compile_failed() says so (bench_masking flags its "compiled" rows with it)."""
    from lm_eval_sinkmask import compiled_tail

    tries = []

    def broken_compile(fn, **kwargs):
        def run(*args, **kw):
            tries.append(1)
            raise RuntimeError("no C compiler")
        return run

    monkeypatch.setattr(compiled_tail.torch, "compile", broken_compile)
    compiled = compiled_tail._Compiled(lambda x: x + 1)
    monkeypatch.setattr(compiled_tail, "_COMPILED", compiled)
    assert not compiled_tail.compile_failed()
    with caplog.at_level("WARNING", logger=compiled_tail.logger.name):
        assert [compiled(torch.tensor(i)).item() for i in range(3)] == [1, 2, 3]
    assert compiled.failed and compiled_tail.compile_failed() and len(tries) == 1
    assert sum("torch.compile of the sink selection failed" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_the_selection_leaves_the_shared_counts_as_it_found_them(backend):
    """A pass's KeyCounts serve every layer's selection, eager and compiled (dynamic shapes,
    the scores zeroed in place): no call may write into them, and each call's result is the
    eager one, for rows shared by the heads ([B, 1, Sk], the mask's) or per head, at both
    granularities and across key counts. aot_eager traces and functionalises the graph as
    inductor does on CUDA, without a compiler."""
    from lm_eval_sinkmask import compiled_tail
    from lm_eval_sinkmask.metric import key_counts

    torch._dynamo.reset()
    compiled = torch.compile(compiled_tail.select_and_count, dynamic=True, backend=backend)
    g = torch.Generator().manual_seed(0)
    for n_keys in (30, 31, 47):
        for heads_of_rows in (1, 4):
            rows = torch.randint(0, 4, (2, heads_of_rows, n_keys), generator=g)
            valid = torch.rand(2, n_keys, generator=g) > 0.1
            for per_layer in (False, True):
                counts = key_counts(rows, valid, per_layer=per_layer)
                before = [t.clone() for t in counts]
                for _ in range(2):  # a second layer of the pass, the same counts
                    mass = torch.rand(2, 4, n_keys, generator=g) ** 4
                    got = compiled(mass, counts, eps=0.5, k=3, per_layer=per_layer)
                    want = compiled_tail.select_and_count(mass, counts, eps=0.5, k=3,
                                                          per_layer=per_layer)
                    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
                    assert all(torch.equal(a, b) for a, b in zip(counts, before, strict=True))
    torch._dynamo.reset()


# -- on a CUDA machine: the compiled kernels (skipped on CPU-only machines such as CI) ---------

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or not fused_mass.triton_runs_on(torch.device("cuda")),
    reason="no CUDA device with Triton here: the compiled kernels are checked on a GPU machine "
           "(the interpreter checks the same kernels in test_fused_mass_triton.py)")


@needs_cuda
@pytest.mark.parametrize("case", list(_unit_cases()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("gqa", [1, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("first_row", [0, 36])
def test_cuda_kernels_match_the_torch_blocked_algorithm(case, dtype, gqa, first_row):
    kw = {k: (v.cuda() if isinstance(v, torch.Tensor) else v)
          for k, v in _unit_cases()[case].items()}
    g = torch.Generator().manual_seed(1)
    B, H, Sq, Sk, D = 2, 4, 37, 70, 24
    q = torch.randn(B, H, Sq, D, generator=g).to("cuda", dtype)
    k = torch.randn(B, H // gqa, Sk, D, generator=g).to("cuda", dtype)
    w = (torch.rand(B, Sq, generator=g) > 0.2).float().cuda()
    w[:, :first_row] = 0
    for bm, bn in ((64, 64), (16, 32)):
        ref = fused_mass.blocked_column_mass(q, k, w, scale=D ** -0.5, first_row=first_row,
                                             block_m=bm, block_n=bn, **kw)
        got = fused_mass.column_mass(q, k, w, scale=D ** -0.5, first_row=first_row,
                                     use_triton=True, block_m=bm, block_n=bn, **kw)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@needs_cuda
@pytest.mark.parametrize("kind", ["llama", "llada", "dream"])
def test_cuda_fused_detection_masks_what_the_materialised_path_masks(kind):
    run = _padded_model_runs(kind, "cuda")
    assert_same_detection(run["fused"], run["materialized"])


@pytest.mark.parametrize("faulty", ["causal", "gqa", "short", "short_at_the_limit"])
def test_auto_checks_each_variant_on_its_first_call_whatever_passed_before(monkeypatch, faulty):
    """A compiler may get one variant of the kernels wrong and the others right: a causal, a
    GQA or a short-tile call is checked on its own first call after a plain call passed (a
    call of exactly SHORT_BLOCK_M rows from first_row on takes the short tiles too)."""
    n, short = fused_mass.SHORT_BLOCK_M + 8, fused_mass.SHORT_BLOCK_M
    rows = {"short": 4, "short_at_the_limit": short}.get(faulty, 0)

    def kernel(q, k, w, **kw):  # wrong only on the faulty variant's calls
        mass = fused_mass.blocked_column_mass(q, k, w, **kw)
        wrong = {"causal": kw.get("is_causal", False), "gqa": k.shape[1] != q.shape[1]}.get(
            faulty, q.shape[-2] - kw.get("first_row", 0) <= short)
        return mass * 2 if wrong else mass

    calls = _auto_on_a_gpu(monkeypatch, kernel)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, n, 16, generator=g), torch.randn(1, 4, 40, 16, generator=g)
    w = torch.ones(1, n)
    assert fused_mass.checked_column_mass(q, k, w) is not None
    last_rows = w.clone()
    last_rows[:, :n - rows] = 0
    faulty_call = {"causal": lambda: fused_mass.checked_column_mass(q, k, w, is_causal=True),
                   "gqa": lambda: fused_mass.checked_column_mass(q, k[:, :2], w)}.get(
        faulty, lambda: fused_mass.checked_column_mass(q, k, last_rows, first_row=n - rows))
    assert faulty_call() is None and calls == [True, True]


def test_auto_checks_a_kernel_in_the_units_eps_is_set_in(monkeypatch):
    """One row over many keys: each key's mass is about 1/|K|, so a kernel off by 9e-4 of mass
    on every third key moves those scores by about half a uniform share (eps is in shares).
    The first-use check must see that, and hand the variant to the materialised path."""
    def off(q, k, w, **kw):
        mass = fused_mass.blocked_column_mass(q, k, w, **kw)
        mass[..., ::3] += 9e-4
        return mass

    calls = _auto_on_a_gpu(monkeypatch, off)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 1, 16, generator=g), torch.randn(1, 2, 512, 16, generator=g)
    assert fused_mass.checked_column_mass(q, k, torch.ones(1, 1)) is None
    assert calls == [True]
    monkeypatch.setattr(fused_mass, "_CHECKED", {})
    _auto_on_a_gpu(monkeypatch, fused_mass.blocked_column_mass)
    assert fused_mass.checked_column_mass(q, k, torch.ones(1, 1)) is not None
