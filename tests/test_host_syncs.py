"""Host syncs of the intercept: on a GPU every tensor -> Python conversion (int(), bool(),
.item(), .tolist()) waits for the device, so the masked path makes none inside a forward pass
or between two of them (an unmasked decoding step waits on nothing either): the counters are
read back once, when the attach block ends or someone reads them.

Counted on CPU by wrapping the conversions and keeping those called from the intercept's modules.
"""

import collections
import sys

import pytest
import torch

from lm_eval_sinkmask import attention_view, chunked_attention, intercept, masking_stats
from lm_eval_sinkmask.config import SinkMaskConfig
from lm_eval_sinkmask.intercept import SinkMasker
from tests import tiny

CONVERSIONS = ("__int__", "__bool__", "__float__", "__index__", "item", "tolist")
# the modules that run inside every masked attention call
INTERCEPT_FILES = {m.__file__ for m in (intercept, attention_view, chunked_attention, masking_stats)}


@pytest.fixture
def syncs(monkeypatch):
    """Counter of the conversions made from the intercept's modules, by method name."""
    counts = collections.Counter()
    for name in CONVERSIONS:

        def counted(self, *args, _original=getattr(torch.Tensor, name), _name=name, **kwargs):
            if sys._getframe(1).f_code.co_filename in INTERCEPT_FILES:
                counts[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


def model_with(kind: str, layers: int) -> torch.nn.Module:
    config = tiny.build(kind).config
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    return type(tiny.build(kind))(config).eval()


def syncs_per_pass(model, config: SinkMaskConfig, syncs, passes: int = 3):
    """Conversions made in each forward pass, and the stats and events of the block;
    ``syncs`` holds those made when the block ended."""
    events = []
    per_pass = []
    ids = torch.randint(5, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), SinkMasker(config, observers=[events.append]).attach(model) as stats:
        for _ in range(passes):
            syncs.clear()
            model(ids)
            per_pass.append(dict(syncs))
        syncs.clear()
    return per_pass, stats, events


@pytest.fixture
def on_accelerator(monkeypatch):
    """The intercept's choices as on a GPU: the masked output from the fused kernel, and no
    host-side question that is free only on a CPU."""
    monkeypatch.setattr(intercept, "_output_from_scores", lambda device: False)
    monkeypatch.setattr(attention_view, "_host_reads_are_free", lambda device: False)


@pytest.mark.parametrize("detect", ["current", "previous"])
@pytest.mark.parametrize("kind", ["llama", "llada", "dream"])
def test_masked_passes_make_no_host_sync_and_the_block_one_whatever_the_depth(kind, detect, syncs,
                                                                                on_accelerator):
    config = SinkMaskConfig(top_k=2, eps=0.0, detect=detect)
    for layers in (2, 4):
        per_pass, stats, events = syncs_per_pass(model_with(kind, layers), config, syncs)
        # the fused kernel masks and the counts wait on the device: no pass reads anything
        assert per_pass == [{}] * 3, (layers, per_pass)
        assert dict(syncs) == {"tolist": 1}  # the end of the block settles them all at once
        assert stats.keys_masked > 0 and len(events) == 3 * layers


@pytest.mark.parametrize("kind", ["llama", "llada", "dream"])
def test_padded_passes_as_the_package_feeds_them_make_no_host_sync(kind, syncs, on_accelerator):
    """Left-padded prompts, each family's model inputs as the package builds them: LLaDA's key
    mask, Dream's square mask that hides pad rows too, Llama's causal mask with padding
    (transformers writes it out row by row). None of them may stall the device in a pass."""
    from lm_eval_sinkmask.families import FAMILIES

    model = model_with(kind, 2)
    ids = torch.randint(5, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    valid = torch.ones(2, 12, dtype=torch.long)
    valid[0, :4] = 0
    if kind == "llama":
        inputs, rule = {"input_ids": ids, "attention_mask": valid}, "last_row"
    else:
        inputs, rule = FAMILIES[kind].model_inputs(ids, valid), "all"
    assert inputs.get("attention_mask") is not None
    per_pass = []
    with torch.no_grad(), SinkMasker(SinkMaskConfig(top_k=2, eps=0.0), rule=rule).attach(
            model) as stats:
        for _ in range(3):
            syncs.clear()
            model(**inputs)
            per_pass.append(dict(syncs))
    assert per_pass == [{}] * 3 and stats.keys_masked > 0


@pytest.mark.parametrize("kind", ["llama", "llada", "dream"])
def test_on_a_cpu_masked_calls_ask_the_host_only_what_is_free_there(kind, syncs):
    """On a CPU a bool() costs no device wait: each masked call asks whether it masks any key
    (none: the model's own output), and the one-sweep path (mask last pass's sinks, detect
    this pass's) whether a row underflowed."""
    layers = 4
    per_pass, stats, _ = syncs_per_pass(model_with(kind, layers), SinkMaskConfig(top_k=2, eps=0.0), syncs)
    assert stats.keys_masked > 0
    assert per_pass[0] == {"__bool__": layers}  # first pass: detect and mask within it
    assert per_pass[1:] == [{"__bool__": 2 * layers}] * 2


def test_top_k_zero_makes_no_host_sync(syncs):
    per_pass, stats, _ = syncs_per_pass(model_with("llada", 2), SinkMaskConfig(top_k=0), syncs)
    assert per_pass == [{}] * 3 and dict(syncs) == {}
    assert stats.attention_calls == 6 and stats.keys_masked == 0


def counters_of_passes(config: SinkMaskConfig, passes: int, on_pass=None) -> dict:
    """as_dict of ``passes`` forward passes of a 3-layer Dream-style model in one block;
    ``on_pass(stats)`` after each pass."""
    model = model_with("dream", 3)
    ids = torch.randint(5, 50, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), SinkMasker(config).attach(model) as stats:
        for _ in range(passes):
            model(ids)
            if on_pass is not None:
                on_pass(stats)
    return stats.as_dict()


def test_a_long_block_settles_between_passes_once_enough_counts_wait(monkeypatch, syncs,
                                                                     on_accelerator):
    """The pending counts are bounded (a generation of thousands of steps must not hold a
    device scalar per call), settled only between passes, and come out the same as when
    every pass settles its own (the intercept's behaviour before it deferred them)."""
    config = SinkMaskConfig(top_k=2, eps=0.0)
    monkeypatch.setattr(intercept, "SETTLE_AT", 7)  # 3 calls per pass: settle after pass 3, 6
    waiting, per_pass = [], []

    def after_pass(stats):
        waiting.append(stats.pending)
        per_pass.append(dict(syncs))
        syncs.clear()

    bounded = counters_of_passes(config, 8, after_pass)
    assert waiting == [3, 6, 0, 3, 6, 0, 3, 6]
    assert per_pass == [{}, {}, {"tolist": 1}] * 2 + [{}, {}]
    monkeypatch.setattr(intercept, "SETTLE_AT", 1)  # every pass settles its own
    every_pass = counters_of_passes(config, 8)
    monkeypatch.setattr(intercept, "SETTLE_AT", masking_stats.SETTLE_AT)
    assert counters_of_passes(config, 8) == bounded == every_pass
    assert bounded["keys_masked"] > 0 and bounded["forward_passes"] == 8


@pytest.mark.parametrize("granularity", ["head", "layer"])
def test_deferred_counters_are_exact_integers_after_every_pass(granularity):
    model = model_with("dream", 3)
    heads = model.config.num_attention_heads
    events = []
    m = SinkMasker(SinkMaskConfig(top_k=2, eps=0.0, granularity=granularity), observers=[events.append])
    ids = torch.randint(5, 50, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), m.attach(model) as stats:
        for step in range(1, 4):
            model(ids)
            assert stats.pending == 3  # nothing settled by the pass itself
            # reading the per-layer counters settles them, in the middle of the block too
            for layer, c in stats.layers.items():
                mine = [e for e in events if e.layer == layer]
                masked = [int(e.blocked.sum()) * heads // e.blocked.shape[1] for e in mine]
                assert c.calls == step
                assert type(c.sinks_detected) is int and type(c.keys_masked) is int
                assert type(c.calls_masked) is int
                assert c.sinks_detected == sum(int(e.sinks.sum()) for e in mine)
                assert c.keys_masked == sum(masked) > 0
                assert c.calls_masked == sum(n > 0 for n in masked)
    d = stats.as_dict()
    assert d["keys_masked"] == stats.keys_masked == sum(c["keys_masked"] for c in d["per_layer"].values())
    assert masking_stats.MaskingStats.from_dict(d).as_dict() == d


def test_equality_and_repr_see_the_deferred_counts():
    """Two records of the same counts compare equal and print the same whether or not their
    deferred device counts have been settled: == and repr read what the counters hold."""
    def recorded(settled: bool) -> masking_stats.MaskingStats:
        stats = masking_stats.MaskingStats(forward_passes=1, attention_calls=1)
        counters = stats.layer(0)
        counters.calls += 1
        stats.defer_counts(counters, torch.tensor([True, False]).sum(),
                           torch.tensor([True, True]).sum(), per_key=2)
        if settled:
            stats.settle()
        return stats

    assert recorded(settled=False) == recorded(settled=True)
    assert repr(recorded(settled=False)) == repr(recorded(settled=True))
    assert "keys_masked=4" in repr(recorded(settled=False))
    other = recorded(settled=True)
    other.layer(0).keys_masked += 1
    assert recorded(settled=False) != other
