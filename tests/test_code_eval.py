"""The scorer around the sandbox: its result memo, its timeout setting, its failure report."""

from __future__ import annotations

import logging

import pytest

from lm_eval_sinkmask import code_eval, sandbox
from lm_eval_sinkmask.sandbox import Outcome
from tests.test_sandbox import CORRECT, FAST

PASS = Outcome(True, "passed", "", 0.1)


@pytest.fixture
def fake_sandbox(monkeypatch):
    """Every program "passes" at once; records how many were really run."""
    runs = []

    def run_programs(jobs, limits, **_):
        runs.append(len(jobs))
        return [PASS] * len(jobs)

    monkeypatch.setattr(code_eval, "run_programs", run_programs)
    monkeypatch.setattr(code_eval, "_memo", {})
    return runs


def test_a_full_memo_is_cleared_without_losing_this_calls_outcomes(monkeypatch, fake_sandbox):
    monkeypatch.setattr(code_eval, "_MEMO_MAX", 3)
    code_eval.execute([("a", "t"), ("b", "t")])
    # "a" is a memo hit, "c" and "d" overflow the memo: it is cleared before they are stored
    outcomes = code_eval.execute([("a", "t"), ("c", "t"), ("d", "t")])
    assert outcomes == [PASS] * 3 and fake_sandbox == [2, 2]
    # "a" was read before the memo was cleared; "c" and "d" stay
    assert code_eval.execute([("c", "t"), ("d", "t")]) == [PASS] * 2 and fake_sandbox == [2, 2]


def test_an_outcome_is_remembered_under_its_limits_only(fake_sandbox):
    """A program that timed out at 1 s was reported as timed out at 10 s in the same process."""
    code_eval.execute([("a", "t")], sandbox.Limits(timeout_s=1.0, cpu_s=1))
    code_eval.execute([("a", "t")], sandbox.Limits(timeout_s=10.0, cpu_s=10))
    code_eval.execute([("a", "t")], sandbox.Limits(timeout_s=1.0, cpu_s=1))
    assert fake_sandbox == [1, 1]


@pytest.mark.parametrize("raw", ["3s", "0", "-1", "nan", "inf", "ten", "", " "])
def test_a_timeout_that_is_not_a_positive_number_is_refused(raw):
    # blank too: the scorer's float() fails on it, after every answer was generated
    with pytest.raises(ValueError, match="SINKMASK_CODE_TIMEOUT='.*' is not a positive number"):
        sandbox.positive_seconds(code_eval.TIMEOUT_ENV, raw, 10.0)


def test_a_timeout_setting_is_read_as_seconds():
    assert sandbox.positive_seconds(code_eval.TIMEOUT_ENV, "2.5", 10.0) == 2.5
    assert sandbox.positive_seconds(code_eval.TIMEOUT_ENV, None, 10.0) == 10.0


@pytest.mark.parametrize("raw", ["0", "-1", "0.0"])
def test_the_scorer_refuses_a_timeout_that_would_fail_every_program(monkeypatch, raw):
    # reached without the pre-load check (the start-up hook off, or the scorer called alone);
    # NaN and inf already fail there, in int()
    monkeypatch.setenv(code_eval.TIMEOUT_ENV, raw)
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        code_eval.default_limits()


def failed(detail, status="failed"):
    return Outcome(False, status, detail, 0.1)


def test_mostly_infrastructure_failures_are_reported(caplog):
    outcomes = [PASS, failed("AssertionError"),
                failed("timed out after 10s", "timeout"),
                failed("ModuleNotFoundError: No module named 'doctest'"),
                failed("ModuleNotFoundError: No module named 'doctest'")]
    with caplog.at_level(logging.WARNING, logger=sandbox.logger.name):
        message = sandbox.warn_if_mostly_infrastructure(outcomes)
    assert message and "3 of 4 failed programs (75%)" in message
    assert "No module named 'doctest'" in message and "(2x)" in message
    assert message in caplog.text


def test_failures_of_the_models_own_code_are_not_reported():
    outcomes = [failed("AssertionError"), failed("NameError: name 'x' is not defined"),
                failed("timed out after 10s", "timeout")]
    assert sandbox.warn_if_mostly_infrastructure(outcomes) is None
    assert sandbox.warn_if_mostly_infrastructure([PASS, PASS]) is None


@pytest.mark.parametrize("outcome", [
    Outcome(False, "timeout", "timed out after 10s", 10.0),
    Outcome(False, "failed", "AssertionError", 0.1),
])
def test_a_program_that_timed_out_or_failed_scores_zero(monkeypatch, outcome):
    monkeypatch.setattr(code_eval, "_memo", {})
    monkeypatch.setattr(code_eval, "run_programs", lambda jobs, limits, **_: [outcome] * len(jobs))
    assert code_eval.pass_at_k(["check()"], [["program"]], k=[1]) == {"pass@1": 0.0}
    monkeypatch.setattr(code_eval, "_memo", {})
    monkeypatch.setattr(code_eval, "run_programs", lambda jobs, limits, **_: [PASS, outcome])
    # one of two samples passes: pass@1 = 1/2, pass@2 = 1
    assert code_eval.pass_at_k(["check()"], [["p1", "p2"]], k=[1, 2]) == {"pass@1": 0.5, "pass@2": 1.0}


def test_the_same_program_under_different_tests_is_run_against_each(monkeypatch):
    monkeypatch.setattr(code_eval, "_memo", {})
    right, wrong = "assert add(2, 3) == 5\n", "assert add(2, 3) == 6\n"
    first, second = code_eval.execute([(CORRECT, right), (CORRECT, wrong)], FAST, progress=False)
    assert first.passed and not second.passed, (first, second)
    # ... and a memo hit from an earlier call is no answer for another test either
    (again,) = code_eval.execute([(CORRECT, wrong)], FAST, progress=False)
    assert not again.passed
    assert code_eval.pass_at_k([wrong], [[CORRECT]]) == {"pass@1": 0.0}
