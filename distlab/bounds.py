"""Printing a rounding-level number the way every CPU prints it: as the bound it meets.

A float32 error of 5.4e-07 on this machine is 6.6e-07 on another vector unit and something else
again on Apple silicon: its digits are noise, and a notebook that prints them fails its own
comparison on the next laptop. What a lesson claims is a bound ("equal to one process, to float32
rounding"), so that is what it prints, and the bound is checked where it is printed::

    err = (ring - full).abs().max().item()
    print(f"ring attention vs one process: max error {distlab.below(err, 1e-5)}")
    # ring attention vs one process: max error < 1e-5      (AssertionError if it is not)

Keep the exact value for asserts and for your own eyes; print the bound.
"""

from __future__ import annotations

import math
import numbers

from .errors import InputTypeError

__all__ = ["above", "below"]


def _number(value, what: str) -> float:
    if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
        value = value.item()  # a one-element tensor or NumPy scalar
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputTypeError(f"{what} must be a number (or a one-element tensor), got {value!r}")
    return float(value)


def limit_text(limit: float) -> str:
    """``1e-05`` -> ``"1e-5"``, ``0.0005`` -> ``"5e-4"``, ``0.25`` -> ``"0.25"``."""
    if limit == 0 or 1e-2 <= abs(limit) < 1e4:
        return f"{limit:g}"
    exponent = math.floor(math.log10(abs(limit)))
    mantissa = round(limit / 10**exponent, 6)
    if abs(mantissa) == 1:
        return f"{'-' if mantissa < 0 else ''}1e{exponent}"
    return f"{mantissa:g}e{exponent}"


def below(value, limit) -> str:
    """``"< limit"``, after checking that ``value < limit``.

    Args:
        value: the number to bound (a float, int, or one-element tensor), e.g. a max error.
        limit: the bound the lesson claims, e.g. ``1e-5``.

    Returns:
        ``"< 1e-5"``: the same text on every CPU.

    Raises:
        AssertionError: ``value`` is not below ``limit`` (the message gives the value), or it is
            NaN.
        TypeError: ``value`` or ``limit`` is not a number.
    """
    return _bound(value, "<", limit)


def above(value, limit) -> str:
    """``"> limit"``, after checking that ``value > limit``: `below` the other way round, for a
    number that must be large enough (a speed-up, a ratio).

    Args:
        value, limit: as for `below`: a float, int, or one-element tensor, and the bound the
            lesson claims.

    Returns:
        ``"> 1e-3"``: the same text on every CPU.

    Raises:
        AssertionError: ``value`` is not above ``limit`` (the message gives the value), or NaN.
        TypeError: ``value`` or ``limit`` is not a number.
    """
    return _bound(value, ">", limit)


def _bound(value, sign: str, limit) -> str:
    """``"< limit"`` or ``"> limit"`` (``sign``), once `below` or `above` holds."""
    value, limit = _number(value, "value"), _number(limit, "limit")
    holds, word = (value < limit, "below") if sign == "<" else (value > limit, "above")
    if not holds:
        raise AssertionError(f"{value:.3g} is not {word} {limit_text(limit)}")
    return f"{sign} {limit_text(limit)}"
