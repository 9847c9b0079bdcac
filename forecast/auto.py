"""``auto``: a forecaster that chooses per series, among the models *and* the trivial baselines,
and changes its mind when the data does.

1. **Season test.** The seasonal strength of the training part: omega-squared of a one-way
   ANOVA on the phase within the season (see :func:`season_strength`). Below
   ``SEASON_STRENGTH_MIN`` the series has no usable season and the seasonal models are not
   tried; seasonal naive is (it costs nothing), as soon as two seasons of history exist, beside
   simple exponential smoothing, persistence and the rolling median.
2. **Validation.** Every candidate is fitted on the training part less its last two seasons and
   scored by its 30-min (``HORIZON``-step) mean absolute error on those two seasons, updating
   every step; the lowest wins, so ``auto`` never starts with a model that loses to seasonal
   naive, persistence or the rolling median there. A flat candidate (smoothing, persistence,
   median: no season) is eligible only where it is no worse than seasonal naive at 30 min *and*
   a quarter season ahead (6 h of a day) on that window: a flat line can win the next half hour of a daily
   cycle and miss its afternoon.
3. **Re-selection.** The chosen model, simple smoothing and the three baselines (all cheap to
   update) keep running;
   every ``RESELECT_EVERY`` steps (one season: a day at 5-min steps) auto compares their
   ``HORIZON``-step absolute errors over the last season and switches to the best if it beats
   the current choice by more than ``SWITCH_MARGIN`` (a flat one only where seasonal naive does
   not beat it). ``selections`` lists every (step, name).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from atoll.forecast.forecasters import (
    BASE_FORECASTERS,
    DAY,
    Chooser,
    Forecaster,
    ForecastError,
    check_history,
)

if TYPE_CHECKING:  # pandas is imported where it is used (0.3 s of every command's start)
    import pandas as pd

MODELS: tuple[str, ...] = ("ets", "sarimax", "uc")
PLAIN_MODELS: tuple[str, ...] = ("ses",)  # no season: tried on every series
SEASONAL_BASELINES: tuple[str, ...] = ("naive",)
BASELINES: tuple[str, ...] = ("persistence", "median")
HORIZON = 6  # 30 min at 5-min steps: the horizon the choice is made for
LONG_SEASON_SHARE = 4  # a quarter season (6 h of a day): where a flat forecast of a cycle shows its miss
FLAT: tuple[str, ...] = PLAIN_MODELS + BASELINES
SEASON_STRENGTH_MIN = 0.2
RESELECT_EVERY_SEASONS = 1
SWITCH_MARGIN = 0.05


def season_strength(y: np.ndarray, season: int) -> float:
    """Share of the variance the phase within the season explains, in [0, 1]: omega-squared of a
    one-way ANOVA of the series (each whole season's mean removed, so level shifts and trends
    do not count) on the phase t mod season. Omega-squared corrects the between-phase sum of
    squares for what noise alone puts there, so white noise scores about 0 however few seasons
    the history holds (a plain between/total ratio scores about 1/seasons)."""
    k = len(y) // season
    if k < 2:
        return 0.0
    x = np.asarray(y[-k * season:], dtype=float).reshape(k, season)
    x = x - x.mean(axis=1, keepdims=True)
    phase_means = x.mean(axis=0)
    ss_between = k * float(np.sum((phase_means - x.mean()) ** 2))
    ss_within = float(np.sum((x - phase_means) ** 2))
    df_within = season * (k - 1) - (k - 1)  # the season means removed cost k - 1 more
    ms_within = ss_within / max(df_within, 1)
    total = ss_between + ss_within
    if total <= 0:
        return 0.0
    return max(0.0, (ss_between - (season - 1) * ms_within) / (total + ms_within))


class AutoForecaster(Chooser):
    """Chooses per series by validation among models and baselines; re-selects online."""

    name = "auto"
    unfitted = "auto forecaster"

    def __init__(self, season: int = DAY) -> None:
        super().__init__(season)
        self.chosen: Forecaster | None = None
        self.scores: dict[str, float] = {}
        self.long_scores: dict[str, float] = {}
        self.strength = float("nan")
        self.selections: list[tuple[int, str]] = []
        self._live: dict[str, Forecaster] = {}

    @property
    def cap_binds(self) -> int:  # type: ignore[override]
        """Forecasts whose planning cap bound, over every candidate that forecast."""
        return sum(f.cap_binds for f in self._live.values())

    def candidates(self) -> tuple[str, ...]:
        if self.strength >= SEASON_STRENGTH_MIN:
            return MODELS + PLAIN_MODELS + SEASONAL_BASELINES + BASELINES
        return PLAIN_MODELS + SEASONAL_BASELINES + BASELINES

    def _eligible(self, scores: dict[str, float], long: dict[str, float] | None = None) -> list[str]:
        """The candidates that may be chosen: a flat one only where seasonal naive does not beat
        it (at 30 min, and at 6 h where that was scored)."""
        naive = SEASONAL_BASELINES[0]
        if naive not in scores:
            return list(scores)

        def beaten(name: str) -> bool:
            if scores[naive] < scores[name]:
                return True
            return long is not None and naive in long and name in long and long[naive] < long[name]

        return [n for n in scores if n not in FLAT or not beaten(n)]

    def fit(self, history: np.ndarray | pd.Series) -> Forecaster:
        y = check_history(history, self.season)
        self.strength = season_strength(y, self.season)
        # validate on the last two seasons, or on what is left after the two seasons every
        # candidate needs to fit (three days of history, as the simulator's warm-up gives: one)
        split = len(y) - min(2 * self.season, len(y) - 2 * self.season)
        self.scores, self.long_scores = {}, {}
        long_h = self.season // LONG_SEASON_SHARE
        long_h = long_h if long_h > HORIZON and len(y) - split >= 2 * long_h else 0
        for name in self.candidates() if len(y) - split >= HORIZON else ():
            f = BASE_FORECASTERS[name](self.season)
            try:
                f.fit(y[:split])
            except (ForecastError, np.linalg.LinAlgError, ValueError):
                continue
            errs, long_errs = [], []
            for i in range(split, len(y) - HORIZON + 1):
                mean = f.forecast(max(HORIZON, long_h)).mean
                errs.append(abs(y[i + HORIZON - 1] - mean[HORIZON - 1]))
                if long_h and i + long_h - 1 < len(y):
                    long_errs.append(abs(y[i + long_h - 1] - mean[long_h - 1]))
                f.update(y[i])
            self.scores[name] = float(np.mean(errs))
            if long_errs:
                self.long_scores[name] = float(np.mean(long_errs))
        if not self.scores:  # no room to validate (two seasons exactly): the trivial baseline
            self.scores = {"persistence": float("nan")}
        best = min(self._eligible(self.scores, self.long_scores), key=self.scores.__getitem__)
        cheap = PLAIN_MODELS + SEASONAL_BASELINES + BASELINES
        live = {best, *(b for b in cheap if b in self.scores)}
        self._live = {name: BASE_FORECASTERS[name](self.season).fit(y) for name in sorted(live)}
        self.chosen = self._live[best]
        self.t = self.chosen.t
        self.selections = [(self.t, best)]
        self._pending: dict[str, deque[float]] = {n: deque() for n in self._live}
        self._abs_err: dict[str, deque[float]] = {n: deque(maxlen=self.season) for n in self._live}
        self._since_check = 0
        return self

    def update(self, y: float | np.ndarray) -> None:
        self._candidate()  # an error before fit()
        for v in np.atleast_1d(np.asarray(y, dtype=float)):
            for name, f in self._live.items():
                pend = self._pending[name]
                pend.append(float(f._mean(HORIZON)[-1]))  # forecast for HORIZON-1 steps on
                if len(pend) == HORIZON:
                    self._abs_err[name].append(abs(float(v) - max(pend.popleft(), 0.0)))
                f.update(float(v))
            self.t = self._candidate().t
            self._since_check += 1
            if self._since_check >= RESELECT_EVERY_SEASONS * self.season:
                self._since_check = 0
                self._reselect()

    def _reselect(self) -> None:
        assert self.chosen is not None
        err = {n: float(np.mean(e)) for n, e in self._abs_err.items() if len(e)}
        if self.chosen.name not in err:
            return
        best = min(self._eligible(err), key=err.__getitem__)
        if best != self.chosen.name and err[best] < (1 - SWITCH_MARGIN) * err[self.chosen.name]:
            self.chosen = self._live[best]
            self.selections.append((self.t, best))
