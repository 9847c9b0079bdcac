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


def check_flag(owner: str, name: str, value: object, *, error: type[AtollError] = InputError) -> bool:
    """``value`` when it is True or False (not 0, 1 or None: a switch is a bool)."""
    if not isinstance(value, bool):
        raise error(f"{owner}: field '{name}' must be True or False, got {value!r}")
    return value


def check_day_range(owner: str, name: str, value: object, *,
                    error: type[AtollError] = InputError) -> tuple[int, int]:
    """``value`` when it is (first, last) whole days, 1-based and inclusive: 1 <= first <= last."""
    ok = isinstance(value, tuple | list) and len(value) == 2 \
        and all(isinstance(d, int) and not isinstance(d, bool) for d in value) and 1 <= value[0] <= value[1]
    if not ok:
        raise error(f"{owner}: field '{name}' must be (first, last) with 1 <= first <= last, got {value!r}")
    return value  # type: ignore[return-value]


def check_port(owner: str, name: str, value: object, *, any_free: bool = False,
               error: type[AtollError] = InputError) -> int:
    """``value`` when it is a TCP port number, 1..65535 (0..65535 with ``any_free``: 0 takes a free one)."""
    low = 0 if any_free else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 65535:
        hint = " (0: any free port)" if any_free else ""
        raise error(f"{owner}: field '{name}' must be an integer in {low}..65535{hint}, got {value!r}")
    return value
