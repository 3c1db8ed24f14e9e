"""The quick check written to zoo model cards decodes the DLMs exactly as ``dlm_sinkmask`` does
(the project's samplers, the family's defaults), only with half the denoising steps."""

import pytest
import torch
from lm_eval.api.registry import get_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from lm_eval_sinkmask.samplers import generate_block, generate_dream
from lm_eval_sinkmask.zoo import checkpoint_path, data, quick_eval
from tests import tiny

GEN = 64  # the zoo tasks' generation length
PROMPTS = ([data.gsm_prompt(d) for d in data.mini_gsm_test()[:3]]
           + [data.code_prompt(d) for d in data.mini_code_test()[:2]])


@pytest.mark.parametrize("name", ["llada", "dream", "llada_sink"])
def test_quick_eval_decodes_as_dlm_sinkmask_at_half_the_steps(name):
    steps = GEN // quick_eval.TOKENS_PER_STEP
    lm = get_model("dlm_sinkmask").create_from_arg_string(
        f"pretrained={checkpoint_path(name)},device=cpu,top_k=0,steps={steps}")
    tok = lm.tokenizer
    quick = quick_eval.generate_dlm(lm.model, tok, PROMPTS, GEN)

    # the same prompts, left-padded into one batch as lm-eval hands them to the model
    ids, att = quick_eval._pad_left([tok(p).input_ids for p in PROMPTS], tok.pad_token_id)
    width = ids.shape[1]
    via_lm_eval = lm._model_generate(ids, width + GEN, None, attention_mask=att)[:, width:]
    with torch.inference_mode():  # the sampler called directly, its settings spelled out
        if name == "dream":
            direct = generate_dream(lm._forward, ids, att, mask_id=lm.mask_id, gen_length=GEN,
                                    steps=steps, alg="entropy", alg_temp=0.0,
                                    padding_side="left")
        else:
            direct = generate_block(lm._forward, ids, att, mask_id=lm.mask_id, gen_length=GEN,
                                    steps=steps, block_length=32, padding_side="right")
    assert quick.shape == (len(PROMPTS), GEN)
    assert torch.equal(quick, via_lm_eval) and torch.equal(quick, direct)
    assert len({tuple(row) for row in quick.tolist()}) > 1  # real decoding, not one constant


def test_quick_eval_scores_gsm_as_the_tasks_strict_match():
    """The task's filter and exact_match settings: the gold answer counts, thousands commas
    are ignored as the task ignores them, another number or no ``####`` does not count."""
    docs = data.mini_gsm_test()[:2]
    gold = docs[0]["answer"].split("####")[-1].strip()
    assert "," not in gold
    wrong = str(int(gold) + 1)
    generations = [docs[0]["answer"], f"so #### {wrong}"]
    assert quick_eval.gsm_correct(generations, [docs[0], docs[0]]) == [True, False]
    assert quick_eval.gsm_correct([f"... {gold}"], docs[:1]) == [False]  # no "####": strict
    big = dict(docs[1], answer="work\n#### 1234")
    assert quick_eval.gsm_correct(["it is #### 1,234"], [big]) == [True]


def test_quick_eval_runs_code_in_the_sandbox_with_the_tasks_stops():
    docs = data.mini_code_test()[:2]
    until = quick_eval.task_config("mini_code_sinkmask")["generation_kwargs"]["until"]
    solved = quick_eval.cut_at_stops(docs[0]["canonical_solution"] + "\ndef extra():\n", until)
    assert solved == docs[0]["canonical_solution"]  # cut at "\ndef" as lm-eval cuts
    assert quick_eval.code_passes([solved, "    return None\n"], docs) == [True, False]


def test_a_budget_of_part_of_a_block_decodes_as_one_block():
    """The block sampler needs whole blocks: a generation length that is not a multiple of
    LLaDA's 32 is decoded as one block of that length rather than refused."""
    model, tok = tiny.build("llada", 0), tiny.tokenizer()
    out = quick_eval.generate_dlm(model, tok, ["Question : Tom has 3 apples", "1 + 2 ="], 20)
    assert out.shape == (2, 20)


def test_quick_eval_scores_exactly_the_first_problems_it_is_asked_for():
    """The first ``n_gsm`` mini_gsm and ``n_code`` mini_code problems, every one of them
    decoded (here one per batch) and counted: the same scores as each prompt's own answer."""
    tok = AutoTokenizer.from_pretrained(checkpoint_path("arm"))
    model = AutoModelForCausalLM.from_pretrained(checkpoint_path("arm")).eval()
    gsm, code = data.mini_gsm_test()[:3], data.mini_code_test()[:2]
    res = quick_eval.quick_eval(model, tok, 3, 2, batch=1)
    assert (res["eval_n_gsm"], res["eval_n_code"]) == (3, 2)

    def own(task, prompt):
        kw = quick_eval.task_config(task)["generation_kwargs"]
        [text] = quick_eval.generate_arm(model, tok, [prompt], kw["max_gen_toks"])
        return quick_eval.cut_at_stops(text, kw["until"])

    g = [own("mini_gsm_sinkmask", data.gsm_prompt(d)) for d in gsm]
    c = [own("mini_code_sinkmask", data.code_prompt(d)) for d in code]
    assert res["example_gsm"] == g[0]
    assert res["mini_gsm_acc"] == sum(quick_eval.gsm_correct(g, gsm)) / 3
    assert res["mini_code_pass@1"] == sum(quick_eval.code_passes(c, code)) / 2
