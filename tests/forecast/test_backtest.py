"""Backtest metrics on a series with a known answer (the command: tests/control/cli/test_cli_forecast.py)."""

from __future__ import annotations

import numpy as np

from atoll.forecast.backtest import backtest
from atoll.forecast.forecasters import DAY


def test_naive_on_a_repeating_series_is_perfect() -> None:
    day = 50 + 30 * np.sin(2 * np.pi * np.arange(DAY) / DAY)
    y = np.tile(day, 9)
    res, _ = backtest(y + 0.0, series="rep", forecaster="naive", train_steps=7 * DAY, horizons=(1, 6))
    for r in res:
        assert r.mase == 0.0 or r.mase < 1e-12
        assert r.series == "rep" and r.points > 0
