"""Rolling-origin backtest: fit on the first days, then step through the test days updating
the forecaster with each observation and forecasting every horizon from every origin.

Metrics per series, forecaster and horizon:
- MASE: mean absolute error / the in-sample MAE of the daily seasonal naive forecast on the
  training days (so seasonal naive itself scores about 1 where the days repeat);
- pinball loss of the 0.1/0.5/0.9 quantiles, scaled the same way;
- coverage of the 80% (0.1-0.9) and 90% (0.05-0.95) intervals: share of held-out points inside;
- the model in use at the end (``chosen``; for ``auto`` the pick can change), every
  (re-)selection as (test step, model), and how many forecasts the planning cap bound.

:func:`planning_backtest` scores forecasters at the planning target instead (the peak over the
look-ahead, :mod:`atoll.forecast.planning`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from atoll.forecast.auto import AutoForecaster
from atoll.forecast.forecasters import (
    DAY,
    DEFAULT_LEVEL,
    MAX_H,
    QUANTILES,
    Forecaster,
    ForecastError,
    check_history,
)
from atoll.forecast.planning import DEFAULT_HORIZON, PLANNING_CANDIDATES, SELECT_LEVEL, PeakAuto, pinball
from atoll.forecast.registry import make_forecaster

HORIZONS: tuple[int, ...] = (1, 6, 12, 72)  # 5 min, 30 min, 1 h, 6 h at 5-min steps
# The planning demand: the PLAN_LEVEL quantile's maximum over the next PLAN_STEPS steps (the
# env's default 15-min look-ahead at its default planning level).
PLAN_LEVEL = DEFAULT_LEVEL
PLAN_STEPS = 3


@dataclass(frozen=True)
class BacktestResult:
    series: str
    forecaster: str
    horizon_min: float
    mase: float
    naive_mase: float
    pinball: float
    coverage_80: float
    coverage_90: float
    points: int
    persistence_mase: float = float("nan")
    planning_ratio_median: float = float("nan")
    chosen: str = ""
    selections: tuple[tuple[int, str], ...] = ()
    cap_binds: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _run(y: np.ndarray, train: int, name: str, horizons: Sequence[int],
         tick: Callable[[], None], season: int = DAY
         ) -> tuple[dict[int, np.ndarray], dict[int, dict[float, np.ndarray]], float, Forecaster,
                    np.ndarray]:
    f = make_forecaster(name, season).fit(y[:train])
    hmax = max(max(horizons), PLAN_STEPS)
    n = len(y) - train
    plan = np.full(n, np.nan)  # the planning demand made at each origin
    means = {h: np.full(n, np.nan) for h in horizons}
    quants: dict[int, dict[float, np.ndarray]] = {h: {} for h in horizons}
    update_s = 0.0
    for i in range(n):
        t0 = time.perf_counter()
        fc = f.forecast(hmax)
        update_s += time.perf_counter() - t0
        plan[i] = float(np.max(fc.quantile(PLAN_LEVEL)[:PLAN_STEPS]))
        for h in horizons:
            if i + h - 1 < n:
                means[h][i + h - 1] = fc.mean[h - 1]
                for q, arr in fc.quantiles.items():
                    quants[h].setdefault(q, np.full(n, np.nan))[i + h - 1] = arr[h - 1]
        t0 = time.perf_counter()
        f.update(y[train + i])
        update_s += time.perf_counter() - t0
        tick()
    return means, quants, update_s / max(n, 1), f, plan


def planning_ratio(plan: np.ndarray, test: np.ndarray) -> float:
    """Median over origins of the planning demand / the realized peak of the next PLAN_STEPS
    steps (origins whose realized peak is 0 are left out: no ratio exists)."""
    n = len(test) - PLAN_STEPS + 1
    if n <= 0:
        return float("nan")
    peak = np.max(np.lib.stride_tricks.sliding_window_view(test, PLAN_STEPS), axis=1)[:n]
    ok = peak > 0
    return float(np.median(plan[:n][ok] / peak[ok])) if ok.any() else float("nan")


def backtest(y: np.ndarray, *, series: str, forecaster: str, train_steps: int = 7 * DAY,
             horizons: Sequence[int] = HORIZONS, step_min: float = 5.0, season: int = DAY,
             tick: Callable[[], None] = lambda: None) -> tuple[list[BacktestResult], float]:
    """Results per horizon, and the mean seconds of one update + forecast."""
    y = check_history(y, season, name=f"series {series!r}")
    if train_steps < 2 * season or train_steps >= len(y):
        raise ForecastError(f"train_steps {train_steps} must be >= {2 * season} and < the series' "
                            f"{len(y)} steps")
    if max(horizons) > MAX_H:
        raise ForecastError(f"horizons above {MAX_H} steps are not calibrated")
    train = y[:train_steps]
    scale = float(np.mean(np.abs(train[season:] - train[:-season]))) or 1.0
    test = y[train_steps:]
    model = _run(y, train_steps, forecaster, horizons, tick, season)
    naive = _run(y, train_steps, "naive", horizons, lambda: None, season) \
        if forecaster != "naive" else model
    persist = _run(y, train_steps, "persistence", horizons, lambda: None, season) \
        if forecaster != "persistence" else model
    ratio = planning_ratio(model[4], test)
    f = model[3]
    chosen = f.chosen_name if isinstance(f, AutoForecaster) else f.name
    # steps counted from the start of the test part (0 = chosen on the training part)
    selections = tuple((t - train_steps, n) for t, n in f.selections) \
        if isinstance(f, AutoForecaster) else ((0, f.name),)
    out = []
    for h in horizons:
        ok = ~np.isnan(model[0][h])
        err = np.abs(test[ok] - model[0][h][ok])
        nerr = np.abs(test[ok] - naive[0][h][ok])
        perr = np.abs(test[ok] - persist[0][h][ok])
        q = {k: v[ok] for k, v in model[1][h].items()}
        yt = test[ok]
        pin = np.mean([np.mean(np.maximum(a * (yt - q[a]), (a - 1) * (yt - q[a]))) for a in (0.1, 0.5, 0.9)])
        out.append(BacktestResult(
            series=series, forecaster=forecaster, horizon_min=h * step_min,
            mase=float(err.mean() / scale), naive_mase=float(nerr.mean() / scale),
            pinball=float(pin / scale), persistence_mase=float(perr.mean() / scale),
            planning_ratio_median=ratio,
            coverage_80=float(np.mean((yt >= q[0.1]) & (yt <= q[0.9]))),
            coverage_90=float(np.mean((yt >= q[0.05]) & (yt <= q[0.95]))),
            points=int(ok.sum()), chosen=chosen, selections=selections, cap_binds=int(f.cap_binds)))
    return out, model[2]


# ----- backtest at the planning target ----------------------------------------------------------
def planning_backtest(y: np.ndarray, *, series: str, forecasters: Sequence[str] = PLANNING_CANDIDATES,
                      train_steps: int = 3 * DAY, horizon: int = DEFAULT_HORIZON, level: float = SELECT_LEVEL,
                      season: int = DAY) -> list[dict[str, object]]:
    """Per forecaster, rolling origin over ``y[train_steps:]`` (fit on the steps before, updated
    step by step as the env does): at every origin g the ``level`` quantile of the peak over
    the next ``horizon`` steps (the forecast's maximum over them) against the realized peak —
    MAPE of the point forecast (the mean path's maximum), pinball loss and coverage of the
    quantile, the pinball loss relative to ``ets``'s where it ran — and the choice ``auto`` /
    ``peak:auto`` made (every (test step, model) selection)."""
    y = check_history(y, season, name=f"series {series!r}")
    if level not in QUANTILES:
        raise ForecastError(f"level {level} is not forecast; use one of {list(QUANTILES)}")
    if train_steps < 2 * season or train_steps + horizon > len(y):
        raise ForecastError(f"train_steps {train_steps} must be >= {2 * season} and leave at least "
                            f"{horizon} steps of the series' {len(y)}")
    origins = np.arange(train_steps, len(y) - horizon + 1)
    peak = np.lib.stride_tricks.sliding_window_view(y, horizon).max(axis=1)[origins]
    rows: list[dict[str, object]] = []
    for name in forecasters:
        f = make_forecaster(name, season, horizon=horizon).fit(y[:train_steps])
        upper = np.empty(len(origins))
        point = np.empty(len(origins))
        for i, g in enumerate(origins):
            fc = f.forecast(horizon)
            upper[i], point[i] = fc.quantile(level).max(), fc.mean.max()
            f.update(y[g])
        ok = peak > 0
        row: dict[str, object] = {
            "series": series, "forecaster": name, "horizon_steps": horizon, "level": level,
            "mape": float(np.mean(np.abs(point[ok] - peak[ok]) / peak[ok])) if ok.any() else math.nan,
            "pinball": pinball(peak, upper, level), "coverage": float(np.mean(peak <= upper)),
            "points": len(origins)}
        if isinstance(f, PeakAuto | AutoForecaster):
            row["chosen"] = f.chosen_name
            row["selections"] = [(int(t) - train_steps, n) for t, n in f.selections]
        rows.append(row)
    base = next((r["pinball"] for r in rows if r["forecaster"] == "ets"), None)
    for r in rows:
        r["pinball_vs_ets"] = float(r["pinball"]) / float(base) if base else math.nan  # type: ignore[arg-type]
    return rows
