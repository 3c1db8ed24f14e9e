import itertools
import re

from lm_eval_sinkmask.zoo import data


def test_test_splits_are_deterministic_and_sized():
    assert data.mini_gsm_test() == data.mini_gsm_test()
    assert data.mini_code_test() == data.mini_code_test()
    assert len(data.mini_gsm_test()) >= 300 and len(data.mini_code_test()) >= 100
    assert len({d["question"] for d in data.mini_gsm_test()}) == len(data.mini_gsm_test())


def test_train_streams_are_seeded():
    a = list(itertools.islice(data.mini_gsm_train(3), 20))
    assert a == list(itertools.islice(data.mini_gsm_train(3), 20))
    assert a != list(itertools.islice(data.mini_gsm_train(4), 20))


def test_train_never_contains_a_test_problem():
    gsm_test = {d["question"] for d in data.mini_gsm_test()}
    code_test = {d["prompt"] for d in data.mini_code_test()}
    assert not gsm_test & {d["question"] for d in itertools.islice(data.mini_gsm_train(0), 5000)}
    assert not code_test & {d["prompt"] for d in itertools.islice(data.mini_code_train(0), 5000)}


def _eval_steps(lines):
    """Recompute every 'a op b = c' of a worked answer."""
    for a, op, b, c in re.findall(r"(\d+) ([-+*]) (\d+) = (\d+)", lines):
        assert eval(f"{a} {op} {b}") == int(c)


def test_gsm_format_matches_gsm8k():
    steps = set()
    for d in data.mini_gsm_test():
        *work, last = d["answer"].split("\n")
        m = re.fullmatch(r"#### (\-?[0-9\.\,]+)", last)
        assert m, d["answer"]
        _eval_steps(d["answer"])
        # The final answer is the last step's result.
        assert work[-1].split(" = ")[-1].split()[0] == m.group(1)
        steps.add(d["question"].count(".") - 1)  # sentences between the start and the ask
        assert d["question"].endswith("?")
    assert steps == {1, 2, 3}


def test_canonical_code_passes_its_own_tests():
    for d in data.mini_code_test():
        assert set(d) == {"task_id", "prompt", "canonical_solution", "test", "entry_point"}
        env = {}
        exec(d["prompt"] + d["canonical_solution"] + "\n" + d["test"], env)
        env["check"](env[d["entry_point"]])


def test_wrong_code_fails_its_tests():
    d = data.mini_code_test()[0]
    env = {}
    exec(d["prompt"] + "    return None\n" + "\n" + d["test"], env)
    try:
        env["check"](env[d["entry_point"]])
    except AssertionError:
        return
    raise AssertionError("a wrong body passed the tests")


def test_mini_mc_has_one_right_and_three_distinct_wrong_worked_answers():
    docs = data.mini_mc_test()
    assert len(docs) == data.N_TEST_MC and docs == data.mini_mc_test()  # deterministic
    gsm = data.mini_gsm_test(data.N_TEST_MC)
    for d, g in zip(docs, gsm):
        assert d["question"] == g["question"] and d["choices"][d["label"]] == g["answer"]
        assert len(set(d["choices"])) == 4 and sorted(d["kinds"]) == ["final", "gold", "operand", "slip"]
        finals = [int(c.rsplit("#### ", 1)[1]) for c in d["choices"]]
        gold = finals[d["label"]]
        assert all(f != gold and f >= 0 for i, f in enumerate(finals) if i != d["label"])
        for c, kind in zip(d["choices"], d["kinds"]):
            lines = c.split("\n")
            if kind == "final":  # right steps, wrong last line
                assert lines[:-1] == g["answer"].split("\n")[:-1]
            if kind == "slip":  # exactly one equation is wrong
                wrong = [ln for ln in lines[:-1] if eval(ln.split(" = ")[0]) != int(ln.split(" = ")[1])]
                assert len(wrong) == 1
            if kind in ("operand", "gold"):  # the arithmetic is right (the operand is not)
                assert all(eval(ln.split(" = ")[0]) == int(ln.split(" = ")[1]) for ln in lines[:-1])
    assert len({d["label"] for d in docs}) == 4


def test_every_mini_gsm_answer_parses_back_to_itself():
    for d in data.mini_gsm_test():
        assert data.worked_answer(*data.parse_steps(d["answer"])) == d["answer"]


def test_the_code_test_split_has_no_repeated_prompt():
    prompts = [d["prompt"] for d in data.mini_code_test()]
    assert len(set(prompts)) == len(prompts) == data.N_TEST_CODE
    assert [d["task_id"] for d in data.mini_code_test()] == [f"MiniCode/{i}" for i in range(100)]
