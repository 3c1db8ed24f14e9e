"""The one way reports write numbers: unknown is said, a signed zero has one spelling."""

from lm_eval_sinkmask.text_format import fixed, or_na, percent, signed_with_se, spread


def test_a_change_that_rounds_to_zero_reads_plus_zero_from_either_side():
    assert fixed(-0.001, 2, sign=True) == fixed(0.001, 2, sign=True) == "+0.00"
    assert fixed(-0.05, 2, sign=True) == "-0.05" and fixed(0.05, 2) == "0.05"
    assert fixed(0.3, 0, sign=True) == fixed(-0.3, 0, sign=True) == "+0"  # --digits 0: no "+0."


def test_unknown_values_are_written_not_guessed():
    assert fixed(None, 2) == or_na(None) == "n/a"
    assert percent(None) == "-" and percent(None, missing="n/a") == "n/a"
    assert signed_with_se(-0.05, None, 2) == "-0.05"  # no "± n/a" for a missing error
    assert spread(0.5, None, None, 2) == "0.50"  # one run: no spread, no se


def test_spread_and_percent_layouts():
    assert spread(0.5, 0.1, 0.03, 2, sign=True) == "+0.50 ± 0.10 (se 0.03)"
    assert signed_with_se(-0.25, 0.04, 2) == "-0.25 ± 0.04"
    assert percent(0.964) == "96.4" and percent(0.03, 0.011, sign=True) == "+3.0 ± 1.1"


def test_a_percentage_change_that_rounds_to_zero_reads_plus_zero_from_either_side():
    # a mean gain of +2 and -2 points is 0 exactly, but in floats comes out as -3.5e-18; the
    # report must not call it a loss ("-0.0") while the same gain in the other order is "+0.0"
    zero = (5 / 100 - 7 / 100 + (6 / 100 - 4 / 100)) / 2
    assert zero < 0 and percent(zero, sign=True) == percent(-zero, sign=True) == "+0.0"
    assert percent(-0.0004, 0.02, sign=True) == "+0.0 ± 2.0"
    assert percent(-0.02, sign=True) == "-2.0" and percent(0.0, sign=True) == "+0.0"
