"""How the reports write numbers: one place, so that every table says ``n/a``, ``±`` and a
signed zero the same way.

Two scales: fractions as they are (``0.85``, the sweep tables) and percentages (``85.0``, the
extra-sink-token report). A value that is unknown (``None``) is written, never guessed.
"""

from __future__ import annotations


def fixed(x: float | None, digits: int, sign: bool = False) -> str:
    """``0.85``, ``+0.05`` with ``sign``; ``n/a`` for None. A signed zero is ``+0.00``, never
    ``-0.00``, so that "no change" reads the same whichever way rounding went."""
    if x is None:
        return "n/a"
    s = f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"
    return f"{0:+.{digits}f}" if sign and float(s) == 0 else s


def signed_with_se(diff: float, se: float | None, digits: int) -> str:
    """``-0.05 ± 0.03``: a difference with its paired standard error (left out where unknown)."""
    return fixed(diff, digits, sign=True) + ("" if se is None else f" ± {fixed(se, digits)}")


def spread(mean: float | None, std: float | None, se: float | None, digits: int,
           sign: bool = False) -> str:
    """``mean ± std (se x)``: ± the spread across runs (left out for a single run), se the mean
    per-run standard error (left out where there is none)."""
    text = fixed(mean, digits, sign=sign) + ("" if std is None else f" ± {fixed(std, digits)}")
    return text if se is None else f"{text} (se {fixed(se, digits)})"


def or_na(x: float | None, spec: str = ".2f") -> str:
    """An aggregate as text; ``n/a`` where it is undefined (e.g. no head qualified)."""
    return "n/a" if x is None else format(x, spec)


def percent(x: float | None, se: float | None = None, sign: bool = False,
            missing: str = "-") -> str:
    """A fraction in percent to one decimal (``85.0``, ``+3.0`` in percentage points with
    ``sign``; a signed zero is ``+0.0``, as in :func:`fixed`), `` ± se`` where a standard error
    is given, ``missing`` for None."""
    if x is None:
        return missing
    text = fixed(100 * x, 1, sign=sign)
    return text if se is None else f"{text} ± {100 * se:.1f}"
