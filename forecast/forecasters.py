"""Demand forecasters with one interface: ``fit(history)`` once, ``update(y)`` cheaply every
step, ``forecast(h)`` -> mean and quantiles (never negative).

Models (step = 5 min, season m = 288 steps a day, 2016 a week):
- ``naive``: seasonal naive, the value one day earlier — the floor to beat.
- ``ets``: additive Holt-Winters (level + daily season), fitted by statsmodels with heuristic
  initialization; updates run the same recursion with the fitted parameters.
- ``sarimax``: regression on daily and weekly Fourier terms with AR(2) errors, fitted by
  statsmodels SARIMAX; updates run the AR recursion on the regression residual.
- ``uc``: unobserved components (local level + daily and weekly trigonometric seasons), fitted
  by statsmodels; updates run a Kalman filter on the fitted state-space matrices.
- ``auto``: picks one of the above per series by a backtest on the training part only.

Every forecaster is made by name through :func:`atoll.forecast.registry.make_forecaster`; this
module's own are in :data:`BASE_FORECASTERS`.

Intervals: quantiles of the model's own h-step errors over the last days of the training data
(so every model's intervals are calibrated the same way), in absolute terms scaled by
``forecast + level`` (level: the series' mean over the last season), so errors stay on the
scale of the series: near a zero forecast they are measured against the typical level, never
divided by ~0, and a zero point forecast keeps positive upper quantiles. Each quantile then
carries an online offset per horizon, moved after every observation by conformal quantile
tracking (Angelopoulos, Candes & Tibshirani, "Conformal PID control", NeurIPS 2023): up by
``rate x level`` after a miss, down by ``rate x (1 - level)`` after a hit, with the rate a
fraction of the errors' spread. The offset is unbounded, so unlike a miscoverage level clipped
to [0.002, 0.6] it cannot run into a floor and stop adapting: the long-run share of points
below each quantile is its level even when the error distribution drifts.

Planning cap: every quantile (and the mean) is capped at ``PEAK_CAP`` x the peak observed over
the last season (if that season was all zeros: over the last seven seasons of the training
history); a forecast says when the cap bound (``Forecast.capped``) and the forecaster
counts it (``cap_binds``).

Outages and spikes: an observation whose one-step error exceeds ``ROBUST_K`` robust scales
moves the state only by that clipped amount (a Huberized update), so a window of zeros or a
burst does not wreck the level or season.
"""

from __future__ import annotations

import math
import sys
import warnings
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from atoll.solvers.errors import InputError

if TYPE_CHECKING:  # pandas only where a caller passes pandas (it is 0.3 s of a command's start)
    import pandas as pd

DAY = 288
WEEK = 7 * DAY
# Bumped whenever the forecasts of a given series change; caches of forecasts include it in
# their key, so a new version never reads forecasts an older one made.
FORECAST_VERSION = 2
# Planning levels a re-plan may provision for (the rule family's @q); the two lower levels
# complete the 80% and 90% central intervals.
PLANNING_LEVELS: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
# The level a re-plan provisions for unless told otherwise (the environment's, the controller's and
# the level the planning target's forecasters are chosen and scored at).
DEFAULT_LEVEL = 0.9
QUANTILES: tuple[float, ...] = (0.05, 0.1, *PLANNING_LEVELS)
MAX_H = 72  # 6 h at 5-min steps: the longest horizon intervals are calibrated for
CALIBRATION_DAYS = 3
ERROR_WINDOW = DAY  # scaled errors kept per horizon for the intervals (rolling)
REQUANTILE_EVERY = 12
ROBUST_K = 4.0
# Central intervals (lower, upper quantile) the backtest reports coverage of.
INTERVALS: tuple[tuple[float, float], ...] = ((0.05, 0.95), (0.1, 0.9))
# Conformal quantile tracking rate, as a fraction of the errors' 5-95% spread at that horizon.
ACI_GAMMA = 0.02
# The planning demand never exceeds this multiple of the peak of the last season's observations.
PEAK_CAP = 2.0
# Outages (ServeGen m-mid has hours of zeros): a target or a forecast below OUTAGE_FRACTION of
# the typical (median) level says nothing about the spread of ordinary errors, so the pair is
# kept out of the error window the quantiles are read from; otherwise the first forecasts
# after an outage (made from a state that followed the zeros) would put large errors in the
# window for a whole day. The pair still moves the tracking offsets, so coverage is kept over
# all points. The point forecasts follow the outage: holding the pre-outage level costs more.
OUTAGE_FRACTION = 0.1


class ForecastError(InputError):
    """Bad forecaster input; the message names the problem and the fix."""


def _check_time_index(index: pd.Index, name: str) -> None:
    """A time-indexed history must be sorted, unique and evenly spaced: the models count steps."""
    import pandas as pd

    if not isinstance(index, pd.DatetimeIndex) or len(index) < 2:
        return
    dup = np.flatnonzero(index.duplicated())
    if len(dup):
        raise ForecastError(f"{name} has a duplicate timestamp {index[dup[0]]} at position "
                            f"{dup[0]}; aggregate duplicates first, e.g. "
                            f"series.groupby(level=0).sum()")
    steps = np.diff(index.asi8)
    back = np.flatnonzero(steps < 0)
    if len(back):
        raise ForecastError(f"{name} timestamps are not sorted: {index[back[0] + 1]} at position "
                            f"{back[0] + 1} comes before {index[back[0]]}; use series.sort_index()")
    uneven = np.flatnonzero(steps != steps[0])
    if len(uneven):
        raise ForecastError(f"{name} is not evenly spaced: {index[uneven[0]]} -> "
                            f"{index[uneven[0] + 1]} differs from the first step "
                            f"{pd.Timedelta(int(steps[0]))}; resample to one step first, e.g. "
                            f"series.resample('5min').mean() and fill the gaps")


def check_history(y: np.ndarray | pd.Series, season: int, *, name: str = "history"
                  ) -> np.ndarray:
    pandas = sys.modules.get("pandas")  # a pandas Series exists only if pandas was imported
    if pandas is not None and isinstance(y, pandas.Series):
        _check_time_index(y.index, name)
    arr = np.asarray(y, dtype=float)
    if arr.ndim != 1:
        raise ForecastError(f"{name} must be a 1-D series, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if len(bad):
        raise ForecastError(f"{name} has NaN/inf at index {bad[0]}; fill or drop missing steps first")
    neg = np.flatnonzero(arr < 0)
    if len(neg):
        raise ForecastError(f"{name} has a negative value {arr[neg[0]]:g} at index {neg[0]}; demand "
                            f"must be >= 0")
    if len(arr) < 2 * season:
        raise ForecastError(f"{name} has {len(arr)} steps; at least two seasons ({2 * season}) are "
                            f"needed — pass more history or a shorter season")
    return arr


@dataclass(frozen=True)
class Forecast:
    """h-step forecast: ``mean`` and ``quantiles[q]`` arrays of length h, all >= 0 and at most
    ``cap``; ``capped[i]`` is True where the cap lowered a quantile of step i."""

    mean: np.ndarray
    quantiles: dict[float, np.ndarray] = field(default_factory=dict)
    cap: float = math.inf
    capped: np.ndarray | None = None

    def quantile(self, q: float) -> np.ndarray:
        if q not in self.quantiles:
            raise KeyError(f"quantile {q} not forecast; available: {sorted(self.quantiles)}")
        return self.quantiles[q]


class Forecaster(ABC):
    """fit once, update cheaply, forecast h steps with calibrated quantiles."""

    name = "base"

    def __init__(self, season: int = DAY) -> None:
        if season < 2:
            raise ForecastError(f"season must be >= 2 steps, got {season}")
        self.season = season
        self._err_q: np.ndarray | None = None  # [MAX_H, len(QUANTILES)] window quantiles
        self._scale = 1.0
        self.t = 0  # steps seen

    # --- model-specific -------------------------------------------------------------------
    @abstractmethod
    def _fit(self, y: np.ndarray) -> None: ...

    @abstractmethod
    def _step(self, y: float) -> None:
        """Absorb one (already robustified) observation."""

    @abstractmethod
    def _mean(self, h: int) -> np.ndarray:
        """Point forecast for the next h steps from the current state."""

    # --- shared ---------------------------------------------------------------------------
    def fit(self, history: np.ndarray | pd.Series) -> Forecaster:
        y = check_history(history, self.season)
        calib = min(CALIBRATION_DAYS * self.season, len(y) - 2 * self.season)
        self._floor_value = max(OUTAGE_FRACTION * float(np.median(y)), 1e-9)
        # Zeros are outages only where the series is typically busy; where zero is the typical
        # value (sparse, bursty demand) they are ordinary errors and stay in the window.
        self._outages = float(np.median(y)) > 0
        self._errors = np.full((MAX_H, ERROR_WINDOW), np.nan)
        self._n_err = np.zeros(MAX_H, dtype=int)
        self._past: deque[tuple[np.ndarray, float]] = deque(maxlen=MAX_H)
        self._offset = np.zeros((MAX_H, len(QUANTILES)))  # conformal tracking, error units
        self._rate = np.zeros(MAX_H)
        self.cap_binds = 0
        if calib >= min(MAX_H, self.season):  # shorter horizons lend theirs to longer ones
            # Interval calibration: fit on the head, forecast the held-back tail as it arrives.
            self._reset(y[: len(y) - calib])
            self.update(y[len(y) - calib:])
        # The model that forecasts is fitted on all of the history; the errors collected so
        # far seed its intervals, and every later update adds the errors it observes.
        self._reset(y)
        self._past.clear()
        self._requantile()
        return self

    def _reset(self, y: np.ndarray) -> None:
        self._fit(y)
        self.t = len(y)
        self._scale = float(np.median(np.abs(np.diff(y)))) or float(np.mean(y)) or 1.0
        self._recent = np.asarray(y[-self.season:], dtype=float).copy()  # ring of the last season
        self._ri = 0
        self._fit_peak = float(np.max(y[-7 * self.season:]))

    @property
    def typical_level(self) -> float:
        """The typical level errors are scaled by: the mean of the last season (never 0)."""
        return max(float(self._recent.mean()), self._floor_value)

    def _record(self, vec: np.ndarray, y: float) -> None:
        """Store the scaled error of every past forecast of this step (horizon k+1)."""
        self._past.appendleft((vec, self.typical_level))
        for k, (past, level) in enumerate(self._past):
            pred = max(float(past[k]), 0.0)
            err = (y - pred) / (pred + level)
            if self._err_q is not None:
                self._track(k, err)
            if self._outages and (y <= self._floor_value or pred <= self._floor_value):
                continue
            slot = self._n_err[k] % ERROR_WINDOW
            self._errors[k, slot] = err
            self._n_err[k] += 1
        if self.t % REQUANTILE_EVERY == 0:
            self._requantile()

    def _track(self, k: int, err: float) -> None:
        """Conformal quantile tracking for horizon k+1 given the scaled error just observed."""
        assert self._err_q is not None
        levels = np.asarray(QUANTILES)
        below = err <= self._err_q[k] + self._offset[k]
        self._offset[k] += self._rate[k] * (levels - below)

    def _requantile(self) -> None:
        if self._n_err[0] == 0:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # horizons with no errors yet
            q = np.nanquantile(self._errors, QUANTILES, axis=1).T  # [MAX_H, len(QUANTILES)]
        n = self._n_err
        q[n == 0] = np.nan
        # horizons without errors yet borrow the nearest shorter one's
        for k in range(1, MAX_H):
            if np.isnan(q[k]).any():
                q[k] = q[k - 1]
        self._err_q = q
        spread = q[:, QUANTILES.index(0.95)] - q[:, QUANTILES.index(0.05)]
        self._rate = ACI_GAMMA * np.maximum(np.nan_to_num(spread), 1e-6)

    def update(self, y: float | np.ndarray) -> None:
        for v in np.atleast_1d(np.asarray(y, dtype=float)):
            if not math.isfinite(v) or v < 0:
                raise ForecastError(f"observation {float(v)!r} at step {self.t}: must be finite and >= 0")
            vec = self._mean(MAX_H)
            self._record(vec, float(v))
            self._absorb(float(v), float(vec[0]))
            self._recent[self._ri] = v
            self._ri = (self._ri + 1) % len(self._recent)
            self.t += 1

    def _absorb(self, v: float, pred: float) -> None:
        bound = ROBUST_K * self._scale
        self._step(pred + max(-bound, min(bound, v - pred)))

    def forecast(self, h: int) -> Forecast:
        if not 1 <= h:
            raise ForecastError(f"horizon must be >= 1 step, got {h}")
        base = np.maximum(self._mean(h), 0.0)
        # A season of zeros says nothing about the next burst: then the cap falls back to the
        # peak of the last week of the training history.
        cap = PEAK_CAP * (float(self._recent.max()) or self._fit_peak or math.inf)
        qs: dict[float, np.ndarray] = {}
        capped = np.zeros(h, dtype=bool)
        if self._err_q is not None:
            rows = np.minimum(np.arange(h), MAX_H - 1)
            err = self._err_q[rows] + self._offset[rows]
            # Crossing offsets are re-sorted per step (rearrangement): quantiles stay monotone.
            err = np.sort(err, axis=1)
            vals = np.maximum(base[:, None] + err * (base + self.typical_level)[:, None], 0.0)
            capped = (vals > cap).any(axis=1)
            vals = np.minimum(vals, cap)
            for j, q in enumerate(QUANTILES):
                qs[q] = vals[:, j]
        if capped.any():
            self.cap_binds += 1
        return Forecast(mean=np.minimum(base, cap), quantiles=qs, cap=cap, capped=capped)


class SeasonalNaive(Forecaster):
    """y_{t+h} = y_{t+h-m}: the value one season earlier."""

    name = "naive"

    def _fit(self, y: np.ndarray) -> None:
        self._buf = list(y[-self.season:])

    def _step(self, y: float) -> None:
        self._buf.append(y)
        del self._buf[0]

    def _absorb(self, v: float, pred: float) -> None:
        # Seasonal naive must reproduce the series one season back: no robust clipping.
        self._step(v)

    def _mean(self, h: int) -> np.ndarray:
        buf = np.asarray(self._buf)
        return buf[np.arange(h) % self.season]


class HoltWinters(Forecaster):
    """Additive level + season, statsmodels ExponentialSmoothing with heuristic initialization."""

    name = "ets"

    def _fit(self, y: np.ndarray) -> None:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = ExponentialSmoothing(y, seasonal="add", seasonal_periods=self.season,
                                       initialization_method="heuristic").fit()
        self.alpha = float(res.params["smoothing_level"])
        self.gamma = float(res.params["smoothing_seasonal"])
        self.level = float(res.level[-1])
        self.seasons = np.asarray(res.season[-self.season:], dtype=float).copy()  # s_{t-m+1..t}
        self._i = 0  # index of s_{t+1-m} in the ring

    def _step(self, y: float) -> None:
        s_old = self.seasons[self._i]
        new_level = self.alpha * (y - s_old) + (1 - self.alpha) * self.level
        self.seasons[self._i] = self.gamma * (y - self.level) + (1 - self.gamma) * s_old
        self.level = new_level
        self._i = (self._i + 1) % self.season

    def _mean(self, h: int) -> np.ndarray:
        idx = (self._i + np.arange(h)) % self.season
        return self.level + self.seasons[idx]


def fourier(t: np.ndarray, period: int, harmonics: int) -> np.ndarray:
    k = np.arange(1, harmonics + 1)
    ang = 2 * np.pi * np.outer(t, k) / period
    return np.hstack([np.sin(ang), np.cos(ang)])


def _harmonics(period: int, wanted: int) -> int:
    """Fourier pairs that a period of ``period`` steps can carry: the sine of harmonic period/2
    is identically zero on the step grid (a singular regressor), so stay below it."""
    return max(1, min(wanted, (period - 1) // 2))


class FourierSarimax(Forecaster):
    """y_t = c + F_t b + u_t with AR(2) errors u; F = Fourier harmonics of the season (a day by
    default), plus ones of seven seasons (a week) when the history spans them (a weekly cycle is
    not identified from less)."""

    name = "sarimax"
    daily_harmonics = 6
    weekly_harmonics = 2

    def _exog(self, t: np.ndarray) -> np.ndarray:
        cols = [np.ones((len(t), 1)),
                fourier(t, self.season, _harmonics(self.season, self.daily_harmonics))]
        if self._weekly:
            cols.append(fourier(t, 7 * self.season, self.weekly_harmonics))
        return np.hstack(cols)

    def _fit(self, y: np.ndarray) -> None:
        from statsmodels.tsa.statespace.sarimax import SARIMAX

        self._weekly = len(y) >= 7 * self.season
        t = np.arange(len(y))
        x = self._exog(t)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = SARIMAX(y, exog=x, order=(2, 0, 0), trend="n").fit(disp=False, maxiter=40)
        p = np.asarray(res.params)
        self.beta = p[: x.shape[1]]
        self.phi = p[x.shape[1]: x.shape[1] + 2]
        resid = y - x @ self.beta
        self.u = [float(resid[-2]), float(resid[-1])]

    def _step(self, y: float) -> None:
        x = self._exog(np.array([self.t]))[0]
        self.u = [self.u[1], y - float(x @ self.beta)]

    def _mean(self, h: int) -> np.ndarray:
        u2, u1 = self.u
        out = np.empty(h)
        for i in range(h):
            u = self.phi[0] * u1 + self.phi[1] * u2
            out[i] = u
            u2, u1 = u1, u
        return self._exog(self.t + np.arange(h)) @ self.beta + out


def _static(matrix: np.ndarray) -> np.ndarray:
    arr = np.asarray(matrix, dtype=float)
    return arr[..., 0] if arr.ndim == 3 else arr


class UnobservedComponentsF(Forecaster):
    """Local level + trigonometric seasons of the season (6 harmonics; a day by default) and of
    seven seasons (2; a week); Kalman filter updates."""

    name = "uc"

    def _fit(self, y: np.ndarray) -> None:
        from statsmodels.tsa.statespace.structural import UnobservedComponents

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = UnobservedComponents(y, level="llevel",
                                       freq_seasonal=[
                                           {"period": self.season,
                                            "harmonics": _harmonics(self.season, 6)},
                                           {"period": 7 * self.season, "harmonics": 2}])
            res = mod.fit(disp=False, maxiter=50)
        ssm = res.model.ssm
        # Time-invariant matrices; statsmodels stores them with a trailing time axis of length 1.
        Z, T, R, Q = (_static(ssm[k]) for k in ("design", "transition", "selection", "state_cov"))
        self.Z, self.T = Z, T
        self.RQR = R @ Q @ R.T
        self.H = float(np.asarray(ssm["obs_cov"]).ravel()[0])
        self.a = np.asarray(res.predicted_state[:, -1], dtype=float).copy()  # a_{t+1|t}
        self.P = np.asarray(res.predicted_state_cov[:, :, -1], dtype=float).copy()
        powers = [self.Z[0]]
        for _ in range(MAX_H * 4):
            powers.append(powers[-1] @ self.T)
        self._ZT = np.array(powers)  # row h = Z T^h

    def _step(self, y: float) -> None:
        z = self.Z[0]
        f = float(z @ self.P @ z) + self.H
        k = self.P @ z / f
        v = y - float(z @ self.a)
        a_filt = self.a + k * v
        p_filt = self.P - np.outer(k, z @ self.P)
        self.a = self.T @ a_filt
        self.P = self.T @ p_filt @ self.T.T + self.RQR

    def _mean(self, h: int) -> np.ndarray:
        if h > len(self._ZT):
            extra = [self._ZT[-1]]
            while len(self._ZT) + len(extra) - 1 < h:
                extra.append(extra[-1] @ self.T)
            self._ZT = np.vstack([self._ZT, np.array(extra[1:])])
        return self._ZT[:h] @ self.a


class Chooser(Forecaster):
    """A forecaster that forecasts with the candidate it chose (``chosen``; ``fit`` and
    ``update`` of the subclass choose); ``unfitted`` names it in the error before ``fit``."""

    unfitted = "chooser"
    chosen: Forecaster | None = None

    def _candidate(self) -> Forecaster:
        if self.chosen is None:
            raise ForecastError(f"{self.unfitted} used before fit()")
        return self.chosen

    @property
    def chosen_name(self) -> str:
        return self._candidate().name

    def _fit(self, y: np.ndarray) -> None:  # pragma: no cover - fit() is overridden
        raise NotImplementedError

    def _step(self, y: float) -> None:  # pragma: no cover - update() is overridden
        raise NotImplementedError

    def _mean(self, h: int) -> np.ndarray:
        return self._candidate()._mean(h)

    def forecast(self, h: int) -> Forecast:
        return self._candidate().forecast(h)


class Persistence(Forecaster):
    """y_{t+h} = y_t: the last value (a trivial baseline auto must beat)."""

    name = "persistence"

    def _fit(self, y: np.ndarray) -> None:
        self._last = float(y[-1])

    def _step(self, y: float) -> None:
        self._last = y

    def _absorb(self, v: float, pred: float) -> None:
        self._step(v)

    def _mean(self, h: int) -> np.ndarray:
        return np.full(h, self._last)


class RollingMedian(Forecaster):
    """y_{t+h} = median of the last season: the robust level of a series without a usable
    pattern (bursts move it little, unlike a mean)."""

    name = "median"

    def _fit(self, y: np.ndarray) -> None:
        self._buf: deque[float] = deque(y[-self.season:].tolist(), maxlen=self.season)
        self._med = float(np.median(self._buf))
        self._dirty = 0

    def _step(self, y: float) -> None:
        self._buf.append(y)
        self._dirty += 1

    def _absorb(self, v: float, pred: float) -> None:
        self._step(v)

    def _mean(self, h: int) -> np.ndarray:
        # The median of a season barely moves in one step; recompute it every few steps.
        if self._dirty >= 6:
            self._med = float(np.median(self._buf))
            self._dirty = 0
        return np.full(h, self._med)


class SimpleSmoothing(Forecaster):
    """Simple exponential smoothing (a level, no season), statsmodels-fitted smoothing weight:
    the non-seasonal model auto tries where the series has no season."""

    name = "ses"

    def _fit(self, y: np.ndarray) -> None:
        from statsmodels.tsa.holtwinters import SimpleExpSmoothing

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = SimpleExpSmoothing(y, initialization_method="heuristic").fit()
        self.alpha = float(res.params["smoothing_level"])
        self.level = float(res.level[-1])

    def _step(self, y: float) -> None:
        self.level = self.alpha * y + (1 - self.alpha) * self.level

    def _mean(self, h: int) -> np.ndarray:
        return np.full(h, self.level)


# The models of this module by name (a name -> factory(season) table, in the order the registry lists
# them): ``auto`` chooses among these; every forecaster name is :mod:`atoll.forecast.registry`'s.
BASE_FORECASTERS: dict[str, Callable[[int], Forecaster]] = {
    "naive": SeasonalNaive, "ets": HoltWinters, "sarimax": FourierSarimax, "uc": UnobservedComponentsF,
    "ses": SimpleSmoothing, "persistence": Persistence, "median": RollingMedian,
}
