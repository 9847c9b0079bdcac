"""The planning target as its own forecasting problem.

A re-optimization sizes a service for a quantile of its demand's **peak over the look-ahead**
(``max(y[t .. t + H - 1])``, H at least the start-up time), so that peak — not the mean path —
is what these forecasters are built, calibrated and chosen on. Every one is a
:class:`~atoll.forecast.forecasters.Forecaster` (``fit`` once, ``update`` each step,
``forecast(h)``), so the env's causal pass (:mod:`atoll.envs.demand`) and the live controller
(:mod:`atoll.control.live_demand`) run the same object.

Names (:func:`atoll.forecast.registry.make_forecaster` ``("peak:<base>", season, horizon=H)``):

- ``peak:persistence`` (the last value), ``peak:ewma`` (simple exponential smoothing, the
  smoothing weight fitted by statsmodels), ``peak:naive`` (the value a season earlier),
  ``peak:ets`` (the additive Holt-Winters model ``ets`` uses), ``peak:llt`` (a local linear trend
  Kalman filter, :class:`LocalLinearTrend`), ``peak:blend`` (the mean of persistence's and ETS's
  peak forecasts) and ``peak:auto`` (chooses among these, see :class:`PeakAuto`).

**Point forecast of the peak** over the first k steps: the running maximum of the base model's
mean path (``blend``: the members' mean).

**Planning quantiles: adaptive conformal inference** (Gibbs & Candes, "Adaptive conformal
inference under distribution shift", NeurIPS 2021) on the target itself. For every look-ahead
k = 1..H and level q the forecaster keeps the last ``CONFORMAL_SEASONS`` seasons of scores
``s = (peak - point) / scale`` of matured targets (``scale``: below) and a working level
``q_t`` started at q; the issued quantile is the window's ``q_t``-quantile of s (its maximum
once ``q_t`` >= 1). When the peak a quantile was issued for matures, ``q_t`` moves
by ``ACI_RATE x (miss - (1 - q))``: up after a miss, down after a hit, so the long-run share of
peaks at or below the quantile is q whatever the scores' distribution does — a level shift
raises misses and ``q_t`` until coverage is back. ``coverage(q)`` reports the realized share
since ``fit`` and ``working_level(q)`` the ``q_t`` tracking it.

**The score's scale is the series' recent volatility** (locally adaptive conformal): ``scale =
vol + VOL_FLOOR x level``, ``vol`` an exponentially weighted mean (weight ``VOL_RATE``) of the
step-to-step changes ``|y_t - y_{t-1}|`` and ``level`` the series' mean over the last season (the
floor keeps a noise-free series' scale positive). Bursty demand is calm for hours and then
jumpy: a scale that follows it issues tight quantiles in calm stretches and wide ones in jumpy
ones, where a scale proportional to the level (``scale = point + level``, this module's
PLANNING_VERSION 1) issued the same relative width all day. On core's validation days 4-10
(3 demand seeds, 3 models) it lowered persistence's 0.9 pinball loss at the target from 0.83x
to 0.73x ets's (with ``ACI_RATE`` 0.005), at the same coverage. ``VOL_RATE`` (0.02, 0.05, 0.1,
0.2), ``VOL_FLOOR`` (0, 0.02, 0.05) and ``ACI_RATE`` (0.005, 0.01, 0.02) were chosen there, on
the validation days only, by a scan with persistence as the point model.

Beyond H steps (``forecast(h)`` with h > H) the quantile path carries the H-step score
quantile over to the longer running maxima: uncalibrated there, documented as such.

The planning cap of :mod:`atoll.forecast.forecasters` applies (``PEAK_CAP`` x the last season's
peak) and ``cap_binds`` counts where it bound.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, cast

import numpy as np

from atoll.forecast.forecasters import (
    CALIBRATION_DAYS,
    DAY,
    DEFAULT_LEVEL,
    OUTAGE_FRACTION,
    PEAK_CAP,
    QUANTILES,
    Chooser,
    Forecast,
    Forecaster,
    ForecastError,
    HoltWinters,
    Persistence,
    SeasonalNaive,
    SimpleSmoothing,
    check_history,
)

if TYPE_CHECKING:  # pandas is imported where it is used (0.3 s of every command's start)
    import pandas as pd

# Bumped whenever a planning forecaster's output for a given series changes (the demand cache
# key includes it with the settings below).
PLANNING_VERSION = 2  # 2: scores scaled by the recent volatility (was: by point + level)
DEFAULT_HORIZON = 3  # 15 min at 5-min steps: the env's default look-ahead
# Gibbs & Candes' gamma: step of the working level per matured target. Chosen on core's
# validation days among 0.005 / 0.01 / 0.02 (0.02 chases noise: 0.89x ets's pinball vs 0.73x).
ACI_RATE = 0.005
VOL_RATE = 0.1  # EWMA weight of the volatility: a ~10-step memory
VOL_FLOOR = 0.02  # share of the season's mean level added to the volatility scale
CONFORMAL_SEASONS = 2  # scores kept per look-ahead: the last two seasons
BURN_IN = 24  # matured targets before a score window is trusted for selection (2 h)
SELECT_LEVEL = DEFAULT_LEVEL  # the pinball loss auto chooses by: the env's default planning level
SWITCH_MARGIN = 0.05  # auto switches only to a candidate that is this much better
BASES: tuple[str, ...] = ("persistence", "ewma", "naive", "ets", "llt", "blend")
# The planning forecaster the env (FleetConfig.forecaster) and the controller (LiveForecast)
# use unless told otherwise: chosen on validation days (core's 4-10 and the robustness suite's),
# ``benchmarks/planning.py``'s ``default_chosen_on_validation``; ``ets`` stays available by name.
DEFAULT_FORECASTER = "peak:auto"
BLEND: tuple[str, ...] = ("persistence", "ets")


# What a cache of planning forecasts must key on besides the name, the horizon and the learned
# model's weights (:func:`atoll.forecast.registry.planning_settings` adds those).
SETTINGS: tuple[object, ...] = (PLANNING_VERSION, ACI_RATE, VOL_RATE, VOL_FLOOR, CONFORMAL_SEASONS, BURN_IN,
                                SELECT_LEVEL, SWITCH_MARGIN, BLEND, QUANTILES)


def pinball(y: np.ndarray | float, q_pred: np.ndarray | float, level: float) -> float:
    """Mean pinball (quantile) loss of ``q_pred`` as the ``level`` quantile of ``y``."""
    d = np.asarray(y, dtype=float) - np.asarray(q_pred, dtype=float)
    return float(np.mean(np.maximum(level * d, (level - 1) * d)))


class LocalLinearTrend(Forecaster):
    """Local linear trend: y_t = mu_t + e_t, mu_{t+1} = mu_t + b_t + u_t, b_{t+1} = b_t + v_t.

    The three variances are estimated by statsmodels (``UnobservedComponents(y, "local linear
    trend")``, maximum likelihood); from the state statsmodels predicts after the fitted history,
    updates run this class's own Kalman filter (:meth:`_step`), which is tested against
    statsmodels' filter on the same parameters."""

    name = "llt"

    def _fit(self, y: np.ndarray) -> None:
        from statsmodels.tsa.statespace.structural import UnobservedComponents

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = UnobservedComponents(y, "local linear trend").fit(disp=False, maxiter=50)
        self.set_state(np.asarray(res.params, dtype=float), np.asarray(res.predicted_state[:, -1]),
                       np.asarray(res.predicted_state_cov[:, :, -1]))

    def set_state(self, params: np.ndarray, a: np.ndarray, p: np.ndarray) -> None:
        """Parameters (sigma2 of irregular, level, trend, as statsmodels orders them) and the
        predicted state a_{t+1|t} with its covariance."""
        if params.shape != (3,) or not np.all(np.isfinite(params)) or np.any(params < 0):
            raise ForecastError(f"llt: parameters must be three variances >= 0, got {params!r}")
        self.params = params.copy()
        self.H = float(params[0])
        self.Q = np.diag(params[1:])
        self.T = np.array([[1.0, 1.0], [0.0, 1.0]])
        self.a = np.asarray(a, dtype=float).copy()
        self.P = np.asarray(p, dtype=float).copy()

    def _step(self, y: float) -> None:
        # Z = [1, 0]: the innovation and gain need only the level's row of P.
        f = self.P[0, 0] + self.H
        v = y - self.a[0]
        if f <= 0:  # a degenerate (noise-free, known) state: take the observation as the level
            k = np.array([1.0, 0.0])
        else:
            k = self.P[:, 0] / f
        a_f = self.a + k * v
        p_f = self.P - np.outer(k, self.P[0, :])
        self.a = self.T @ a_f
        self.P = self.T @ p_f @ self.T.T + self.Q

    def _mean(self, h: int) -> np.ndarray:
        return self.a[0] + self.a[1] * np.arange(h)


# Point models by base name; their own interval machinery is not used here (only _reset, _absorb
# and _mean), so they cost one recursion per step.
_POINT: dict[str, type[Forecaster]] = {
    "persistence": Persistence, "ewma": SimpleSmoothing, "naive": SeasonalNaive, "ets": HoltWinters,
    "llt": LocalLinearTrend,
}


class PeakForecaster(Forecaster):
    """The peak over the look-ahead from one point model (or a blend), with adaptive conformal
    quantiles per look-ahead k = 1..``horizon`` (see the module docstring)."""

    def __init__(self, season: int = DAY, horizon: int = DEFAULT_HORIZON, base: str = "ets") -> None:
        super().__init__(season)
        if base not in BASES:
            raise ForecastError(f"unknown planning base {base!r}; valid: {', '.join(BASES)}")
        if not (isinstance(horizon, int) and horizon >= 1):
            raise ForecastError(f"planning horizon must be an int >= 1 step, got {horizon!r}")
        self.base, self.horizon = base, horizon
        self.name = f"peak:{base}"
        self._members: list[Forecaster] = []
        self._calibrating = False

    # --- the point models -----------------------------------------------------------------
    def _fit(self, y: np.ndarray) -> None:
        names = BLEND if self.base == "blend" else (self.base,)
        self._members = []
        for n in names:
            m = _POINT[n](self.season)
            m._reset(y)
            self._members.append(m)

    def _step(self, y: float) -> None:
        for m in self._members:
            m._absorb(y, float(m._mean(1)[0]))
            m.t += 1

    def _mean(self, h: int) -> np.ndarray:
        if len(self._members) == 1:  # the same values as the mean of one, without its overhead
            return np.maximum(self._members[0]._mean(h), 0.0)
        return np.mean([np.maximum(m._mean(h), 0.0) for m in self._members], axis=0)

    def _point_peaks(self, h: int) -> np.ndarray:
        """Point forecast of max(y[t .. t + k - 1]) for k = 1..h."""
        if len(self._members) == 1:
            return np.maximum.accumulate(np.maximum(self._members[0]._mean(h), 0.0))
        return np.mean([np.maximum.accumulate(np.maximum(m._mean(h), 0.0)) for m in self._members],
                       axis=0)

    # --- fit / update / forecast ----------------------------------------------------------
    def fit(self, history: np.ndarray | pd.Series) -> Forecaster:
        y = check_history(history, self.season)
        calib = min(CALIBRATION_DAYS * self.season, len(y) - 2 * self.season)
        self._floor_value = max(OUTAGE_FRACTION * float(np.median(y)), 1e-9)
        levels = np.asarray(QUANTILES)
        window = CONFORMAL_SEASONS * self.season
        self._scores = np.full((self.horizon, window), np.nan)
        self._n_scores = np.zeros(self.horizon, dtype=int)
        self._work = np.tile(levels, (self.horizon, 1))  # ACI working levels [H, len(QUANTILES)]
        self._covered = np.zeros((self.horizon, len(levels)))
        self._matured = np.zeros(self.horizon, dtype=int)
        # the volatility from the last season of the history the point models start from
        head = y[: len(y) - calib] if calib > 0 else y
        self._vol = float(np.mean(np.abs(np.diff(head[-self.season:]))))
        self._last_obs = float(head[-1])
        # per pending origin: (point peaks [H], score scale, issued quantiles [H, L], running max)
        self._pending: deque[list] = deque(maxlen=self.horizon)
        self._sorted: np.ndarray | None = None
        # _paths(h) of the current state: update() issues the same quantiles forecast(h) gave
        # (the env calls both every step), so they are computed once per state
        self._path_cache: dict[int, tuple[np.ndarray, np.ndarray, float]] = {}
        self._peak_cache: dict[int, np.ndarray] = {}  # _point_peaks(h) of the current state
        self._scale_now: float | None = None  # score_scale of the current state
        self.cap_binds = 0
        # validation record: (target, issued SELECT_LEVEL quantile) of matured look-ahead-H targets
        self.validation: list[tuple[float, float]] = []
        if calib > 0:
            # Calibration: fit on the head, forecast the held-back tail as it arrives (online, so
            # the scores and the working levels are those a live run would have had).
            self._reset(y[: len(y) - calib])
            self._calibrating = True
            try:
                self.update(y[len(y) - calib:])
            finally:
                self._calibrating = False
        self._covered[:] = 0  # coverage is reported over the forecasting period only
        self._matured[:] = 0
        # The point models are re-fitted on the whole history; scores, working levels and the
        # volatility (which has run through the whole history by now) stay.
        self._reset(y)
        self._pending.clear()
        return self

    def _thresholds(self) -> np.ndarray:
        """[H, len(QUANTILES)] issued score quantiles at the working levels."""
        if self._sorted is None:
            n = np.minimum(self._n_scores, self._scores.shape[1])
            out = np.zeros((self.horizon, len(QUANTILES)))
            if n[0] and np.all(n == n[0]):
                # every look-ahead holds as many scores (the steady state): one sort for all, and
                # np.interp's own arithmetic on the integer grid, so the values are the same
                m = int(n[0])
                s = np.sort(self._scores[:, :m], axis=1)
                pos = np.clip(self._work, 0.0, 1.0) * (m - 1)
                j = np.minimum(pos.astype(np.int64), max(m - 2, 0))
                rows = np.arange(self.horizon)[:, None]
                lo = s[rows, j]
                hi = s[rows, np.minimum(j + 1, m - 1)]
                out = np.where(pos >= m - 1, s[:, m - 1: m], (hi - lo) * (pos - j) + lo)
            else:
                for k in range(self.horizon):
                    # look-aheads without scores yet borrow the nearest shorter one's
                    if n[k] == 0:
                        out[k] = out[k - 1] if k else 0.0
                        continue
                    srt = np.sort(self._scores[k, : n[k]])
                    pos = np.clip(self._work[k], 0.0, 1.0) * (n[k] - 1)
                    out[k] = np.interp(pos, np.arange(n[k]), srt)
            self._sorted = out
        return self._sorted

    def update(self, y: float | np.ndarray) -> None:
        levels = np.asarray(QUANTILES)
        sel = QUANTILES.index(SELECT_LEVEL)
        window = self._scores.shape[1]
        for v in np.atleast_1d(np.asarray(y, dtype=float)):
            if not math.isfinite(v) or v < 0:
                raise ForecastError(f"observation {float(v)!r} at step {self.t}: must be finite and >= 0")
            v = float(v)
            # what is issued now for the peaks over the next 1..H steps, kept until they mature
            self._pending.appendleft([self._peaks_now(self.horizon), self.score_scale,
                                      self._paths(self.horizon)[0], 0.0])
            for k, entry in enumerate(self._pending):  # entry made k steps ago: look-ahead k + 1
                point, scale, issued, runmax = entry
                runmax = entry[3] = max(runmax, v)
                miss = runmax > issued[k]
                self._work[k] += ACI_RATE * (miss - (1 - levels))
                self._covered[k] += ~miss
                self._matured[k] += 1
                self._scores[k, self._n_scores[k] % window] = (runmax - point[k]) / scale
                self._n_scores[k] += 1
                if k == self.horizon - 1 and self._calibrating:
                    self.validation.append((runmax, float(issued[k, sel])))
            self._sorted = None
            self._path_cache.clear()
            self._peak_cache.clear()
            self._step_point(v)

    @property
    def score_scale(self) -> float:
        """What scores are divided by (see the module docstring); always > 0."""
        if self._scale_now is None:  # read twice per step: computed once per state
            self._scale_now = scale = self._vol + VOL_FLOOR * self.typical_level
            return scale
        return self._scale_now

    def _reset(self, y: np.ndarray) -> None:
        super()._reset(y)
        # new point models: what was computed from the old ones goes
        self._scale_now = None
        self._path_cache = {}
        self._peak_cache = {}

    def _step_point(self, v: float) -> None:
        # the point models absorb the observation (each its own robust clip)
        self._scale_now = None
        self._step(v)
        self._vol += VOL_RATE * (abs(v - self._last_obs) - self._vol)
        self._last_obs = v
        self._recent[self._ri] = v
        self._ri = (self._ri + 1) % len(self._recent)
        self.t += 1

    def coverage(self, level: float, k: int | None = None) -> float:
        """Share of the peaks over ``k`` steps (default: the horizon) that matured since ``fit``
        at or below the ``level`` quantile issued for them (NaN before any)."""
        j, kk = QUANTILES.index(level), (k or self.horizon) - 1
        return float(self._covered[kk, j] / self._matured[kk]) if self._matured[kk] else math.nan

    def working_level(self, level: float, k: int | None = None) -> float:
        """The ACI working level that issues the ``level`` quantile at look-ahead ``k``."""
        return float(self._work[(k or self.horizon) - 1, QUANTILES.index(level)])

    def validation_pinball(self) -> float:
        """Pinball loss at SELECT_LEVEL of the look-ahead-``horizon`` peaks of the calibration
        tail (the first BURN_IN left out: their score windows were nearly empty)."""
        rows = self.validation[BURN_IN:]
        if not rows:
            return math.nan
        t, q = np.array(rows).T
        return pinball(t, q, SELECT_LEVEL)

    def _paths(self, h: int) -> tuple[np.ndarray, np.ndarray, float]:
        """([h, len(QUANTILES)] quantiles of the running peak, where the cap bound, the cap);
        read-only arrays, cached until the state changes."""
        if h not in self._path_cache:
            self._path_cache[h] = self._compute_paths(h)
        return self._path_cache[h]

    def _peaks_now(self, h: int) -> np.ndarray:
        """:meth:`_point_peaks` of the current state (update and the paths both read it)."""
        if h not in self._peak_cache:
            self._peak_cache[h] = self._point_peaks(h)
        return self._peak_cache[h]

    def _compute_paths(self, h: int) -> tuple[np.ndarray, np.ndarray, float]:
        point = self._peaks_now(h)
        thr = self._thresholds()[np.minimum(np.arange(h), self.horizon - 1)]
        thr = np.sort(thr, axis=1)  # rearrangement: quantiles never cross
        vals = np.maximum(point[:, None] + thr * self.score_scale, 0.0)
        # A peak over more steps is at least the peak over fewer: quantiles are running maxima.
        vals = np.maximum.accumulate(vals, axis=0)
        cap = PEAK_CAP * (float(self._recent.max()) or self._fit_peak or math.inf)
        capped = np.asarray((vals > cap).any(axis=1))
        vals = np.minimum(vals, cap)
        vals.setflags(write=False)
        capped.setflags(write=False)
        return vals, capped, cap

    def forecast(self, h: int) -> Forecast:
        if not 1 <= h:
            raise ForecastError(f"horizon must be >= 1 step, got {h}")
        vals, capped, cap = self._paths(h)
        if capped.any():
            self.cap_binds += 1
        qs = {q: vals[:, j].copy() for j, q in enumerate(QUANTILES)}  # callers own what they get
        return Forecast(mean=np.minimum(self._mean(h), cap), quantiles=qs, cap=cap, capped=capped.copy())


class PeakAuto(Chooser):
    """``peak:auto``: every base of :data:`BASES` as a :class:`PeakForecaster`; the one with the
    lowest pinball loss at ``SELECT_LEVEL`` on the planning target over the calibration tail of
    the history ``fit`` gets (the warm-up's last day in the env) forecasts, and every season (a
    day) the choice is remade on the last season's matured targets (a switch needs a
    ``SWITCH_MARGIN`` gain). ``selections`` lists every (step, base); ``scores`` the last
    comparison. Only data already observed reaches a choice."""

    name = "peak:auto"
    unfitted = "peak:auto"

    def __init__(self, season: int = DAY, horizon: int = DEFAULT_HORIZON,
                 bases: Sequence[str] = BASES) -> None:
        super().__init__(season)
        self.horizon = horizon
        self.bases = tuple(bases)
        self._live: dict[str, PeakForecaster] = {}
        self.chosen: PeakForecaster | None = None
        self.scores: dict[str, float] = {}
        self.selections: list[tuple[int, str]] = []

    @property
    def cap_binds(self) -> int:  # type: ignore[override]
        """Forecasts of the chosen candidate whose planning cap bound."""
        return self.chosen.cap_binds if self.chosen is not None else 0

    def fit(self, history: np.ndarray | pd.Series) -> Forecaster:
        y = check_history(history, self.season)
        self._live, self.scores = {}, {}
        for b in self.bases:
            f = PeakForecaster(self.season, self.horizon, b)
            try:
                f.fit(y)
            except (ForecastError, np.linalg.LinAlgError, ValueError):
                continue  # a model that cannot fit this history is not a candidate
            self._live[b] = f
            self.scores[b] = f.validation_pinball()
        if not self._live:
            raise ForecastError("peak:auto: no candidate could be fitted on this history")
        ranked = [b for b in self._live if math.isfinite(self.scores[b])]
        best = min(ranked, key=self.scores.__getitem__) if ranked else next(iter(self._live))
        self.chosen = self._live[best]
        self.t = self.chosen.t
        self.selections = [(self.t, best)]
        sel = QUANTILES.index(SELECT_LEVEL)
        self._sel = sel
        self._loss: dict[str, deque[float]] = {b: deque(maxlen=self.season) for b in self._live}
        self._issued: dict[str, deque[float]] = {b: deque() for b in self._live}
        self._since = 0
        self._window: deque[float] = deque(maxlen=self.horizon)  # the last `horizon` observations
        return self

    def update(self, y: float | np.ndarray) -> None:
        self._candidate()  # an error before fit()
        for v in np.atleast_1d(np.asarray(y, dtype=float)):
            for b, f in self._live.items():
                f.update(float(v))
                # the SELECT_LEVEL quantile of the peak over the horizon issued before v (the
                # candidate's newest pending entry: what its forecast(horizon) gave), which
                # matures horizon - 1 steps from now
                self._issued[b].append(float(f._pending[0][2][-1, self._sel]))
            self._mature(float(v))
            self.t = self._candidate().t
            self._since += 1
            if self._since >= self.season:
                self._since = 0
                self._reselect()

    def _mature(self, v: float) -> None:
        # the peak of the last `horizon` observations, once that many are in
        recent = self._window
        recent.append(v)
        if len(recent) < self.horizon:
            return
        peak = max(recent)
        for b, issued in self._issued.items():
            if len(issued) >= self.horizon:
                self._loss[b].append(pinball(peak, issued.popleft(), SELECT_LEVEL))

    def _reselect(self) -> None:
        assert self.chosen is not None
        self.scores = {b: float(np.mean(loss)) for b, loss in self._loss.items() if len(loss)}
        current = self.chosen.base
        if current not in self.scores:
            return
        best = min(self.scores, key=self.scores.__getitem__)
        if best != current and self.scores[best] < (1 - SWITCH_MARGIN) * self.scores[current]:
            self.chosen = self._live[best]
            self.selections.append((self.t, best))

    def coverage(self, level: float, k: int | None = None) -> float:
        return cast(PeakForecaster, self._candidate()).coverage(level, k)


def _peak(season: int, horizon: int, *, base: str) -> Forecaster:
    return PeakForecaster(season, horizon, base)


# The planning-target forecasters of this module, name -> factory(season, horizon), in the order
# the registry lists them (:mod:`atoll.forecast.registry`, which also lists each at the default
# look-ahead, and ``llt``, the :class:`LocalLinearTrend` level model).
PEAK_FORECASTERS: dict[str, Callable[[int, int], Forecaster]] = {
    **{f"peak:{b}": partial(_peak, base=b) for b in BASES}, "peak:auto": PeakAuto}


# The forecasters the planning backtest (:func:`atoll.forecast.backtest.planning_backtest`) compares
# unless told otherwise.
PLANNING_CANDIDATES: tuple[str, ...] = ("ets", *(f"peak:{b}" for b in BASES), "peak:auto")
