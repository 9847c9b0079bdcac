"""Interval calibration: conformal quantile tracking keeps coverage near nominal under drift;
zero point forecasts keep positive upper quantiles; the planning cap binds and says so."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from atoll.forecast import forecasters as fmod
from atoll.forecast.forecasters import ForecastError
from atoll.forecast.registry import make_forecaster

SEASON = 24


def _drifting(seed: int) -> np.ndarray:
    """Seasonal series whose noise triples after the training part (a regime change)."""
    rng = np.random.default_rng(seed)
    t = np.arange(40 * SEASON)
    base = 100 + 30 * np.sin(2 * np.pi * t / SEASON)
    sd = np.where(t < 10 * SEASON, 2.0, 6.0)
    return np.maximum(base + rng.normal(0, sd), 0.0)


def _coverage_90(y: np.ndarray, h: int, first: int, last: int) -> float:
    """90% coverage at horizon h of targets in seasons first..last-1, updating every step."""
    f = make_forecaster("naive", SEASON).fit(y[: 10 * SEASON])
    hits = []
    for i in range(10 * SEASON, len(y) - h):
        fc = f.forecast(h)
        if first * SEASON <= i + h - 1 < last * SEASON:
            hits.append(fc.quantile(0.05)[h - 1] <= y[i + h - 1] <= fc.quantile(0.95)[h - 1])
        f.update(y[i])
    return float(np.mean(hits))


@pytest.mark.parametrize("h", [1, 6])
def test_coverage_recovers_after_noise_triples(h: int, monkeypatch: pytest.MonkeyPatch) -> None:
    y = _drifting(5)
    # The rolling window of errors catches up by itself once it holds only new errors; a
    # window longer than the series isolates what the conformal step adds.
    monkeypatch.setattr(fmod, "ERROR_WINDOW", 40 * SEASON)
    adapted = _coverage_90(y, h, 10, 25)
    monkeypatch.setattr(fmod, "ACI_GAMMA", 0.0)
    frozen = _coverage_90(y, h, 10, 25)
    assert 0.85 <= adapted <= 0.95
    assert frozen < adapted - 0.05  # intervals from calm errors under-cover the noisy regime


def test_nominal_coverage_without_drift() -> None:
    rng = np.random.default_rng(7)
    t = np.arange(40 * SEASON)
    y = np.maximum(100 + 30 * np.sin(2 * np.pi * t / SEASON) + rng.normal(0, 3.0, len(t)), 0)
    assert 0.85 <= _coverage_90(y, 1, 12, 40) <= 0.95


def test_quantiles_stay_ordered_after_adaptation() -> None:
    y = _drifting(6)
    f = make_forecaster("naive", SEASON).fit(y[: 10 * SEASON])
    f.update(y[10 * SEASON: 30 * SEASON])
    fc = f.forecast(48)
    qs = [fc.quantile(q) for q in fmod.QUANTILES]
    for lo, hi in zip(qs, qs[1:], strict=False):
        assert np.all(lo <= hi + 1e-9)


def test_time_indexed_history_must_be_sorted_unique_and_even() -> None:
    idx = pd.date_range("2024-01-01", periods=4 * SEASON, freq="5min")
    y = pd.Series(_drifting(1)[: 4 * SEASON], index=idx)
    make_forecaster("naive", SEASON).fit(y)  # a clean index is accepted
    swapped = y.index.to_numpy().copy()
    swapped[[10, 11]] = swapped[[11, 10]]
    with pytest.raises(ForecastError, match=r"not sorted.*position 11.*sort_index"):
        make_forecaster("naive", SEASON).fit(pd.Series(y.to_numpy(), index=swapped))
    dup = y.index.to_numpy().copy()
    dup[20] = dup[19]
    with pytest.raises(ForecastError, match=r"duplicate timestamp .* position 20"):
        make_forecaster("naive", SEASON).fit(pd.Series(y.to_numpy(), index=dup))
    with pytest.raises(ForecastError, match="not evenly spaced"):
        make_forecaster("naive", SEASON).fit(y.drop(y.index[30]))


def test_outage_counts_as_miss_but_stays_out_of_the_error_window() -> None:
    rng = np.random.default_rng(3)
    t = np.arange(14 * SEASON)
    y = np.maximum(100 + 30 * np.sin(2 * np.pi * t / SEASON) + rng.normal(0, 3.0, len(t)), 0)
    f = make_forecaster("naive", SEASON).fit(y[: 10 * SEASON])
    f.update(y[10 * SEASON: 12 * SEASON])
    offset_before = f._offset[0].copy()
    f.update(np.zeros(30))  # an outage: every quantile is above the truth
    # the misses drive every quantile's tracking offset down ...
    assert np.all(f._offset[0] < offset_before)
    # ... but the -100% errors never enter the window the quantiles are read from
    assert np.nanmin(f._errors) > -0.5


def _bursty(seed: int, n: int) -> np.ndarray:
    """No season, 70% zeros, Pareto bursts: the point forecast is 0 most of the time."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random(n) < 0.3, 5.0 * (1.0 + rng.pareto(2.5, n)), 0.0)


def test_zero_point_forecast_keeps_positive_upper_quantiles_and_coverage() -> None:
    y = _bursty(11, 40 * SEASON)
    f = make_forecaster("naive", SEASON).fit(y[: 10 * SEASON])
    zero_means, hits = 0, []
    for i in range(10 * SEASON, len(y)):
        fc = f.forecast(1)
        if fc.mean[0] == 0.0:
            zero_means += 1
            assert fc.quantile(0.95)[0] > 0.0 and fc.quantile(0.9)[0] > 0.0
        if i >= 20 * SEASON:
            hits.append(fc.quantile(0.05)[0] <= y[i] <= fc.quantile(0.95)[0])
        f.update(y[i])
    assert zero_means > 10 * SEASON  # the case under test happened often
    assert 0.85 <= np.mean(hits) <= 0.95


def test_tracking_offset_has_no_floor() -> None:
    """Misses beyond anything in the error window keep moving the upper quantile up, linearly and
    without saturating (a miscoverage level clipped at 0.002 stops at the window's largest
    error and the conformal step stops there)."""
    y = _drifting(3)[: 12 * SEASON]
    f = make_forecaster("naive", SEASON).fit(y)
    j = fmod.QUANTILES.index(0.95)
    start = f._err_q[0, j] + f._offset[0, j]
    for _ in range(200):
        f._track(0, 1e6)  # a miss far above every stored error
    after_200 = f._err_q[0, j] + f._offset[0, j] - start
    for _ in range(1800):
        f._track(0, 1e6)
    after_2000 = f._err_q[0, j] + f._offset[0, j] - start
    assert after_200 > 0 and after_2000 == pytest.approx(10 * after_200)


def test_coverage_returns_after_noise_jumps_25x() -> None:
    rng = np.random.default_rng(4)
    t = np.arange(30 * SEASON)
    y = 100 + 30 * np.sin(2 * np.pi * t / SEASON) + rng.normal(0, 1.0, len(t))
    y[12 * SEASON:] += rng.normal(0, 25.0, 18 * SEASON)  # noise x25 after training
    y = np.maximum(y, 0.0)
    f = make_forecaster("naive", SEASON).fit(y[: 10 * SEASON])
    hits = []
    for i in range(10 * SEASON, len(y)):
        fc = f.forecast(1)
        if i >= 20 * SEASON:
            hits.append(fc.quantile(0.05)[0] <= y[i] <= fc.quantile(0.95)[0])
        f.update(y[i])
    assert np.mean(hits) >= 0.85


def test_planning_cap_binds_and_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fmod, "PEAK_CAP", 0.5)  # below the recent peak: it must bind
    y = _drifting(2)[: 12 * SEASON]
    f = make_forecaster("naive", SEASON).fit(y)
    fc = f.forecast(SEASON)
    assert fc.cap == pytest.approx(0.5 * y[-SEASON:].max())
    assert fc.capped is not None and fc.capped.any() and f.cap_binds == 1
    assert all(np.all(q <= fc.cap + 1e-9) for q in fc.quantiles.values())
