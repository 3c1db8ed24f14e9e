"""The shipped zoo checkpoints: present, small, loadable offline, and actually trained."""

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from lm_eval_sinkmask.zoo import CHECKPOINTS_DIR, ZOO_NAMES, checkpoint_path, data, register
from lm_eval_sinkmask.zoo.install import PACKAGE_BUDGET_MB, REPO_BUDGET_MB, megabytes

pytestmark = pytest.mark.skipif(not (CHECKPOINTS_DIR / "arm").is_dir(),
                                reason="zoo checkpoints not trained yet")


def test_checkpoints_fit_the_size_budgets():
    """Inside the package (what every install carries) <= 40 MB; with the further training
    seeds in the repository's zoo_seeds/ <= 120 MB."""
    shipped = megabytes(CHECKPOINTS_DIR)
    seeds = CHECKPOINTS_DIR.parents[2] / "zoo_seeds"
    assert PACKAGE_BUDGET_MB == 40 and REPO_BUDGET_MB == 120
    assert shipped <= PACKAGE_BUDGET_MB
    assert shipped + (megabytes(seeds) if seeds.is_dir() else 0) <= REPO_BUDGET_MB


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_checkpoint_loads_offline_with_its_tokenizer(name):
    register()
    path = checkpoint_path(name)
    tok = AutoTokenizer.from_pretrained(path)
    auto = AutoModelForCausalLM if name == "arm" else AutoModel
    model = auto.from_pretrained(path)
    assert model.config.vocab_size >= len(tok)
    assert (path / "README.md").is_file()
    if name != "arm":
        assert model.config.mask_token_id == tok.mask_token_id


def test_arm_solves_code_problems_greedily():
    path = checkpoint_path("arm")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    solved = 0
    for doc in data.mini_code_test()[:5]:
        ids = torch.tensor([tok(doc["prompt"]).input_ids])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=40, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        body = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        solved += body.strip() == doc["canonical_solution"].strip()
    assert solved >= 4
