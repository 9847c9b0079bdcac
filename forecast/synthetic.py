"""Seeded synthetic demand series (requests/s at 5-min steps) for the forecasters' robustness
suite: each is a shape real traces show and ServeGen alone does not.

- ``smooth-daily``: a daily sine-like cycle (trough/peak 1:3) with mild noise;
- ``weekly``: the daily cycle times a weekday/weekend level (weekend at 40%);
- ``no-season``: an AR(1) level with noise, no cycle;
- ``pareto-bursts``: a low base with heavy-tailed bursts (Pareto, shape 1.5) on 5% of steps, a
  faint daily cycle: peak/mean far above 10, median well below the mean;
- ``zero-stretches``: a daily cycle broken by outages of 2-8 h of zeros;
- ``level-shift``: a daily cycle whose level steps to 3x, then to 0.5x, of the first.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from atoll.solvers.errors import UnknownNameError

DAY = 288


def _daily(t: np.ndarray) -> np.ndarray:
    return 2.0 - np.cos(2 * np.pi * t / DAY)  # 1 at night, 3 at the peak


def smooth_daily(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n)
    return 10 * _daily(t) * (1 + rng.normal(0, 0.05, n))


def weekly(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n)
    weekend = ((t // DAY) % 7) >= 5
    return 10 * _daily(t) * np.where(weekend, 0.4, 1.0) * (1 + rng.normal(0, 0.05, n))


def no_season(n: int, rng: np.random.Generator) -> np.ndarray:
    level = np.empty(n)
    x = 0.0
    for i in range(n):
        x = 0.98 * x + rng.normal(0, 0.5)
        level[i] = x
    return np.maximum(20 + level + rng.normal(0, 2.0, n), 0.0)


def pareto_bursts(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n)
    base = 0.5 * (1 + 0.2 * np.sin(2 * np.pi * t / DAY)) * rng.exponential(1.0, n)
    bursts = np.where(rng.random(n) < 0.05, 5.0 * rng.pareto(1.5, n), 0.0)
    return base + bursts


def zero_stretches(n: int, rng: np.random.Generator) -> np.ndarray:
    y = smooth_daily(n, rng)
    i = int(rng.integers(0, DAY))
    while i < n:
        length = int(rng.integers(24, 97))  # 2-8 h
        y[i: i + length] = 0.0
        i += length + int(rng.integers(DAY, 3 * DAY))
    return y


def level_shift(n: int, rng: np.random.Generator) -> np.ndarray:
    y = smooth_daily(n, rng)
    a, b = int(n * 0.45), int(n * 0.8)
    y[a:b] *= 3.0
    y[b:] *= 0.5
    return y


SYNTHETIC: dict[str, Callable[[int, np.random.Generator], np.ndarray]] = {
    "smooth-daily": smooth_daily, "weekly": weekly, "no-season": no_season,
    "pareto-bursts": pareto_bursts, "zero-stretches": zero_stretches, "level-shift": level_shift,
}


def synthetic_series(name: str, days: int = 14, seed: int = 0) -> np.ndarray:
    """``days`` days of the named shape at 5-min steps, the same for the same seed."""
    if name not in SYNTHETIC:
        raise UnknownNameError(f"unknown synthetic series {name!r}; valid: {', '.join(SYNTHETIC)}")
    return np.maximum(SYNTHETIC[name](days * DAY, np.random.default_rng(seed)), 0.0)
