"""A few training steps of every zoo model: proves the script runs (CI does not retrain)."""

import json

import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from lm_eval_sinkmask.zoo import data, train
from lm_eval_sinkmask.zoo.modeling import TinyDreamModel, TinyLladaModel


def test_training_script_writes_loadable_checkpoints(tmp_path):
    train.main(["--out", str(tmp_path), "--size", "test", "--steps-arm", "2",
                "--steps-llada", "2", "--steps-dream", "2", "--eval-gsm", "1",
                "--eval-code", "1", "--seed", "0"])
    for name in ("arm", "llada", "dream"):
        path = tmp_path / name
        info = json.loads((path / "train_info.json").read_text())
        assert info["steps"] == 2 and info["final_loss"] > 0
        assert "final training loss" in (path / "README.md").read_text().lower()
    tok = AutoTokenizer.from_pretrained(tmp_path / "llada")
    assert tok.mask_token_id is not None and tok("a").input_ids[0] == tok.bos_token_id
    assert isinstance(AutoModel.from_pretrained(tmp_path / "llada"), TinyLladaModel)
    assert isinstance(AutoModel.from_pretrained(tmp_path / "dream"), TinyDreamModel)
    arm = AutoModelForCausalLM.from_pretrained(tmp_path / "arm")
    assert arm.config.model_type == "llama"


def test_tokenizer_round_trips_code_and_splits_digits():
    from lm_eval_sinkmask.zoo.tokenizer import train_tokenizer

    tok = train_tokenizer(seed=0)
    assert len(tok) <= 4096
    for d in data.mini_code_test()[:20]:
        text = d["prompt"] + d["canonical_solution"]
        assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text
    pieces = tok.convert_ids_to_tokens(tok(" 1234", add_special_tokens=False).input_ids)
    assert len(pieces) == 4


def test_diffusion_loss_counts_only_the_answer_region():
    from lm_eval_sinkmask.zoo.modeling import TinyLladaConfig
    torch.manual_seed(0)
    model = TinyLladaModel(TinyLladaConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1,
                                           num_attention_heads=2, mask_token_id=3))
    ids = torch.randint(4, 20, (4, 8))
    region = torch.zeros(4, 8, dtype=torch.bool)
    region[:, 4:] = True
    valid = torch.ones(4, 8, dtype=torch.bool)
    for shift in (False, True):
        gen = torch.Generator().manual_seed(0)
        loss = train.diffusion_loss(model, ids, region, valid, 3, shift, gen)
        assert torch.isfinite(loss) and loss.item() > 0
