"""Dream's sampler against an independent re-implementation of Dream's own decoding loop.

``dream_loop`` below is written from the algorithm of Dream's ``diffusion_generate`` (greedy
token choice), not from our sampler: Dream's layout (left-padded prompt + mask tokens, pads
given position 1 and hidden both ways), its right-shifted logits, probabilities in the model's
dtype, the batch-average count of tokens to reveal and ``torch.topk`` over the whole row.
Our ``reference`` variant must give exactly its tokens; the ``invariant`` variant must not
(else these tests could not tell the two apart).
"""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lm_eval_sinkmask.families import FAMILIES
from lm_eval_sinkmask.samplers import generate_dream
from tests import tiny

ALGS = ("entropy", "maskgit_plus", "topk_margin", "origin")
GEN, STEPS = 12, 12


def dream_loop(model, ids, mask, *, mask_id, gen_length, steps, alg, eps=1e-3):
    """Dream's diffusion_generate at temperature 0: the generated tokens, [B, gen_length]."""
    B, P = ids.shape
    x = F.pad(ids, (0, gen_length), value=mask_id)
    position_ids = attention = None
    if bool((mask == 0).any()):  # padded: a pairwise mask and positions from the first token
        valid = F.pad(mask, (0, gen_length), value=1).bool()
        position_ids = (valid.long().cumsum(-1) - 1).masked_fill(~valid, 1)
        attention = valid[:, None, :, None] & valid[:, None, None, :]
    times = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        t, s = times[i], times[i + 1]
        is_mask = x == mask_id
        logits = model(input_ids=x, attention_mask=attention, position_ids=position_ids).logits
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # token j from position j-1
        probs = logits[is_mask].softmax(-1)  # the model's dtype, mask token included
        best, x0 = probs.max(-1)
        if alg == "origin":
            share = 1 - s / t if i < steps - 1 else 1
            revealed = torch.full_like(x0, mask_id)
            take = torch.rand(x0.shape) < share
            revealed[take] = x0[take]
            x[is_mask] = revealed
            continue
        if alg == "maskgit_plus":
            score = best
        elif alg == "topk_margin":
            ranked = probs.sort(-1, descending=True).values
            score = ranked[:, 0] - ranked[:, 1]
        else:
            score = (probs * (probs + 1e-10).log()).sum(-1)
        per_row = is_mask.sum() / B
        n = int(per_row * (1 - s / t)) if i < steps - 1 else int(per_row)
        if n == 0:
            continue
        scores = torch.full(x.shape, -torch.inf, dtype=logits.dtype)
        scores[is_mask] = score
        picked = scores.topk(n).indices
        proposal = torch.full_like(x, mask_id)
        proposal[is_mask] = x0
        x.scatter_(1, picked, proposal.gather(1, picked))
    return x[:, P:]


class FondOfMask(torch.nn.Module):
    """Wraps a model so that the mask token is the favourite prediction wherever logit 3 beats
    logit 5 (fond=True), and never predicted otherwise (fond=False). Dream leaves positions
    where it predicts the mask token masked, so its answer may end with mask tokens."""

    def __init__(self, model, mask_id, fond=True):
        super().__init__()
        self.model, self.mask_id, self.fond = model, mask_id, fond

    def forward(self, **kwargs):
        logits = self.model(**kwargs).logits
        if self.fond:
            where = logits[..., 3] > logits[..., 5]
            value = logits.max(-1).values + 1
        else:
            where, value = torch.ones_like(logits[..., 0], dtype=torch.bool), torch.finfo(logits.dtype).min
        logits[..., self.mask_id] = torch.where(where, value, logits[..., self.mask_id])
        return SimpleNamespace(logits=logits)


def ours(model, ids, mask, *, variant, **kw):
    inputs = FAMILIES["dream"].model_inputs
    return generate_dream(lambda x, m: model(**inputs(x, m)).logits, ids, mask, variant=variant,
                          padding_side="left", **kw)


@pytest.fixture(scope="module")
def bf16_dream():
    """Tiny random Dream in bfloat16: its near-uniform probabilities tie in bfloat16, so the
    order in which ties are broken decides tokens."""
    return tiny.build("dream").to(torch.bfloat16)


def prompts(n, lengths=(7, 3, 5)):
    g = torch.Generator().manual_seed(n)
    rows = [torch.randint(5, 60, (length,), generator=g) for length in lengths[:n]]
    P = max(map(len, rows))
    ids = torch.full((n, P), tiny.tokenizer().pad_token_id)
    mask = torch.zeros(n, P, dtype=torch.long)
    for r, row in enumerate(rows):  # left padding, as Dream's tokenizer pads
        ids[r, P - len(row):], mask[r, P - len(row):] = row, 1
    return ids, mask


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("batch", [1, 3])
def test_reference_variant_equals_dreams_loop(bf16_dream, batch, alg):
    """Batch 1: a model fond of the mask token, so some positions end masked, as in Dream.
    Batch 3, left-padded as Dream's tokenizer pads: the model never predicts the mask token,
    so every row holds equally many masks and Dream's batch-average count is each row's (with
    unequal rows Dream's count would let one row steer another's; ours counts per row)."""
    model = FondOfMask(bf16_dream, tiny.tokenizer().mask_token_id, fond=batch == 1)
    ids, mask = prompts(batch)
    kw = dict(mask_id=model.mask_id, gen_length=GEN, steps=STEPS, alg=alg)
    with torch.no_grad():
        torch.manual_seed(batch)
        expected = dream_loop(model, ids, mask, **kw)
        torch.manual_seed(batch)
        got = ours(model, ids, mask, variant="reference", **kw)
    assert torch.equal(got, expected)
    assert expected.eq(model.mask_id).any() == model.fond


def test_the_invariant_variant_is_not_dreams_loop(bf16_dream):
    """The parity above has teeth: a suppressed mask token changes the tokens under every alg,
    and float32 probabilities with leftmost ties change them under entropy, where bfloat16
    confidences tie most."""
    mask_id = tiny.tokenizer().mask_token_id
    fond, plain = FondOfMask(bf16_dream, mask_id), FondOfMask(bf16_dream, mask_id, fond=False)
    kw = dict(mask_id=mask_id, gen_length=GEN, steps=STEPS)
    with torch.no_grad():
        for n in (1, 3):
            ids, mask = prompts(n)
            for model, algs in ((fond, ALGS[:3]), (plain, ["entropy"])):
                for alg in algs:
                    expected = dream_loop(model, ids, mask, alg=alg, **kw)
                    got = ours(model, ids, mask, variant="invariant", alg=alg, **kw)
                    assert not torch.equal(got, expected), (n, model.fond, alg)


@pytest.mark.parametrize("side", ["left", "right"])
def test_the_invariant_variant_of_a_float32_model_decodes_each_row_as_alone(side):
    """The README's claim: the invariant sampler gives a padded row its tokens alone wherever
    the model's own rounding does not move with the batch shape (float32 here; the same tiny
    model in bfloat16, whose near-uniform logits tie most, moves a few of these)."""
    model = FondOfMask(tiny.build("dream"), tiny.tokenizer().mask_token_id, fond=False)
    inputs = FAMILIES["dream"].model_inputs

    def decode(ids, mask, **kw):
        return generate_dream(lambda x, m: model(**inputs(x, m)).logits, ids, mask,
                              variant="invariant", padding_side=side, **kw)

    ids, mask = prompts(3)
    with torch.no_grad():
        for alg in ALGS[:3]:
            for steps in (GEN, GEN // 2, 3):
                kw = dict(mask_id=model.mask_id, gen_length=GEN, steps=steps, alg=alg)
                alone = [decode(ids[r:r + 1, mask[r].bool()], mask[r:r + 1, mask[r].bool()], **kw)
                         for r in range(len(ids))]
                assert torch.equal(decode(ids, mask, **kw), torch.cat(alone)), (alg, steps)


def test_dlm_sinkmask_decodes_dream_as_dreams_loop_by_default(tiny_dirs):
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    lm = get_model("dlm_sinkmask").create_from_arg_string(
        f"pretrained={tiny_dirs['dream']},device=cpu,dtype=bfloat16,top_k=0")
    assert lm.settings.dream_sampler == "reference"
    prompt = "Question : Tom has 3 apples . how many ?"
    [text] = lm.generate_until([Instance("generate_until", {}, (prompt, {"until": ["<eos>"], "max_gen_toks": GEN}), 0)])
    ids = torch.tensor([lm.tok_encode(prompt)])
    with torch.no_grad():
        out = dream_loop(lm.model, ids, torch.ones_like(ids), mask_id=lm.mask_id, gen_length=GEN,
                         steps=GEN, alg="entropy")
    assert text == lm.tok_decode(out[0].tolist()).split("<eos>")[0]
