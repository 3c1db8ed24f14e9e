"""The family table: detection, per-family model inputs, and the SDPA-path switch."""

import pytest
import torch

from lm_eval_sinkmask.families import (FAMILIES, disable_flash_attention, family_for,
                                       is_autoregressive)


@pytest.mark.parametrize(
    "model_type, family",
    [("llada", "llada"), ("mmada", "mmada"), ("Dream", "dream"), ("sinkmask_llada", "llada"),
     ("sinkmask_dream", "dream")],
)
def test_model_types_map_to_families(model_type, family):
    assert family_for(model_type).name == family


def test_override_wins_and_unknown_names_are_explained():
    assert family_for("llama", override="LLaDA").name == "llada"
    assert family_for("llada", override="mmada").name == "mmada"  # the same sampler
    with pytest.raises(ValueError, match="unknown family 'gpt'"):
        family_for("llada", override="gpt")
    with pytest.raises(ValueError, match="cannot tell the diffusion family of model_type 'my_dlm'"):
        family_for("my_dlm")
    with pytest.raises(ValueError, match="'llama' is an autoregressive LM: use --model arm_sinkmask"):
        family_for("llama")


def test_dream_inputs_hide_pads_both_ways_and_count_positions_from_the_first_token():
    x = torch.arange(10).view(2, 5)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    inputs = FAMILIES["dream"].model_inputs(x, mask)
    square = inputs["attention_mask"]
    assert square.shape == (2, 1, 5, 5) and square.dtype == torch.bool
    assert not square[0, 0, :2].any() and not square[0, 0, :, :2].any()
    assert square[0, 0, 2:, 2:].all() and square[1].all()
    assert inputs["position_ids"].tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert FAMILIES["dream"].model_inputs(x, torch.ones_like(mask))["attention_mask"] is None


def test_llada_inputs_pass_the_padding_mask_only_when_there_is_padding():
    x = torch.arange(6).view(2, 3)
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert torch.equal(FAMILIES["llada"].model_inputs(x, mask)["attention_mask"], mask)
    assert FAMILIES["llada"].model_inputs(x, torch.ones_like(mask))["attention_mask"] is None


@pytest.mark.parametrize("name", ["llada", "mmada"])
def test_the_pairwise_attention_bias_form_hides_pads_both_ways(name):
    """MMaDA's code honours only this form: a bool [B, 1, T, T], True where both are real."""
    forms = dict(FAMILIES[name].padding_inputs())
    assert list(forms) == ["attention_mask", "attention_bias"]
    x = torch.arange(6).view(2, 3)
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    inputs = forms["attention_bias"](x, mask)
    assert "attention_mask" not in inputs
    bias = inputs["attention_bias"]
    assert bias.shape == (2, 1, 3, 3) and bias.dtype == torch.bool
    assert bias[0, 0].tolist() == [[False] * 3, [False, True, True], [False, True, True]]
    assert bias[1].all()
    assert forms["attention_bias"](x, torch.ones_like(mask))["attention_mask"] is None
    assert list(dict(FAMILIES["dream"].padding_inputs())) == ["attention_mask"]


def test_flash_attention_is_switched_off_so_sdpa_is_called():
    """LLaDA's blocks prefer ``self.flash_attn_func`` when it is set and no mask is passed."""
    calls = []

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.flash_attn_func = lambda q, k, v: calls.append("flash") or q

        def forward(self, q):
            if self.flash_attn_func is not None:
                return self.flash_attn_func(q, q, q)
            calls.append("sdpa")
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    model = torch.nn.Sequential(Block(), Block())
    assert disable_flash_attention(model) == 2
    model(torch.randn(1, 1, 3, 4))
    assert calls == ["sdpa", "sdpa"]


class _Vocab:
    """Just what the EOS lookup reads from a tokenizer."""

    def __init__(self, ids: dict[str, int], eos: str | None, unk: int | None = 0):
        self.ids, self.unk_token_id = ids, unk
        self.eos_token_id = ids.get(eos) if eos else None

    def convert_tokens_to_ids(self, token):
        return self.ids.get(token, self.unk_token_id)


LLADA_VOCAB = {"<|endoftext|>": 126081, "<|eot_id|>": 126348, "<|eos|>": 1}


@pytest.mark.parametrize("eos", ["<|endoftext|>", "<|eot_id|>"])
def test_lladas_eos_flags_name_its_end_of_text_token_whatever_the_tokenizer_calls_eos(eos):
    """LLaDA's own decoding takes EOS out of the logits as <|endoftext|> (126081) and EOS/EoT
    out of the confidences as 126081 and <|eot_id|> (126348), whichever token the tokenizer's
    eos_token is; MMaDA decodes as LLaDA."""
    for name in ("llada", "mmada"):
        family = FAMILIES[name]
        vocab = _Vocab(LLADA_VOCAB, eos)
        assert family.eos_ids(vocab) == (126081,)
        assert family.eos_ids(vocab) + family.special_ids(vocab, family.eot_tokens) == (126081, 126348)


def test_eos_falls_back_to_the_tokenizers_own_where_the_familys_name_is_not_a_token():
    """A tokenizer without <|endoftext|> (the zoo's) keeps its own eos_token; one with neither
    has no EOS to suppress. Dream names no EOS of its own."""
    zoo = _Vocab({"<|eos|>": 1}, "<|eos|>")
    assert FAMILIES["llada"].eos_ids(zoo) == (1,)
    assert FAMILIES["llada"].eos_ids(_Vocab({}, None)) == ()
    assert FAMILIES["dream"].eos_ids(_Vocab(LLADA_VOCAB, "<|eot_id|>")) == (126348,)


def test_an_autoregressive_model_type_is_told_apart_in_any_case():
    """model_types are matched case-blind (Dream's own config says ``"Dream"``): a causal LM's
    too, so one spelled ``"Llama"`` is pointed to arm_sinkmask, not called an unknown family."""
    assert is_autoregressive("Llama") and is_autoregressive("llama")
    with pytest.raises(ValueError, match="'Llama' is an autoregressive LM: use --model arm_sinkmask"):
        family_for("Llama")
