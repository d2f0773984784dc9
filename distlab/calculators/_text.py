"""How the calculators write numbers and errors: the same units everywhere, never noise.

Bytes are shown exactly (``1,234,567``) and in GB of 10^9 bytes, as the ZeRO paper counts them
(``GiB``, 2^30, only where a chart's axis says so). Times are rounded to 3 significant digits,
fractions are shown exactly (``3/11``) and as a percentage. Errors are `CalculatorError`\\ s (a
`distlab.DistlabError` and a `ValueError`) whose message says what was wrong and what to choose
instead.

Every result prints as its ``text()`` (`Printed`), in a notebook's output and in ``print``.

Knows nothing about what is being computed.
"""

from __future__ import annotations

import math
from fractions import Fraction

from .._config import check_int
from ..errors import DistlabError

GB = 10**9  #: the ZeRO paper's gigabyte (its Figure 1: 7.5 billion parameters x 16 bytes = 120 GB)


class CalculatorError(DistlabError, ValueError):
    """A calculator's input that cannot work; the message says what to choose instead. A
    `ValueError` too, so ``except ValueError`` keeps working."""


class Printed:
    """A calculator's result, shown as its ``text()`` wherever it is shown: a notebook cell's
    output (``repr``) and ``print`` / ``str`` alike. A dataclass that is one says
    ``repr=False``, or the dataclass writes a ``__repr__`` of its own over this one."""

    def text(self) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.text()

    __str__ = __repr__


def divisors(n: int) -> list[int]:
    """Every positive divisor of ``n``, smallest first."""
    return [d for d in range(1, n + 1) if n % d == 0]


def one_of(values) -> str:
    """``"1, 2, 4, 8"``: a list of choices for an error message (long lists shortened)."""
    values = list(values)
    if len(values) > 12:
        values = values[:10] + ["...", values[-1]]
    return ", ".join(str(v) for v in values)


def positive_int(value, name: str, hint: str = "") -> int:
    """``value`` as an int >= 1, or a `CalculatorError` that names ``name``."""
    return check_int(value, name, low=1, noun="a whole number", hint=hint, error=CalculatorError)


def choice(value, name: str, options) -> str:
    """``value`` if it is one of ``options``, else a `CalculatorError` listing them."""
    if value not in options:
        raise CalculatorError(
            f"{name}={value!r} is not one of {', '.join(repr(o) for o in options)}"
        )
    return value


def gb(nbytes) -> str:
    """Bytes as GB (10^9 bytes) with 2 decimals: ``"17.64 GB"``."""
    return f"{nbytes / GB:.2f} GB"


def human_bytes(nbytes) -> str:
    """Bytes with a decimal unit, 3 significant digits: ``"1.07 GB"``, ``"512 B"``."""
    nbytes = float(nbytes)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{_sig3(nbytes / scale)} {unit}"
    return f"{int(nbytes)} B" if nbytes.is_integer() else f"{_sig3(nbytes)} B"


def seconds(t: float) -> str:
    """A time with a unit, 3 significant digits: ``"3.94 ms"``, ``"12.1 µs"``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(t) >= scale:
            return f"{_sig3(t / scale)} {unit}"
    return f"{_sig3(t / 1e-9)} ns"


def fraction(f: Fraction) -> str:
    """``"3/11 = 27.3%"``."""
    return f"{f} = {float(f):.1%}"


def _sig3(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    digits = max(0, 2 - int(math.floor(math.log10(abs(x)))))
    return f"{x:.{digits}f}"
