"""Live demand: the controller's measured history -> the forecast the env plans with.

The simulator forecasts each model's *request rate* with an online forecaster (fitted on the
first ``WARMUP_DAYS`` days of the trace, then updated step by step) and plans for the planning
quantile, maximized over the look-ahead, times the model's request shape. The controller does
the same from what it measured, through the same forecaster class:

1. Each history point carries the interval's request rate: the measured token rates over the
   model's request shape, the larger of the two phases (:func:`request_equivalent`; in the env
   both phases give the same rate). Points are averaged into ``step_s`` bins aligned to the
   clock (a point belongs to the bin its interval ends in; bins without points repeat the
   previous one); the bin in progress is left out.
2. With ``WARMUP_DAYS`` days of bins the forecaster is fitted on the first ``WARMUP_DAYS``
   days and updated bin by bin with the rest and every later bin — the env's causal pass.
3. Before that (a fresh controller) the forecast is ``recent``: the mean of the last
   ``RECENT_BINS`` complete bins (at least the latest rate) as the mean, and their maximum
   x (1 + ``RECENT_MARGIN``) as the upper quantile. It is labelled as such in every tick
   report, so nobody mistakes it for a seasonal forecast; the env never needs it.

Token demand = request rate x shape: prompt tokens are the prefill service's, generation tokens
the decode service's, the units the templates' throughputs use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from atoll.control.state import HistoryPoint
from atoll.envs.demand import WARMUP_DAYS
from atoll.forecast.forecasters import DAY, Forecaster, make_forecaster

RECENT_BINS = 3
RECENT_MARGIN = 0.1
PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class ModelForecast:
    """One model's planning inputs: ``last`` the latest measured token rates per phase (prefill,
    decode); ``mean_rps`` and ``upper_rps`` the forecast request rate's maxima over the
    look-ahead; ``mean`` and ``upper`` those x the request shape (tokens/s per phase);
    ``method`` is the forecaster's name or ``recent`` (see the module docstring);
    ``first_rps``/``last_rps`` the mean forecast of the look-ahead's first and last bin;
    ``uppers_rps`` the look-ahead's maximum at every planning level a re-optimization may use
    (``recent``: the same upper for every level, first = last = the mean)."""

    model: str
    last: tuple[float, float]
    mean_rps: float
    upper_rps: float
    mean: tuple[float, float]
    upper: tuple[float, float]
    method: str
    bins: int
    first_rps: float = 0.0
    last_rps: float = 0.0
    uppers_rps: tuple[tuple[float, float], ...] = ()

    def upper_at(self, level: float) -> float:
        """The look-ahead's maximum request rate at planning level ``level``."""
        return dict(self.uppers_rps).get(level, self.upper_rps)

    def as_dict(self) -> dict[str, object]:
        return {"method": self.method, "bins": self.bins, "mean_requests_per_s": self.mean_rps,
                "upper_requests_per_s": self.upper_rps,
                **{f"{p}_last": self.last[i] for i, p in enumerate(PHASES)},
                **{f"{p}_mean": self.mean[i] for i, p in enumerate(PHASES)},
                **{f"{p}_upper": self.upper[i] for i, p in enumerate(PHASES)}}


def request_equivalent(prompt_tokens_per_s: float, generation_tokens_per_s: float,
                       shape: tuple[float, float]) -> float:
    """The request rate a model's token rates amount to at its request shape: the larger of the
    phases' (planning for it covers both)."""
    return max(prompt_tokens_per_s / shape[0], generation_tokens_per_s / shape[1])


def bin_index(time_s: float, step_s: float) -> int:
    """The bin a point whose interval ends at ``time_s`` belongs to (end times on a boundary
    close the bin before it)."""
    return math.ceil(time_s / step_s - 1e-9) - 1


def _bin(times: np.ndarray, values: np.ndarray, step_s: float, now_s: float) -> tuple[int, np.ndarray]:
    current = math.floor(now_s / step_s + 1e-9)  # the bin in progress, left out
    if len(times) == 0:
        return current, np.zeros((0, values.shape[1]))
    idx = np.array([bin_index(t, step_s) for t in times])
    keep = idx < current
    if not keep.any():
        return current, np.zeros((0, values.shape[1]))
    idx, values = idx[keep], values[keep]
    first = int(idx.min())
    n = int(idx.max()) - first + 1
    sums = np.zeros((n, values.shape[1]))
    counts = np.zeros(n)
    np.add.at(sums, idx - first, values)
    np.add.at(counts, idx - first, 1)
    out = np.empty_like(sums)
    for i in range(n):
        out[i] = sums[i] / counts[i] if counts[i] else out[i - 1]
    return first, out


def bin_history(points: Sequence[HistoryPoint], step_s: float, now_s: float) -> tuple[int, np.ndarray]:
    """(clock index of the first bin, [bins, 2] mean token rates per complete ``step_s`` bin
    (prefill, decode), oldest first); bins without points repeat the previous bin (the first
    bin always has points)."""
    times = np.array([p.time_s for p in points])
    values = np.array([[p.prompt_tokens_per_s, p.generation_tokens_per_s] for p in points]).reshape(-1, 2)
    return _bin(times, values, step_s, now_s)


class LiveForecast:
    """Per-model planning forecasts from the controller's history (see the module docstring).

    ``forecaster``: a name ``atoll.forecast.forecasters.make_forecaster`` knows; ``quantile``: the
    planning quantile (one of the forecasters' ``QUANTILES``); ``horizon``: look-ahead bins;
    ``shapes``: model -> (input, output) tokens per request.
    """

    def __init__(self, *, shapes: Mapping[str, tuple[float, float]], forecaster: str = "ets",
                 quantile: float = 0.9, horizon: int = 3, step_s: float = 300.0, season: int = DAY,
                 levels: Sequence[float] = ()) -> None:
        if horizon < 1:
            raise ValueError(f"LiveForecast: field 'horizon' must be >= 1 bin, got {horizon}")
        if not step_s > 0:
            raise ValueError(f"LiveForecast: field 'step_s' must be > 0, got {step_s}")
        make_forecaster(forecaster, season)  # unknown names fail here, naming the valid ones
        self.forecaster, self.quantile, self.horizon = forecaster, quantile, horizon
        self.levels = tuple(dict.fromkeys((float(quantile), *map(float, levels))))
        self.step_s, self.season = step_s, season
        self.shapes = {m: (float(a), float(b)) for m, (a, b) in shapes.items()}
        # model -> (fitted forecaster, clock index of the last bin it absorbed)
        self._fitted: dict[str, tuple[Forecaster, int]] = {}

    def rate_of(self, model: str, point: HistoryPoint) -> float:
        if point.requests_per_s is not None:
            return point.requests_per_s
        return request_equivalent(point.prompt_tokens_per_s, point.generation_tokens_per_s,
                                  self.shapes[model])

    def forecast(self, history: Mapping[str, Sequence[HistoryPoint]], now_s: float,
                 models: Sequence[str]) -> dict[str, ModelForecast]:
        """Forecasts of the models that have at least one point."""
        out: dict[str, ModelForecast] = {}
        for model in models:
            points = history.get(model, ())
            if not points:
                continue
            shape = self.shapes[model]
            last = (points[-1].prompt_tokens_per_s, points[-1].generation_tokens_per_s)
            latest = self.rate_of(model, points[-1])
            times = np.array([p.time_s for p in points])
            rates = np.array([[self.rate_of(model, p)] for p in points])
            first, bins = _bin(times, rates, self.step_s, now_s)
            y = bins[:, 0]
            method = "recent"
            fitted = None
            if len(y) >= WARMUP_DAYS * self.season:
                fitted = self._seasonal(model, first + len(y) - 1, y)
            if fitted is not None:
                mean, upper, first_rps, last_rps, uppers = fitted
                method = self.forecaster
            else:
                if len(y) == 0:
                    mean, upper = latest, latest * (1 + RECENT_MARGIN)
                else:
                    recent = y[-RECENT_BINS:]
                    mean = max(float(recent.mean()), latest)
                    upper = max(float(recent.max()), latest) * (1 + RECENT_MARGIN)
                first_rps = last_rps = mean
                uppers = tuple((q, upper) for q in self.levels)
            out[model] = ModelForecast(model, last, mean, upper, (mean * shape[0], mean * shape[1]),
                                       (upper * shape[0], upper * shape[1]), method, len(y),
                                       first_rps, last_rps, uppers)
        return out

    def _seasonal(self, model: str, last_bin: int, y: np.ndarray
                  ) -> tuple[float, float, float, float, tuple[tuple[float, float], ...]] | None:
        entry = self._fitted.get(model)
        try:
            new = last_bin - entry[1] if entry is not None else -1
            if entry is None or not 0 <= new < len(y):
                # first fit, or the history moved under it (restart, clock jump): fit on the first
                # WARMUP_DAYS days and absorb the rest bin by bin, as the env's forecast pass does
                warm = WARMUP_DAYS * self.season
                f = make_forecaster(self.forecaster, self.season).fit(y[:warm])
                for v in y[warm:]:
                    f.update(float(v))
                entry = (f, last_bin)
            else:
                for v in y[len(y) - new:]:
                    entry[0].update(float(v))
                entry = (entry[0], last_bin)
        except (ValueError, np.linalg.LinAlgError):  # ForecastError is a ValueError
            self._fitted.pop(model, None)
            return None  # e.g. a flat-zero history ETS cannot fit: fall back to recent
        self._fitted[model] = entry
        fc = entry[0].forecast(self.horizon)
        uppers = tuple((q, float(np.max(fc.quantiles.get(q, fc.mean)))) for q in self.levels)
        return (float(np.max(fc.mean)), float(np.max(fc.quantiles.get(self.quantile, fc.mean))),
                float(fc.mean[0]), float(fc.mean[-1]), uppers)
