"""The planning target's forecasters: conformal coverage under a level shift, auto's
choices, the local-linear-trend filter against statsmodels, causality of every choice, and the
env's and the controller's forecasts from the same object."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.forecast.forecasters import ForecastError
from atoll.forecast.planning import BURN_IN, LocalLinearTrend, PeakAuto, PeakForecaster, pinball
from atoll.forecast.registry import FORECASTERS, make_forecaster

SEASON = 48  # a short "day" keeps the tests fast; the code is the same for 288


def realized(f: PeakForecaster | PeakAuto, y: np.ndarray, start: int, horizon: int, level: float
             ) -> tuple[np.ndarray, np.ndarray]:
    """(issued level quantile of the peak over `horizon`, realized peak) from every origin."""
    issued, peaks = [], []
    for g in range(start, len(y) - horizon + 1):
        issued.append(float(f.forecast(horizon).quantile(level).max()))
        peaks.append(float(y[g: g + horizon].max()))
        f.update(y[g])
    return np.array(issued), np.array(peaks)


def test_conformal_quantiles_keep_coverage_through_a_level_shift() -> None:
    rng = np.random.default_rng(0)
    n = 40 * SEASON
    t = np.arange(n)
    y = 50 + 20 * np.sin(2 * np.pi * t / SEASON) + 5 * rng.standard_normal(n)
    shift = 20 * SEASON
    y[shift:] = 2.0 * y[shift:]  # demand doubles, and so does its noise
    f = PeakForecaster(SEASON, horizon=3, base="ets").fit(y[: 3 * SEASON])
    issued, peaks = realized(f, y, 3 * SEASON, 3, 0.9)
    hit = peaks <= issued
    after = shift - 3 * SEASON
    # tolerance: +-0.03 over ~1,800 targets, +-0.04 over the ~950 after the shift (binomial sd
    # ~0.01, plus the transient while the working level catches up)
    assert abs(hit.mean() - 0.9) <= 0.03
    assert abs(hit[after:].mean() - 0.9) <= 0.04
    assert abs(f.coverage(0.9) - hit.mean()) <= 0.01  # what it reports is what happened


def test_quantiles_follow_the_recent_volatility() -> None:
    """Scores are scaled by the recent volatility: on a series calm for half of every season and
    six times noisier for the other half, the issued 0.9 quantile of the peak lies much closer to
    the point forecast in calm stretches (with a constant scale the two widths are equal: 11.2
    and 11.2 on this series; scaled by volatility 6.2 and 12.5), and overall coverage holds."""
    season = 96
    rng = np.random.default_rng(3)
    n = 30 * season
    t = np.arange(n)
    noisy = (t % season) >= season // 2
    y = 50 + np.where(noisy, 6.0, 1.0) * rng.standard_normal(n)
    f = PeakForecaster(season, horizon=3, base="persistence").fit(y[: 3 * season])
    width, hit = [], []
    for g in range(3 * season, n - 2):
        fc = f.forecast(3)
        upper = float(fc.quantile(0.9).max())
        width.append(upper - float(fc.mean.max()))
        hit.append(y[g: g + 3].max() <= upper)
        f.update(y[g])
    w, in_noise = np.array(width), noisy[3 * season: n - 2]
    assert w[~in_noise].mean() < 0.6 * w[in_noise].mean()
    assert abs(np.mean(hit) - 0.9) <= 0.03  # ~2,600 targets: binomial sd ~0.006


# auto chooses on the calibration tail (three seasons of six here: 264 matured peaks after the
# burn-in, as the env's last warm-up day gives at 288 steps a day)
AUTO_SEASON = 96


def test_auto_picks_persistence_on_a_random_walk() -> None:
    rng = np.random.default_rng(1)
    y = 200 + np.cumsum(rng.standard_normal(6 * AUTO_SEASON))
    f = PeakAuto(AUTO_SEASON, horizon=3, bases=("persistence", "naive", "ets", "blend")).fit(y)
    assert f.chosen_name == "peak:persistence", f.scores
    # with every base, the pick is a non-seasonal model (ewma and llt track a walk as well)
    g = PeakAuto(AUTO_SEASON, horizon=3).fit(y)
    assert g.chosen_name in ("peak:persistence", "peak:ewma", "peak:llt"), g.scores


def test_auto_picks_a_seasonal_model_on_a_clean_daily_sine() -> None:
    rng = np.random.default_rng(2)
    t = np.arange(6 * AUTO_SEASON)
    y = 100 + 60 * np.sin(2 * np.pi * t / AUTO_SEASON) + 0.5 * rng.standard_normal(len(t))
    f = PeakAuto(AUTO_SEASON, horizon=3).fit(y)
    assert f.chosen_name in ("peak:naive", "peak:ets"), f.scores


def test_local_linear_trend_filter_matches_statsmodels() -> None:
    from statsmodels.tsa.statespace.structural import UnobservedComponents

    rng = np.random.default_rng(3)
    y = 10 + 0.05 * np.arange(160) + np.cumsum(0.3 * rng.standard_normal(160)) + rng.standard_normal(160)
    head = 120
    f = LocalLinearTrend(season=40)
    f._reset(y[:head])
    for v in y[head:]:
        f._step(float(v))  # the filter itself, without the Forecaster's robust clip
    full = UnobservedComponents(y, "local linear trend").filter(f.params)
    np.testing.assert_allclose(f.a, full.predicted_state[:, -1], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(f.P, full.predicted_state_cov[:, :, -1], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(f._mean(3)[0], full.forecast(1)[0], rtol=1e-7)


def test_no_later_data_reaches_a_choice_or_a_forecast() -> None:
    """Two series equal up to step `cut` (then one doubles): every selection and every forecast
    issued up to `cut` is the same, so test days cannot move what was chosen before them."""
    rng = np.random.default_rng(4)
    t = np.arange(8 * SEASON)
    a = 80 + 30 * np.sin(2 * np.pi * t / SEASON) + 4 * rng.standard_normal(len(t))
    b = a.copy()
    cut = 6 * SEASON
    b[cut:] *= 2
    runs = []
    for y in (a, b):
        f = PeakAuto(SEASON, horizon=3).fit(y[: 3 * SEASON])
        fc = []
        for g in range(3 * SEASON, len(y)):
            fc.append(f.forecast(3).quantile(0.9).copy())
            f.update(y[g])
        runs.append((f.selections, np.array(fc)))
    n = cut - 3 * SEASON + 1  # forecasts issued at steps <= cut
    np.testing.assert_array_equal(runs[0][1][:n], runs[1][1][:n])
    assert [s for s in runs[0][0] if s[0] <= cut] == [s for s in runs[1][0] if s[0] <= cut]
    assert not np.array_equal(runs[0][1][n:], runs[1][1][n:])  # the later data does matter


def test_planning_forecasters_are_registered_and_check_their_inputs() -> None:
    for name in ("peak:persistence", "peak:ewma", "peak:naive", "peak:ets", "peak:llt", "peak:blend",
                 "peak:auto", "llt"):
        assert name in FORECASTERS
    f = make_forecaster("peak:persistence", SEASON, horizon=5)
    assert isinstance(f, PeakForecaster) and f.horizon == 5
    with pytest.raises(ForecastError, match="planning base"):
        PeakForecaster(SEASON, 3, "prophet")
    with pytest.raises(ForecastError, match="horizon"):
        PeakForecaster(SEASON, 0, "ets")
    y = np.abs(50 + 10 * np.random.default_rng(5).standard_normal(4 * SEASON))
    f.fit(y)
    fc = f.forecast(5)
    for q in (0.5, 0.9, 0.99):  # quantiles of a running peak never fall with the look-ahead
        assert np.all(np.diff(fc.quantile(q)) >= 0)
    assert np.all(fc.quantile(0.9) <= fc.quantile(0.99))
    with pytest.raises(ForecastError, match="finite"):
        f.update(-1.0)


def test_pinball_loss() -> None:
    assert pinball(10.0, 8.0, 0.9) == pytest.approx(1.8)
    assert pinball(10.0, 12.0, 0.9) == pytest.approx(0.2)
    assert BURN_IN > 0


def test_env_book_and_live_controller_forecast_the_same_peak() -> None:
    """The env's causal pass and the controller's LiveForecast run the same planning forecaster:
    the upper planning demand at an origin agrees."""
    from atoll.control.live_demand import LiveForecast
    from atoll.control.state import HistoryPoint
    from atoll.envs.demand import build_book
    from atoll.forecast.workloads import DemandSeries

    rng = np.random.default_rng(6)
    steps = 4 * 288 + 12
    t = np.arange(steps)
    rates = np.maximum(20 * (1 + 0.5 * np.sin(2 * np.pi * t / 288)) + 2 * rng.standard_normal(steps), 0.1)
    series = DemandSeries("s", 300.0, rates, np.full(steps, 100.0), np.full(steps, 10.0))
    book = build_book(("m",), (series,), forecaster="peak:blend", horizon=3, quantile=0.9,
                      use_cache=False)
    live = LiveForecast(shapes={"m": (100.0, 10.0)}, forecaster="peak:blend", quantile=0.9, horizon=3)
    g = 3 * 288 + 5  # origin: steps < g seen
    history = {"m": tuple(HistoryPoint((i + 1) * 300.0, rates[i] * 100.0, rates[i] * 10.0)
                          for i in range(g))}
    fc = live.forecast(history, g * 300.0, ["m"])["m"]
    assert fc.methods == ("peak:blend", "peak:blend")
    # to the rounding of the request-equivalent units (see atoll.control.live_demand)
    np.testing.assert_allclose(fc.upper[0] / 100.0, book.upper[0, g].max(), rtol=1e-6)
    np.testing.assert_allclose(fc.upper[1] / 10.0, book.upper[0, g].max(), rtol=1e-6)


def test_the_env_and_the_controller_default_to_the_planning_forecaster_chosen_on_validation() -> None:
    """peak:auto was chosen as the default on validation days (benchmarks/planning.py's
    default_chosen_on_validation); the env's config and the controller's forecast share it, and
    ets stays available by name."""
    import inspect

    from atoll.control.live_demand import LiveForecast
    from atoll.envs.config import FleetConfig
    from atoll.forecast.planning import DEFAULT_FORECASTER
    from atoll.forecast.registry import PLANNING_FORECASTERS

    assert DEFAULT_FORECASTER == "peak:auto" and DEFAULT_FORECASTER in PLANNING_FORECASTERS
    assert FleetConfig().forecaster == DEFAULT_FORECASTER
    assert inspect.signature(LiveForecast).parameters["forecaster"].default == DEFAULT_FORECASTER
    assert FleetConfig(forecaster="ets").forecaster == "ets"


def test_score_quantiles_are_np_interp_of_each_sorted_window_to_the_bit() -> None:
    # the thresholds are computed for every look-ahead at once; the reference is one sort and
    # one np.interp per look-ahead, the plain reading of the definition
    from atoll.forecast.forecasters import QUANTILES

    rng = np.random.default_rng(5)
    n = 9 * SEASON
    y = np.maximum(30 + 10 * np.sin(2 * np.pi * np.arange(n) / SEASON) + 4 * rng.standard_normal(n), 0)
    f = PeakForecaster(SEASON, horizon=4, base="persistence").fit(y[: 3 * SEASON])
    steady = 0
    for g in range(3 * SEASON, n):
        f.update(y[g])
        if g % 7:
            continue
        m = np.minimum(f._n_scores, f._scores.shape[1])
        steady += bool(np.all(m == m[0]))  # windows of one length: the shared sort's case
        ref = np.empty((4, len(QUANTILES)))
        for k in range(4):
            s = np.sort(f._scores[k, : m[k]])
            ref[k] = np.interp(np.clip(f._work[k], 0.0, 1.0) * (m[k] - 1), np.arange(m[k]), s)
        assert np.array_equal(f._thresholds(), ref)
    assert steady > 10
