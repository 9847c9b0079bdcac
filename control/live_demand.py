"""Live demand: the controller's measured history -> the forecast each phase is planned from.

The simulator forecasts each model's *request rate* with an online forecaster (fitted on the
first ``WARMUP_DAYS`` days of the trace, then updated step by step) and plans for the planning
quantile, maximized over the look-ahead, times the model's request shape. Live, the traffic's
mix of prompt and generation tokens need not be that shape (the README's replay of the ServeGen
services sends Phi-4-14B ~3 prompt tokens per generated token where its scenario shape has ~73),
so turning measured tokens into one request rate and multiplying back by the shape plans one
phase at the wrong size (25x, measured). The controller therefore forecasts each phase from its
own measured token rate, through the same forecaster class and the same causal scheme:

1. Each history point carries the interval's prompt and generation token rates. Points are
   averaged into ``step_s`` bins aligned to the clock (a point belongs to the bin its interval
   ends in); the bin in progress is left out. Bins without points (the controller was down)
   are filled with the bin a season (a day) earlier where there is one, else the previous bin;
   a gap longer than a season — longer than the forecaster's memory of the daily pattern —
   cuts the history: only what follows it is binned, so the forecaster is re-fitted from what
   remains (``recent`` until it has ``WARMUP_DAYS`` again), never fed weeks of a stale rate
   bin by bin (a 30-day gap cost 4.3 s per model and forecast the old rate after it).
2. Each phase's series is forecast on its own (two fitted forecasters per model). It is
   forecast in *request-equivalent units* — the token rate over the model's profiled tokens per
   request of that phase — and multiplied back: a fixed change of units per (model, phase),
   so when the traffic has the profiled shape both phases' series are the env's request-rate
   series (to rounding) and the forecasts are the env's whatever the forecaster. The units
   matter: not every fit is scale-equivariant — on a 5-day test series, forecasting tokens/s
   directly moved SARIMAX's forecast by up to 0.4% and UC's by 28% (ETS by 4e-9), while in
   these units all agree with the request-rate forecast x the shape to 4e-7. When the mix
   differs, each phase follows its own tokens.
3. With ``WARMUP_DAYS`` days of bins a phase's forecaster is fitted on the first
   ``WARMUP_DAYS`` days and updated bin by bin with the rest and every later bin — the env's
   causal pass.
4. Before that (a fresh controller) a phase's forecast is ``recent``: the mean of the last
   ``RECENT_BINS`` complete bins (at least the latest rate) as the mean, and their maximum
   x (1 + ``RECENT_MARGIN``) as the upper quantile. It is labelled as such in every tick
   report, so nobody mistakes it for a seasonal forecast; the env never needs it.

Prompt tokens/s are the prefill service's demand, generation tokens/s the decode service's —
the units the templates' throughputs use. Request rates are information only.

**Request shape.** The templates were profiled at the scenario's request shape (tokens per
request of each phase). The shape actually served is measured from vLLM's request-length
histograms (see :mod:`atoll.control.rates`), request-weighted over the last
``SHAPE_WINDOW_S``; the scenario's shape is only the prior before such data. A measured shape
more than ``tolerance`` (default 25%) off the profiled one in either phase is a *drift*,
reported on the tick and in the plan (a template's throughput was profiled at the other shape,
so its capacity for this traffic is an extrapolation). Without the histograms the token mix
still shows a drift: a prompt:generation token ratio outside
[(1 - tol) / (1 + tol), (1 + tol) / (1 - tol)] of the profiled ratio cannot come from phases
each within the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atoll.control.state import HistoryPoint
from atoll.envs.demand import WARMUP_DAYS
from atoll.forecast.forecasters import DAY, Forecaster
from atoll.forecast.planning import DEFAULT_FORECASTER
from atoll.forecast.registry import make_forecaster

RECENT_BINS = 3
RECENT_MARGIN = 0.1
PHASES = ("prefill", "decode")
SHAPE_TOLERANCE = 0.25  # a measured tokens/request this far off the profiled one is a drift
SHAPE_WINDOW_S = 3600.0  # the measured shape is request-weighted over this much history

Pair = tuple[float, float]


def _pair(owner: str, name: str, value: Any, *, positive: bool = False) -> Pair:
    ok = isinstance(value, tuple | list) and len(value) == 2 and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        and (v > 0 if positive else v >= 0) for v in value)
    if not ok:
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{owner}: field {name!r} must be a (prefill, decode) pair of finite numbers "
                         f"{bound}, got {value!r}")
    return float(value[0]), float(value[1])


@dataclass(frozen=True)
class ShapeReport:
    """A model's request shape: ``profiled`` the (prompt, generation) tokens per request its
    templates were profiled at; ``measured`` the one vLLM's histograms show (None without them);
    ``mix`` the measured prompt:generation token ratio over the profiled one (None without
    traffic); ``tolerance`` the relative drift reported (see the module docstring)."""

    model: str
    profiled: Pair
    measured: Pair | None = None
    mix: float | None = None
    tolerance: float = SHAPE_TOLERANCE

    def __post_init__(self) -> None:
        owner = f"ShapeReport {self.model!r}"
        object.__setattr__(self, "profiled", _pair(owner, "profiled", self.profiled, positive=True))
        if self.measured is not None:
            object.__setattr__(self, "measured", _pair(owner, "measured", self.measured, positive=True))
        if self.mix is not None and not (math.isfinite(self.mix) and self.mix > 0):
            raise ValueError(f"{owner}: field 'mix' must be None or finite and > 0, got {self.mix!r}")
        if not (isinstance(self.tolerance, int | float) and 0 < self.tolerance < 1):
            raise ValueError(f"{owner}: field 'tolerance' must be in (0, 1), got {self.tolerance!r}")

    @property
    def ratio(self) -> Pair | None:
        """Measured / profiled tokens per request, per phase."""
        if self.measured is None:
            return None
        return self.measured[0] / self.profiled[0], self.measured[1] / self.profiled[1]

    @property
    def source(self) -> str:
        return "histograms" if self.measured is not None else "token mix" if self.mix is not None else "none"

    @property
    def drifted(self) -> bool:
        tol = self.tolerance
        if self.ratio is not None:
            return any(abs(r - 1.0) > tol for r in self.ratio)
        if self.mix is not None:
            return not (1 - tol) / (1 + tol) <= self.mix <= (1 + tol) / (1 - tol)
        return False

    @property
    def shape(self) -> Pair:
        """The shape request-rate figures use: measured, else the profiled prior."""
        return self.measured if self.measured is not None else self.profiled

    def message(self) -> str:
        p = self.profiled
        if self.ratio is not None and self.measured is not None:
            m, r = self.measured, self.ratio
            return (f"{m[0]:.0f} prompt / {m[1]:.0f} generation tokens per request measured, "
                    f"profiled at {p[0]:.0f} / {p[1]:.0f} (x{r[0]:.2f} / x{r[1]:.2f})")
        if self.mix is not None:
            return (f"prompt:generation tokens {self.mix * p[0] / p[1]:.3g}:1 measured, profiled at "
                    f"{p[0] / p[1]:.3g}:1 (x{self.mix:.3g}; tokens per request not measured: no "
                    f"vllm:request_prompt_tokens / vllm:request_generation_tokens histograms)")
        return "no traffic measured yet"

    def as_dict(self) -> dict[str, Any]:
        return {"profiled": list(self.profiled), "measured": list(self.measured) if self.measured else None,
                "ratio": list(self.ratio) if self.ratio else None, "mix": self.mix, "source": self.source,
                "tolerance": self.tolerance, "drifted": self.drifted, "message": self.message()}


def shape_report(model: str, points: Sequence[HistoryPoint], now_s: float, profiled: Pair, *,
                 tolerance: float = SHAPE_TOLERANCE, window_s: float = SHAPE_WINDOW_S) -> ShapeReport:
    """The shape of ``model``'s traffic over the last ``window_s`` of ``points`` (at least the
    latest point): tokens per request request-weighted (sum of tokens over sum of requests,
    each phase), and the token mix."""
    recent = [p for p in points if p.time_s > now_s - window_s] or list(points[-1:])
    measured: list[float] = []
    for j in range(2):
        tokens = requests = 0.0
        for p in recent:
            shape = p.shape
            rate = (p.prompt_tokens_per_s, p.generation_tokens_per_s)[j]
            if shape is not None and shape[j] > 0:
                tokens += rate
                requests += rate / shape[j]
        measured.append(tokens / requests if requests > 0 else math.nan)
    prompt = math.fsum(p.prompt_tokens_per_s for p in recent)
    generation = math.fsum(p.generation_tokens_per_s for p in recent)
    mix = (prompt / generation) / (profiled[0] / profiled[1]) if prompt > 0 and generation > 0 else None
    pair = (measured[0], measured[1]) if all(v > 0 for v in measured) else None  # NaN compares False
    return ShapeReport(model, profiled, pair, mix, tolerance)


@dataclass(frozen=True)
class ModelForecast:
    """One model's planning inputs, (prefill, decode) pairs in tokens/s: ``measured`` the latest
    measured token rates; ``mean`` and ``upper`` the look-ahead's maxima of the mean forecast and
    of the planning quantile; ``first``/``last`` the mean forecast of the look-ahead's first and
    last bin; ``uppers`` the look-ahead's maximum at every planning level a re-optimization may
    use (``recent``: the same upper for every level, first = last = the mean); ``methods`` each
    phase's forecaster name or ``recent``; ``bins`` complete bins of history; ``shape`` the
    request shape (measured or the prior) behind the request-rate figures, information only."""

    model: str
    measured: Pair
    mean: Pair
    upper: Pair
    first: Pair
    last: Pair
    methods: tuple[str, str]
    bins: int
    uppers: tuple[tuple[float, Pair], ...] = ()
    shape: ShapeReport | None = None

    def __post_init__(self) -> None:
        owner = f"ModelForecast {self.model!r}"
        for name in ("measured", "mean", "upper", "first", "last"):
            object.__setattr__(self, name, _pair(owner, name, getattr(self, name)))
        object.__setattr__(self, "uppers", tuple((float(q), _pair(owner, f"uppers[{q}]", u))
                                                 for q, u in self.uppers))
        if len(self.methods) != 2 or not all(isinstance(m, str) and m for m in self.methods):
            raise ValueError(f"{owner}: field 'methods' must name each phase's method, got {self.methods!r}")
        object.__setattr__(self, "methods", tuple(self.methods))

    @property
    def method(self) -> str:
        """The forecaster's name (``recent`` before the warm-up), per phase when they differ."""
        a, b = self.methods
        return a if a == b else f"prefill:{a},decode:{b}"

    def upper_at(self, level: float) -> Pair:
        """The look-ahead's maximum tokens/s per phase at planning level ``level``."""
        return dict(self.uppers).get(level, self.upper)

    def _rps(self, tokens: Pair) -> float:
        shape = self.shape.shape if self.shape is not None else (1.0, 1.0)
        return max(tokens[0] / shape[0], tokens[1] / shape[1])

    @property
    def mean_rps(self) -> float:
        """Information only: the larger phase's mean forecast over its tokens per request."""
        return self._rps(self.mean)

    @property
    def upper_rps(self) -> float:
        return self._rps(self.upper)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "bins": self.bins}
        for name in ("measured", "mean", "upper"):
            out.update({f"{p}_{name}": getattr(self, name)[i] for i, p in enumerate(PHASES)})
        out.update({f"{p}_first_bin": self.first[i] for i, p in enumerate(PHASES)})
        out.update({f"{p}_last_bin": self.last[i] for i, p in enumerate(PHASES)})
        out["upper_by_level"] = {f"{q:g}": list(u) for q, u in self.uppers}
        if self.shape is not None:
            out.update({"mean_requests_per_s": self.mean_rps, "upper_requests_per_s": self.upper_rps,
                        "request_shape": self.shape.as_dict()})
        return out


def bin_index(time_s: float, step_s: float) -> int:
    """The bin a point whose interval ends at ``time_s`` belongs to (end times on a boundary
    close the bin before it)."""
    return math.ceil(time_s / step_s - 1e-9) - 1


def _bin(times: np.ndarray, values: np.ndarray, step_s: float, now_s: float,
         season: int | None = None) -> tuple[int, np.ndarray]:
    current = math.floor(now_s / step_s + 1e-9)  # the bin in progress, left out
    if len(times) == 0:
        return current, np.zeros((0, values.shape[1]))
    idx = np.array([bin_index(t, step_s) for t in times])
    if season is not None:
        # a gap longer than a season (the in-progress bin's points included) cuts the history
        order = np.argsort(idx, kind="stable")
        idx, values = idx[order], values[order]
        jumps = np.nonzero(np.diff(idx) > season + 1)[0]
        if len(jumps):
            idx, values = idx[jumps[-1] + 1:], values[jumps[-1] + 1:]
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
        if counts[i]:
            out[i] = sums[i] / counts[i]
        elif season is not None and i >= season and counts[i - season]:
            out[i] = out[i - season]  # the same time a day earlier: the daily pattern, not a flat line
        else:
            out[i] = out[i - 1]
    return first, out


def bin_history(points: Sequence[HistoryPoint], step_s: float, now_s: float,
                season: int | None = None) -> tuple[int, np.ndarray]:
    """(clock index of the first bin, [bins, 2] mean token rates per complete ``step_s`` bin
    (prefill, decode), oldest first); bins without points repeat the previous bin (the first
    bin always has points) or, with ``season`` (bins), the bin a season earlier, and a gap of
    more than ``season`` bins drops everything before it (see the module docstring)."""
    times = np.array([p.time_s for p in points])
    values = np.array([[p.prompt_tokens_per_s, p.generation_tokens_per_s] for p in points]).reshape(-1, 2)
    return _bin(times, values, step_s, now_s, season)


def _merge(points: Sequence[HistoryPoint]) -> HistoryPoint:
    """One point standing for ``points`` (all in one bin): the bin's mean rates (what
    :func:`bin_history` takes of them), dated at the last; tokens per request request-weighted."""
    if len(points) == 1:
        return points[0]
    n = len(points)
    prompt = math.fsum(p.prompt_tokens_per_s for p in points) / n
    generation = math.fsum(p.generation_tokens_per_s for p in points) / n
    reqs = [p.requests_per_s for p in points if p.requests_per_s is not None]
    shape: list[float | None] = []
    for j in range(2):
        tokens = requests = 0.0
        for p in points:
            s = p.shape
            if s is not None and s[j] > 0:
                rate = (p.prompt_tokens_per_s, p.generation_tokens_per_s)[j]
                tokens += rate
                requests += rate / s[j]
        shape.append(tokens / requests if requests > 0 else None)
    both = shape[0] is not None and shape[1] is not None
    return HistoryPoint(points[-1].time_s, prompt, generation, math.fsum(reqs) / len(reqs) if reqs else None,
                        shape[0] if both else None, shape[1] if both else None)


def compact_history(points: Sequence[HistoryPoint], now_s: float, step_s: float, *,
                    raw_s: float = SHAPE_WINDOW_S, span_s: float = 7 * 86400.0) -> tuple[HistoryPoint, ...]:
    """``points`` bounded in time, not in ticks: those older than ``span_s`` dropped, and those of
    complete bins older than ``raw_s`` merged one per ``step_s`` bin (:func:`bin_history` gives
    the same bins), so a controller ticking every 5 s keeps a week in ~2,000 points, not 120,000.
    The last ``raw_s`` stay as measured (the request shape is weighted over them)."""
    kept = [p for p in points if p.time_s > now_s - span_s]
    cutoff = bin_index(now_s - raw_s, step_s)  # bins up to this one are complete and merged
    old = [p for p in kept if bin_index(p.time_s, step_s) < cutoff]
    if not old:
        return tuple(kept)
    merged: list[HistoryPoint] = []
    group: list[HistoryPoint] = []
    for p in old:
        if group and bin_index(p.time_s, step_s) != bin_index(group[-1].time_s, step_s):
            merged.append(_merge(group))
            group = []
        group.append(p)
    merged.append(_merge(group))
    return (*merged, *kept[len(old):])


# (mean, upper, first, last, uppers by level) of one phase, in the forecast's units
_PhaseForecast = tuple[float, float, float, float, tuple[tuple[float, float], ...]]


class LiveForecast:
    """Per-model, per-phase planning forecasts from the controller's history (see the module
    docstring).

    ``forecaster``: a name ``atoll.forecast.registry.make_forecaster`` knows; ``quantile``: the
    planning quantile (one of the forecasters' ``QUANTILES``); ``horizon``: look-ahead bins;
    ``shapes``: model -> the (input, output) tokens per request its templates were profiled at
    (each phase's forecast units, and the prior request shape); ``shape_tolerance``: the
    relative shape drift reported.
    """

    def __init__(self, *, shapes: Mapping[str, tuple[float, float]], forecaster: str = DEFAULT_FORECASTER,
                 quantile: float = 0.9, horizon: int = 3, step_s: float = 300.0, season: int = DAY,
                 levels: Sequence[float] = (), shape_tolerance: float = SHAPE_TOLERANCE) -> None:
        if horizon < 1:
            raise ValueError(f"LiveForecast: field 'horizon' must be >= 1 bin, got {horizon}")
        if not step_s > 0:
            raise ValueError(f"LiveForecast: field 'step_s' must be > 0, got {step_s}")
        if not (isinstance(shape_tolerance, int | float) and 0 < shape_tolerance < 1):
            raise ValueError(f"LiveForecast: field 'shape_tolerance' must be in (0, 1), "
                             f"got {shape_tolerance!r}")
        make_forecaster(forecaster, season)  # unknown names fail here, naming the valid ones
        self.forecaster, self.quantile, self.horizon = forecaster, quantile, horizon
        self.levels = tuple(dict.fromkeys((float(quantile), *map(float, levels))))
        self.step_s, self.season = step_s, season
        self.shape_tolerance = float(shape_tolerance)
        self.shapes = {m: _pair("LiveForecast", f"shapes[{m!r}]", (a, b), positive=True)
                       for m, (a, b) in shapes.items()}
        # (model, phase index) -> (fitted forecaster, clock index of the last bin it absorbed)
        self._fitted: dict[tuple[str, int], tuple[Forecaster, int]] = {}

    def shape_of(self, model: str, points: Sequence[HistoryPoint], now_s: float) -> ShapeReport:
        return shape_report(model, points, now_s, self.shapes[model], tolerance=self.shape_tolerance)

    def forecast(self, history: Mapping[str, Sequence[HistoryPoint]], now_s: float,
                 models: Sequence[str]) -> dict[str, ModelForecast]:
        """Forecasts of the models that have at least one point."""
        out: dict[str, ModelForecast] = {}
        for model in models:
            points = history.get(model, ())
            if not points:
                continue
            unit = self.shapes[model]
            measured = (points[-1].prompt_tokens_per_s, points[-1].generation_tokens_per_s)
            first_bin, bins = bin_history(points, self.step_s, now_s, self.season)
            phases: list[_PhaseForecast] = []
            methods: list[str] = []
            for j in range(2):
                # request-equivalent units (see the module docstring), multiplied back below
                y = bins[:, j] / unit[j]
                latest = measured[j] / unit[j]
                fitted = None
                if len(y) >= WARMUP_DAYS * self.season:
                    fitted = self._seasonal((model, j), first_bin + len(y) - 1, y)
                else:
                    self._fitted.pop((model, j), None)  # a gap cut its history: re-fitted later
                if fitted is None:
                    fitted = self._recent(y, latest)
                    methods.append("recent")
                else:
                    methods.append(self.forecaster)
                mean, upper, first, last, uppers = fitted
                phases.append((mean * unit[j], upper * unit[j], first * unit[j], last * unit[j],
                               tuple((q, u * unit[j]) for q, u in uppers)))
            p, d = phases
            out[model] = ModelForecast(
                model, measured, (p[0], d[0]), (p[1], d[1]), (p[2], d[2]), (p[3], d[3]),
                (methods[0], methods[1]), len(bins),
                tuple((q, (up, ud)) for (q, up), (_, ud) in zip(p[4], d[4], strict=True)),
                self.shape_of(model, points, now_s))
        return out

    def _recent(self, y: np.ndarray, latest: float) -> _PhaseForecast:
        if len(y) == 0:
            mean, upper = latest, latest * (1 + RECENT_MARGIN)
        else:
            recent = y[-RECENT_BINS:]
            mean = max(float(recent.mean()), latest)
            upper = max(float(recent.max()), latest) * (1 + RECENT_MARGIN)
        return mean, upper, mean, mean, tuple((q, upper) for q in self.levels)

    def _seasonal(self, key: tuple[str, int], last_bin: int, y: np.ndarray) -> _PhaseForecast | None:
        entry = self._fitted.get(key)
        try:
            new = last_bin - entry[1] if entry is not None else -1
            if entry is None or not 0 <= new < len(y):
                # first fit, or the history moved under it (restart, clock jump): fit on the first
                # WARMUP_DAYS days and absorb the rest bin by bin, as the env's forecast pass does
                warm = WARMUP_DAYS * self.season
                f = make_forecaster(self.forecaster, self.season, horizon=self.horizon).fit(y[:warm])
                for v in y[warm:]:
                    f.update(float(v))
                entry = (f, last_bin)
            else:
                for v in y[len(y) - new:]:
                    entry[0].update(float(v))
                entry = (entry[0], last_bin)
        except (ValueError, np.linalg.LinAlgError):  # ForecastError is a ValueError
            self._fitted.pop(key, None)
            return None  # e.g. a flat-zero history ETS cannot fit: fall back to recent
        self._fitted[key] = entry
        fc = entry[0].forecast(self.horizon)
        uppers = tuple((q, float(np.max(fc.quantiles.get(q, fc.mean)))) for q in self.levels)
        return (float(np.max(fc.mean)), float(np.max(fc.quantiles.get(self.quantile, fc.mean))),
                float(fc.mean[0]), float(fc.mean[-1]), uppers)
