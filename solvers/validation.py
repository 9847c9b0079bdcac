"""Field checks for the frozen dataclasses' ``__post_init__`` (in the style of statsmodels'
``tools/validation``): each checks one field, returns the value and raises an error that names
the owner, the field, the bound and the value — ``Slo: field 'ttft_ms' must be finite and > 0,
got -1``.

The error class defaults to :class:`~atoll.solvers.errors.InputError` (also a ``ValueError``);
an owner whose errors have their own class (a sink's, a state file's) passes it as ``error``.
Booleans are not numbers here: ``True`` as a price or a count is a mistake, not a 1.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import TypeVar

from atoll.solvers.errors import AtollError, InputError

T = TypeVar("T")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def check_number(owner: str, name: str, value: object, *, allow_zero: bool = False,
                 error: type[AtollError] = InputError) -> float:
    """``value`` when it is a finite number > 0 (>= 0 with ``allow_zero``)."""
    if not _is_number(value):
        raise error(f"{owner}: field '{name}' must be a number, got {value!r}")
    if not _finite(value) or value < 0 or (value == 0 and not allow_zero):  # type: ignore[arg-type, operator]
        bound = ">= 0" if allow_zero else "> 0"
        raise error(f"{owner}: field '{name}' must be finite and {bound}, got {value!r}")
    return value  # type: ignore[return-value]


def check_integer(owner: str, name: str, value: object, *, minimum: int = 1,
                  error: type[AtollError] = InputError) -> int:
    """``value`` when it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{owner}: field '{name}' must be an integer, got {value!r}")
    if value < minimum:
        raise error(f"{owner}: field '{name}' must be >= {minimum}, got {value!r}")
    return value


def check_fraction(owner: str, name: str, value: object, *, low_open: bool = False, high_open: bool = False,
                   error: type[AtollError] = InputError) -> float:
    """``value`` when it is a number in [0, 1] (``low_open`` / ``high_open`` exclude an end)."""
    ok = _is_number(value) and _finite(value)  # type: ignore[arg-type]
    v = float(value) if ok else math.nan  # type: ignore[arg-type]  # in [0, 1] when ok: no overflow
    if not ok or not 0 <= v <= 1 or (low_open and v == 0) or (high_open and v == 1):
        interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
        raise error(f"{owner}: field '{name}' must be in {interval}, got {value!r}")
    return value  # type: ignore[return-value]


def check_choice(owner: str, name: str, value: T, choices: Collection[T], *, allow_none: bool = False,
                 error: type[AtollError] = InputError) -> T:
    """``value`` when it is one of ``choices`` (or None with ``allow_none``); the error lists them."""
    if (allow_none and value is None) or value in choices:
        return value
    shown = ", ".join(str(c) for c in choices) + (" or None" if allow_none else "")
    raise error(f"{owner}: field '{name}' must be one of {shown}, got {value!r}")
