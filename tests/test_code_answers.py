"""Cutting the code out of a chat answer: what a solution needs must survive the cut."""

from __future__ import annotations

import pytest

from lm_eval_sinkmask.code_answers import extract_code, program_from_answer

PROMPT = 'def capped(x):\n    """x, at most LIMIT."""\n'
FUNCTION = "def capped(x):\n    return min(x, LIMIT)\n"


def run(program: str, entry_point: str):
    namespace: dict = {}
    exec(program, namespace)
    return namespace[entry_point]


@pytest.mark.parametrize("constant", ["LIMIT = 10", "LIMIT: int = 10", "LIMIT:int=10"])
@pytest.mark.parametrize("before", ["", "Here is the code:\n"])
def test_a_module_constant_that_starts_an_unfenced_answer_is_kept(constant, before):
    # A function that reads a constant defined above it raised NameError: a correct answer
    # scored 0.
    answer = f"{before}{constant}\n\n{FUNCTION}\nThis caps x."
    assert extract_code(answer, "capped").startswith(constant)
    assert run(program_from_answer(PROMPT, answer, "capped"), "capped")(20) == 10


@pytest.mark.parametrize("prose", ["Note: the result = min(x, 10)", "x == 10 when x is large"])
def test_prose_that_merely_contains_an_equals_sign_is_still_dropped(prose):
    answer = f"{prose}\ndef capped(x):\n    return min(x, 10)\n"
    assert extract_code(answer, "capped") == "def capped(x):\n    return min(x, 10)\n"


def test_an_unclosed_fence_runs_to_the_end_of_the_answer():
    # An answer cut off by the token limit never closes its block.
    answer = ("A helper:\n```python\ndef cap():\n    return 10\n```\nThen:\n```python\n"
              "def capped(x):\n    return min(x, cap())\n")
    assert extract_code(answer, "capped") == "def capped(x):\n    return min(x, cap())\n"
    assert run(program_from_answer(PROMPT, answer, "capped"), "capped")(20) == 10
    body = "```python\n    return min(x, 10)\n"
    assert program_from_answer(PROMPT, body, "capped") == PROMPT + "    return min(x, 10)\n"


def test_an_indented_first_line_is_a_body_that_continues_the_prompt():
    # Not prose to skip up to the first ``def``: that would lose the body and keep the helper.
    answer = "    return min(x, cap())\n\n\ndef cap():\n    return 10\n"
    assert extract_code(answer, "capped") == answer
    program = program_from_answer(PROMPT, answer, "capped")
    assert program.startswith(PROMPT + "    return min(x, cap())\n")
    assert run(program, "capped")(20) == 10


@pytest.mark.parametrize("prose", ["Result = the sum of the list, capped.",
                                   "total = every value, at most LIMIT"])
@pytest.mark.parametrize("before", ["", "Here is the code:\n"])
def test_prose_shaped_like_an_assignment_is_not_where_the_code_starts(prose, before):
    # Such a line, kept, made the whole program a SyntaxError: a correct answer scored 0.
    answer = f"{before}{prose}\nLIMIT = 10\n\n{FUNCTION}"
    assert extract_code(answer, "capped") == f"LIMIT = 10\n\n{FUNCTION}"
    assert run(program_from_answer(PROMPT, answer, "capped"), "capped")(20) == 10


def test_an_unfinished_assignment_still_starts_the_code():
    answer = f"Here is the code:\nLIMITS = [\n    10,\n]\nLIMIT = LIMITS[0]\n{FUNCTION}"
    assert extract_code(answer, "capped").startswith("LIMITS = [\n")
    assert run(program_from_answer(PROMPT, answer, "capped"), "capped")(20) == 10


SOLVED = "```python\ndef capped(x):\n    return min(x, 10)\n```\n"


@pytest.mark.parametrize("answer", [
    # an example session or a command after the code: not Python, and it cut the program
    # (every block that does not define the entry point was pasted in as a helper)
    SOLVED + "Example:\n```\n>>> capped(20)\n10\n```\n",
    SOLVED + "Run it:\n```\n$ python capped.py\n```\n",
    # a block tagged otherwise before the code: its closing fence was read as an opening one
    "Trace:\n```text\n20 -> 10\n```\nCode:\n" + SOLVED,
    "```bash\npython capped.py\n```\n" + SOLVED,
    # the prompt's stub restated first: it defines the entry point too, with no body
    f"You gave:\n```python\n{PROMPT}```\nCompleted:\n" + SOLVED,
])
def test_a_correct_answer_survives_the_other_blocks_around_it(answer):
    assert run(program_from_answer(PROMPT, answer, "capped"), "capped")(20) == 10


def test_an_answer_whose_only_block_is_not_python_has_no_code():
    assert extract_code("```text\n20 -> 10\n```\n", "capped") == ""


@pytest.mark.parametrize("prelude", [
    "def _low():\n    return 10\n\nLIMIT = _low()\n",  # set by a call of its own function
    "LIMIT, HIGH = 10, 1000\n",  # several names at once
    "try:\n    LIMIT = 10\nexcept Exception:\n    LIMIT = 10\n",  # as `try: from math import isqrt`
    "if True:\n    LIMIT = 10\n",
])
def test_module_level_names_the_solution_reads_are_kept(prelude):
    # each was dropped: the function raised NameError, and a correct answer scored 0
    answer = f"```python\n{prelude}\n{FUNCTION}```"
    assert run(program_from_answer(PROMPT, answer, "capped"), "capped")(20) == 10


def test_a_demonstration_stays_out_even_beside_a_kept_name():
    program = program_from_answer(
        PROMPT, "```python\nLIMIT = 10\n" + FUNCTION + "result = capped(3)\nassert result == 4\n"
        "if __name__ == '__main__':\n    print(capped(3))\n```", "capped")
    assert program == PROMPT + "LIMIT = 10\n" + FUNCTION
