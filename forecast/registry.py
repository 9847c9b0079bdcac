"""Every forecaster by name: the name -> factory tables and the lookup, :func:`make_forecaster`.

The forecaster modules define classes and import nothing of each other's tables; this module
imports them and lists their names here, in one place (a plain import graph: registry ->
auto, planning, learned -> forecasters). Whichever forecast module is imported first, the tables
are whole once this one is.

- :data:`FORECASTERS`: name -> factory(season), every name the env, the controller and the
  CLI take, in the order errors and ``--help`` list them: the models and baselines of
  :mod:`atoll.forecast.forecasters`, ``auto`` (:mod:`atoll.forecast.auto`), the planning-target
  forecasters of :mod:`atoll.forecast.planning` at its default look-ahead, ``llt`` (the local
  linear trend level model) and ``peak:learned`` (:mod:`atoll.forecast.learned`).
- :data:`PLANNING_FORECASTERS`: name -> factory(season, horizon), the forecasters of the planning
  target (``peak:*``), made for a look-ahead.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from atoll.forecast.auto import AutoForecaster
from atoll.forecast.forecasters import BASE_FORECASTERS, DAY, Forecaster, ForecastError
from atoll.forecast.learned import make_peak_learned, shipped_digest
from atoll.forecast.planning import DEFAULT_HORIZON, PEAK_FORECASTERS, SETTINGS, LocalLinearTrend


def _at_default_horizon(make: Callable[[int, int], Forecaster], season: int) -> Forecaster:
    return make(season, DEFAULT_HORIZON)


# name -> factory(season, horizon): the planning target's forecasters, made for a look-ahead
PLANNING_FORECASTERS: dict[str, Callable[[int, int], Forecaster]] = {
    **PEAK_FORECASTERS, "peak:learned": make_peak_learned}

# name -> factory(season): every forecaster (a planning one at the default look-ahead)
FORECASTERS: dict[str, Callable[[int], Forecaster]] = {
    **BASE_FORECASTERS,
    "auto": AutoForecaster,
    **{name: partial(_at_default_horizon, make) for name, make in PEAK_FORECASTERS.items()},
    "llt": LocalLinearTrend,
    "peak:learned": partial(_at_default_horizon, make_peak_learned),
}


def make_forecaster(name: str, season: int = DAY, *, horizon: int | None = None) -> Forecaster:
    """A new forecaster by name; unknown names list the valid ones. ``horizon`` (steps) is the
    look-ahead a planning-target forecaster (``peak:*``) is calibrated for; the others forecast
    every horizon and ignore it."""
    if name not in FORECASTERS:
        raise ForecastError(f"unknown forecaster {name!r}; valid: {', '.join(FORECASTERS)}")
    if horizon is not None and name in PLANNING_FORECASTERS:
        return PLANNING_FORECASTERS[name](season, horizon)
    return FORECASTERS[name](season)


def planning_settings() -> tuple[object, ...]:
    """What a cache of planning forecasts must key on besides the name and horizon: the planning
    module's settings and the shipped learned model's weights."""
    return (*SETTINGS, shipped_digest())
