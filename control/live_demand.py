"""Live demand: the controller's measured history -> the planning forecast the env plans with.

The simulator plans each model's prefill and decode services for the planning quantile
(default 0.9) of the demand forecast, maximized over the look-ahead (default 15 min), on
5-minute steps. The controller does the same from what it measured:

1. Its per-interval token rates (``ControllerState.history``, one point per tick) are averaged
   into ``step_s`` bins aligned to the clock (a tick interval shorter than the step gives
   several points per bin, a longer one leaves bins empty, which are filled from the previous
   bin). Only complete bins are used; the bin in progress is not.
2. With at least two days of bins (what a daily-seasonal model needs) the configured
   forecaster (``atoll.forecast.forecasters``, ``ets`` by default) is fitted once per (model, phase)
   and then updated bin by bin, as the env's causal forecast pass does.
3. Before that (a fresh controller) the forecast is ``recent``: the mean of the last
   ``RECENT_BINS`` complete bins as the mean, and their maximum x (1 + ``RECENT_MARGIN``) as
   the upper quantile. It is labelled as such in every tick report, so nobody mistakes it for
   a seasonal forecast.

Demand is in tokens/s: prompt tokens are the prefill service's demand, generation tokens the
decode service's, the units the templates' throughputs use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from atoll.control.state import HistoryPoint
from atoll.forecast.forecasters import DAY, Forecaster, make_forecaster

RECENT_BINS = 3
RECENT_MARGIN = 0.1
PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class ModelForecast:
    """One model's planning inputs, tokens/s per phase (prefill, decode): ``last`` the latest
    measured rate, ``mean`` and ``upper`` the maxima over the look-ahead; ``method`` is the
    forecaster's name or ``recent`` (see the module docstring)."""

    model: str
    last: tuple[float, float]
    mean: tuple[float, float]
    upper: tuple[float, float]
    method: str
    bins: int

    def as_dict(self) -> dict[str, object]:
        return {"method": self.method, "bins": self.bins,
                **{f"{p}_last": self.last[i] for i, p in enumerate(PHASES)},
                **{f"{p}_mean": self.mean[i] for i, p in enumerate(PHASES)},
                **{f"{p}_upper": self.upper[i] for i, p in enumerate(PHASES)}}


def bin_history(points: Sequence[HistoryPoint], step_s: float, now_s: float) -> tuple[int, np.ndarray]:
    """(clock index of the first bin, [bins, 2] mean token rates per complete ``step_s`` bin
    (prefill, decode), oldest first); bins without points repeat the previous bin (the first
    bin always has points)."""
    current = math.floor(now_s / step_s)  # the bin in progress, left out
    if not points:
        return current, np.zeros((0, 2))
    idx = np.array([math.floor(p.time_s / step_s) for p in points])
    keep = idx < current
    if not keep.any():
        return current, np.zeros((0, 2))
    idx = idx[keep]
    values = np.array([[p.prompt_tokens_per_s, p.generation_tokens_per_s] for p in points])[keep]
    first = int(idx.min())
    n = int(idx.max()) - first + 1
    sums = np.zeros((n, 2))
    counts = np.zeros(n)
    np.add.at(sums, idx - first, values)
    np.add.at(counts, idx - first, 1)
    out = np.empty((n, 2))
    for i in range(n):
        out[i] = sums[i] / counts[i] if counts[i] else out[i - 1]
    return first, out


class LiveForecast:
    """Per-model planning forecasts from the controller's history (see the module docstring).

    ``forecaster``: a name ``atoll.forecast.forecasters.make_forecaster`` knows; ``quantile``: the
    planning quantile (one of the forecasters' ``QUANTILES``); ``horizon``: look-ahead bins.
    """

    def __init__(self, *, forecaster: str = "ets", quantile: float = 0.9, horizon: int = 3,
                 step_s: float = 300.0, season: int = DAY) -> None:
        if horizon < 1:
            raise ValueError(f"LiveForecast: field 'horizon' must be >= 1 bin, got {horizon}")
        if not step_s > 0:
            raise ValueError(f"LiveForecast: field 'step_s' must be > 0, got {step_s}")
        make_forecaster(forecaster, season)  # unknown names fail here, naming the valid ones
        self.forecaster, self.quantile, self.horizon = forecaster, quantile, horizon
        self.step_s, self.season = step_s, season
        # (model, phase) -> (fitted forecaster, clock index of the last bin it absorbed)
        self._fitted: dict[tuple[str, int], tuple[Forecaster, int]] = {}

    def forecast(self, history: Mapping[str, Sequence[HistoryPoint]], now_s: float,
                 models: Sequence[str]) -> dict[str, ModelForecast]:
        """Forecasts of the models that have at least one complete bin or point."""
        out: dict[str, ModelForecast] = {}
        for model in models:
            points = history.get(model, ())
            if not points:
                continue
            last = (points[-1].prompt_tokens_per_s, points[-1].generation_tokens_per_s)
            first, bins = bin_history(points, self.step_s, now_s)
            if len(bins) == 0:
                grown = (last[0] * (1 + RECENT_MARGIN), last[1] * (1 + RECENT_MARGIN))
                out[model] = ModelForecast(model, last, last, grown, "recent", 0)
                continue
            if len(bins) >= 2 * self.season:
                fitted = self._seasonal(model, first + len(bins) - 1, bins)
                if fitted is not None:
                    mean, upper = fitted
                    # the bin in progress is already measured: plan for at least what runs now
                    out[model] = ModelForecast(model, last, (max(mean[0], last[0]), max(mean[1], last[1])),
                                               (max(upper[0], last[0]), max(upper[1], last[1])),
                                               self.forecaster, len(bins))
                    continue
            recent = bins[-RECENT_BINS:]
            mean_r = np.maximum(recent.mean(axis=0), last)
            upper_r = np.maximum(recent.max(axis=0), last) * (1 + RECENT_MARGIN)
            out[model] = ModelForecast(model, last, (float(mean_r[0]), float(mean_r[1])),
                                       (float(upper_r[0]), float(upper_r[1])), "recent", len(bins))
        return out

    def _seasonal(self, model: str, last_bin: int, bins: np.ndarray
                  ) -> tuple[tuple[float, float], tuple[float, float]] | None:
        means, uppers = [], []
        for phase in range(2):
            key = (model, phase)
            y = bins[:, phase]
            entry = self._fitted.get(key)
            try:
                new = last_bin - entry[1] if entry is not None else -1
                if entry is None or not 0 <= new < len(y):
                    # first fit, or the history moved under it (restart, clock jump): fit again
                    entry = (make_forecaster(self.forecaster, self.season).fit(y), last_bin)
                elif new:
                    entry[0].update(y[len(y) - new:])
                    entry = (entry[0], last_bin)
            except (ValueError, np.linalg.LinAlgError):  # ForecastError is a ValueError
                self._fitted.pop(key, None)
                return None  # e.g. a flat-zero history ETS cannot fit: fall back to recent
            self._fitted[key] = entry
            fc = entry[0].forecast(self.horizon)
            upper = fc.quantiles.get(self.quantile, fc.mean)
            means.append(float(np.max(fc.mean)))
            uppers.append(float(np.max(upper)))
        return (means[0], means[1]), (uppers[0], uppers[1])
