"""The online inversion's bisection, several steps per call of the latency model: the same
brackets as one step per call, to the bit, whatever the signs (monotone or not)."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.envs.servers import _bisect_levels


def _stepwise(lo: np.ndarray, hi: np.ndarray, steps: int, above: object) -> tuple[np.ndarray, np.ndarray]:
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        up = above(mid)  # type: ignore[operator]
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
    return lo, hi


@pytest.mark.parametrize("levels", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("kind", ["monotone", "noisy"])
def test_levels_per_call_replay_the_stepwise_bisection(levels: int, kind: str) -> None:
    rng = np.random.default_rng(levels * 7 + len(kind))
    rows = 13
    lo = np.log(rng.uniform(1.0, 500.0, rows))
    hi = lo + rng.uniform(0.1, 4.0, rows)
    root = lo + rng.uniform(0.0, 1.0, rows) * (hi - lo)
    salt = rng.uniform(0.0, 1.0, rows)

    def above(x: np.ndarray) -> np.ndarray:  # elementwise in the row's own point, as the model is
        r = np.resize(root, x.shape)
        if kind == "monotone":
            return x < r
        s = np.resize(salt, x.shape)
        return (np.sin(1e3 * x * (1.0 + s)) > 0) | (x < r)  # signs that are not monotone in x

    calls = []

    def above_at(points: np.ndarray, k: int) -> np.ndarray:
        calls.append(k)
        assert points.shape == (k * rows,)
        return above(points)

    want = (lo, hi)
    got = (lo, hi)
    for chunk in (levels, levels, 3, 0):
        want = _stepwise(*want, chunk, above)
        got = _bisect_levels(*got, chunk, above_at) if chunk else got
    assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1])
    assert calls[:2] == [2**levels - 1] * 2
