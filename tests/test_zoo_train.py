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


def _answer_region(lengths, width=12, start=2):
    region = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, n in enumerate(lengths):
        region[row, start:start + n] = True
    return region


def test_noise_masks_only_answer_tokens_and_prefix_free_noise_draws_as_before():
    region = _answer_region([8, 5, 10, 3])
    t = torch.tensor([0.2, 0.5, 0.9, 1.0])
    masked, forced = train.noise_answer(region, t, torch.Generator().manual_seed(1))
    assert not (masked & ~region).any() and not forced.any()
    assert masked[3].sum() == 3  # t = 1 masks the whole answer
    # prefix_frac = 0 draws exactly LLaDA's Bernoulli(t) masks: one [B, L] uniform draw
    u = torch.rand(region.shape, generator=torch.Generator().manual_seed(1))
    assert torch.equal(masked, (u < t[:, None]) & region)


def test_clean_prefix_rows_keep_a_prefix_and_mask_past_the_window():
    region = _answer_region([10] * 64, width=14)
    t = torch.full((64,), 0.5)
    masked, forced = train.noise_answer(region, t, torch.Generator().manual_seed(0),
                                        prefix_frac=1.0, window=3)
    offset = region.long().cumsum(-1) - 1
    kept = 0
    for row in range(64):
        answer_masked = masked[row][region[row]]
        first = int(answer_masked.float().argmax()) if answer_masked.any() else 10
        # everything before the first masked token is clean; past the 3-token window after
        # the cut, everything is masked outright (and only there is `forced` set)
        cut = int(offset[row][forced[row]].min()) - 3 if forced[row].any() else None
        if cut is not None:
            assert answer_masked[cut + 3:].all() and not answer_masked[:cut].any()
            assert forced[row][region[row]][cut + 3:].all()
            assert not forced[row][region[row]][:cut + 3].any()
        kept += first
    assert kept > 64  # prefixes of random length, not all empty
    assert not (forced & ~masked).any() and not (masked & ~region).any()
