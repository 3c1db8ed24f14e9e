"""The zoo tasks load offline and score like the real ones: gold answers get 100%."""

import pytest
from lm_eval import simple_evaluate
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager

from lm_eval_sinkmask.tasks import TASKS_DIR
from lm_eval_sinkmask.zoo import data


class GoldLM(LM):
    """Answers each prompt with its gold continuation (or a wrong one)."""

    def __init__(self, wrong=False):
        super().__init__()
        self.answers = {data.gsm_prompt(d): data.gsm_target(d) for d in data.mini_gsm_test()}
        self.answers.update({data.code_prompt(d): data.code_target(d)
                             for d in data.mini_code_test()})
        self.wrong = wrong

    def generate_until(self, requests):
        out = []
        for r in requests:
            gold = self.answers[r.args[0]]
            out.append("    return None\n" if self.wrong and gold.startswith("    ")
                       else " #### -1" if self.wrong else gold + "\nQuestion: next")
        return out

    def loglikelihood(self, requests):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError


def _run(lm):
    tm = TaskManager(include_path=str(TASKS_DIR))
    res = simple_evaluate(model=lm, tasks=["mini_gsm_sinkmask", "mini_code_sinkmask"],
                          task_manager=tm, limit=20, confirm_run_unsafe_code=True)
    return res["results"]


def test_tasks_have_the_full_test_splits():
    tm = TaskManager(include_path=str(TASKS_DIR))
    tasks = tm.load(["mini_gsm_sinkmask", "mini_code_sinkmask"])["tasks"]
    assert len(list(tasks["mini_gsm_sinkmask"].test_docs())) >= 300
    assert len(list(tasks["mini_code_sinkmask"].test_docs())) >= 100


@pytest.mark.parametrize("wrong", [False, True])
def test_gold_answers_score_full_marks(wrong):
    results = _run(GoldLM(wrong))
    expect = 0.0 if wrong else 1.0
    assert results["mini_gsm_sinkmask"]["exact_match,strict-match"] == expect
    assert results["mini_code_sinkmask"]["pass@1,create_test"] == expect


class ScoreLM(LM):
    """Scores each choice of mini_mc by a fixed rule: the gold answer highest, or lowest."""

    def __init__(self, wrong=False):
        super().__init__()
        self.gold = {(data.gsm_prompt(d), " " + d["answer"]) for d in data.mini_mc_test()}
        self.wrong = wrong

    def loglikelihood(self, requests):
        return [((-1.0 if self.wrong else 0.0) if r.args in self.gold else -0.5, False)
                for r in requests]

    def generate_until(self, requests):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError


@pytest.mark.parametrize("wrong", [False, True])
def test_mini_mc_scores_by_the_choice_likelihoods(wrong):
    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    res = simple_evaluate(model=ScoreLM(wrong), tasks=["mini_mc_sinkmask"], task_manager=tm)
    assert res["results"]["mini_mc_sinkmask"]["acc,none"] == (0.0 if wrong else 1.0)
    assert res["n-samples"]["mini_mc_sinkmask"]["effective"] == data.N_TEST_MC


@pytest.mark.parametrize("task, answers, target",
                         [("mini_gsm_sinkmask", data.mini_gsm_test, data.gsm_target),
                          ("mini_code_sinkmask", data.mini_code_test, data.code_target)])
def test_every_zoo_answer_fits_the_generation_budget(task, answers, target):
    """A DLM fills every one of its max_gen_toks positions, so the budget is kept short; it
    must still hold every gold answer (zoo tokenizer, EOS included), and the zoo's training
    region covers it."""
    from transformers import AutoTokenizer

    from lm_eval_sinkmask.tasks import max_gen_toks
    from lm_eval_sinkmask.zoo import batches, checkpoint_path

    budget = max_gen_toks(task)
    tok = AutoTokenizer.from_pretrained(str(checkpoint_path("llada", 0)))
    longest = max(len(tok(target(doc), add_special_tokens=False)["input_ids"]) + 1 for doc in answers())
    assert longest <= budget <= batches.GEN_LEN
    with pytest.raises(KeyError, match="no task YAML"):
        max_gen_toks("no_such_task")
