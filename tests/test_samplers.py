"""Samplers: layout, batch invariance, unmasking order and the options of both samplers.

What batch invariance asks of a model (and what TinyBidir below does):
  * it honours the attention mask: pad keys get exactly zero attention (pad query rows may
    attend to anything, as long as they do not produce NaN that real rows then read);
  * its positions do not depend on the padding: position ids counted from the first real token
    (cumsum(mask) - 1), or no absolute positions at all. RoPE with absolute positions is
    relative only up to rounding; with right padding positions start at 0 and are exact anyway.
  * then batched greedy output equals batch-size-1 output up to floating-point reduction order,
    which the float64 model here makes irrelevant.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lm_eval_sinkmask.samplers import generate_block, generate_dream, validate_block_args
from lm_eval_sinkmask.samplers.block import guided_logits, transfer_counts
from lm_eval_sinkmask.samplers.layout import build_layout

V, MASK = 16, 15


class TinyBidir(nn.Module):
    """Bidirectional transformer, learned positions counted from the first real token."""

    def __init__(self, vocab=V, d=32, heads=4, layers=2, max_len=64, honour_mask=True, relative_pos=True):
        super().__init__()
        self.honour_mask, self.relative_pos = honour_mask, relative_pos
        torch.manual_seed(0)
        self.heads, self.emb, self.pos = heads, nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.head = nn.Linear(d, vocab)
        for lin in [*self.qkv, *self.out]:  # larger weights: outputs depend strongly on context
            lin.weight.data.mul_(3)
        self.double().eval()

    def forward(self, ids, attn):
        B, L = ids.shape
        attn = attn if self.honour_mask else torch.ones_like(attn)
        pos = (attn.long().cumsum(1) - 1).clamp_min(0) if self.relative_pos else torch.arange(L)
        h = self.emb(ids) + self.pos(pos)
        keep = attn.bool()[:, None, None, :]  # pad keys get no attention
        for qkv, out in zip(self.qkv, self.out):
            q, k, v = qkv(F.layer_norm(h, h.shape[-1:])).view(B, L, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            h = h + out(F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2).reshape(B, L, -1))
        return self.head(F.layer_norm(h, h.shape[-1:]))


@pytest.fixture(scope="module")
def model():
    return TinyBidir()


class Recorder:
    """Wraps a model_fn and keeps every input it was called with."""

    def __init__(self, fn):
        self.fn, self.inputs = fn, []

    def __call__(self, ids, attn):
        self.inputs.append((ids.clone(), attn.clone()))
        return self.fn(ids, attn)


def toy(score, target=lambda rel: rel % (V - 1), offset=0):
    """Context-free model_fn: at relative position r (counted from the first real token) it
    predicts token target(r + offset) with logit score(r + offset), every other token logit 0."""

    def fn(ids, attn):
        rel = (attn.long().cumsum(1) - 1).clamp_min(0) + offset
        logits = torch.zeros(*ids.shape, V, dtype=torch.float64, device=ids.device)
        return logits.scatter(-1, target(rel)[..., None], score(rel).double()[..., None])

    return fn


def padded(prompts, side="left", pad=0):
    """Pad a list of token lists into (ids, mask) on the given side."""
    P = max(map(len, prompts))
    ids = torch.full((len(prompts), P), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), P, dtype=torch.long)
    for i, p in enumerate(prompts):
        sl = slice(P - len(p), P) if side == "left" else slice(0, len(p))
        ids[i, sl], mask[i, sl] = torch.tensor(p), 1
    return ids, mask


PROMPTS = [[3, 1, 4, 1, 5], [9], [2, 6, 5], [5, 3, 5, 8, 9, 7, 9]]
# the batch-invariant variants: these tests ask for the same tokens at every batch size and a
# fully unmasked answer (the reference variants are checked against LLaDA's and Dream's own
# loops in test_llada_reference.py and test_dream_reference.py)
BLOCK = dict(mask_id=MASK, gen_length=8, steps=8, block_length=4, variant="invariant")
DREAM = dict(mask_id=MASK, gen_length=8, steps=6, variant="invariant")


def unmask_step(rec, gen_cols_of):
    """For each generated position, the index of the first model call that saw it unmasked."""
    seen = torch.stack([gen_cols_of(ids) for ids, _ in rec.inputs])  # [calls, B, G]
    return (seen == MASK).sum(0)  # masked in calls 0..k-1 -> revealed after call k-1


# ---- layout ----------------------------------------------------------------------------------

@pytest.mark.parametrize("side", ["left", "right"])
def test_layout_places_prompt_gen_and_pads(side):
    ids, mask = padded([[7, 8], [4, 5, 6]], side="right" if side == "left" else "left", pad=0)
    lay = build_layout(ids, mask, gen_length=2, mask_id=MASK, padding_side=side)
    M = MASK
    if side == "left":
        assert lay.x.tolist() == [[M, 7, 8, M, M], [4, 5, 6, M, M]]
        assert lay.attention_mask.tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    else:
        assert lay.x.tolist() == [[7, 8, M, M, M], [4, 5, 6, M, M]]
        assert lay.attention_mask.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert lay.generated(lay.x).eq(M).all()
    assert lay.prompt.sum(1).tolist() == [2, 3]


def test_layout_rejects_gaps_and_bad_side():
    with pytest.raises(ValueError, match="contiguous"):
        build_layout(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 0, 1]]), gen_length=2, mask_id=MASK, padding_side="left")
    with pytest.raises(ValueError, match="padding_side"):
        build_layout(torch.tensor([[1]]), torch.tensor([[1]]), gen_length=2, mask_id=MASK, padding_side="middle")


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_batch_of_empty_prompts_decodes_as_beside_a_prompt(model, side):
    """An empty prompt (no BOS, empty text) is unconditional generation for the block sampler:
    alone, its batch has no prompt column at all, and must decode as the same row does
    beside a prompted one (it raised an IndexError)."""
    ids, mask = padded([[], [3, 1, 4]], side=side)
    beside = generate_block(model, ids, mask, padding_side=side, **BLOCK)[:1]
    alone = generate_block(model, ids[:1, :0], mask[:1, :0], padding_side=side, **BLOCK)
    assert torch.equal(alone, beside) and not alone.eq(MASK).any()
    lay = build_layout(ids[:, :0], mask[:, :0], gen_length=2, mask_id=MASK, padding_side=side)
    assert lay.x.tolist() == [[MASK, MASK]] * 2 and lay.attention_mask.tolist() == [[1, 1]] * 2


# ---- argument checks -------------------------------------------------------------------------

def test_validate_block_args():
    validate_block_args(256, 256, 32)
    with pytest.raises(ValueError, match="gen_length=10 must be a multiple of block_length=4"):
        validate_block_args(10, 10, 4)
    with pytest.raises(ValueError, match="steps=6 .* number of blocks .* 4"):
        validate_block_args(16, 6, 4)
    with pytest.raises(ValueError, match="positive"):
        validate_block_args(8, 0, 4)


def test_unknown_remasking_and_alg(model):
    ids, mask = padded(PROMPTS[:1])
    with pytest.raises(ValueError, match="remasking"):
        generate_block(model, ids, mask, **BLOCK, remasking="lowest")
    with pytest.raises(ValueError, match="alg"):
        generate_dream(model, ids, mask, **DREAM, alg="greedy")
    with pytest.raises(ValueError, match="variant"):
        generate_dream(model, ids, mask, **{**DREAM, "variant": "exact"})


def test_transfer_counts_spread_evenly():
    assert transfer_counts(32, 32) == [1] * 32
    assert transfer_counts(10, 4) == [3, 3, 2, 2]
    assert transfer_counts(2, 4) == [1, 1, 0, 0]


# ---- batch invariance ------------------------------------------------------------------------

def _alone_vs_batched(gen, model, **kw):
    alone = torch.cat([gen(model, *padded([p]), **kw) for p in PROMPTS])
    outs = {side: gen(model, *padded(PROMPTS, side="right"), padding_side=side, **kw) for side in ("left", "right")}
    for side, out in outs.items():
        assert torch.equal(out, alone), side
        assert not out.eq(MASK).any()


@pytest.mark.parametrize("kw", [dict(), dict(steps=4), dict(cfg_scale=1.5)], ids=["1_per_step", "2_per_step", "cfg"])
def test_block_batched_equals_alone(model, kw):
    _alone_vs_batched(generate_block, model, **{**BLOCK, **kw})


@pytest.mark.parametrize("alg", ["entropy", "maskgit_plus", "topk_margin"])
def test_dream_batched_equals_alone(model, alg):
    _alone_vs_batched(generate_dream, model, **DREAM, alg=alg)


def _zoo(kind):
    zoo = pytest.importorskip("lm_eval_sinkmask.zoo.modeling")
    cls, cfg = (zoo.TinyLladaModel, zoo.TinyLladaConfig) if kind == "llada" else (zoo.TinyDreamModel, zoo.TinyDreamConfig)
    torch.manual_seed(0)
    model = cls(cfg(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2 if kind == "dream" else 4,  # Dream uses GQA
                    mask_token_id=MASK, initializer_range=0.3)).double().eval()
    # Positions from the first real token, as Dream's own sampler passes tok_idx.
    return lambda ids, attn: model(ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp_min(0)).logits


@pytest.mark.parametrize("kind,gen,kw", [("llada", generate_block, BLOCK), ("dream", generate_dream, DREAM)], ids=["llada", "dream"])
def test_zoo_models_batched_equals_alone(kind, gen, kw):
    _alone_vs_batched(gen, _zoo(kind), **kw)


@pytest.mark.parametrize("flaw", ["ignores_mask", "absolute_positions"])
def test_batch_invariance_needs_mask_and_relative_positions(flaw):
    # Negative control: the invariance tests above have teeth. A model that ignores the mask
    # breaks both sides; absolute positions break left padding only (right padding starts at 0).
    bad = TinyBidir(honour_mask=flaw != "ignores_mask", relative_pos=flaw != "absolute_positions")
    alone = torch.cat([generate_block(bad, *padded([p]), **BLOCK) for p in PROMPTS])
    batched = {side: generate_block(bad, *padded(PROMPTS), **BLOCK, padding_side=side) for side in ("left", "right")}
    assert not torch.equal(batched["left"], alone)
    assert torch.equal(batched["right"], alone) == (flaw == "absolute_positions")


# ---- block sampler behaviour -----------------------------------------------------------------

@pytest.mark.parametrize("side", ["left", "right"])
def test_block_order_blocks_left_to_right_confident_first(side):
    # Confidence rises with position, so inside a block the right end goes first, yet block 0
    # is finished before block 1 starts. 2 steps per block, 2 tokens per step.
    rec = Recorder(toy(score=lambda r: r.double()))
    ids, mask = padded([[1, 2, 3], [4]], side=side)
    out = generate_block(rec, ids, mask, **{**BLOCK, "steps": 4}, padding_side=side)
    lay = build_layout(ids, mask, gen_length=8, mask_id=MASK, padding_side=side)
    steps = unmask_step(rec, lay.generated)
    assert steps.tolist() == [[2, 2, 1, 1, 4, 4, 3, 3]] * 2
    assert out.tolist() == [[(3 + j) % 15 for j in range(8)], [(1 + j) % 15 for j in range(8)]]


def test_block_single_block_is_global_order():
    rec = Recorder(toy(score=lambda r: r.double()))
    ids, mask = padded([[1, 2]])
    generate_block(rec, ids, mask, mask_id=MASK, gen_length=8, steps=4, block_length=8)
    lay = build_layout(ids, mask, gen_length=8, mask_id=MASK, padding_side="left")
    assert unmask_step(rec, lay.generated).tolist() == [[4, 4, 3, 3, 2, 2, 1, 1]]


@pytest.mark.parametrize("gen,kw", [(generate_block, BLOCK), (generate_dream, DREAM)], ids=["block", "dream"])
def test_unmasked_tokens_never_change(model, gen, kw):
    rec = Recorder(model)
    ids, mask = padded(PROMPTS)
    out = gen(rec, ids, mask, **kw)
    lay = build_layout(ids, mask, gen_length=8, mask_id=MASK, padding_side="left")
    seen = [lay.generated(x) for x, _ in rec.inputs] + [out]
    for before, after in zip(seen, seen[1:]):
        fixed = before != MASK
        assert torch.equal(after[fixed], before[fixed])
        assert (after != MASK).sum() >= fixed.sum()
    assert not out.eq(MASK).any()
    assert all(torch.equal(x[lay.prompt], lay.x[lay.prompt]) for x, _ in rec.inputs)  # prompt untouched


def test_cfg_is_noop_when_cond_equals_uncond(model):
    # A prompt made of mask tokens: masking it out for the unconditional copy changes nothing.
    ids, mask = padded([[MASK] * 3, [MASK]])
    assert torch.equal(generate_block(model, ids, mask, **BLOCK), generate_block(model, ids, mask, **BLOCK, cfg_scale=2.0))


def test_cfg_feeds_an_unconditional_copy(model):
    rec = Recorder(model)
    ids, mask = padded(PROMPTS[:2])
    generate_block(rec, ids, mask, **BLOCK, cfg_scale=1.0)
    x, attn = rec.inputs[0]
    lay = build_layout(ids, mask, gen_length=8, mask_id=MASK, padding_side="left")
    assert x.shape[0] == 4 and torch.equal(x[:2], lay.x) and torch.equal(attn, torch.cat([lay.attention_mask] * 2))
    assert x[2:][lay.prompt].eq(MASK).all() and torch.equal(x[2:][~lay.prompt], lay.x[~lay.prompt])


def test_cfg_decodes_from_the_guided_logits():
    """Conditioned, the model prefers token 3 (2.0 over 1.9); unconditioned (prompt masked), it
    prefers 3 by more (2.5 over 0). Guidance, uncond + (s + 1)(cond - uncond), favours 4 at s = 1
    (3.8 over 1.5): every generated token shows which logits the sampler decoded from."""
    def fn(ids, attn):
        conditioned = ids[:, 0] != MASK  # the unconditional copy has its prompt masked
        logits = torch.full((*ids.shape, V), -10.0, dtype=torch.float64)
        logits[..., 3] = torch.where(conditioned, 2.0, 2.5)[:, None]
        logits[..., 4] = torch.where(conditioned, 1.9, 0.0)[:, None]
        return logits

    ids, mask = padded([[1, 2, 5], [6, 7, 8]])
    assert generate_block(fn, ids, mask, **BLOCK).eq(3).all()
    assert generate_block(fn, ids, mask, **BLOCK, cfg_scale=1.0).eq(4).all()


def test_guidance_leaves_a_token_both_logits_forbid_forbidden():
    # -inf - -inf is NaN: one such column made the whole row's log-softmax NaN
    cond = torch.tensor([[1.0, 2.0, float("-inf")]])
    uncond = torch.tensor([[0.5, 2.5, float("-inf")]])
    guided = guided_logits(cond, uncond, 0.5)
    assert torch.equal(guided, torch.tensor([[1.25, 1.75, float("-inf")]]))
    assert torch.isfinite(guided.log_softmax(-1)[:, :2]).all()


def test_block_suppress_logit_ids_never_appear(model):
    ids, mask = padded(PROMPTS)
    plain = generate_block(model, ids, mask, **BLOCK)
    banned = tuple(plain.unique().tolist()[:3])
    out = generate_block(model, ids, mask, **BLOCK, suppress_logit_ids=banned)
    assert not torch.isin(out, torch.tensor(banned)).any() and not out.eq(MASK).any()


def test_block_suppress_confidence_ids_go_last():
    # Token 7 is the most confident prediction, but suppressed confidence makes it wait until
    # the last step of its block (it still gets generated: it is the prediction there).
    rec = Recorder(toy(score=lambda r: torch.where(r % 4 == 0, 9.0, 1.0 + r), target=lambda r: torch.where(r % 4 == 0, 7, 3)))
    ids, mask = padded([[1, 2, 3, 4]])
    out = generate_block(rec, ids, mask, mask_id=MASK, gen_length=8, steps=8, block_length=4, suppress_confidence_ids=(7,))
    steps = unmask_step(rec, build_layout(ids, mask, gen_length=8, mask_id=MASK, padding_side="left").generated)
    assert out[0, 0] == 7 and out[0, 4] == 7
    assert steps[0, 0] == 4 and steps[0, 4] == 8
    rec.inputs.clear()
    generate_block(rec, ids, mask, mask_id=MASK, gen_length=8, steps=8, block_length=4)
    assert unmask_step(rec, build_layout(ids, mask, gen_length=8, mask_id=MASK, padding_side="left").generated)[0, 0] == 1


def test_block_temperature_seeded_is_reproducible(model):
    ids, mask = padded(PROMPTS)
    run = lambda seed, **kw: generate_block(model, ids, mask, **BLOCK, temperature=1.0,
                                            generator=torch.Generator().manual_seed(seed), **kw)
    assert torch.equal(run(1), run(1)) and not torch.equal(run(1), run(2))
    assert torch.equal(run(3, remasking="random"), run(3, remasking="random"))
    assert not run(1).eq(MASK).any()


def test_mask_token_is_never_generated():
    # A model whose favourite prediction is the mask token itself still ends fully unmasked;
    # except under the reference variants, where, as in LLaDA and Dream, such positions stay
    # masked.
    fn = toy(score=lambda r: 5.0 + 0 * r, target=lambda r: torch.full_like(r, MASK))
    ids, mask = padded([[1, 2]])
    assert not generate_block(fn, ids, mask, **BLOCK).eq(MASK).any()
    assert not generate_dream(fn, ids, mask, **DREAM).eq(MASK).any()
    assert generate_block(fn, ids, mask, **{**BLOCK, "variant": "reference"}).eq(MASK).all()
    assert generate_dream(fn, ids, mask, **{**DREAM, "variant": "reference"}).eq(MASK).all()


# ---- dream sampler behaviour -----------------------------------------------------------------

def test_dream_reads_logits_shifted_right():
    # The model predicts token (r % 15) at relative position r; Dream puts it at r + 1.
    ids, mask = padded([[1, 2, 3], [4]])
    out = generate_dream(toy(score=lambda r: 1.0 + r), ids, mask, **DREAM, alg="maskgit_plus")
    assert out.tolist() == [[(2 + j) % 15 for j in range(8)], [(0 + j) % 15 for j in range(8)]]


def test_dream_counts_and_confidence_order():
    rec = Recorder(toy(score=lambda r: r.double()))
    ids, mask = padded([[1, 2, 3], [4]])
    generate_dream(rec, ids, mask, **DREAM, alg="maskgit_plus", padding_side="right")
    lay = build_layout(ids, mask, gen_length=8, mask_id=MASK, padding_side="right")
    masked = torch.stack([lay.generated(x).eq(MASK).sum(1) for x, _ in rec.inputs])[:, 0].tolist()
    ts = torch.linspace(1, 1e-3, 7)
    expect = [8]
    for i in range(5):
        expect.append(expect[-1] - int(expect[-1] * (1 - ts[i + 1] / ts[i])))
    assert masked == expect
    # confidence rises with position, so the right end is revealed first
    steps = unmask_step(rec, lay.generated)
    assert (steps[:, :-1] >= steps[:, 1:]).all()


@pytest.mark.parametrize("kw", [dict(alg="origin"), dict(alg_temp=0.5), dict(temperature=0.8, top_p=0.9),
                                dict(temperature=1.0, top_k=3, alg="topk_margin")],
                         ids=["origin", "alg_temp", "top_p", "top_k"])
def test_dream_seeded_sampling_is_reproducible_and_complete(model, kw):
    ids, mask = padded(PROMPTS)
    run = lambda seed: generate_dream(model, ids, mask, **DREAM, generator=torch.Generator().manual_seed(seed), **kw)
    a = run(0)
    assert torch.equal(a, run(0)) and not a.eq(MASK).any()


def test_dream_top_k_one_and_top_p_tiny_match_greedy():
    fn = toy(score=lambda r: 1.0 + r)
    ids, mask = padded(PROMPTS)
    greedy = generate_dream(fn, ids, mask, **DREAM, alg="maskgit_plus")
    g = torch.Generator().manual_seed(0)
    assert torch.equal(generate_dream(fn, ids, mask, **DREAM, temperature=1.0, top_k=1, generator=g), greedy)
    assert torch.equal(generate_dream(fn, ids, mask, **DREAM, temperature=1.0, top_p=1e-6, generator=g), greedy)


def test_dream_needs_a_prompt_token(model):
    with pytest.raises(ValueError, match="at least one real token"):
        generate_dream(model, torch.tensor([[1, 2], [0, 0]]), torch.tensor([[1, 1], [0, 0]]), **DREAM)


def test_more_steps_than_tokens(model):
    # Steps that reveal nothing (block: counts [1, 1, 0, 0]; Dream: nothing left to sample) are fine.
    ids, mask = padded(PROMPTS)
    assert not generate_block(model, ids, mask, mask_id=MASK, gen_length=4, steps=8, block_length=2).eq(MASK).any()
    for alg in ("origin", "entropy"):
        out = generate_dream(model, ids, mask, mask_id=MASK, gen_length=4, steps=20, alg=alg, temperature=1.0,
                             generator=torch.Generator().manual_seed(0))
        assert out.shape == (4, 4) and not out.eq(MASK).any()


def test_blocks_of_one_token_decode_strictly_left_to_right():
    # The decoding-order ablation (block_length=1, steps=gen_length): one forward pass per
    # token, and each pass fixes the leftmost masked position, even where the model is far more
    # confident about a later one (confidence here rises with position, so the default
    # low-confidence order within one block of 8 would go right to left).
    rec = Recorder(toy(score=lambda r: r.double()))
    ids, mask = padded([[1, 2, 3], [4]], side="right")
    out = generate_block(rec, ids, mask, mask_id=MASK, gen_length=8, steps=8, block_length=1,
                         padding_side="right")
    lay = build_layout(ids, mask, gen_length=8, mask_id=MASK, padding_side="right")
    assert len(rec.inputs) == 8
    assert unmask_step(rec, lay.generated).tolist() == [list(range(1, 9))] * 2
    assert out.tolist() == [[(3 + j) % 15 for j in range(8)], [(1 + j) % 15 for j in range(8)]]
    default = Recorder(toy(score=lambda r: r.double()))
    generate_block(default, ids, mask, mask_id=MASK, gen_length=8, steps=8, block_length=8,
                   padding_side="right")
    assert unmask_step(default, lay.generated).tolist() == [list(range(8, 0, -1))] * 2
    with pytest.raises(ValueError, match="multiple of the number of blocks"):
        validate_block_args(8, 4, 1)  # fewer steps than one-token blocks


# ---- settings a sampler's mode never reads -----------------------------------------------
# (refused by DiffusionSettings before any weight loads; these tests pin down why each is, or
# is not, unread)


@pytest.mark.parametrize("variant", ["invariant", "reference"])
def test_dream_alg_temp_is_read_by_the_confidence_algs_only(model, variant):
    ids, mask = padded(PROMPTS)
    run = lambda **kw: generate_dream(model, ids, mask, **{**DREAM, "variant": variant},  # noqa: E731
                                      generator=torch.Generator().manual_seed(0), **kw)
    assert torch.equal(run(alg="origin", alg_temp=5.0), run(alg="origin", alg_temp=0.0))
    assert not torch.equal(run(alg="entropy", alg_temp=5.0), run(alg="entropy", alg_temp=0.0))
    # the same Gumbel draws at another alg_temp rank the positions otherwise
    assert not torch.equal(run(alg="entropy", alg_temp=0.05), run(alg="entropy", alg_temp=5.0))


def test_dream_top_k_and_top_p_are_read_at_temperature_zero():
    """Not refused at temperature 0: they renormalise the probabilities the confidence algs
    rank, and even argmax (alg=origin) reads them where the model's dtype rounds two leaders'
    probabilities apart in one distribution and together in the other."""
    from lm_eval_sinkmask.samplers.dream import confidence, sample_tokens

    logits = torch.zeros(1, 100)
    logits[0, :2] = torch.tensor([0.996, 1.0])
    logits = logits.bfloat16()  # the released checkpoints' dtype, the reference variant's
    assert sample_tokens(logits)[1].item() == 1
    assert sample_tokens(logits, top_k=2)[1].item() == 0 and sample_tokens(logits, top_p=0.5)[1].item() == 0
    probs, x0 = sample_tokens(logits.float())
    kept, _ = sample_tokens(logits.float(), top_k=2)
    assert confidence(kept, x0, "entropy") > confidence(probs, x0, "entropy")


def test_block_random_remasking_reads_eos_eot_confidences_only_when_invariant():
    """LLaDA's random remasking (the reference) draws confidences without looking at the
    tokens; the invariant variant still unmasks the suppressed ones last."""
    rec = Recorder(toy(score=lambda r: torch.where(r % 4 == 0, 9.0, 1.0 + r),
                       target=lambda r: torch.where(r % 4 == 0, 7, 3)))
    ids, mask = padded([[1, 2, 3, 4]])
    gen_cols = build_layout(ids, mask, gen_length=8, mask_id=MASK, padding_side="left").generated

    def order(variant, suppressed):
        rec.inputs.clear()
        out = generate_block(rec, ids, mask, mask_id=MASK, gen_length=8, steps=8, block_length=4,
                             remasking="random", variant=variant, suppress_confidence_ids=suppressed,
                             generator=torch.Generator().manual_seed(0))
        return out, unmask_step(rec, gen_cols)

    plain, suppressed = order("reference", ()), order("reference", (7,))
    assert torch.equal(plain[0], suppressed[0]) and torch.equal(plain[1], suppressed[1])
    out, steps = order("invariant", (7,))
    assert out[0, 0] == 7 and steps[0, 0] == 4 and steps[0, 4] == 8
    assert not torch.equal(steps, order("invariant", ())[1])


@pytest.mark.parametrize("kind, args, message", [
    ("dream", dict(alg="origin", alg_temp="5"), r"alg_temp=5 changes nothing under alg=origin.*drop alg_temp, or pick alg=maskgit_plus"),
    ("llada", dict(remasking="random", confidence_eos_eot_inf="true"),
     r"confidence_eos_eot_inf=true changes nothing under remasking=random with llada_sampler=reference.*drop confidence_eos_eot_inf, or add llada_sampler=invariant"),
])
def test_a_setting_the_mode_never_reads_is_refused_before_loading(tiny_dirs, kind, args, message):
    from lm_eval_sinkmask.dlm_model import DLMSinkMaskLM

    with pytest.raises(ValueError, match=message):
        DLMSinkMaskLM.check_args(str(tiny_dirs[kind]), **args)


@pytest.mark.parametrize("kind, args", [
    ("dream", dict(alg="origin")),
    ("dream", dict(alg="origin", alg_temp="0")),  # the default, said out loud
    ("dream", dict(alg="entropy", alg_temp="5")),
    ("dream", dict(alg="origin", top_p="0.9", sampling_top_k="5")),  # read: see above
    ("llada", dict(remasking="random", confidence_eos_eot_inf="false")),
    ("llada", dict(remasking="random", confidence_eos_eot_inf="true", llada_sampler="invariant")),
    ("llada", dict(confidence_eos_eot_inf="true")),
])
def test_settings_the_mode_reads_are_accepted(tiny_dirs, kind, args):
    from lm_eval_sinkmask.dlm_model import DLMSinkMaskLM

    DLMSinkMaskLM.check_args(str(tiny_dirs[kind]), **args)
