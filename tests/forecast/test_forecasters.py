"""Forecasters: known answers on seeded seasonal series, seasonal-naive oracle, non-negativity,
update == refit, bad input."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from atoll.forecast import forecasters as fmod
from atoll.forecast.forecasters import DAY, QUANTILES, ForecastError, HoltWinters
from atoll.forecast.registry import make_forecaster

SEASON = 48  # a short season keeps statsmodels fits fast


def seasonal(n: int, seed: int, noise: float = 2.0, season: int = SEASON
             ) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    signal = 100 + 40 * np.sin(2 * np.pi * t / season)
    return signal + rng.normal(0, noise, n), signal


def test_seasonal_naive_reproduces_one_season_back() -> None:
    y, _ = seasonal(6 * SEASON, 0)
    f = make_forecaster("naive", SEASON).fit(y[: 4 * SEASON])
    np.testing.assert_array_equal(f.forecast(SEASON).mean, y[3 * SEASON: 4 * SEASON])
    f.update(y[4 * SEASON: 5 * SEASON])
    np.testing.assert_array_equal(f.forecast(10).mean, y[4 * SEASON: 4 * SEASON + 10])


# 48 divides a day (288 steps) and 50 does not: a model that hard-codes a daily period passes
# with 48 (its 6th harmonic is the 48-step cycle) and fails with 50.
@pytest.mark.parametrize("season", [48, 50])
@pytest.mark.parametrize("name", ["ets", "sarimax", "uc", "auto"])
def test_models_recover_known_seasonal_signal(name: str, season: int) -> None:
    y, signal = seasonal(8 * season, 1, season=season)
    f = make_forecaster(name, season).fit(y[: 7 * season])
    fc = f.forecast(12)
    # noise sd 2 on an amplitude of 40: a model that learned the season is within a few units
    assert np.max(np.abs(fc.mean - signal[7 * season: 7 * season + 12])) < 8.0
    for lo, hi in zip(QUANTILES, QUANTILES[1:], strict=False):
        assert np.all(fc.quantile(lo) <= fc.quantile(hi) + 1e-9)


@pytest.mark.parametrize("name", ["naive", "ets", "sarimax", "uc"])
def test_never_negative_with_outages(name: str) -> None:
    y, _ = seasonal(8 * SEASON, 2, noise=20.0)
    y = np.maximum(y - 90, 0.0)  # long stretches of zero
    y[3 * SEASON: 3 * SEASON + 20] = 0.0
    f = make_forecaster(name, SEASON).fit(y[: 6 * SEASON])
    f.update(np.zeros(30))
    fc = f.forecast(40)
    assert np.all(fc.mean >= 0) and all(np.all(q >= 0) for q in fc.quantiles.values())


def test_ets_update_equals_refit_with_fixed_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    monkeypatch.setattr(fmod, "ROBUST_K", 1e9)  # compare the pure recursion
    y, _ = seasonal(6 * SEASON, 3)
    f = make_forecaster("ets", SEASON).fit(y[: 5 * SEASON])
    assert isinstance(f, HoltWinters)
    f.update(y[5 * SEASON:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = ExponentialSmoothing(y, seasonal="add", seasonal_periods=SEASON,
                                   initialization_method="heuristic").fit(
            smoothing_level=f.alpha, smoothing_seasonal=f.gamma, optimized=False)
    np.testing.assert_allclose(f.forecast(SEASON).mean, ref.forecast(SEASON), rtol=1e-6, atol=1e-6)


def test_uc_update_equals_statsmodels_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fmod, "ROBUST_K", 1e9)
    y, _ = seasonal(3 * DAY, 4)
    f = make_forecaster("uc").fit(y[: 2 * DAY])
    ref = _uc_ref(y[: 2 * DAY])
    f.update(y[2 * DAY: 2 * DAY + 30])
    ref = ref.append(y[2 * DAY: 2 * DAY + 30], refit=False)
    np.testing.assert_allclose(f.forecast(5).mean, ref.forecast(5), rtol=1e-6, atol=1e-6)


def _uc_ref(y: np.ndarray):  # type: ignore[no-untyped-def]
    from statsmodels.tsa.statespace.structural import UnobservedComponents

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = UnobservedComponents(y, level="llevel", freq_seasonal=[{"period": DAY, "harmonics": 6},
                                                                     {"period": 7 * DAY, "harmonics": 2}])
        return mod.fit(disp=False, maxiter=50)


def test_bad_input_is_named() -> None:
    y, _ = seasonal(4 * SEASON, 5)
    with pytest.raises(ForecastError, match="NaN/inf at index 7"):
        make_forecaster("ets", SEASON).fit(np.where(np.arange(len(y)) == 7, np.nan, y))
    with pytest.raises(ForecastError, match="negative value -1 at index 3"):
        make_forecaster("ets", SEASON).fit(np.where(np.arange(len(y)) == 3, -1.0, y))
    with pytest.raises(ForecastError, match="at least two seasons"):
        make_forecaster("ets", SEASON).fit(y[: SEASON + 5])
    with pytest.raises(ForecastError, match="unknown forecaster 'prophet'; valid: naive, ets"):
        make_forecaster("prophet")
    f = make_forecaster("naive", SEASON).fit(y)
    with pytest.raises(ForecastError, match="observation -2.0"):
        f.update(-2.0)
    with pytest.raises(ForecastError, match="horizon must be >= 1"):
        f.forecast(0)


@pytest.mark.parametrize("name", ["naive", "ets"])
def test_every_planning_level_is_forecast_ordered_and_calibrated(name: str) -> None:
    """The planning levels 0.5-0.99 all exist, never cross, and each upper quantile is exceeded
    about as often as its level says on a series whose errors do not drift."""
    assert set(fmod.PLANNING_LEVELS) == {0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99}
    assert set(fmod.PLANNING_LEVELS) <= set(QUANTILES)
    y, _ = seasonal(40 * SEASON, 8, noise=5.0)
    f = make_forecaster(name, SEASON).fit(y[: 10 * SEASON])
    below = {q: [] for q in fmod.PLANNING_LEVELS}
    for i in range(10 * SEASON, len(y)):
        fc = f.forecast(6)
        qs = [fc.quantile(q) for q in QUANTILES]
        for lo, hi in zip(qs, qs[1:], strict=False):
            assert np.all(lo <= hi + 1e-9)
        for q in fmod.PLANNING_LEVELS:
            below[q].append(y[i] <= fc.quantile(q)[0])
        f.update(y[i])
    for q, hits in below.items():
        assert abs(np.mean(hits) - q) < 0.06, (q, np.mean(hits))
