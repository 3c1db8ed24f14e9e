"""Padded batches on checkpoints whose code mishandles the padding mask, as the released remote
code of GSAI's LLaDA (mask never reaches attention) and MMaDA (a 2-D mask with a 0 turns
attention causal) do: the load-time probe picks a form the code honours, or splits batches
into prompts of equal length, so that batch size 4 decodes exactly as batch size 1.

The mimics (tests/tiny.py) load the tiny LLaDA checkpoint through ``model_class=``, the way
MMaDA's class is loaded from its own repository.
"""

import logging

import pytest
import torch

from lm_eval_sinkmask.families import FAMILIES
from lm_eval_sinkmask.padding_probe import UNPADDED, choose_padding, honours_padding
from tests import tiny
from tests.test_models import make, requests

# two prompts of equal length (grouped together when batches are split by length)
PROMPTS = [
    "Question : Tom has 3 apples . how many ?",
    "Question : Anna has 12 books and Ben gives 4 more books . how many books ? Answer :",
    "Question : 7 + 5 = ?",
    "Question : 2 + 9 = ?",
]

MIMICS = {  # model_class -> what the probe must conclude
    "tests.tiny:IgnoresPaddingLlada": UNPADDED,
    "tests.tiny:CausalWhenPaddedLlada": "attention_bias",
}


@pytest.fixture(scope="module")
def sharp_llada(tmp_path_factory):
    """The tiny LLaDA with weights 15x larger: its answers depend on what attention sees (at
    the default init they barely depend on the context at all)."""
    model = tiny.build("llada")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(15)
    path = tmp_path_factory.mktemp("sharp_llada")
    model.save_pretrained(path)
    tiny.tokenizer().save_pretrained(path)
    return path


def load(path, model_class=None, **args):
    extra = {"model_class": model_class, "family": "mmada"} if model_class else {}
    return make("dlm_sinkmask", path, block_length=4, **extra, **args)


@pytest.mark.parametrize("model_class, padding", [*MIMICS.items(), (None, "attention_mask")])
def test_the_probe_finds_how_each_checkpoint_takes_padding(sharp_llada, caplog, model_class, padding):
    with caplog.at_level(logging.INFO, logger="lm_eval.sinkmask"):
        lm = load(sharp_llada, model_class)
    assert lm.padding == padding
    assert lm.get_model_info()["sinkmask"]["padding"] == padding
    said = "equal length" if padding == UNPADDED else f"as {padding}"
    assert any(said in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("args", [dict(top_k=0), dict(top_k=1, eps=0.0)], ids=["unmasked", "masked"])
@pytest.mark.parametrize("model_class", MIMICS)
def test_batch_four_equals_batch_one_on_mimics_of_the_remote_code(sharp_llada, model_class, args):
    one = load(sharp_llada, model_class, batch_size=1, **args).generate_until(requests(PROMPTS))
    four = load(sharp_llada, model_class, batch_size=4, **args)
    assert four.generate_until(requests(PROMPTS)) == one
    assert any(one)
    if args["top_k"]:
        assert four.mask_stats.keys_masked > 0


@pytest.mark.parametrize("model_class", MIMICS)
def test_without_the_probe_the_mimics_break_batching(sharp_llada, model_class):
    """The mimics reproduce the bug: passing them the plain 2-D mask in padded batches
    changes their answers."""
    one = load(sharp_llada, model_class, batch_size=1).generate_until(requests(PROMPTS))
    four = load(sharp_llada, model_class, batch_size=4)
    four.padding, four._inputs = "attention_mask", FAMILIES["mmada"].model_inputs
    assert four.generate_until(requests(PROMPTS)) != one


def test_equal_length_groups_decode_together(sharp_llada):
    """UNPADDED splits a batch only by prompt length: the two equal-length prompts share one
    sampler call (one masker block), the other two get one each."""
    lm = load(sharp_llada, "tests.tiny:IgnoresPaddingLlada", batch_size=4)
    calls = []
    decode = lm._decode
    lm._decode = lambda context, mask, s: calls.append(context.shape[0]) or decode(context, mask, s)
    lm.generate_until(requests(PROMPTS))
    assert sorted(calls) == [1, 1, 2]


@pytest.mark.parametrize("name", ["llada", "dream", "llada_sink"])
def test_the_shipped_zoo_checkpoints_take_the_plain_mask(name):
    assert make("dlm_sinkmask", f"zoo:{name}").padding == "attention_mask"


@pytest.mark.parametrize("kind, side", [("llada", "right"), ("llada", "left"), ("dream", "left")])
def test_the_zoo_classes_honour_their_mask(kind, side):
    model = tiny.build(kind)
    family = FAMILIES[kind]
    with torch.no_grad():
        assert honours_padding(lambda x, m: model(**family.model_inputs(x, m)).logits,
                               vocab_size=model.config.vocab_size, mask_id=model.config.mask_token_id,
                               padding_side=side, device="cpu", dtype=torch.float32)


# the probe on forwards made to fail one way each: logits of a position from its own token
# only (padding invisible), plus what the failure adds
V, MASK_ID = 50, 49
LOGITS = torch.randn(V, V, generator=torch.Generator().manual_seed(1))
PROBE = dict(vocab_size=V, mask_id=MASK_ID, device="cpu", dtype=torch.float32)


def own_token_only(ids, mask):
    return LOGITS[ids]


def pads_leak_slightly(ids, mask):
    """The pad tokens reach the real positions, by far less than the rounding tolerance: only
    the two pad fills' bit-identical logits can tell."""
    return LOGITS[ids] + 1e-7 * (ids * (1 - mask)).sum(1).float()[:, None, None]


def length_moves_logits(ids, mask):
    """Padding changes how the real tokens see each other (as a causal switch would)."""
    return LOGITS[ids] + 1e-3 * ids.shape[1]


def right_padding_leaks(ids, mask):
    """Honours left padding only: the pads are attended when they follow the row."""
    leak = 0.01 * ids.sum(1).float()[:, None, None] if bool(mask[0, -1] == 0) else 0.0
    return LOGITS[ids] + leak


def minus_inf_alone_only(ids, mask):
    """A logit that is -inf by design when the row is alone (an extra sink token's) comes out
    finite once the row is padded: padding changed what the real positions see."""
    out = LOGITS[ids].clone()
    if bool(mask.all()):
        out[..., 0] = float("-inf")
    return out


@pytest.mark.parametrize("side", ["left", "right"])
def test_the_probe_tells_invisible_padding_from_each_leak(side):
    assert honours_padding(own_token_only, padding_side=side, **PROBE)
    assert not honours_padding(pads_leak_slightly, padding_side=side, **PROBE)
    assert not honours_padding(length_moves_logits, padding_side=side, **PROBE)
    assert not honours_padding(minus_inf_alone_only, padding_side=side, **PROBE)
    # the probe pads on the side the run pads
    assert honours_padding(right_padding_leaks, padding_side=side, **PROBE) == (side == "left")


def test_a_form_the_forward_refuses_is_passed_over_unless_it_is_the_first():
    """The first form is the one every generation uses: its TypeError is the run's to see."""
    forwards = {"plain": own_token_only, "leaky": pads_leak_slightly}

    def forward_with(form, ids, mask):
        if form not in forwards:
            raise TypeError("forward() got an unexpected keyword argument 'attention_bias'")
        return forwards[form](ids, mask)

    probe = dict(padding_side="left", **PROBE)
    assert choose_padding(forward_with, [("a", "leaky"), ("b", "refused"), ("c", "plain")],
                          **probe) == "c"
    assert choose_padding(forward_with, [("a", "leaky")], **probe) == UNPADDED
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        choose_padding(forward_with, [("b", "refused"), ("c", "plain")], **probe)
