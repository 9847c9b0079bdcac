"""auto: falls back to a baseline where models have nothing to learn, keeps a model where they
do, skips seasonal models without a season (seasonal naive is always a candidate), never starts
with a flat model seasonal naive beats, and re-selects online when it falls behind."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.forecast import auto as amod
from atoll.forecast.auto import AutoForecaster, season_strength
from atoll.forecast.registry import make_forecaster

SEASON = 24


def test_white_noise_falls_back_to_a_baseline_without_trying_seasonal_models() -> None:
    y = 50 + np.random.default_rng(0).normal(0, 5.0, 10 * SEASON)
    f = make_forecaster("auto", SEASON).fit(y)
    assert isinstance(f, AutoForecaster)
    assert f.strength < amod.SEASON_STRENGTH_MIN
    assert set(f.scores) == set(amod.PLAIN_MODELS + amod.SEASONAL_BASELINES + amod.BASELINES)
    # a level (smoothed or the median) beats the last value on iid noise
    assert f.chosen_name in ("ses", "median")


def test_strong_daily_pattern_picks_a_seasonal_model() -> None:
    rng = np.random.default_rng(1)
    t = np.arange(10 * SEASON)
    y = 100 + 40 * np.sin(2 * np.pi * t / SEASON) + rng.normal(0, 2.0, len(t))
    assert season_strength(y, SEASON) > 0.9
    f = make_forecaster("auto", SEASON).fit(y)
    assert isinstance(f, AutoForecaster)
    assert f.chosen_name in amod.MODELS + amod.SEASONAL_BASELINES
    assert f.scores[f.chosen_name] < min(f.scores["persistence"], f.scores["median"])
    assert f.selections == [(len(y), f.chosen_name)]


def test_reselects_when_the_season_disappears() -> None:
    """Trained on a clean daily pattern; then the pattern vanishes into noise around a new
    level: within a few checks (one a season) auto moves to a baseline and says when."""
    rng = np.random.default_rng(2)
    t = np.arange(10 * SEASON)
    y = 100 + 40 * np.sin(2 * np.pi * t / SEASON) + rng.normal(0, 2.0, len(t))
    f = make_forecaster("auto", SEASON).fit(y)
    assert isinstance(f, AutoForecaster)
    first = f.chosen_name
    f.update(30 + rng.normal(0, 1.0, 8 * SEASON))
    assert f.chosen_name != first
    assert f.chosen_name in amod.PLAIN_MODELS + amod.BASELINES + amod.SEASONAL_BASELINES
    (t0, n0), (t1, n1) = f.selections[0], f.selections[-1]
    assert n0 == first and n1 == f.chosen_name and t1 > t0 and (t1 - t0) % SEASON == 0


@pytest.mark.parametrize("seasons", [2, 3])
def test_auto_fits_on_the_simulators_short_warm_up(seasons: int) -> None:
    """Three seasons of history (the simulator's warm-up) used to leave every candidate without
    the two seasons it needs to fit, and fit() died on an empty score table; two seasons leave
    no room to validate: the trivial baseline is chosen."""
    rng = np.random.default_rng(0)
    season = 48
    y = np.maximum(rng.pareto(1.5, seasons * season), 0.0)
    f = make_forecaster("auto", season=season).fit(y)
    assert f.chosen_name == ("persistence" if seasons == 2 else f.chosen_name)
    assert seasons == 2 or f.scores  # validated on the third season
    fc = f.forecast(6)
    assert np.all(np.isfinite(fc.mean))
    if seasons == 3:  # two seasons leave no errors to calibrate intervals on, with any forecaster
        assert np.all(fc.quantile(0.9) >= fc.mean - 1e-9)


def test_a_flat_model_is_never_chosen_where_seasonal_naive_beats_it() -> None:
    """Simple smoothing wins the next half hour of a daily cycle and loses the next six hours to
    seasonal naive (the scores of a seeded daily cycle under hour-long noise): it is not
    eligible, the seasonal model behind it is; where naive loses at both horizons, smoothing
    stays eligible."""
    f = AutoForecaster()
    half_hour = {"ets": 1.74, "sarimax": 1.58, "ses": 1.57, "naive": 5.06, "persistence": 1.57, "median": 6.9}
    six_hours = {"ets": 5.84, "sarimax": 4.52, "ses": 7.73, "naive": 5.4, "persistence": 7.73, "median": 7.3}
    eligible = f._eligible(half_hour, six_hours)  # noqa: SLF001 - the selection rule itself
    assert set(eligible) == {"ets", "sarimax", "naive"}
    assert min(eligible, key=half_hour.__getitem__) == "sarimax"
    assert "ses" in f._eligible(half_hour, {**six_hours, "naive": 9.0})  # noqa: SLF001
    assert set(f._eligible({"ses": 2.0, "naive": 1.0})) == {"naive"}  # noqa: SLF001 - one horizon
