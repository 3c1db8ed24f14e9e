"""LLaDA's block sampler against an independent re-implementation of LLaDA's own decoding loop.

``llada_loop`` below is written from the algorithm of LLaDA's ``generate.py`` (greedy token
choice, low-confidence remasking), not from our sampler: the answer appended as mask tokens,
blocks decoded in turn, the logits and their softmax in the model's dtype, EOS/EOT set to -inf
in the logits after the argmax (``confidence_eos_eot_inf``) so that the other confidences
renormalise, every masked position up to the block's end a candidate, and ``torch.topk`` over
the whole row. Our ``reference`` variant must give exactly its tokens; the ``invariant`` variant
must not (else these tests could not tell the two apart).
"""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lm_eval_sinkmask.families import FAMILIES
from lm_eval_sinkmask.samplers import generate_block
from tests import tiny
from tests.test_dream_reference import FondOfMask
from tests.test_samplers import MASK, V

GEN, STEPS, BLOCK = 12, 12, 4


def llada_loop(model, ids, *, mask_id, gen_length, steps, block_length, cfg_scale=0.0,
               banned_logits=(), banned_confidence=(), score_dtype=None):
    """LLaDA's generate at temperature 0 for prompts of equal length: the generated tokens.
    ``score_dtype=torch.float64`` is MMaDA's text decoding (``mmu_generate``), which is the
    same loop with the softmax of the confidences taken in float64."""
    B, P = ids.shape
    x = F.pad(ids, (0, gen_length), value=mask_id)
    prompt = torch.zeros_like(x, dtype=torch.bool)
    prompt[:, :P] = True
    per_block = steps // (gen_length // block_length)
    for b in range(gen_length // block_length):
        end = P + (b + 1) * block_length
        left = (x[:, end - block_length:end] == mask_id).sum(1)
        counts = [[int(n) // per_block + (i < int(n) % per_block) for n in left] for i in range(per_block)]
        for i in range(per_block):
            masked = x == mask_id
            logits = model(input_ids=x).logits
            if cfg_scale > 0:
                uncond = model(input_ids=x.masked_fill(prompt, mask_id)).logits
                logits = uncond + (cfg_scale + 1) * (logits - uncond)
            logits[..., list(banned_logits)] = -torch.inf
            x0 = logits.argmax(-1)
            logits[..., list(banned_confidence)] = -torch.inf
            score = logits.softmax(-1, dtype=score_dtype).gather(-1, x0[..., None])[..., 0]
            score[:, end:] = -torch.inf
            score = torch.where(masked, score, torch.tensor(-torch.inf, dtype=score.dtype))
            x0 = torch.where(masked, x0, x)
            for j in range(B):
                picked = score[j].topk(counts[i][j]).indices
                x[j, picked] = x0[j, picked]
    return x[:, P:]


def ours(model, ids, *, variant, banned_logits=(), banned_confidence=(), family="llada", **kw):
    inputs = FAMILIES[family].model_inputs
    return generate_block(lambda x, m: model(**inputs(x, m)).logits, ids, torch.ones_like(ids),
                          variant=variant, confidence_dtype=FAMILIES[family].confidence_dtype,
                          suppress_logit_ids=banned_logits,
                          suppress_confidence_ids=banned_confidence, padding_side="right", **kw)


class Varied(torch.nn.Module):
    """A tiny random LLaDA predicts its input token (at every masked position: the mask), so
    a fixed random logit table per position makes its predictions differ from position to
    position, at near-uniform probabilities."""

    def __init__(self, model, width=32, scale=0.3):
        super().__init__()
        self.model = model
        g = torch.Generator().manual_seed(0)
        self.table = (scale * torch.randn(width, model.config.vocab_size, generator=g)).to(model.dtype)

    def forward(self, input_ids, **kwargs):
        logits = self.model(input_ids=input_ids, **kwargs).logits
        return SimpleNamespace(logits=logits + self.table[: input_ids.shape[1]])


class Confident(torch.nn.Module):
    """A bfloat16 model as confident as a trained LLaDA: every masked position predicts one
    token at about 0.993, which bfloat16 rounds to the same value everywhere while float32
    still ranks the positions (the later, the more confident). The token predicted depends on
    how many positions are already decoded, so the order of decoding decides the answer."""

    mask_id = 4
    vocab = 57

    def forward(self, input_ids, **kwargs):
        decoded = (input_ids != self.mask_id).sum(1, keepdim=True)  # [B, 1]
        position = torch.arange(input_ids.shape[1])[None, :]
        target = 5 + (decoded * 7 + position) % 40  # [B, T]
        logits = torch.zeros(*input_ids.shape, self.vocab)
        logits.scatter_(-1, target[..., None], (9.0 + 0.01 * position)[..., None].expand_as(target[..., None]))
        return SimpleNamespace(logits=logits.to(torch.bfloat16))


@pytest.fixture(scope="module")
def bf16_llada():
    return Varied(tiny.build("llada").to(torch.bfloat16))


def prompts(batch, length=6, seed=0):
    return torch.randint(5, 50, (batch, length), generator=torch.Generator().manual_seed(seed))


CASES = {
    "plain": {},
    "cfg": {"cfg_scale": 1.0},
    "eos_banned": {"banned_logits": (7, 9)},
    "eos_eot_last": {"banned_confidence": (7, 9, 11)},
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("model_name, batch", [("fond", 1), ("plain", 1), ("plain", 3), ("confident", 1),
                                               ("confident", 3)])
def test_reference_variant_equals_llada_loop(bf16_llada, model_name, batch, case):
    """fond: a model whose favourite prediction is often the mask token, so positions stay
    masked and compete again in later blocks, as in LLaDA's loop; confident: confidences that
    tie in bfloat16, so that the order in which ties are broken decides the tokens."""
    mask_id = tiny.tokenizer().mask_token_id
    model = {"fond": FondOfMask(bf16_llada, mask_id), "plain": FondOfMask(bf16_llada, mask_id, fond=False),
             "confident": Confident()}[model_name]
    ids = prompts(batch)
    kw = dict(mask_id=mask_id, gen_length=GEN, steps=STEPS, block_length=BLOCK, **CASES[case])
    with torch.no_grad():
        expected = llada_loop(model, ids, **kw)
        got = ours(model, ids, variant="reference", **kw)
    assert torch.equal(got, expected)
    assert expected.eq(mask_id).any() == (model_name == "fond")


def test_the_invariant_variant_is_not_llada_loop(bf16_llada):
    """The parity above has teeth: a mask token never predicted, and float32 confidences
    with leftmost ties, change the tokens."""
    mask_id = tiny.tokenizer().mask_token_id
    kw = dict(mask_id=mask_id, gen_length=GEN, steps=STEPS, block_length=BLOCK)
    with torch.no_grad():
        for model in (FondOfMask(bf16_llada, mask_id), Confident()):
            ids = prompts(1)
            assert not torch.equal(ours(model, ids, variant="invariant", **kw),
                                   llada_loop(model, ids, **kw)), model


def test_confidence_eos_eot_inf_renormalises_the_other_confidences():
    """LLaDA removes EOS/EOT from the softmax, so the other confidences renormalise: here
    position 0's runner-up is the banned token 1, and without it position 0 becomes the more
    confident one; the invariant variant ranks the raw confidences."""
    table = torch.tensor([[2.0, 1.9, -9.0, -9.0],   # position 0: a close runner-up, token 1
                          [-9.0, -9.0, 2.0, 1.0]])  # position 1: its runner-up far behind
    mask_id = 3

    def fn(x, m):
        logits = torch.full((*x.shape, 4), -9.0)
        logits[0, -2:] = table
        return logits

    ids = torch.tensor([[0]])
    first = {}
    for variant, banned in (("reference", ()), ("reference", (1,)), ("invariant", (1,))):
        calls = []
        generate_block(lambda x, m: calls.append(x.clone()) or fn(x, m), ids, torch.ones_like(ids),
                       mask_id=mask_id, gen_length=2, steps=2, block_length=2, variant=variant,
                       suppress_confidence_ids=banned)
        first[(variant, banned)] = int((calls[1][0, 1:] != mask_id).nonzero()[0])
    assert first[("reference", ())] == 1
    assert first[("reference", (1,))] == 0
    assert first[("invariant", (1,))] == 1


@pytest.mark.parametrize("batch", [1, 3])
def test_mmada_reference_scores_confidences_in_float64_as_mmadas_own_loop(batch):
    """MMaDA's own text decoding is LLaDA's loop with one difference: its confidences are the
    softmax in float64, not in the model's dtype. On bfloat16 logits whose confidences tie
    (Confident), that changes the order of decoding and so the tokens."""
    model, ids = Confident(), prompts(batch)
    kw = dict(mask_id=Confident.mask_id, gen_length=GEN, steps=STEPS, block_length=BLOCK)
    with torch.no_grad():
        expected = llada_loop(model, ids, score_dtype=torch.float64, **kw)
        assert not torch.equal(expected, llada_loop(model, ids, **kw))  # the test has teeth
        assert torch.equal(ours(model, ids, variant="reference", family="mmada", **kw), expected)
        assert torch.equal(ours(model, ids, variant="reference", family="llada", **kw),
                           llada_loop(model, ids, **kw))


@pytest.mark.parametrize("family, dtype", [("llada", None), ("mmada", torch.float64)])
def test_dlm_sinkmask_decodes_with_its_familys_confidence_dtype(tiny_dirs, monkeypatch, family, dtype):
    """The model class hands each family's confidence dtype to the block sampler, in
    generation and in the greedy check of loglikelihood requests alike."""
    from lm_eval_sinkmask import dlm_model, mc_scoring
    from tests.test_models import make, requests

    seen = []
    real = dlm_model.generate_block
    for module in (dlm_model, mc_scoring):  # generation; the greedy check
        monkeypatch.setattr(module, "generate_block",
                            lambda *a, **kw: seen.append(kw.get("confidence_dtype", "unset")) or real(*a, **kw))
    lm = make("dlm_sinkmask", tiny_dirs["llada"], family=family, block_length=4, greedy_check=True)
    lm.generate_until(requests(max_gen_toks=8))
    lm._greedy_matches([5, 6, 7], [8, 9])
    assert seen and set(seen) == {dtype}


class LateDecider(torch.nn.Module):
    """Column 3 of the answer (block 0's last) predicts the mask token, at low confidence,
    until column 4 is decoded; then token 3, very confidently. Other columns predict token
    (col % 10) at confidences falling with the column."""

    P = 2

    def forward(self, input_ids, **kwargs):
        B, T = input_ids.shape
        col = torch.arange(T) - self.P
        logits = torch.zeros(B, T, V)
        logits[:, torch.arange(T), (col % 10).clamp_min(0)] = 3.0 - 0.1 * col.float()
        waiting = input_ids[:, self.P + 4] == MASK  # [B]
        logits[:, self.P + 3] = 0.0
        logits[waiting, self.P + 3, MASK] = 0.5
        logits[~waiting, self.P + 3, 3] = 9.0
        return SimpleNamespace(logits=logits)


def test_a_mask_left_in_a_blocks_last_column_competes_in_the_next_block():
    """Reference variant: as in LLaDA's loop, a column left masked (the mask token predicted)
    stays a candidate in later blocks; here the only such column is the last of block 0."""
    model, ids = LateDecider(), torch.tensor([[5, 6]])
    kw = dict(mask_id=MASK, gen_length=8, steps=4, block_length=4)
    with torch.no_grad():
        expected = llada_loop(model, ids, **kw)
        got = ours(model, ids, variant="reference", **kw)
    assert expected[0, 3] == 3 and expected[0, 7] == MASK  # the test has teeth
    assert torch.equal(got, expected)
