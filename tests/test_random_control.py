"""``mask_target=random``, the matched control of sink masking: as many keys as the sinks, never a
sink, drawn uniformly and reproducibly; masked exactly as sinks are."""

import pytest
import torch
import torch.nn.functional as F

from lm_eval_sinkmask.config import SinkMaskConfig
from lm_eval_sinkmask.metric import top_k_sinks
from lm_eval_sinkmask.random_control import key_draws, random_non_sinks, row_seeds, row_tokens
from tests.test_intercept import SDPALayer, eager_attention, masker, run_model


def test_the_draw_matches_the_sink_count_and_never_takes_a_sink_or_an_ineligible_key():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(3, 4, 20, generator=g)
    is_sink = torch.rand(3, 4, 20, generator=g) < 0.3
    eligible = torch.rand(3, 1, 20, generator=g) < 0.8  # padding: per element, all heads
    is_sink &= eligible
    chosen = top_k_sinks(scores, is_sink, 3)
    drawn = random_non_sinks(chosen, is_sink, eligible, torch.rand(3, 4, 20, generator=g))
    assert not (drawn & is_sink).any() and not (drawn & ~eligible).any()
    candidates = (eligible & ~is_sink).sum(-1)
    assert torch.equal(drawn.sum(-1), torch.minimum(chosen.sum(-1), candidates))
    # fewer candidates than sinks chosen: every candidate
    few = torch.zeros(1, 1, 6, dtype=torch.bool)
    few[..., :2] = True
    sinks = ~few
    assert torch.equal(random_non_sinks(top_k_sinks(torch.rand(1, 1, 6), sinks, 3), sinks,
                                        torch.ones_like(few), torch.rand(1, 1, 6)), few)


def test_the_draw_is_uniform_over_the_candidates():
    g = torch.Generator().manual_seed(1)
    n_draws, keys = 20_000, 10
    is_sink = torch.zeros(n_draws, keys, dtype=torch.bool)
    is_sink[:, [0, 3]] = True
    chosen = is_sink.clone()  # two sinks chosen per row: two non-sinks drawn
    drawn = random_non_sinks(chosen, is_sink, torch.ones_like(is_sink),
                             torch.rand(n_draws, keys, generator=g))
    freq = drawn.float().mean(0)
    assert freq[[0, 3]].eq(0).all()
    # each of the 8 candidates has probability 2/8; binomial sd over 20k rows is 0.003
    torch.testing.assert_close(freq[[1, 2, 4, 5, 6, 7, 8, 9]], torch.full((8,), 0.25),
                               atol=0.015, rtol=0)


def test_a_rows_draws_ignore_its_padding_and_its_batch_mates():
    doc, other = [7, 8, 9], [1, 2, 3, 4, 5]
    seen = torch.tensor([[True] * 5, [False, False, True, True, True]])  # doc left-padded
    batched = key_draws(seen, 3, row_seeds(0, [other, doc], 2), step=2, layer=1)
    alone = key_draws(torch.ones(1, 3, dtype=torch.bool), 3, row_seeds(0, [doc], 1), 2, 1)
    assert torch.equal(batched[1, :, 2:], alone[0]) and batched[1, :, :2].eq(2).all()
    assert alone.lt(1).all() and alone.ge(0).all()
    # another pass, layer, mask_seed or document draws afresh
    for seed, rows, step, layer in [(0, [doc], 3, 1), (0, [doc], 2, 0), (1, [doc], 2, 1),
                                    (0, [[7, 8, 10]], 2, 1)]:
        again = key_draws(torch.ones(1, 3, dtype=torch.bool), 3, row_seeds(seed, rows, 1), step, layer)
        assert not torch.equal(again, alone)


def test_row_seeds_follow_the_declared_rows():
    rows = [[5, 6], [1, 2, 3]]
    # a row's seed follows its tokens and mask_seed, not its place in the batch
    assert row_seeds(0, rows, 2) == row_seeds(0, rows[::-1], 2)[::-1] != row_seeds(1, rows, 2)
    doubled = row_seeds(0, rows, 4)  # classifier-free guidance: two copies of every row
    assert doubled[:2] == row_seeds(0, rows, 2) and len(set(doubled)) == 4
    with pytest.raises(ValueError, match="batch 3 for 2 declared rows"):
        row_seeds(0, rows, 3)
    assert len(set(row_seeds(0, None, 3))) == 3  # undeclared: by position in the batch
    ids = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4]])
    assert row_tokens(ids, torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])) == [[5, 6], [1, 2, 3, 4]]
    assert row_tokens(ids) == ids.tolist()


@pytest.mark.parametrize("detect", ["current", "previous"])
def test_in_the_model_it_masks_as_many_non_sink_keys_as_the_sinks_and_nothing_else(tiny_model, detect):
    kind, model = tiny_model
    ids = torch.randint(5, 50, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0  # padded keys are never drawn
    m, events = masker(top_k=2, detect=detect, mask_target="random")
    _, stats, rec = run_model(kind, model, m, ids, mask)
    assert stats.keys_masked > 0
    for (args, kwargs, out), e in zip(rec.calls, events, strict=True):
        # this pass's draw: same count as the top-2 sinks of each (element, head), no sink
        assert not (e.chosen & e.sinks).any()
        assert torch.equal(e.chosen.sum(-1), top_k_sinks(e.scores, e.sinks, 2).sum(-1))
        assert not e.chosen[1, :, :3].any()
        # and the keys are removed exactly as sinks would be
        q, k, v = args[:3]
        call_kwargs = dict(zip(["attn_mask", "dropout_p", "is_causal"], args[3:]), **kwargs)
        probs, expected, _ = eager_attention(q, k, v, **call_kwargs,
                                             blocked=e.blocked.expand(-1, q.shape[1], -1))
        rows = (probs.sum(-1) > 0).unsqueeze(-1).expand_as(out)
        torch.testing.assert_close(out[rows], expected[rows], atol=2e-5, rtol=1e-4)


def test_the_draw_is_reproducible_by_mask_seed(tiny_model):
    kind, model = tiny_model
    ids = torch.randint(5, 50, (2, 16), generator=torch.Generator().manual_seed(0))

    def keys(seed):
        m, events = masker(top_k=3, detect="current", mask_target="random", mask_seed=seed)
        logits, _, _ = run_model(kind, model, m, ids)
        return logits, torch.stack([e.blocked for e in events])

    (a, ka), (b, kb), (_, kc) = keys(0), keys(0), keys(1)
    assert torch.equal(a, b) and torch.equal(ka, kb)
    assert not torch.equal(ka, kc)


def test_the_extra_sink_token_stays_out_of_the_draw_when_excluded():
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 3, 9, 8) for _ in range(3))
    extra = torch.zeros(2, 9, dtype=torch.bool)
    extra[:, 0] = True
    attn = SDPALayer(q, k, v)
    for seed in range(20):
        m, events = masker(top_k=4, detect="current", mask_target="random", mask_seed=seed,
                           sink_token="exclude")
        with m.attach(attn):
            m.set_extra_keys(extra)
            attn()
        assert not events[0].blocked[:, :, 0].any()


def test_each_pass_and_layer_draws_afresh_in_the_masker():
    """The same attention call twice per pass, in two passes: the sinks are the same four
    times, the random keys drawn for them must not be (one draw reused across passes or
    layers would make the control mask fixed keys, as sinks are)."""
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))

    class TwoLayers(torch.nn.Module):
        def forward(self):
            return [F.scaled_dot_product_attention(q, k, v) for _ in range(2)]

    model = TwoLayers()
    m, events = masker(top_k=3, detect="current", mask_target="random")
    with m.attach(model):
        model()
        model()
    assert [(e.forward_pass, e.layer) for e in events] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(torch.equal(e.sinks, events[0].sinks) for e in events) and events[0].sinks.any()
    drawn = [e.chosen for e in events]
    assert not torch.equal(drawn[0], drawn[1])  # another layer, same pass
    assert not torch.equal(drawn[0], drawn[2])  # the same layer, next pass
    assert all(torch.equal(d.sum(-1), drawn[0].sum(-1)) for d in drawn)


def test_a_row_short_of_candidates_draws_none_of_its_padding():
    """Every visible key is a sink (eps -100): no key is left to draw, and the padding keys,
    which are not sinks, must not be drawn in their place."""
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 3, 7, 8) for _ in range(3))
    visible = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    visible[1, ..., :2] = False  # element 1 left-padded by two keys
    attn = SDPALayer(q, k, v, attn_mask=visible)
    m, events = masker(top_k=2, eps=-100.0, detect="current", mask_target="random")
    with m.attach(attn) as stats:
        attn()
    (event,) = events
    assert event.sinks[1, :, 2:].all() and not event.sinks[1, :, :2].any()
    assert not event.chosen.any() and stats.keys_masked == 0


@pytest.mark.parametrize("bad, message", [
    ({"mask_target": "sink"}, "mask_target must be one of"),
    ({"mask_seed": -1}, "mask_seed must be an integer >= 0"),
])
def test_bad_values_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        SinkMaskConfig(top_k=1, **bad)


def test_model_args_strings_become_the_config():
    kwargs = {"top_k": 5, "mask_target": "random", "mask_seed": "3", "pretrained": "x"}
    config = SinkMaskConfig.pop_from(kwargs)
    assert (config.mask_target, config.mask_seed) == ("random", 3) and kwargs == {"pretrained": "x"}
    assert config.as_dict()["mask_target"] == "random"


def test_each_head_draws_its_own_keys():
    """The draws are per (batch element, head): heads with the same candidates must not
    mask the same random keys in lockstep."""
    d = key_draws(torch.ones(2, 16, dtype=torch.bool), 4, row_seeds(0, [[1, 2], [3]], 2), 1, 0)
    for b in range(2):
        assert len({tuple(d[b, h].tolist()) for h in range(4)}) == 4


def test_no_two_pass_layer_pairs_share_a_stream():
    """(pass, layer) pairs with equal sums, e.g. (1, 1) and (2, 0), draw afresh too."""
    seen = torch.ones(1, 12, dtype=torch.bool)
    seeds = row_seeds(0, [[5, 6, 7]], 1)
    draws = {(s, l): key_draws(seen, 2, seeds, s, l) for s in range(1, 4) for l in range(3)}
    keys = list(draws)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            assert not torch.equal(draws[a], draws[b]), (a, b)


@pytest.mark.parametrize("target,said", [("random", "mask_target=random, mask_seed=2)"),
                                         ("sinks", "granularity=head)")])
def test_the_run_summary_says_when_the_keys_were_random(tiny_dirs, caplog, target, said):
    """The summary line is how a log tells the control run from the sinks run."""
    import logging

    from tests.test_models import RANDOM_LLADA, make, requests

    lm = make("dlm_sinkmask", tiny_dirs["llada"], top_k=1, eps=0.0, block_length=4,
              mask_target=target, **({"mask_seed": 2} if target == "random" else {}),
              **RANDOM_LLADA)
    with caplog.at_level(logging.INFO, logger="lm_eval.sinkmask"):
        lm.generate_until(requests())
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sink masking (")]
    assert said + ": " in line
