"""Deterministic generators for the zoo's two tasks (docs/method.md section 10).

- ``mini_gsm``: arithmetic word problems in GSM8K's format: ``question`` and ``answer``, where
  the answer is worked steps, one per line, then ``#### <number>``. One to three steps.
- ``mini_code``: small Python functions in HumanEval's format (``task_id``, ``prompt`` with the
  signature and docstring, ``canonical_solution``, ``test`` defining ``check(candidate)``,
  ``entry_point``), so the same sandbox scores them.

Test splits come from a fixed seed; training streams skip every test question, so the splits
are disjoint by construction.
"""

import random
from collections.abc import Callable

TEST_SEED = 1234
N_TEST_GSM = 300
N_TEST_CODE = 100

# ----------------------------------------------------------------------------- mini_gsm

NAMES = [("Tom", "he"), ("Anna", "she"), ("Ben", "he"), ("Lily", "she"), ("Sam", "he"),
         ("Mia", "she"), ("Jack", "he"), ("Emma", "she"), ("Leo", "he"), ("Zoe", "she"),
         ("Max", "he"), ("Ella", "she"), ("Noah", "he"), ("Ruby", "she"), ("Omar", "he"),
         ("Nina", "she"), ("Liam", "he"), ("Sara", "she"), ("Paul", "he"), ("Rosa", "she")]
OBJECTS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "cards", "shells",
           "stamps", "coins", "balloons", "candies", "toys", "eggs", "flowers", "rocks",
           "buttons", "cupcakes", "oranges", "crayons"]

# Each step: (sentence in the question, worked lines of the answer). {n} is the name,
# {p} the pronoun ({p_} capitalised, {p_lo} possessive, {p_obj} object), {o} the object,
# {a} the operand, {b} a second operand, {x} the old total, {y} the new total, {m} an
# intermediate product.
ADD = [("{p_} buys {a} more {o}.", "{x} + {a} = {y}"),
       ("{p_} finds {a} more {o}.", "{x} + {a} = {y}"),
       ("A friend gives {n} {a} {o}.", "{x} + {a} = {y}"),
       ("Then {p} gets {a} more {o}.", "{x} + {a} = {y}")]
SUB = [("{p_} gives away {a} {o}.", "{x} - {a} = {y}"),
       ("{p_} loses {a} {o}.", "{x} - {a} = {y}"),
       ("{p_} sells {a} of the {o}.", "{x} - {a} = {y}"),
       ("Then {p} uses {a} {o}.", "{x} - {a} = {y}")]
MUL = [("{p_} buys {a} bags with {b} {o} in each bag.", "{a} * {b} = {m}\n{x} + {m} = {y}"),
       ("{p_} gets {a} boxes of {o} with {b} in each box.",
        "{a} * {b} = {m}\n{x} + {m} = {y}"),
       ("Each of {p_lo} {a} friends gives {p_obj} {b} {o}.",
        "{a} * {b} = {m}\n{x} + {m} = {y}")]
START = ["{n} has {x} {o}.", "{n} starts with {x} {o}.", "There are {x} {o} in {n}'s bag.",
         "{n} collected {x} {o}."]
ASK = ["How many {o} does {n} have now?", "How many {o} does {n} have at the end?",
       "How many {o} are left with {n}?"]


def _gsm_problem(rng: random.Random, n_steps: int) -> dict:
    name, pron = rng.choice(NAMES)
    obj = rng.choice(OBJECTS)
    fmt = dict(n=name, p=pron, p_=pron.capitalize(), o=obj,
               p_lo="his" if pron == "he" else "her", p_obj="him" if pron == "he" else "her")
    x = rng.randint(2, 30)
    question = [rng.choice(START).format(x=x, **fmt)]
    lines = []
    for _ in range(n_steps):
        kind = rng.choice("ASM") if x > 1 else rng.choice("AM")
        if kind == "A":
            (q, s), a, b = rng.choice(ADD), rng.randint(1, 20), 0
            y, m = x + a, 0
        elif kind == "S":
            (q, s), a, b = rng.choice(SUB), rng.randint(1, x - 1), 0
            y, m = x - a, 0
        else:
            (q, s), a, b = rng.choice(MUL), rng.randint(2, 6), rng.randint(2, 9)
            m = a * b
            y = x + m
        question.append(q.format(a=a, b=b, **fmt))
        lines.append(s.format(a=a, b=b, x=x, y=y, m=m, **fmt))
        x = y
    question.append(rng.choice(ASK).format(**fmt))
    return {"question": " ".join(question), "answer": "\n".join(lines) + f"\n#### {x}"}


def gsm_problem(rng: random.Random, max_steps: int = 3) -> dict:
    return _gsm_problem(rng, rng.randint(1, max_steps))


# ---------------------------------------------------------------------------- mini_code

INT_VARS = ["x", "n", "num", "value", "a", "k"]
PAIR_VARS = [("a", "b"), ("x", "y"), ("m", "n"), ("first", "second")]
LIST_VARS = ["xs", "nums", "values", "items", "numbers", "data"]
STR_VARS = ["s", "text", "word", "name"]

# (function names, kind, docstring, body). kind picks the arguments: i = one int (+ const
# k), p = two ints, l = a list (+ const k), s = a string (+ const k).
CODE_FAMILIES = [
    (["add_const", "plus_k", "increase"], "i", "Return {v} plus {k}.", "return {v} + {k}"),
    (["sub_const", "minus_k", "decrease"], "i", "Return {v} minus {k}.", "return {v} - {k}"),
    (["mul_const", "times_k", "scale"], "i", "Return {v} multiplied by {k}.",
     "return {v} * {k}"),
    (["square", "squared", "sq"], "i", "Return the square of {v}.", "return {v} * {v}"),
    (["is_even", "even", "check_even"], "i", "Return True if {v} is even, otherwise False.",
     "return {v} % 2 == 0"),
    (["is_odd", "odd", "check_odd"], "i", "Return True if {v} is odd, otherwise False.",
     "return {v} % 2 == 1"),
    (["divisible", "is_multiple", "divides"], "i",
     "Return True if {v} is divisible by {k}, otherwise False.", "return {v} % {k} == 0"),
    (["absolute", "abs_value", "magnitude"], "i", "Return the absolute value of {v}.",
     "return abs({v})"),
    (["clip_low", "at_least", "floor_k"], "i",
     "Return {v} if it is greater than {k}, otherwise return {k}.",
     "if {v} > {k}:\n        return {v}\n    return {k}"),
    (["add", "total", "combine"], "p", "Return the sum of {a} and {b}.", "return {a} + {b}"),
    (["subtract", "difference", "diff"], "p", "Return {a} minus {b}.", "return {a} - {b}"),
    (["multiply", "product", "mul"], "p", "Return the product of {a} and {b}.",
     "return {a} * {b}"),
    (["larger", "bigger", "maximum"], "p", "Return the larger of {a} and {b}.",
     "return max({a}, {b})"),
    (["smaller", "lesser", "minimum"], "p", "Return the smaller of {a} and {b}.",
     "return min({a}, {b})"),
    (["list_sum", "sum_all", "add_all"], "l", "Return the sum of the numbers in {v}.",
     "return sum({v})"),
    (["list_max", "largest", "top"], "l", "Return the largest number in {v}.",
     "return max({v})"),
    (["list_min", "smallest", "bottom"], "l", "Return the smallest number in {v}.",
     "return min({v})"),
    (["count_items", "size", "length"], "l", "Return how many numbers are in {v}.",
     "return len({v})"),
    (["first", "head", "get_first"], "l", "Return the first number in {v}.", "return {v}[0]"),
    (["last", "tail", "get_last"], "l", "Return the last number in {v}.", "return {v}[-1]"),
    (["count_k", "occurrences", "how_many"], "l",
     "Return how many times {k} appears in {v}.", "return {v}.count({k})"),
    (["above", "greater_than", "filter_big"], "l",
     "Return a list of the numbers in {v} that are greater than {k}.",
     "return [e for e in {v} if e > {k}]"),
    (["scale_all", "multiply_all", "times_all"], "l",
     "Return a list with each number in {v} multiplied by {k}.",
     "return [e * {k} for e in {v}]"),
    (["shift_all", "add_to_all", "plus_all"], "l",
     "Return a list with {k} added to each number in {v}.",
     "return [e + {k} for e in {v}]"),
    (["sum_squares", "square_sum", "sum_sq"], "l",
     "Return the sum of the squares of the numbers in {v}.",
     "total = 0\n    for e in {v}:\n        total += e * e\n    return total"),
    (["count_even", "evens", "num_even"], "l",
     "Return how many numbers in {v} are even.",
     "count = 0\n    for e in {v}:\n        if e % 2 == 0:\n            count += 1\n    return count"),
    (["upper", "shout", "to_upper"], "s", "Return {v} in upper case.", "return {v}.upper()"),
    (["lower", "whisper", "to_lower"], "s", "Return {v} in lower case.", "return {v}.lower()"),
    (["reverse", "backwards", "flip"], "s", "Return {v} reversed.", "return {v}[::-1]"),
    (["str_len", "text_length", "char_count"], "s",
     "Return the number of characters in {v}.", "return len({v})"),
    (["repeat", "echo", "duplicate"], "s", "Return {v} repeated {k} times.",
     "return {v} * {k}"),
]

_INPUTS = {
    "i": [(0,), (1,), (7,), (-4,), (12,), (25,)],
    "p": [(3, 5), (10, 2), (-1, 4), (7, 7), (0, 9)],
    "l": [([1, 2, 3],), ([5, -2, 8, 8],), ([4],), ([0, 9, 3, 6, 2],), ([7, 1, 7, 4],)],
    "s": [("hello",), ("Code",), ("abc",), ("Zoo Keeper",)],
}


def _code_problem(rng: random.Random, index: int) -> dict:
    names, kind, doc, body = rng.choice(CODE_FAMILIES)
    fname, k = rng.choice(names), rng.randint(2, 9)
    if kind == "p":
        a, b = rng.choice(PAIR_VARS)
        args, fmt = f"{a}, {b}", dict(a=a, b=b, k=k)
    else:
        v = rng.choice({"i": INT_VARS, "l": LIST_VARS, "s": STR_VARS}[kind])
        args, fmt = v, dict(v=v, k=k)
    prompt = f'def {fname}({args}):\n    """{doc.format(**fmt)}\n    """\n'
    solution = "    " + body.format(**fmt) + "\n"
    env = {}
    exec(prompt + solution, env)  # trusted: our own template, to compute expected outputs
    fn = env[fname]
    asserts = []
    for inp in _INPUTS[kind]:
        asserts.append(f"    assert candidate({', '.join(map(repr, inp))}) == {fn(*inp)!r}")
    test = "def check(candidate):\n" + "\n".join(asserts) + "\n"
    return {"task_id": f"MiniCode/{index}", "prompt": prompt, "canonical_solution": solution,
            "test": test, "entry_point": fname}


# ------------------------------------------------------------------------------ splits

def _distinct(n: int, draw: Callable[[int], dict], key: str) -> list[dict]:
    """The first ``n`` problems ``draw(index)`` gives whose ``key`` no earlier one had: a test
    split never asks the same question twice."""
    out, seen = [], set()
    while len(out) < n:
        p = draw(len(out))
        if p[key] not in seen:
            seen.add(p[key])
            out.append(p)
    return out


def mini_gsm_test(n: int = N_TEST_GSM) -> list[dict]:
    rng = random.Random(TEST_SEED)
    return _distinct(n, lambda _: gsm_problem(rng), "question")


def mini_code_test(n: int = N_TEST_CODE) -> list[dict]:
    rng = random.Random(TEST_SEED + 1)
    return _distinct(n, lambda index: _code_problem(rng, index), "prompt")


def mini_gsm_train(seed: int, max_steps: int = 3):
    """Endless training problems (seeded), never a test question."""
    banned = {p["question"] for p in mini_gsm_test()}
    rng = random.Random(f"gsm-train-{seed}")
    while True:
        p = gsm_problem(rng, max_steps)
        if p["question"] not in banned:
            yield p


def mini_code_train(seed: int):
    """Endless training problems (seeded), never a test prompt."""
    banned = {p["prompt"] for p in mini_code_test()}
    rng, i = random.Random(f"code-train-{seed}"), 0
    while True:
        p = _code_problem(rng, i)
        i += 1
        if p["prompt"] not in banned:
            yield p


# ------------------------------------------------------------------------------ mini_mc
# mini_gsm's test questions as multiple choice: the worked answer and three wrong worked
# answers, each a mistake a solver could make. "slip": one step's result is off and the error
# carries through; "operand": one step uses a number the question does not give there,
# computed correctly from it; "final": every step is right but the "#### " line is not.

N_TEST_MC = 100
MC_KINDS = ("slip", "operand", "final")


def parse_steps(answer: str) -> tuple[int, list[tuple[str, int, int]]]:
    """(starting total, steps) of a mini_gsm answer; a step is ("A"|"S", operand, 0) or
    ("M", count, each), the two-line "a * b = m / x + m = y" step."""
    lines = [ln.split() for ln in answer.split("\n") if not ln.startswith("####")]
    start, steps, i = None, [], 0
    while i < len(lines):
        a, op, b = int(lines[i][0]), lines[i][1], int(lines[i][2])
        if op == "*":
            steps.append(("M", a, b))
            start = int(lines[i + 1][0]) if start is None else start
            i += 2
        else:
            steps.append(("A" if op == "+" else "S", b, 0))
            start = a if start is None else start
            i += 1
    return start, steps


def worked_answer(start: int, steps, slip: tuple[int, int] | None = None,
                  final_offset: int = 0) -> str | None:
    """The answer's worked lines and ``#### N``, with an optional slip (step index, error in its
    result) and an error in the final line only; None if a running total would go negative."""
    x, lines = start, []
    for i, (kind, a, b) in enumerate(steps):
        err = slip[1] if slip is not None and slip[0] == i else 0
        if kind == "M":
            m = a * b + err
            lines += [f"{a} * {b} = {m}", f"{x} + {m} = {x + m}"]
            y = x + m
        else:
            y = (x + a if kind == "A" else x - a) + err
            lines.append(f"{x} {'+' if kind == 'A' else '-'} {a} = {y}")
        if y < 0:
            return None
        x = y
    return "\n".join(lines) + f"\n#### {x + final_offset}" if x + final_offset >= 0 else None


def _wrong_answer(rng: random.Random, kind: str, start: int, steps) -> str | None:
    i = rng.randrange(len(steps))
    err = rng.choice([d for d in range(-9, 10) if d])
    if kind == "slip":
        return worked_answer(start, steps, slip=(i, err))
    if kind == "final":
        return worked_answer(start, steps, final_offset=err)
    step_kind, a, b = steps[i]
    changed = list(steps)
    if step_kind == "M":
        changed[i] = ("M", a, rng.choice([v for v in range(2, 10) if v != b]))
    else:
        changed[i] = (step_kind, rng.choice([v for v in range(1, 21) if v != a]), 0)
    return worked_answer(start, changed)


def mc_problem(doc: dict, index: int) -> dict:
    """One mini_gsm test problem as four choices (the gold one at a seeded position)."""
    rng = random.Random(f"mini-mc-{index}")
    start, steps = parse_steps(doc["answer"])
    if worked_answer(start, steps) != doc["answer"]:  # the parser must round-trip the answer
        raise ValueError(f"cannot parse mini_gsm answer {doc['answer']!r}")
    choices, kinds = [doc["answer"]], ["gold"]
    for kind in MC_KINDS:
        wrong = None
        while wrong is None or wrong in choices:
            wrong = _wrong_answer(rng, kind, start, steps)
        choices.append(wrong)
        kinds.append(kind)
    order = list(range(4))
    rng.shuffle(order)
    return {"question": doc["question"], "answer": doc["answer"],
            "choices": [choices[j] for j in order], "kinds": [kinds[j] for j in order],
            "label": order.index(0)}


def mini_mc_test(n: int = N_TEST_MC) -> list[dict]:
    """The first n mini_gsm test questions as multiple choice (never seen in training)."""
    return [mc_problem(d, i) for i, d in enumerate(mini_gsm_test(n))]


# Prompt / target strings as the lm-eval tasks render them (no chat template, zero-shot).
def gsm_prompt(doc: dict) -> str:
    return f"Question: {doc['question']}\nAnswer:"


def gsm_target(doc: dict) -> str:
    return " " + doc["answer"]


def code_prompt(doc: dict) -> str:
    return doc["prompt"]


def code_target(doc: dict) -> str:
    return doc["canonical_solution"]
