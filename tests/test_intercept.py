"""The SDPA intercept (docs/method.md section 3): what it masks, checked against independent recomputation."""

import math

import pytest
import torch
import torch.nn.functional as F

from lm_eval_sinkmask.config import SinkMaskConfig
from lm_eval_sinkmask import intercept
from lm_eval_sinkmask.attention_view import MaskView, Scores
from lm_eval_sinkmask.intercept import SinkMasker
from tests import tiny


def masker(**kw):
    events = []
    kw.setdefault("eps", 0.0)  # random-init models rarely clear eps=3; 0 always finds sinks
    m = SinkMasker(SinkMaskConfig(**kw), observers=[events.append])
    return m, events


class Recorder:
    """Wraps the intercepted SDPA to keep every call's inputs and the output it returned."""

    def __init__(self):
        self.calls = []

    def __enter__(self):
        self.inner = F.scaled_dot_product_attention

        def record(*args, **kwargs):
            out = self.inner(*args, **kwargs)
            self.calls.append((args, kwargs, out))
            return out

        F.scaled_dot_product_attention = record
        return self

    def __exit__(self, *exc):
        F.scaled_dot_product_attention = self.inner


def eager_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False, blocked=None):
    """Textbook attention with ``blocked`` keys given zero weight: the independent reference."""
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    s = (q.double() @ k.double().transpose(-1, -2)) * (scale or 1 / math.sqrt(q.shape[-1]))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else s + attn_mask.double()
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    visible = torch.isfinite(s)
    masked_rows = torch.zeros(s.shape[:-1], dtype=torch.bool)
    if blocked is not None:  # docs/method.md section 3: rows whose every visible key is blocked keep their scores
        b = blocked[:, :, None, :].expand_as(s)
        masked_rows = (visible & ~b).any(-1)
        s = s.masked_fill(b & masked_rows[..., None], -math.inf)
    probs = torch.softmax(s, -1).nan_to_num(0.0)
    return probs, (probs @ v.double()).to(q.dtype), masked_rows


class SDPALayer(torch.nn.Module):
    """An attention layer cut down to its one SDPA call, on the tensors it holds (assign ``q``,
    ``k``, ``v`` or ``sdpa_kwargs`` between calls): the masker hooks it as it hooks a model's
    layers. ``attention_mask``, the padding a masker reads from a model's inputs, goes unused."""

    def __init__(self, q, k, v, **sdpa_kwargs):
        super().__init__()
        self.q, self.k, self.v, self.sdpa_kwargs = q, k, v, sdpa_kwargs

    def forward(self, attention_mask=None):
        return F.scaled_dot_product_attention(self.q, self.k, self.v, **self.sdpa_kwargs)


def run_model(kind, model, masker_, ids, mask=None):
    from lm_eval_sinkmask.families import FAMILIES

    kwargs = {"input_ids": ids, "attention_mask": mask}
    if kind == "dream" and mask is not None:
        kwargs = FAMILIES["dream"].model_inputs(ids, mask)
    with torch.no_grad(), masker_.attach(model) as stats, Recorder() as rec:
        logits = model(**kwargs).logits
    return logits, stats, rec


@pytest.mark.parametrize("detect", ["current", "previous"])
def test_masked_output_equals_eager_attention_without_the_sinks(tiny_model, detect):
    kind, model = tiny_model
    ids = torch.randint(5, 50, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0  # left padding on the second element
    m, events = masker(top_k=2, detect=detect)
    _, stats, rec = run_model(kind, model, m, ids, mask)
    assert stats.attention_calls == len(rec.calls) == model.config.num_hidden_layers
    assert stats.keys_masked > 0
    for (args, kwargs, out), event in zip(rec.calls, events, strict=True):
        q, k, v = args[:3]
        call_kwargs = dict(zip(["attn_mask", "dropout_p", "is_causal"], args[3:]), **kwargs)
        blocked = event.blocked.expand(-1, q.shape[1], -1)
        probs, expected, _ = eager_attention(q, k, v, **call_kwargs, blocked=blocked)
        valid_rows = probs.sum(-1) > 0
        torch.testing.assert_close(out[valid_rows.unsqueeze(-1).expand_as(out)],
                                   expected[valid_rows.unsqueeze(-1).expand_as(expected)],
                                   atol=2e-5, rtol=1e-4)


def test_blocked_keys_have_exactly_zero_weight_in_the_returned_output():
    """Poisoning the values of masked keys with huge numbers must not change any output row
    that still has another visible key: their probability is exactly 0, not merely small."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 8)
    v = torch.randn(2, 3, 9, 8)

    attn = SDPALayer(q, k, v)
    m, events = masker(top_k=1, detect="current")
    with m.attach(attn):
        out = attn()
    blocked = events[0].blocked  # [2, 3, 9]
    assert (blocked.sum(-1) == 1).all()  # eps=0, top_k=1: one key per (element, head)
    poisoned = v.clone()
    poisoned[blocked.unsqueeze(-1).expand_as(v)] = 1e6
    m2, _ = masker(top_k=1, detect="current")
    attn.v = poisoned
    with m2.attach(attn):
        out2 = attn()
    assert torch.equal(out, out2)
    attn.v = torch.ones_like(v)
    with m2.attach(attn):  # and rows sum to one: all-ones values give all-ones output
        ones = attn()
    torch.testing.assert_close(ones, torch.ones_like(ones))


def test_top_k_zero_is_bit_identical_to_no_intercept(tiny_model):
    kind, model = tiny_model
    ids = torch.randint(5, 50, (2, 10))
    with torch.no_grad():
        plain = model(ids).logits
    m, _ = masker(top_k=0)
    with torch.no_grad(), m.attach(model) as stats:
        intercepted = model(ids).logits
    assert torch.equal(plain, intercepted)
    assert stats.attention_calls == model.config.num_hidden_layers and stats.keys_masked == 0


@pytest.mark.parametrize("detect", ["current", "previous"])
def test_a_call_that_masks_no_key_returns_the_models_own_output(tiny_model, detect):
    """top_k > 0 where no key clears eps (eps=1000): every call returns what top_k=0 returns,
    bit for bit, on every pass, padded or not, rather than the intercept's own recomputation."""
    kind, model = tiny_model
    ids = torch.randint(5, 50, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0
    for attention_mask in (None, mask):
        plain, _, _ = run_model(kind, model, masker(top_k=0)[0], ids, attention_mask)
        m, events = masker(top_k=1, eps=1000.0, detect=detect)
        with torch.no_grad(), m.attach(model) as stats:
            kwargs = {"input_ids": ids, "attention_mask": attention_mask}
            if kind == "dream" and attention_mask is not None:
                from lm_eval_sinkmask.families import FAMILIES
                kwargs = FAMILIES["dream"].model_inputs(ids, attention_mask)
            passes = [model(**kwargs).logits for _ in range(3)]
        assert stats.sinks_detected == 0 and len(events) == 3 * model.config.num_hidden_layers
        for logits in passes:
            assert torch.equal(logits, plain)


def test_detect_previous_masks_the_sinks_found_on_the_previous_pass(tiny_model):
    kind, model = tiny_model
    m, events = masker(top_k=1, detect="previous")
    with torch.no_grad(), m.attach(model):
        for seed in range(3):
            model(torch.randint(5, 50, (1, 10), generator=torch.Generator().manual_seed(seed)))
    n_layers = model.config.num_hidden_layers
    by_pass = [events[i * n_layers:(i + 1) * n_layers] for i in range(3)]
    for layer in range(n_layers):
        first = by_pass[0][layer]
        assert torch.equal(first.blocked, first.chosen)  # first pass: no t-1, uses its own
        for t in (1, 2):
            assert torch.equal(by_pass[t][layer].blocked, by_pass[t - 1][layer].chosen)


def test_state_does_not_leak_between_attach_blocks(tiny_model):
    kind, model = tiny_model
    ids = torch.randint(5, 50, (2, 10))
    padded = torch.ones(2, 10, dtype=torch.long)
    padded[0, :3] = 0  # the second block's first row: its first keys are padding, never sinks
    m, events = masker(top_k=3, detect="previous")
    run_model(kind, model, m, ids)
    run_model(kind, model, m, ids, padded)
    n = model.config.num_hidden_layers
    a, b = events[:n], events[n:]
    # the two blocks choose other keys, so a leaked choice would show
    assert all(not torch.equal(x.chosen, y.chosen) for x, y in zip(a, b, strict=True))
    for event in b:  # the second block starts afresh: its first pass masks its own choice
        assert torch.equal(event.blocked, event.chosen)


def test_granularity_layer_masks_the_same_keys_in_every_head(tiny_model):
    kind, model = tiny_model
    m, events = masker(top_k=2, granularity="layer", detect="current")
    _, stats, rec = run_model(kind, model, m, torch.randint(5, 50, (2, 10)))
    assert all(e.blocked.shape[1] == 1 for e in events)
    heads = model.config.num_attention_heads
    assert stats.keys_masked == sum(int(e.blocked.sum()) * heads for e in events) > 0
    for (args, kwargs, out), event in zip(rec.calls, events, strict=True):
        q, k, v = args[:3]
        call_kwargs = dict(zip(["attn_mask", "dropout_p", "is_causal"], args[3:]), **kwargs)
        blocked = event.blocked.expand(-1, q.shape[1], -1)  # the layer's keys, in every head
        _, expected, _ = eager_attention(q, k, v, **call_kwargs, blocked=blocked)
        torch.testing.assert_close(out, expected.to(out.dtype), atol=2e-5, rtol=1e-4)


def test_layers_subset_leaves_other_layers_untouched(tiny_model):
    kind, model = tiny_model
    m, events = masker(top_k=1, layers=(1,))
    with torch.no_grad(), m.attach(model) as stats:
        model(torch.randint(5, 50, (1, 10)))
    assert [e.layer for e in events] == [1]
    assert stats.layers[0].calls == 1 and stats.layers[0].keys_masked == 0
    assert stats.layers[1].keys_masked > 0


def test_gqa_as_enable_gqa_and_as_repeated_heads_agree():
    torch.manual_seed(1)
    q = torch.randn(1, 4, 7, 8)
    k, v = torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    k[:, :, 0] *= 5

    outs = []
    for attn in (SDPALayer(q, k, v, enable_gqa=True),
                 SDPALayer(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))):
        m, events = masker(top_k=1, detect="current")
        with m.attach(attn):
            outs.append(attn())
        assert events[0].blocked.sum() > 0
    torch.testing.assert_close(outs[0], outs[1])


@pytest.mark.parametrize("mask_kind", ["bool", "float", "causal"])
def test_model_masks_are_honoured(mask_kind):
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    kwargs = {
        "bool": {"attn_mask": causal},
        "float": {"attn_mask": torch.zeros(6, 6).masked_fill(~causal, float("-inf"))},
        "causal": {"is_causal": True},
    }[mask_kind]

    attn = SDPALayer(q, k, v, **kwargs)
    m, events = masker(top_k=1, detect="current")
    with m.attach(attn):
        out = attn()
    _, expected, _ = eager_attention(q, k, v, attn_mask=causal, blocked=events[0].blocked)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    # row 0 sees only key 0; if key 0 is blocked, that row keeps its scores (docs/method.md section 3)
    torch.testing.assert_close(out[:, :, 0], v[:, :, 0])


def test_arm_last_row_rule_detects_on_the_last_query_only():
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 1, 5, 8) for _ in range(3))

    events = []
    attn = SDPALayer(q, k, v, is_causal=True)
    m = SinkMasker(SinkMaskConfig(top_k=1, eps=0.0), rule="last_row", observers=[events.append])
    with m.attach(attn):
        attn()
    probs, _, _ = eager_attention(q, k, v, is_causal=True)
    expected = 5 * probs[0, 0, -1]
    torch.testing.assert_close(events[0].scores[0, 0], expected.float(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("granularity", ["head", "layer"])
def test_arm_all_rows_rule_counts_every_row_under_a_kv_cache(granularity):
    """The all_rows ARM rule (docs/method.md section 5): s_j = |K| * mean_{i >= j} A_ij over every causal row. A cached decode
    step computes only its new row; the scores must still be those of one uncached pass over
    the same tokens (earlier rows' attention does not change under a causal mask)."""
    model = tiny.build("llama").eval()
    ids = torch.randint(5, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    # nothing qualifies at this eps, so nothing is masked and every row's attention is unmasked
    config = SinkMaskConfig(top_k=1, eps=1e30, granularity=granularity)

    def scores_by_pass(run):
        events = []
        with torch.no_grad(), SinkMasker(config, rule="all_rows", observers=[events.append]).attach(model):
            run()
        return {(e.forward_pass, e.layer): e.scores for e in events}

    def cached():
        out = model(ids[:, :5], use_cache=True)
        for t in range(5, 9):
            out = model(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)

    steps = scores_by_pass(cached)
    for n_tokens, step in ((5, 1), (7, 3), (9, 5)):
        full = scores_by_pass(lambda: model(ids[:, :n_tokens]))
        for layer in range(model.config.num_hidden_layers):
            torch.testing.assert_close(steps[(step, layer)], full[(1, layer)], atol=1e-5, rtol=1e-4)
    # and it is not the last row alone: the last_row rule gives other scores at the last step
    last = []
    with torch.no_grad(), SinkMasker(config, rule="last_row", observers=[last.append]).attach(model):
        cached()
    assert not torch.allclose(last[-1].scores, steps[(5, 1)], atol=1e-3)


@pytest.mark.parametrize("rule", ["all_rows", "last_row"])
def test_a_static_kv_cache_is_refused_by_all_rows_only(rule):
    """A static cache gives every step keys of a fixed length, so the all_rows history cannot
    be extended: refused (it used to start over at every step, scoring the new row alone).
    last_row reads only the current row and masks the same keys as under the default cache."""
    model = tiny.build("llama").eval()
    ids = torch.randint(5, 40, (2, 7), generator=torch.Generator().manual_seed(1))

    def generate(**kw):
        m = SinkMasker(SinkMaskConfig(top_k=1, eps=0.0, arm_rule=rule), rule=rule)
        with torch.no_grad(), m.attach(model) as stats:
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=4, do_sample=False, pad_token_id=0, **kw)
        return out, stats.keys_masked

    dynamic, masked = generate()
    assert masked > 0
    if rule == "all_rows":
        with pytest.raises(ValueError, match="cache_implementation=static"):
            generate(cache_implementation="static")
    else:
        static, static_masked = generate(cache_implementation="static")
        assert torch.equal(static, dynamic) and static_masked == masked


def test_calls_outside_the_model_forward_are_untouched():
    q = k = v = torch.randn(1, 1, 4, 8)
    model = tiny.build("llada")
    m, _ = masker(top_k=1)
    with m.attach(model) as stats:
        out = F.scaled_dot_product_attention(q, k, v)  # not inside model.forward
    assert stats.attention_calls == 0
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v))
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


@pytest.mark.parametrize("kv_heads", [4, 1], ids=["mha", "gqa"])
def test_observers_get_each_query_heads_value_norms(kv_heads):
    """The sink traces' value-norm figures read these: the L2 norm of every key's value
    vector, per query head (a GQA key head's values repeated for each of its query heads)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 6, 8, generator=g)
    k, v = torch.randn(2, kv_heads, 6, 8, generator=g), torch.randn(2, kv_heads, 6, 8, generator=g)
    m, events = masker(top_k=1)
    layer = SDPALayer(q, k, v, enable_gqa=kv_heads < 4)
    with torch.no_grad(), m.attach(layer):
        layer()
    [event] = events
    expected = v.repeat_interleave(4 // kv_heads, 1).norm(dim=-1)
    torch.testing.assert_close(event.value_norms.float(), expected)


def test_a_failure_to_settle_the_counters_still_unhooks_the_model(monkeypatch):
    """Settling reads the device (a CUDA error can surface there): the patched SDPA and the
    hooks must go first, or the dead run would mask the model's next pass a second time."""
    from lm_eval_sinkmask.masking_stats import MaskingStats

    model = tiny.build("llada")
    m, _ = masker(top_k=1)

    def fail(self):
        raise RuntimeError("device lost")

    monkeypatch.setattr(MaskingStats, "settle", fail)
    with pytest.raises(RuntimeError, match="device lost"), m.attach(model):
        model(torch.tensor([[1, 2, 3]]))
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert m.extra_keys is None


def test_dropout_in_training_mode_is_refused():
    q = k = v = torch.randn(1, 1, 4, 8)

    attn = SDPALayer(q, k, v, dropout_p=0.1)
    m, _ = masker(top_k=1)
    with pytest.raises(ValueError, match="training mode"), m.attach(attn):
        attn()


# -- the fast paths: single sweep (detect=previous), fused masked output, folded key masks ----


def _two_pass_events(q_list, k, v, query_chunk, detect, **sdpa_kwargs):
    """Run an SDPA module once per query tensor inside one attach block; return the outputs
    and the events (the second pass of detect=previous takes the single-sweep path)."""
    attn = SDPALayer(None, k, v, **sdpa_kwargs)
    m, events = masker(top_k=2, detect=detect, query_chunk=query_chunk)
    outs = []
    with torch.no_grad(), m.attach(attn):
        for q in q_list:
            attn.q = q
            outs.append(attn())
    return outs, events


def _mask_forms():
    torch.manual_seed(5)
    B, S = 2, 9
    pad = torch.ones(B, S, dtype=torch.bool)
    pad[1, :3] = False  # left padding on the second element
    key_only = pad[:, None, None, :]
    per_row = key_only & pad[:, None, :, None]  # pads neither attend nor are attended (Dream)
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    return {
        "none": {},
        "bool_key": {"attn_mask": key_only},
        "bool_key_expanded": {"attn_mask": key_only.expand(B, 1, S, S)},
        "bool_key_materialised": {"attn_mask": key_only.expand(B, 1, S, S).clone()},
        "float_key": {"attn_mask": torch.zeros(B, 1, 1, S).masked_fill(~key_only, torch.finfo(torch.float32).min)},
        "bool_per_row": {"attn_mask": per_row},
        "float_per_row": {"attn_mask": torch.zeros(B, 1, S, S).masked_fill(~per_row, float("-inf"))},
        "causal": {"is_causal": True},
        "bool_causal_2d": {"attn_mask": causal},
    }


@pytest.mark.parametrize("form", list(_mask_forms()))
@pytest.mark.parametrize("detect", ["current", "previous"])
@pytest.mark.parametrize("query_chunk", [1, 4, 256])
@pytest.mark.parametrize("output_from_scores", [True, False], ids=["cpu_strategy", "gpu_strategy"])
def test_every_path_matches_eager_attention_without_the_blocked_keys(
    form, detect, query_chunk, output_from_scores, monkeypatch
):
    """Both output strategies (the sweep's own product on a CPU, the fused kernel with the
    blocked keys hidden on an accelerator) are checked here on the CPU."""
    monkeypatch.setattr(intercept, "_output_from_scores", lambda device: output_from_scores)
    kwargs = _mask_forms()[form]
    torch.manual_seed(6)
    B, H, S, D = 2, 3, 9, 8
    k, v = torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    k[:, :, 4] *= 4  # a strong key, so that sinks exist and change little between passes
    qs = [torch.randn(B, H, S, D) for _ in range(3)]
    outs, events = _two_pass_events(qs, k, v, query_chunk, detect, **kwargs)
    assert len(events) == 3 and all(int(e.blocked.sum()) > 0 for e in events)
    for i, (q, out, event) in enumerate(zip(qs, outs, events, strict=True)):
        if detect == "previous" and i > 0:
            assert torch.equal(event.blocked, events[i - 1].chosen)
        probs, expected, _ = eager_attention(q, k, v, **kwargs, blocked=event.blocked)
        rows = probs.sum(-1) > 0  # fully hidden rows: torch's SDPA gives 0 or nan there
        torch.testing.assert_close(out[rows], expected[rows], atol=2e-5, rtol=1e-4)
        # and the scores equal Eq. 3 on the model's own (unmasked) attention
        unmasked, _, _ = eager_attention(q, k, v, **kwargs)
        if "attn_mask" not in kwargs and not kwargs.get("is_causal"):
            expected_scores = unmasked.sum(-2) * S / S
            torch.testing.assert_close(event.scores, expected_scores.float(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("detect", ["current", "previous"])
def test_a_float_mask_hiding_pad_rows_with_minus_inf_detects_as_its_bool_form(detect):
    """A pad row that sees no key under a float mask of -inf (not finfo.min) must weigh
    nothing, as under the same mask in bool form: its NaN softmax once made every key's mass
    NaN, so the padded element found no sink and was never masked, and (detect=previous) the
    CPU output of its pad rows was NaN, where torch's own SDPA gives 0."""
    forms = _mask_forms()
    torch.manual_seed(6)
    B, H, S, D = 2, 3, 9, 8
    k, v = torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    k[:, :, 4] *= 4
    qs = [torch.randn(B, H, S, D) for _ in range(2)]
    got = {form: _two_pass_events(qs, k, v, 4, detect, **forms[form])
           for form in ("float_per_row", "bool_per_row")}
    (outs_f, ev_f), (outs_b, ev_b) = got["float_per_row"], got["bool_per_row"]
    assert int(ev_b[-1].blocked[1].sum()) > 0  # the padded element has sinks to mask
    for a, b in zip(ev_f, ev_b, strict=True):
        torch.testing.assert_close(a.scores, b.scores, atol=1e-6, rtol=1e-6)
        assert torch.equal(a.blocked, b.blocked)
    for a, b in zip(outs_f, outs_b, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("key, causal", [(2, False), (0, True)])
def test_dominant_sink_does_not_underflow_the_other_keys(key, causal):
    """A sink 200 nats above every other key: exp(s - rowmax) of the rest is 0 in float32, so
    the single sweep must fall back to the kept keys' own maximum, as the textbook masked
    softmax does, instead of returning 0/0. Under a causal mask with the usual sink, key 0
    (BOS), row 0 sees key 0 alone: it keeps its scores in that redo too (hidden, it is NaN)."""
    torch.manual_seed(7)
    B, H, S, D = 1, 2, 8, 4
    q = torch.randn(B, H, S, D)
    k, v = torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    q[..., 0] = 10.0
    k[..., 0] = 0.0
    k[:, :, key, 0] = 40.0  # the key scores 10 * 40 / 2 = 200 above the others in every row
    sdpa_kwargs = {"is_causal": True} if causal else {}
    outs, events = _two_pass_events([q, q], k, v, 3, "previous", **sdpa_kwargs)
    assert bool(events[1].blocked[:, :, key].all())
    _, expected, _ = eager_attention(q, k, v, blocked=events[1].blocked, **sdpa_kwargs)
    assert torch.isfinite(outs[1]).all()
    torch.testing.assert_close(outs[1], expected, atol=2e-5, rtol=1e-4)
    if causal:
        torch.testing.assert_close(outs[1][:, :, 0], v[:, :, 0])


def test_float32_inputs_are_not_copied_for_keys_and_values():
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    mask = MaskView(None, False, 1, 5, 5, q.device, None, "all", 256)
    sc = Scores(q, k, v, mask, None, False)
    assert sc.kt.data_ptr() == k.data_ptr() and sc.v.data_ptr() == v.data_ptr()
    assert mask.key_only and mask.key_bias is None


@pytest.mark.parametrize("detect", ["current", "previous"])
def test_autocast_does_not_lower_the_precision_of_detection_or_the_masked_output(detect):
    """lm-eval's mixed_precision_dtype runs the model under autocast; the intercept's scores
    and the CPU sweep's output are float32 math, which autocast had run in bfloat16 (scores
    off by ~1e-2 on this call, where float32 is exact to ~1e-6): the same bfloat16 inputs
    must give the same sinks and output with autocast on or off."""
    torch.manual_seed(0)
    B, H, S, D = 1, 4, 64, 32
    q, k, v = (torch.randn(B, H, S, D).bfloat16() for _ in range(3))
    k[:, :, 3] *= 3

    def run(autocast):
        attn, (m, events) = SDPALayer(q, k, v), masker(top_k=1, detect=detect)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), \
                m.attach(attn):
            outs = [attn(), attn()]
        return outs, events

    (outs_a, ev_a), (outs_f, ev_f) = run(True), run(False)
    for a, f in zip(ev_a, ev_f, strict=True):
        torch.testing.assert_close(a.scores, f.scores, atol=1e-6, rtol=1e-6)
        assert torch.equal(a.blocked, f.blocked)
    for a, f in zip(outs_a, outs_f, strict=True):
        torch.testing.assert_close(a, f, atol=0, rtol=0)


# -- Eq. 3 and the removal written out by hand, against the intercept under adversarial masks --


def one_call_by_hand(q, k, v, attn_mask, is_causal, token_valid, eps, top_k, scale=None):
    """docs/method.md sections 2-3 for one detect=current call, in float64 loops: Q = rows
    that see a key (and are not padding), K = non-padding keys some row of Q sees,
    s_j = |K| * sum_{i in Q} A_ij / |{i in Q : i sees j}|, Eq. 3 sinks, the top_k by score,
    and the output with them removed (a row left with no visible key keeps its scores).
    A float mask hides a key with -inf or finfo.min, as the models' masks do; ``scale``: the
    call's own, else 1/sqrt(head_dim), as SDPA's."""
    B, H, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = (q.double() @ k.double().transpose(-1, -2)) * scale
    visible = torch.ones(B, H, n_q, n_k, dtype=torch.bool)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        visible = visible & attn_mask
    elif attn_mask is not None:
        visible = visible & (attn_mask > torch.finfo(attn_mask.dtype).min / 2)
        logits = logits + attn_mask.double()
    if is_causal:  # torch aligns it top-left: row i sees keys 0..i, also when n_q < n_k
        visible = visible & torch.ones(n_q, n_k, dtype=torch.bool).tril()
    if token_valid is None:
        token_valid = torch.ones(B, n_k, dtype=torch.bool)
    probs = torch.softmax(logits.masked_fill(~visible, -math.inf), -1).nan_to_num(0.0)
    scores = torch.zeros(B, H, n_k, dtype=torch.float64)
    chosen = torch.zeros(B, H, n_k, dtype=torch.bool)
    sinks = torch.zeros_like(chosen)
    for b in range(B):
        Q = [i for i in range(n_q) if token_valid[b, n_k - n_q + i] and visible[b, :, i].any()]
        K = [j for j in range(n_k) if token_valid[b, j] and any(visible[b, :, i, j].any() for i in Q)]
        for h in range(H):
            for j in K:
                rows = [i for i in Q if visible[b, h, i, j]]
                if rows:
                    scores[b, h, j] = len(K) * sum(probs[b, h, i, j] for i in rows) / len(rows)
            for j in K:
                others = [scores[b, h, o] for o in K if o != j]
                sinks[b, h, j] = bool(others) and bool(scores[b, h, j] > sum(others) / len(others) + eps)
            ranked = sorted((j for j in K if sinks[b, h, j]), key=lambda j: -scores[b, h, j])
            chosen[b, h, ranked[:top_k]] = True
    keep = visible & ~chosen[:, :, None, :]
    keep = torch.where(keep.any(-1, keepdim=True), keep, visible)
    out = torch.softmax(logits.masked_fill(~keep, -math.inf), -1).nan_to_num(0.0) @ v.double()
    return scores, sinks, chosen, out, visible.any(-1)


def _adversarial_calls():
    """(q, k, v, SDPA kwargs, the forward's 2-D attention_mask or None) per case."""
    g = torch.Generator().manual_seed(11)
    B, H, S, D = 3, 2, 9, 8

    def qkv(n_q=S):
        q, k, v = torch.randn(B, H, n_q, D, generator=g), torch.randn(B, H, S, D, generator=g), \
            torch.randn(B, H, S, D, generator=g)
        k[:, :, 5] *= 3  # a strong key, so that sinks exist
        return q, k, v

    pad = torch.ones(B, S, dtype=torch.bool)
    pad[1, :4] = False
    pad[2, :] = False  # a batch row that is all padding
    key_pad = torch.zeros(B, 1, 1, S).masked_fill(~pad[:, None, None, :], torch.finfo(torch.float32).min)
    some_rows = torch.ones(B, 1, S, S, dtype=torch.bool)
    some_rows[:, :, :4, 5] = False  # the strong key hidden from rows 0-3 only
    some_rows[1, :, 7, :] = False  # a row that sees no key at all
    return {
        # LLaDA's finfo.min key bias: the padded row's softmax is uniform, yet it weighs nothing
        "float_min_padding_with_an_all_padding_row": (*qkv(), {"attn_mask": key_pad}, None),
        "key_hidden_from_some_rows_only": (*qkv(), {"attn_mask": some_rows}, None),
        # padding the model attends to, known only from the forward's attention_mask
        "padding_known_only_from_the_forward": (*qkv(), {}, pad.long()),
        # as under a KV cache; row 0 sees only key 0, a sink of element 2: it keeps its scores
        "causal_with_fewer_queries_than_keys": (*qkv(4), {"is_causal": True}, None),
    }


@pytest.mark.parametrize("case", list(_adversarial_calls()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("query_chunk", [2, 256])
def test_scores_sinks_and_output_match_eq3_written_out_by_hand(case, dtype, query_chunk):
    q, k, v, kwargs, forward_mask = _adversarial_calls()[case]
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if "attn_mask" in kwargs and kwargs["attn_mask"].is_floating_point():  # the dtype's own finfo.min
        kwargs = {"attn_mask": kwargs["attn_mask"].clamp(min=torch.finfo(dtype).min).to(dtype)}

    m, events = masker(top_k=2, eps=0.5, detect="current", query_chunk=query_chunk)
    attn = SDPALayer(q, k, v, **kwargs)
    with torch.no_grad(), m.attach(attn):
        out = attn(attention_mask=forward_mask)
    token_valid = None if forward_mask is None else forward_mask.bool()
    scores, sinks, chosen, expected, has_key = one_call_by_hand(
        q, k, v, kwargs.get("attn_mask"), kwargs.get("is_causal", False), token_valid, 0.5, 2)
    (event,) = events
    assert chosen.any() and (event.sinks == sinks).all()
    assert torch.equal(event.chosen, chosen) and torch.equal(event.blocked, chosen)
    torch.testing.assert_close(event.scores.double(), scores, atol=1e-5, rtol=1e-5)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double()[has_key], expected[has_key], atol=tol, rtol=tol)


# -- edge cases of the same, each one a plausible bug that the tests above let through --

# the two ways a masked output is made: the fused SDPA call with the blocked keys hidden
# (detect=current, and every call on an accelerator), and the detection sweep's own product
# (a CPU call that knows its blocked keys beforehand: detect=previous after its first pass)
OUTPUT_PATHS = ["fused", "sweep"]


def _masked_call(attn, path, monkeypatch, forward_kwargs=None, **config):
    """The event and the output of ``attn(**forward_kwargs)``'s last call along an output
    path (the sweep: a second identical pass of detect=previous, masking the first's sinks)."""
    monkeypatch.setattr(intercept, "_output_from_scores", lambda device: path == "sweep")
    m, events = masker(detect="current" if path == "fused" else "previous", **config)
    with torch.no_grad(), m.attach(attn):
        outs = [attn(**(forward_kwargs or {})) for _ in range(1 if path == "fused" else 2)]
    if path == "sweep":
        assert torch.equal(events[1].blocked, events[0].chosen)
    return events[-1], outs[-1]


def _by_hand_call(q, k, v, sdpa_kwargs, forward_mask, *, eps, top_k, path, monkeypatch):
    """One call through the intercept along an output path, and the same call by hand
    (:func:`one_call_by_hand`)."""
    event, out = _masked_call(SDPALayer(q, k, v, **sdpa_kwargs), path, monkeypatch,
                              {"attention_mask": forward_mask}, top_k=top_k, eps=eps)
    token_valid = None if forward_mask is None else forward_mask.bool()
    by_hand = one_call_by_hand(q, k, v, sdpa_kwargs.get("attn_mask"),
                               sdpa_kwargs.get("is_causal", False), token_valid, eps, top_k,
                               scale=sdpa_kwargs.get("scale"))
    return event, out, by_hand


def _assert_matches_by_hand(event, out, by_hand):
    scores, sinks, chosen, expected, has_key = by_hand
    assert chosen.any() and torch.equal(event.sinks, sinks) and torch.equal(event.chosen, chosen)
    torch.testing.assert_close(event.scores.double(), scores, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.double()[has_key], expected[has_key], atol=1e-5, rtol=1e-5)


def _strong_key_qkv(n_q=9, seed=12):
    g = torch.Generator().manual_seed(seed)
    B, H, S, D = 2, 2, 9, 8
    q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (n_q, S, S))
    k[:, :, 5] *= 3
    return q, k, v


@pytest.mark.parametrize("path", OUTPUT_PATHS)
def test_the_calls_own_scale_sets_the_scores_and_the_masked_output(path, monkeypatch):
    """A model that passes SDPA a scale of its own (not 1/sqrt(head_dim)) has its attention,
    hence its sinks and its masked output, at that scale, on both output paths."""
    q, k, v = _strong_key_qkv()
    _assert_matches_by_hand(*_by_hand_call(q, k, v, {"scale": 1.0}, None, eps=0.5, top_k=2,
                                           path=path, monkeypatch=monkeypatch))


def test_a_cached_step_reads_its_query_padding_from_the_end_of_the_forward_mask(monkeypatch):
    """Under a KV cache a decoding step's one query row is the last position of the forward's
    [B, past + 1] attention_mask, not the first: a left-padded element (first position a pad)
    must still detect on its new row."""
    q, k, v = _strong_key_qkv(n_q=1)
    pad = torch.ones(2, 9, dtype=torch.long)
    pad[1, :3] = 0
    event, out, by_hand = _by_hand_call(q, k, v, {}, pad, eps=0.5, top_k=2, path="fused",
                                        monkeypatch=monkeypatch)
    assert by_hand[2][1].any()  # the left-padded element has sinks of its own
    _assert_matches_by_hand(event, out, by_hand)


@pytest.mark.parametrize("form", ["key_only", "per_row"])
def test_keys_that_no_row_of_q_sees_are_left_out_of_k(form, monkeypatch):
    """Eq. 3's K is the real keys some row of Q sees: a key the forward's attention_mask calls
    real but the SDPA mask hides from every row is not one of them (|K| and the mean scores
    are over the others), whether the mask is one row for all or one per row."""
    q, k, v = _strong_key_qkv()
    visible = torch.ones(2, 1, 9, 9, dtype=torch.bool)
    visible[..., 0] = False  # key 0 hidden from every row
    if form == "key_only":
        visible = visible[..., :1, :]
    else:
        visible[..., 2, 7] = False  # rows differ: the mask cannot fold to one row
    event, out, by_hand = _by_hand_call(q, k, v, {"attn_mask": visible},
                                        torch.ones(2, 9, dtype=torch.long), eps=0.5, top_k=2,
                                        path="fused", monkeypatch=monkeypatch)
    _assert_matches_by_hand(event, out, by_hand)
    if form == "key_only":  # every row sees all of K: the scores average 1 over |K| = 8
        torch.testing.assert_close(event.scores.sum(-1), torch.full((2, 2), 8.0))


@pytest.mark.parametrize("form", ["none", "bool_key", "float_key", "bool_per_row", "causal"])
@pytest.mark.parametrize("path", OUTPUT_PATHS)
def test_rows_whose_every_visible_key_is_blocked_keep_their_scores(form, path, monkeypatch):
    """A negative eps can make every key a sink; with top_k covering them all, every row's
    visible keys are blocked, and each row keeps its scores (docs/method.md section 3): the
    output is the model's own, not a softmax over nothing (NaN) or a uniform average."""
    kwargs = _mask_forms()[form]
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 3, 9, 8) for _ in range(3))

    event, out = _masked_call(SDPALayer(q, k, v, **kwargs), path, monkeypatch, top_k=9, eps=-100.0)
    assert event.blocked.sum() == event.sinks.sum() > 0
    probs, expected, _ = eager_attention(q, k, v, **kwargs)
    rows = probs.sum(-1) > 0
    torch.testing.assert_close(out[rows], expected[rows], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("path", OUTPUT_PATHS)
def test_only_the_rows_whose_every_key_is_blocked_keep_their_scores(path, monkeypatch):
    """The rule holds per (element, head, row): in element 0's head 0, whose queries are zero
    (every score 1, all nine keys sinks at eps -0.5), every key is blocked and the rows keep
    their scores; in every other (element, head) one key outweighs the rest, is the only
    sink, and is hidden while the others stay."""
    g = torch.Generator().manual_seed(7)
    q = torch.ones(2, 2, 9, 8) + 0.1 * torch.randn(2, 2, 9, 8, generator=g)
    k, v = torch.randn(2, 2, 9, 8, generator=g) * 0.1, torch.randn(2, 2, 9, 8, generator=g)
    k[:, :, 3] = 1.5
    q[0, 0] = 0.0

    event, out = _masked_call(SDPALayer(q, k, v), path, monkeypatch, top_k=9, eps=-0.5)
    assert event.blocked[0, 0].all()
    assert event.blocked.sum(-1).tolist() == [[9, 1], [1, 1]]
    assert event.blocked[:, :, 3].all()
    _, expected, _ = eager_attention(q, k, v, blocked=event.blocked)
    torch.testing.assert_close(out, expected.float(), atol=2e-5, rtol=1e-4)
    _, unmasked, _ = eager_attention(q, k, v)
    torch.testing.assert_close(out[0, 0], unmasked[0, 0].float(), atol=2e-5, rtol=1e-4)


def _qkv_with_a_sink_at(key, batch, g):
    """q, k, v of 2 heads over 7 keys whose key ``key`` every query row attends to most:
    the queries share a direction that this key points along."""
    q = torch.randn(batch, 2, 7, 8, generator=g) + 1.0
    k, v = torch.randn(batch, 2, 7, 8, generator=g), torch.randn(batch, 2, 7, 8, generator=g)
    k[:, :, key] = 2.0
    return q, k, v


def test_detect_previous_starts_afresh_when_the_batch_size_changes():
    """Last pass's sinks belong to last pass's batch rows: a pass with another batch size (a
    smaller last batch, classifier-free guidance's doubled batch) detects on its own instead
    of broadcasting one row's sinks over the others."""
    g = torch.Generator().manual_seed(4)
    m, events = masker(top_k=1, detect="previous")
    attn = SDPALayer(None, None, None)
    with torch.no_grad(), m.attach(attn):
        attn.q, attn.k, attn.v = _qkv_with_a_sink_at(1, 1, g)
        attn()
        attn.q, attn.k, attn.v = _qkv_with_a_sink_at(5, 2, g)
        attn()
    first, second = events
    assert first.chosen[0, :, 1].all()
    assert torch.equal(second.blocked, second.chosen) and second.chosen[:, :, 5].all()


def test_a_new_attach_block_does_not_mask_the_last_blocks_sinks():
    """detect=previous state lives in one attach block: the next block's first pass (another
    request, with its sinks elsewhere) masks its own sinks, not the last block's."""
    g = torch.Generator().manual_seed(8)
    m, events = masker(top_k=1, detect="previous")
    attn = SDPALayer(None, None, None)
    for strong in (1, 5):
        attn.q, attn.k, attn.v = _qkv_with_a_sink_at(strong, 1, g)
        with torch.no_grad(), m.attach(attn):
            attn()
    first, second = events
    assert first.chosen[0, :, 1].all() and second.chosen[0, :, 5].all()
    assert torch.equal(second.blocked, second.chosen)


def test_a_real_row_that_sees_no_key_weighs_nothing(monkeypatch):
    """A row the forward calls real but the SDPA mask lets see no key has no attention to
    give: its softmax over nothing must not spread a uniform share over every key's mass."""
    q, k, v = _strong_key_qkv()
    visible = torch.ones(2, 1, 9, 9, dtype=torch.bool)
    visible[:, :, 3] = False
    event, out, by_hand = _by_hand_call(q, k, v, {"attn_mask": visible},
                                        torch.ones(2, 9, dtype=torch.long), eps=0.5, top_k=2,
                                        path="fused", monkeypatch=monkeypatch)
    _assert_matches_by_hand(event, out, by_hand)


def test_sdpa_arguments_are_read_by_name_however_the_model_passes_them():
    """Positional or keyword, a call's arguments land under SDPA's names with its defaults
    filled in, and a call SDPA itself would refuse raises the same TypeError."""
    from lm_eval_sinkmask.intercept import _sdpa_arguments

    q, k, v, m = object(), object(), object(), object()
    positional = _sdpa_arguments(q, k, v, m, 0.0, True, scale=0.5)
    keyword = _sdpa_arguments(query=q, key=k, value=v, attn_mask=m, is_causal=True, scale=0.5)
    assert positional == keyword == {"query": q, "key": k, "value": v, "attn_mask": m,
                                     "dropout_p": 0.0, "is_causal": True, "scale": 0.5,
                                     "enable_gqa": False}
    assert _sdpa_arguments(q, k, v)["attn_mask"] is None
    for bad_args, bad_kwargs in (((q, k), {}), ((q, k, v), {"mask": m}), ((q, k, v, m, 0.0, True, 0.5), {})):
        with pytest.raises(TypeError):
            _sdpa_arguments(*bad_args, **bad_kwargs)


# -- what a forward pass shares between its layers, and what a pass carries to the next ------


class _ManyMasks(torch.nn.Module):
    """Attention calls that share one forward pass but not one mask: a key-padding mask, a
    sliding window of another tensor (GQA), the padding mask again, is_causal with no mask,
    and a float bias read by the last ``bias_rows`` query rows. ``pad`` is edited in place
    between passes, the same tensor with other contents, as a model that reuses its mask
    buffer would. Under the all_rows rule a call of fewer rows than keys must continue a KV
    cache, which these passes are not: there the bias call reads every row."""

    def __init__(self, batch=2, seq=12, heads=4, dim=8, bias_rows=3):
        super().__init__()
        self.bias_rows = bias_rows
        g = torch.Generator().manual_seed(0)
        self.w = torch.randn(5, 3, heads * dim, heads * dim, generator=g) / dim ** 0.5
        self.heads, self.dim = heads, dim
        self.pad = torch.ones(batch, 1, 1, seq, dtype=torch.bool)
        rows, cols = torch.arange(seq)[:, None], torch.arange(seq)
        self.window = ((cols <= rows) & (cols > rows - 4))[None, None]
        self.bias = torch.zeros(batch, 1, 1, seq)

    def _qkv(self, layer, x, kv_heads):
        B, S, _ = x.shape
        q, k, v = (x @ self.w[layer, i] for i in range(3))
        q = q.view(B, S, self.heads, self.dim).transpose(1, 2)
        k, v = (t.view(B, S, self.heads, self.dim).transpose(1, 2)[:, :kv_heads] for t in (k, v))
        return q, k, v

    def forward(self, x):
        sdpa, h = F.scaled_dot_product_attention, self.heads
        out = [sdpa(*self._qkv(0, x, h), attn_mask=self.pad)]
        out.append(sdpa(*self._qkv(1, x, h // 2), attn_mask=self.window, enable_gqa=True))
        out.append(sdpa(*self._qkv(2, x, h), self.pad))
        out.append(sdpa(*self._qkv(3, x, h), is_causal=True))
        q, k, v = self._qkv(4, x, h)
        out.append(sdpa(q[:, :, -self.bias_rows:], k, v, attn_mask=self.bias))
        return sum(o.sum() for o in out)


def _many_masks_events(config, rule, passes=3, fresh_views=False, monkeypatch=None):
    if fresh_views:  # every call reads its mask anew: nothing shared between layers
        monkeypatch.setattr(MaskView, "fits", lambda self, *a: False)
    model = _ManyMasks(bias_rows=12 if rule == "all_rows" else 3)
    g = torch.Generator().manual_seed(1)
    m = SinkMasker(SinkMaskConfig(**config), rule=rule, observers=[])
    events = []
    m.observers.append(events.append)
    with torch.no_grad(), m.attach(model) as stats:
        for t in range(passes):
            model.pad[:] = torch.rand(model.pad.shape, generator=g) > 0.25 * t
            model.pad[..., 0] = True
            model.bias.copy_(torch.where(torch.rand(model.bias.shape, generator=g) > 0.3, 0.0,
                                         torch.finfo(torch.float32).min))
            if t == 2:
                m.set_extra_keys(torch.zeros(2, 12, dtype=torch.bool).index_fill_(1, torch.tensor([0]), True))
            model(torch.randn(2, 12, 32, generator=g))
    if fresh_views:
        monkeypatch.undo()
    return events, stats.as_dict()


@pytest.mark.parametrize("backend", ["materialized", "fused"])
@pytest.mark.parametrize("rule", ["all", "last_row", "all_rows"])
@pytest.mark.parametrize("config", [
    {"detect": "previous", "granularity": "head"},
    {"detect": "current", "granularity": "layer"},
    {"detect": "previous", "granularity": "layer", "sink_token": "exclude"},
    {"detect": "previous", "granularity": "head", "mask_target": "random"},
], ids=["previous-head", "current-layer", "previous-layer-exclude", "previous-random"])
def test_counts_shared_by_a_pass_are_those_each_call_would_make(config, rule, backend, monkeypatch):
    """The mask's view and its Eq. 3 key counts are made once and shared by the layers given
    the same mask in one pass; layers with another mask, another query length, GQA, or a mask
    tensor edited between passes must select exactly what a view of their own selects."""
    config = dict(top_k=2, eps=0.0, detect_backend=backend, **config)
    shared, shared_stats = _many_masks_events(config, rule)
    fresh, fresh_stats = _many_masks_events(config, rule, fresh_views=True, monkeypatch=monkeypatch)
    assert len(shared) == len(fresh) == 15
    for a, b in zip(shared, fresh, strict=True):
        for name in ("scores", "sinks", "chosen", "blocked"):
            assert torch.equal(getattr(a, name), getattr(b, name)), (a.forward_pass, a.layer, name)
    assert shared_stats == fresh_stats
    assert any(bool(e.blocked.any()) for e in shared)


@pytest.mark.parametrize("rule", ["all", "all_rows"])
@pytest.mark.parametrize("config", [
    {"detect": "previous", "granularity": "head"},
    {"detect": "current", "granularity": "head"},
    {"detect": "previous", "granularity": "layer", "sink_token": "exclude"},
    {"detect": "previous", "granularity": "head", "mask_target": "random"},
], ids=["previous-head", "current-head", "previous-layer-exclude", "previous-random"])
def test_the_stats_count_the_keys_each_call_blocked(config, rule):
    """The blocked keys' count a call records comes from the pass that chose them (detect=
    previous) or from this one: it must be the keys the call actually blocked, on the first
    pass, when the inputs change between passes, and when the batch size changes (a new
    batch starts afresh and blocks its own choice)."""
    model = _ManyMasks(batch=2, bias_rows=12 if rule == "all_rows" else 3)
    heads = model.heads
    events = []
    m = SinkMasker(SinkMaskConfig(top_k=2, eps=0.0, **config), rule=rule, observers=[events.append])
    g = torch.Generator().manual_seed(2)
    with torch.no_grad(), m.attach(model) as stats:
        for t in range(4):
            batch = 2 if t < 2 else 1
            if batch != model.pad.shape[0]:
                model.pad, model.bias = model.pad[:batch].clone(), model.bias[:batch].clone()
            model.pad[:] = torch.rand(model.pad.shape, generator=g) > 0.2
            model.pad[..., 0] = True
            if config.get("sink_token") == "exclude":
                # most keys: the sinks left to choose are then fewer than top_k
                m.set_extra_keys(torch.arange(12).expand(batch, 12) < 9)
            model(torch.randn(batch, 12, 32, generator=g))
    assert len(events) == 20 and stats.layers
    for layer, c in stats.layers.items():
        mine = [e for e in events if e.layer == layer]
        assert c.sinks_detected == sum(int(e.sinks.sum()) for e in mine)
        masked = [int(e.blocked.sum()) * heads // e.blocked.shape[1] for e in mine]
        assert c.keys_masked == sum(masked), layer
        assert c.calls_masked == sum(n > 0 for n in masked)
    assert stats.keys_masked > 0


@pytest.mark.parametrize("rule", ["last_row", "all_rows"])
@pytest.mark.parametrize("detect", ["previous", "current"])
def test_the_stats_count_the_keys_each_decoding_step_blocked(rule, detect):
    """Under a KV cache each step appends keys that the previous step's sinks know nothing
    of: the count carried over from the step that chose them must stay the keys this step
    blocked, the left-padded element of the batch included."""
    model = tiny.build("llama")
    heads = model.config.num_attention_heads
    events = []
    m = SinkMasker(SinkMaskConfig(top_k=2, eps=0.0, detect=detect), rule=rule,
                   observers=[events.append])
    ids = torch.randint(5, 50, (2, 7), generator=torch.Generator().manual_seed(3))
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :2] = 0
    with torch.no_grad(), m.attach(model) as stats:
        model.generate(ids, attention_mask=attention_mask, max_new_tokens=4, do_sample=False,
                       pad_token_id=0)
    assert stats.forward_passes == 4 and stats.keys_masked > 0
    for layer, c in stats.layers.items():
        mine = [e for e in events if e.layer == layer]
        assert c.sinks_detected == sum(int(e.sinks.sum()) for e in mine)
        assert c.keys_masked == sum(int(e.blocked.sum()) * heads // e.blocked.shape[1] for e in mine)


@pytest.mark.parametrize("path", OUTPUT_PATHS)
@pytest.mark.parametrize("sdpa_kwargs", [
    {"is_causal": True},
    {"attn_mask": torch.ones(10, 10, dtype=torch.bool).tril()},
    {"attn_mask": torch.rand(2, 1, 1, 10, generator=torch.Generator().manual_seed(0)) > 0.2},
], ids=["causal", "per_row_mask", "key_padding"])
def test_a_masked_output_is_laid_out_as_the_unmasked_one(path, sdpa_kwargs, monkeypatch):
    """Models project q/k/v as [B, S, H, D] and transpose them; SDPA then returns its output in
    [B, Sq, H, Dv] memory, and the model's transpose-and-reshape after the call is a view. A
    masked output made per query chunk in another layout costs a copy per layer there."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 10, 3, 8, generator=g).transpose(1, 2) for _ in range(3))
    k[:, :, 0] *= 6  # a key that draws the attention: a sink to mask

    plain = F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs)
    event, out = _masked_call(SDPALayer(q, k, v, **sdpa_kwargs), path, monkeypatch, top_k=1)
    assert bool(event.blocked.any())
    assert out.shape == plain.shape and out.stride() == plain.stride()


def test_detect_previous_starts_afresh_when_a_pass_has_fewer_keys():
    """Last pass's sinks index last pass's keys: a pass over fewer keys (another, shorter
    request in the same attach block) detects on its own, rather than masking the first
    keys of a choice cut to its length (a negative pad crops)."""
    g = torch.Generator().manual_seed(4)
    m, events = masker(top_k=1, detect="previous")
    attn = SDPALayer(None, None, None)
    with torch.no_grad(), m.attach(attn):
        attn.q, attn.k, attn.v = _qkv_with_a_sink_at(1, 1, g)  # 7 keys, sink at key 1
        attn()
        q, k, v = _qkv_with_a_sink_at(3, 1, g)
        attn.q, attn.k, attn.v = q[:, :, :5], k[:, :, :5], v[:, :, :5]  # 5 keys, sink at key 3
        attn()
    first, second = events
    assert first.chosen[0, :, 1].all() and second.chosen[0, :, 3].all()
    assert second.blocked.shape == second.chosen.shape
    assert torch.equal(second.blocked, second.chosen)


def test_a_half_precision_float_bias_is_kept_in_the_masked_output():
    """A float mask is a bias, not only 0 / finfo.min: in bfloat16 as in float32 the masked
    output adds it to the scores (treated as a bool mask, its values were dropped)."""
    g = torch.Generator().manual_seed(3)
    B, H, S, D = 2, 2, 9, 8
    q, k, v = (torch.randn(B, H, S, D, generator=g) for _ in range(3))
    k[:, :, 4] *= 4
    bias = torch.randn(B, 1, 1, S, generator=g) * 3  # finite, per key
    for dtype in (torch.float32, torch.bfloat16):
        qd, kd, vd, bd = q.to(dtype), k.to(dtype), v.to(dtype), bias.to(dtype)
        m, events = masker(top_k=1, detect="current")
        attn = SDPALayer(qd, kd, vd, attn_mask=bd)
        with torch.no_grad(), m.attach(attn):
            out = attn()
        (event,) = events
        assert event.blocked.any()
        _, expected, _ = eager_attention(qd, kd, vd, attn_mask=bd, blocked=event.blocked)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)


def test_the_sweeps_masked_output_has_the_calls_dtype(monkeypatch):
    """detect=previous on a CPU makes the masked output from its float32 probabilities: it
    must come back in the call's dtype, as SDPA's does (a bfloat16 model's next projection
    refuses a float32 input)."""
    monkeypatch.setattr(intercept, "_output_from_scores", lambda device: True)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 8, 8, generator=g).bfloat16() for _ in range(3))
    k[:, :, 2] *= 4
    outs, events = _two_pass_events([q, q], k, v, 3, "previous")
    assert events[1].blocked.any()
    plain = F.scaled_dot_product_attention(q, k, v)
    assert all(o.dtype == plain.dtype == torch.bfloat16 for o in outs)


def test_a_row_that_sees_no_key_stays_zero_when_the_underflow_redo_runs(monkeypatch):
    """A dominant sink makes the sweep redo its chunks with the kept keys' own maximum; a
    row the mask lets see no key must come out 0 there too, as from SDPA and from the sweep
    without the redo (it came out as the mean of the values)."""
    monkeypatch.setattr(intercept, "_output_from_scores", lambda device: True)
    torch.manual_seed(7)
    B, H, S, D = 1, 2, 8, 4
    q, k, v = torch.randn(B, H, S, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    q[..., 0], k[..., 0] = 10.0, 0.0
    k[:, :, 2, 0] = 40.0  # 200 nats above the rest: the others underflow next to it
    visible = torch.ones(B, 1, S, S, dtype=torch.bool)
    visible[:, :, 5] = False  # row 5 sees no key
    outs, events = _two_pass_events([q, q], k, v, 3, "previous", attn_mask=visible)
    assert bool(events[1].blocked[:, :, 2].all())
    plain = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
    assert torch.equal(plain[:, :, 5], torch.zeros_like(plain[:, :, 5]))
    assert torch.equal(outs[1][:, :, 5], torch.zeros_like(outs[1][:, :, 5]))
    probs, expected, _ = eager_attention(q, k, v, attn_mask=visible, blocked=events[1].blocked)
    rows = probs.sum(-1) > 0
    torch.testing.assert_close(outs[1][rows], expected[rows], atol=2e-5, rtol=1e-4)
