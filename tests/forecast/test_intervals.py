"""Interval calibration: adaptive conformal levels keep coverage near nominal under drift."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from atoll.forecast import forecasters as fmod
from atoll.forecast.forecasters import ForecastError, make_forecaster

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
    alpha_before = f._alpha[0].copy()
    f.update(np.zeros(30))  # an outage: every interval misses
    # the misses drive the conformal levels outward ...
    assert np.all(f._alpha[0] < alpha_before - 0.05)
    # ... but the -100% errors never enter the window the quantiles are read from
    assert np.nanmin(f._errors) > -0.5
