"""Live demand binning and forecasts (the controller's fleet file: test_live_fleet.py)."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.control.live_demand import RECENT_MARGIN, LiveForecast, bin_history
from atoll.control.state import HistoryPoint


def points(times: list[float], prompt: list[float], gen: list[float] | None = None
           ) -> tuple[HistoryPoint, ...]:
    gen = gen or [p / 10 for p in prompt]
    return tuple(HistoryPoint(t, p, g) for t, p, g in zip(times, prompt, gen, strict=True))


def test_bins_average_points_fill_gaps_and_leave_out_the_bin_in_progress() -> None:
    # bins of 300 s: [0, 300) has 2 points, [300, 600) none, [600, 900) one, 900 is in progress
    first, bins = bin_history(points([60, 240, 700, 950], [10, 20, 40, 99]), 300.0, now_s=960.0)
    assert first == 0
    np.testing.assert_allclose(bins[:, 0], [15, 15, 40])
    np.testing.assert_allclose(bins[:, 1], [1.5, 1.5, 4.0])
    assert bin_history((), 300.0, 0.0)[1].shape == (0, 2)


SHAPES = {"m": (1.0, 0.1)}  # the points' generation rate is a tenth of the prompt rate: 1 token = 1 request


def test_recent_forecast_before_the_warm_up_days() -> None:
    lf = LiveForecast(shapes=SHAPES, forecaster="naive", horizon=3, step_s=300.0, season=4)
    history = {"m": points([100, 400, 700, 1000], [10, 30, 20, 25])}
    out = lf.forecast(history, 1100.0, ["m", "absent"])
    f = out["m"]
    assert "absent" not in out and f.method == "recent" and f.bins == 3
    assert f.measured == (25, 2.5) and f.methods == ("recent", "recent")
    assert f.upper[0] == pytest.approx(30 * (1 + RECENT_MARGIN))  # the max of the last 3 bins + 10%
    assert f.mean[0] == pytest.approx(25)  # max(mean of the bins 20, the latest 25)


def test_seasonal_forecast_after_the_warm_up_days_follows_the_pattern_unfloored() -> None:
    season = 4
    pattern = [10.0, 40.0, 10.0, 5.0]
    times = [300.0 * k + 150 for k in range(4 * season)]
    values = [pattern[k % season] for k in range(4 * season)]
    lf = LiveForecast(shapes=SHAPES, forecaster="naive", horizon=1, step_s=300.0, season=season)
    now = 300.0 * 4 * season + 10  # next bin is position 0 of the pattern (10)
    f = lf.forecast({"m": points(times, values)}, now, ["m"])["m"]
    assert f.method == "naive" and f.bins == 16
    assert f.mean[0] == pytest.approx(10.0)  # seasonal naive: one season earlier; >= the latest (5)
    # one more bin: the fitted model is updated, not refitted, and moves to position 1 (40)
    times.append(300.0 * 16 + 150)
    values.append(10.0)
    g = lf.forecast({"m": points(times, values)}, now + 300.0, ["m"])["m"]
    assert g.mean[0] == pytest.approx(40.0) and g.mean_rps == pytest.approx(40.0)
    assert g.mean[1] == pytest.approx(4.0)  # request rate x the shape's output tokens
    # as in the env, the forecast is not floored at the latest rate (40): position 2 is 10
    times.append(300.0 * 17 + 150)
    values.append(40.0)
    h = lf.forecast({"m": points(times, values)}, now + 600.0, ["m"])["m"]
    assert h.mean[0] == pytest.approx(10.0) and h.upper[0] >= h.mean[0]
