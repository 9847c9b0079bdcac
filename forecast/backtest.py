"""Rolling-origin backtest: fit on the first days, then step through the test days updating
the forecaster with each observation and forecasting every horizon from every origin.

Metrics per series, forecaster and horizon:
- MASE: mean absolute error / the in-sample MAE of the daily seasonal naive forecast on the
  training days (so seasonal naive itself scores about 1 where the days repeat);
- pinball loss of the 0.1/0.5/0.9 quantiles, scaled the same way;
- coverage of the 80% (0.1-0.9) and 90% (0.05-0.95) intervals: share of held-out points inside.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from atoll.forecast.forecasters import DAY, MAX_H, ForecastError, check_history, make_forecaster

HORIZONS: tuple[int, ...] = (1, 6, 12, 72)  # 5 min, 30 min, 1 h, 6 h at 5-min steps


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

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _run(y: np.ndarray, train: int, name: str, horizons: Sequence[int],
         tick: Callable[[], None]) -> tuple[dict[int, np.ndarray], dict[int, dict[float, np.ndarray]], float]:
    f = make_forecaster(name).fit(y[:train])
    hmax = max(horizons)
    n = len(y) - train
    means = {h: np.full(n, np.nan) for h in horizons}
    quants: dict[int, dict[float, np.ndarray]] = {h: {} for h in horizons}
    update_s = 0.0
    for i in range(n):
        t0 = time.perf_counter()
        fc = f.forecast(hmax)
        update_s += time.perf_counter() - t0
        for h in horizons:
            if i + h - 1 < n:
                means[h][i + h - 1] = fc.mean[h - 1]
                for q, arr in fc.quantiles.items():
                    quants[h].setdefault(q, np.full(n, np.nan))[i + h - 1] = arr[h - 1]
        t0 = time.perf_counter()
        f.update(y[train + i])
        update_s += time.perf_counter() - t0
        tick()
    return means, quants, update_s / max(n, 1)


def backtest(y: np.ndarray, *, series: str, forecaster: str, train_steps: int = 7 * DAY,
             horizons: Sequence[int] = HORIZONS, step_min: float = 5.0,
             tick: Callable[[], None] = lambda: None) -> tuple[list[BacktestResult], float]:
    """Results per horizon, and the mean seconds of one update + forecast."""
    y = check_history(y, DAY, name=f"series {series!r}")
    if train_steps < 2 * DAY or train_steps >= len(y):
        raise ForecastError(f"train_steps {train_steps} must be >= {2 * DAY} and < the series' "
                            f"{len(y)} steps")
    if max(horizons) > MAX_H:
        raise ForecastError(f"horizons above {MAX_H} steps are not calibrated")
    train = y[:train_steps]
    scale = float(np.mean(np.abs(train[DAY:] - train[:-DAY]))) or 1.0
    test = y[train_steps:]
    model = _run(y, train_steps, forecaster, horizons, tick)
    naive = _run(y, train_steps, "naive", horizons, lambda: None) if forecaster != "naive" else model
    out = []
    for h in horizons:
        ok = ~np.isnan(model[0][h])
        err = np.abs(test[ok] - model[0][h][ok])
        nerr = np.abs(test[ok] - naive[0][h][ok])
        q = {k: v[ok] for k, v in model[1][h].items()}
        yt = test[ok]
        pin = np.mean([np.mean(np.maximum(a * (yt - q[a]), (a - 1) * (yt - q[a]))) for a in (0.1, 0.5, 0.9)])
        out.append(BacktestResult(
            series=series, forecaster=forecaster, horizon_min=h * step_min,
            mase=float(err.mean() / scale), naive_mase=float(nerr.mean() / scale),
            pinball=float(pin / scale),
            coverage_80=float(np.mean((yt >= q[0.1]) & (yt <= q[0.9]))),
            coverage_90=float(np.mean((yt >= q[0.05]) & (yt <= q[0.95]))),
            points=int(ok.sum())))
    return out, model[2]
