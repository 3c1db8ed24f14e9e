"""What the samplers draw from and in which order they unmask, checked where the options'
effects show: tokens drawn from softmax(logits / temperature), positions from
softmax(confidence / alg_temp), confidences read from the clean logits in float32, ties and
suppressed tokens placed as documented, and each row revealing its own count. The draws use
seeded generators over hundreds of rows, so the frequencies are fixed numbers, held to a
tolerance far below what a wrong formula would move them."""

import pytest
import torch

from lm_eval_sinkmask.samplers import generate_block, generate_dream
from lm_eval_sinkmask.samplers.dream import gumbel
from lm_eval_sinkmask.samplers.layout import build_layout, topk_over_rows
from tests.test_samplers import MASK, V, Recorder, padded, toy, unmask_step


def generated(rec, ids, mask, gen_length):
    """The step at which each answer position of a left-padded run was unmasked."""
    lay = build_layout(ids, mask, gen_length=gen_length, mask_id=MASK, padding_side="left")
    return unmask_step(rec, lay.generated)


@pytest.mark.parametrize("sampler", ["block", "dream"])
def test_tokens_are_drawn_from_softmax_of_logits_over_temperature(sampler):
    """Score 1 on the target, 0 on the 14 other tokens the invariant variants allow (never the
    mask token): the target's share is e^(1/T) / (e^(1/T) + 14). One step reveals the whole
    answer: with more, confident-first reveals would bias the tokens. (At T = 1, l / T and
    l * T agree.)"""
    B, G = 500, 8
    fn = toy(score=lambda r: torch.ones_like(r, dtype=torch.float64))
    ids, mask = padded([[1]] * B)
    for T in (0.5, 2.0):
        if sampler == "block":
            out = generate_block(fn, ids, mask, mask_id=MASK, gen_length=G, steps=1,
                                 block_length=G, temperature=T, variant="invariant",
                                 generator=torch.Generator().manual_seed(0))
            first = 1  # LLaDA reads answer position j from its own column
        else:
            out = generate_dream(fn, ids, mask, mask_id=MASK, gen_length=G, steps=1,
                                 alg="maskgit_plus", temperature=T, variant="invariant",
                                 generator=torch.Generator().manual_seed(0))
            first = 0  # Dream reads it from the column before
        target = torch.arange(first, first + G) % (V - 1)
        share = out.eq(target).double().mean().item()
        e = torch.tensor(1.0 / T).exp().item()
        assert abs(share - e / (e + 14)) < 0.03, (T, share, e / (e + 14))


def test_gumbel_noise_is_standard_gumbel():
    g = gumbel((200_000,), "cpu", torch.Generator().manual_seed(0)).double()
    assert abs(g.mean().item() - 0.5772) < 0.02  # the Euler-Mascheroni constant
    assert abs((g > 0).double().mean().item() - (1 - torch.exp(torch.tensor(-1.0)).item())) < 0.01


@pytest.mark.parametrize("variant", ["invariant", "reference"])
def test_alg_temp_draws_positions_from_softmax_of_confidence_over_alg_temp(variant):
    """Three masked positions and one to reveal (gen_length 3, 2 steps): alg_temp picks position
    j with probability softmax(conf / alg_temp)_j (Gumbel-top-1)."""
    B, alg_temp = 4000, 0.2
    others = 14 if variant == "invariant" else 15  # the invariant variant drops the mask token
    want_conf = torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64)
    scores = (others * want_conf / (1 - want_conf)).log()  # p = e^s / (e^s + others)
    rec = Recorder(toy(score=lambda r: scores[r.clamp_max(2)]))
    ids, mask = padded([[1]] * B)
    generate_dream(rec, ids, mask, mask_id=MASK, gen_length=3, steps=2, alg="maskgit_plus",
                   alg_temp=alg_temp, variant=variant, generator=torch.Generator().manual_seed(0))
    revealed = rec.inputs[1][0][:, 1:] != MASK  # [B, 3] after the first step
    assert revealed.sum(1).eq(1).all()
    share = revealed.double().mean(0)
    assert torch.allclose(share, torch.softmax(want_conf / alg_temp, 0), atol=0.025), share


@pytest.mark.parametrize("variant", ["invariant", "reference"])
def test_origin_reveals_every_position_at_the_last_step(variant):
    """alg=origin reveals each masked token with probability 1 - s/t, except at the last step,
    where all are revealed, whatever eps leaves for s/t (0.5 leaves many)."""
    ids, mask = padded([[1, 2]] * 50)
    out = generate_dream(toy(score=lambda r: 1.0 + r), ids, mask, mask_id=MASK, gen_length=8,
                         steps=2, alg="origin", eps=0.5, variant=variant,
                         generator=torch.Generator().manual_seed(0))
    assert not out.eq(MASK).any()


@pytest.mark.parametrize("variant", ["invariant", "reference"])
def test_confidence_is_read_from_the_clean_logits_at_temperature(variant):
    """LLaDA samples x0 from the noisy logits but ranks positions by softmax(clean logits)[x0].
    A model that predicts its target almost surely (score 10 + r, 0 elsewhere) samples as it
    decodes greedily, so at temperature 1 the order is the greedy one: the most confident
    (rightmost) first, one token per step. (Ranked by the noisy values, every position would
    tie at 1.0.)"""
    rec = Recorder(toy(score=lambda r: 10.0 + r))
    ids, mask = padded([[1, 2]] * 4)
    out = generate_block(rec, ids, mask, mask_id=MASK, gen_length=8, steps=8, block_length=8,
                         temperature=1.0, variant=variant,
                         generator=torch.Generator().manual_seed(0))
    assert out.tolist() == [[(2 + j) % 15 for j in range(8)]] * 4  # the targets, as greedy
    assert generated(rec, ids, mask, 8).tolist() == [[8, 7, 6, 5, 4, 3, 2, 1]] * 4


def test_invariant_confidences_are_float32_for_bfloat16_logits():
    """A bfloat16 model, confident as a trained one: every column predicts token 3 with logit
    8 + col / 16 (exact in bfloat16), probabilities about 0.995 that bfloat16 rounds into a
    few equal values while float32 ranks every column (the later, the more confident). The
    invariant variant ranks in float32: one token per step, right to left."""
    G = 12

    def fn(ids, attn):
        logits = torch.zeros(*ids.shape, V)
        logits[..., 3] = 8.0 + torch.arange(ids.shape[1]) / 16
        return logits.bfloat16()

    conf16 = fn(torch.zeros(1, G, dtype=torch.long), None)[0].softmax(-1)[:, 3]
    assert conf16.unique().numel() < G  # the test has teeth: bfloat16 ties
    rec = Recorder(fn)
    ids, mask = padded([[1, 2]])
    out = generate_block(rec, ids, mask, mask_id=MASK, gen_length=G, steps=G, block_length=G,
                         variant="invariant")
    assert out.eq(3).all()
    assert generated(rec, ids, mask, G).tolist() == [list(range(G, 0, -1))]


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("sampler", ["block", "dream"])
def test_invariant_ties_go_to_the_leftmost_column(sampler, device):
    """Equal confidences everywhere: the invariant variants unmask left to right (a stable
    sort), at any batch size. The row is long enough (64) for an unstable sort to reorder
    ties, on the CPU as on CUDA, where the check runs too."""
    G = 64
    rec = Recorder(toy(score=lambda r: torch.full_like(r, 2.0, dtype=torch.float64),
                       target=lambda r: torch.full_like(r, 3)))
    ids, mask = (t.to(device) for t in padded([[1, 2]] * 3))
    if sampler == "block":
        generate_block(rec, ids, mask, mask_id=MASK, gen_length=G, steps=G, block_length=G,
                       variant="invariant")
    else:
        generate_dream(rec, ids, mask, mask_id=MASK, gen_length=G, steps=G, alg="maskgit_plus",
                       variant="invariant")
    order = generated(rec, ids, mask, G).tolist()
    assert order == [sorted(order[0])] * 3  # each position unmasked no later than the next
    if sampler == "block":  # one token a step (Dream's schedule reveals by its own counts)
        assert order[0] == list(range(1, G + 1))


def test_a_suppressed_token_at_a_blocks_right_end_is_still_unmasked_in_its_block():
    """Invariant variant: EOS/EOT predictions get the lowest finite confidence, so on the last
    step of a block they still beat the already decoded positions (-inf). Here the suppressed
    prediction sits at the block's last column, where a -inf tie would go to a decoded column
    on its left and leave it masked."""
    fn = toy(score=lambda r: torch.where(r % 4 == 3, 9.0, 1.0 + r),
             target=lambda r: torch.where(r % 4 == 3, 7, 3))
    ids, mask = padded([[1, 2, 3, 4]])  # answer position j at relative position 4 + j
    for remasking in ("low_confidence", "random"):
        rec = Recorder(fn)
        out = generate_block(rec, ids, mask, mask_id=MASK, gen_length=8, steps=4, block_length=4,
                             suppress_confidence_ids=(7,), variant="invariant",
                             remasking=remasking, generator=torch.Generator().manual_seed(0))
        steps = generated(rec, ids, mask, 8)
        assert not out.eq(MASK).any(), (remasking, out)
        assert out[0, 3] == 7 and out[0, 7] == 7
        assert steps[0, 3] == 2 and steps[0, 7] == 4


def test_each_row_reveals_its_own_count():
    conf = torch.tensor([[0.9, 0.8, 0.7], [0.9, 0.8, 0.7], [0.1, 0.3, 0.2]])
    cols = torch.tensor([[1, 2, 3]] * 3)
    got = topk_over_rows(conf, torch.tensor([1, 2, 0]), cols, width=5)
    assert got.tolist() == [[True, False, False], [True, True, False], [False, False, False]]
    got = topk_over_rows(conf, torch.tensor([2, 1, 1]), cols, width=5)
    assert got.tolist() == [[True, True, False], [True, False, False], [False, True, False]]
