"""Training on row groups: the losses run the model on rows of similar length, each group cut
to its longest row, and compute exactly the whole batch's loss, gradient and noise."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lm_eval_sinkmask import sink_token
from lm_eval_sinkmask.zoo import batches, objectives
from lm_eval_sinkmask.zoo.modeling import TinyDreamModel, TinyLladaConfig, TinyLladaModel

VOCAB, MASK_ID, EOS, PAD = 842, 3, 1, 2


def _prefix_valid(lengths, width):
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def _as_rows(rows, batch):
    return list(range(batch)) if rows == slice(None) else sorted(rows.tolist())


def test_groups_sort_rows_by_length_and_cut_each_group_to_its_longest_row():
    lengths = [3, 7, 1, 5, 2, 9]
    valid = _prefix_valid(lengths, 12)
    groups = batches.row_groups(valid, 2)
    assert [(_as_rows(r, 6), w) for r, w in groups] == [([0, 2, 4], 3), ([1, 3, 5], 9)]
    assert batches.row_groups(valid, 1) == [(slice(None), 9)]
    assert batches.row_groups(valid, 0) == [(slice(None), 12)]  # the batch as drawn
    # more groups than rows: one row each, never an empty group
    single = batches.row_groups(valid, 10)
    assert sorted(r for rows, _ in single for r in _as_rows(rows, 6)) == list(range(6))
    assert [w for _, w in single] == sorted(lengths)


def test_a_row_ends_at_its_last_valid_column_whatever_lies_before():
    valid = torch.zeros(2, 10, dtype=torch.bool)
    valid[0, [0, 1, 7]] = True  # not a prefix: three tokens, the last at column 7
    valid[1, :2] = True
    assert batches.row_groups(valid, 1) == [(slice(None), 8)]
    assert [w for _, w in batches.row_groups(valid, 2)] == [2, 8]


def test_rows_without_a_token_are_left_out():
    valid = _prefix_valid([0, 4, 0, 6], 8)
    groups = batches.row_groups(valid, 2)
    assert [(_as_rows(r, 4), w) for r, w in groups] == [([1, 3], 6)]


@pytest.fixture(scope="module")
def pool_batch():
    from lm_eval_sinkmask.zoo import pool
    p = pool.build_pool(n_gsm=300, n_code=60, workers=1)

    def draw(pad_region):
        stream = batches.PoolBatches(p, seed=0, device="cpu", eos_id=EOS, pad_id=PAD)
        return stream.next(24, max_steps=3, pad_region=pad_region)
    return draw


def _arm():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=True, pad_token_id=PAD, attn_implementation="sdpa"))


def _llada(vocab=VOCAB):
    torch.manual_seed(1)
    return TinyLladaModel(TinyLladaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          mask_token_id=MASK_ID, max_position_embeddings=256))


def _case(kind):
    """(model, pad_region, loss for a number of groups) of one zoo recipe, its noise stream
    seeded afresh on every call."""
    if kind == "arm":
        return _arm(), False, lambda g: (lambda m, *b: objectives.arm_loss(m, *b, groups=g))
    sink = None
    if kind == "llada_sink":
        model, sink = _llada(VOCAB + 1), sink_token.SinkToken(VOCAB, "start")
    elif kind == "dream":
        model = TinyDreamModel.from_llama(_arm())
    else:
        model = _llada()
    shift = kind == "dream"
    return model, True, lambda g: objectives.DiffusionLoss(
        MASK_ID, shift, torch.Generator().manual_seed(5), sink, prefix_frac=0.3, window=8,
        groups=g)


def _positions_seen(model):
    """Hook that adds up batch x width of every forward call the model makes."""
    seen = [0]

    def count(module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        seen[0] += ids.numel()
    model.register_forward_pre_hook(count, with_kwargs=True)
    return seen


@pytest.mark.parametrize("kind", ["arm", "llada", "dream", "llada_sink"])
def test_grouped_loss_is_the_whole_batch_loss_on_fewer_positions(pool_batch, kind):
    model, pad_region, make_loss = _case(kind)
    ids, region, valid = pool_batch(pad_region)
    seen = _positions_seen(model)
    results = {}
    for g in (0, 1, 2, 4, 24):
        loss_fn = make_loss(g)
        model.zero_grad(set_to_none=True)
        before = seen[0]
        loss = loss_fn(model, ids, region, valid)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        state = [gen.get_state() for gen in getattr(loss_fn, "generators", [])]
        results[g] = (loss.detach(), grads, state, seen[0] - before)
    ref_loss, ref_grads, ref_state, full = results[0]
    assert full == ids.shape[0] * (ids.shape[1] + (kind == "llada_sink"))  # + the sink column
    for g, (loss, grads, state, positions) in results.items():
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        assert len(grads) == len(ref_grads)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
        # the same noise, drawn at the batch's full width, whatever the grouping
        assert all(torch.equal(a, b) for a, b in zip(state, ref_state))
    widths = [results[g][3] for g in (0, 1, 2, 4)]
    assert widths == sorted(widths, reverse=True) and widths[2] < widths[0]
    if pad_region:  # the DLMs' region padding leaves columns no row reaches
        assert results[1][3] < full


def _whole_batch_loss(kind, model, ids, region, valid, gen):
    """The loss as the zoo computed it before row groups (c35bd8e), written out here: the
    model on the whole batch, a mean over the answer's next tokens (ARM) or the 1/t-weighted
    cross-entropy on the masked answer tokens over the answer's length (DLMs, Dream's logits
    shifted), the noise drawn from ``gen`` as ``diffusion_loss`` draws it."""
    if kind == "arm":
        logits = model(ids, attention_mask=valid.long()).logits[:, :-1]
        target = ids[:, 1:].masked_fill(~region[:, 1:], -100)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(),
                                                 ignore_index=-100)
    B = ids.shape[0]
    t = ((torch.arange(B) + torch.rand(B, generator=gen)) / B)[torch.randperm(B, generator=gen)]
    t = objectives.EPS + (1 - objectives.EPS) * t
    masked, forced = objectives.noise_answer(region, t, gen, 0.3, 8)
    noisy = ids.masked_fill(masked, MASK_ID)
    if kind == "llada_sink":
        logits = sink_token.forward(model, noisy, valid, sink_token.SinkToken(VOCAB, "start"),
                                    with_position_ids=False)
    else:
        logits = model(noisy, attention_mask=valid.long()).logits
    target = ids
    if kind == "dream":
        logits, masked, forced, target = logits[:, :-1], masked[:, 1:], forced[:, 1:], ids[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits[masked], target[masked], reduction="none")
    weight = torch.where(forced, 1.0, (1.0 / t)[:, None])[masked]
    return (ce * weight).sum() / region.sum()


@pytest.mark.parametrize("kind", ["arm", "llada", "dream", "llada_sink"])
def test_every_grouping_computes_the_loss_the_zoo_computed_before_row_groups(pool_batch, kind):
    """Grouped against the batch as drawn only checks that the grouping changes nothing; a
    denominator or weight that is wrong at every grouping alike needs a reference outside
    ``objectives``: the pre-grouping formulas."""
    model, pad_region, make_loss = _case(kind)
    ids, region, valid = pool_batch(pad_region)
    model.zero_grad(set_to_none=True)
    want = _whole_batch_loss(kind, model, ids, region, valid, torch.Generator().manual_seed(5))
    want.backward()
    want_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    for g in (0, 1, 2, 24):
        model.zero_grad(set_to_none=True)
        got = make_loss(g)(model, ids, region, valid)
        got.backward()
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-6)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert len(grads) == len(want_grads)
        for a, b in zip(grads, want_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_batch_without_tokens_has_no_group_and_a_negative_count_is_refused():
    """n = 1 kept a width-0 group for a batch of empty rows (the model then fails on a
    zero-width input), n >= 2 failed on a batch of no rows, and a negative n (a typo of
    --row-groups) failed at the first step with torch's tensor_split message."""
    for n in (1, 2, 5):
        assert batches.row_groups(torch.zeros(3, 6, dtype=torch.bool), n) == []
        assert batches.row_groups(torch.zeros(0, 6, dtype=torch.bool), n) == []
    with pytest.raises(ValueError, match="row groups"):
        batches.row_groups(torch.ones(3, 6, dtype=torch.bool), -1)


def test_a_mask_that_is_not_bool_is_refused_by_name():
    for n in (0, 2):
        with pytest.raises(TypeError, match="bool mask of valid tokens, got torch.float32"):
            batches.row_groups(torch.ones(3, 6), n)
