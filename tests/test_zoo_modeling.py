import torch
import pytest
from transformers import AutoModel, LlamaConfig, LlamaForCausalLM

from lm_eval_sinkmask.zoo.modeling import (TinyDreamConfig, TinyDreamModel, TinyLladaConfig,
                                           TinyLladaModel)

V = 50


def _llada():
    torch.manual_seed(0)
    return TinyLladaModel(TinyLladaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, mask_token_id=V - 1)).eval()


def _dream():
    torch.manual_seed(0)
    return TinyDreamModel(TinyDreamConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2,
                                          mask_token_id=V - 1)).eval()


@pytest.mark.parametrize("make", [_llada, _dream])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_does_not_change_valid_positions(make, side):
    model = make()
    ids = torch.randint(0, V - 1, (1, 7))
    ref = model(ids).logits
    pad = torch.zeros(1, 3, dtype=torch.long)
    padded = torch.cat([pad, ids], 1) if side == "left" else torch.cat([ids, pad], 1)
    mask = (torch.arange(10) >= 3) if side == "left" else (torch.arange(10) < 7)
    mask = mask.long()[None]
    # Positions count from the first valid token, as the samplers pass them.
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(padded, attention_mask=mask, position_ids=pos).logits
    valid = out[:, 3:] if side == "left" else out[:, :7]
    torch.testing.assert_close(valid, ref, atol=1e-5, rtol=1e-4)


def test_dream_accepts_4d_bool_mask():
    model = _dream()
    ids = torch.randint(0, V - 1, (2, 6))
    full = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    torch.testing.assert_close(model(ids, attention_mask=full).logits, model(ids).logits)


def test_batch_matches_single():
    model = _llada()
    ids = torch.randint(0, V - 1, (3, 5))
    batch = model(ids).logits
    for i in range(3):
        torch.testing.assert_close(batch[i:i + 1], model(ids[i:i + 1]).logits,
                                   atol=1e-5, rtol=1e-4)


def test_attention_goes_through_patched_sdpa(monkeypatch):
    calls = []
    orig = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *a, **kw):
        calls.append((q.shape, k.shape, kw.get("attn_mask")))
        return orig(q, k, v, *a, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    ids = torch.randint(0, V - 1, (2, 6))
    _llada()(ids)
    assert len(calls) == 2 and calls[0][2] is None
    calls.clear()
    _dream()(ids, attention_mask=torch.ones(2, 6, dtype=torch.long))
    assert len(calls) == 2
    (qs, ks, mask) = calls[0]
    assert qs == ks == (2, 4, 6, 8)  # KV heads repeated before the call
    assert mask.dtype == torch.bool and mask.shape == (2, 1, 6, 6)


def test_from_llama_matches_llama_under_causal_mask():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      attn_implementation="sdpa")
    llama = LlamaForCausalLM(cfg).eval()
    dream = TinyDreamModel.from_llama(llama).eval()
    ids = torch.randint(0, V, (2, 6))
    causal = torch.ones(6, 6, dtype=torch.bool).tril()[None, None].expand(2, 1, 6, 6)
    torch.testing.assert_close(dream(ids, attention_mask=causal).logits,
                               llama(ids).logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("make", [_llada, _dream])
def test_save_and_load_with_auto_model(make, tmp_path):
    model = make()
    model.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    ids = torch.randint(0, V - 1, (1, 5))
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
