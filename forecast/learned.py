"""``peak:learned``: one network for every series' planning target, trained offline on the bundled
traces, with the planning module's adaptive conformal calibration on top.

**What it predicts.** At step t, having seen ``y[.. t-1]``, the quantiles 0.5 and 0.9 of the peak
``max(y[t .. t+k-1])`` for k = 1..H (H = 3: the env's 15-minute look-ahead), each divided by the
series' level (its mean over the last day). Dividing by the level makes the network global: a new
series, at any rate, needs no retraining.

**What it sees** (:func:`features`), all divided by the same level:

- the last ``LAGS`` steps (2 hours);
- yesterday's steps around the same time, ``t - season + j`` for j in ``DAY_WINDOW`` (-3 .. +5),
  which carry the daily shape and the hour of the day without assuming where the history starts
  (the live controller's does not start at midnight);
- ``log10`` of the level: sampled counts are noisier at low rates, and the intervals should know it.

**The network**: a multilayer perceptron (``HIDDEN`` ReLU units per layer) with 2H outputs: the
median of each look-ahead, and the 0.9 quantile as the median plus a softplus, so the two never
cross. Inference here is numpy (no torch at simulate time): about 10 microseconds a step.
Training (:mod:`atoll.forecast.learned_fit`, ``atoll forecast train``) is torch.

**Calibration on top.** :class:`PeakLearned` is a :class:`~atoll.forecast.planning.PeakForecaster`
whose point peaks are the network's medians and whose score scale is the network's own spread
(0.9 quantile - median at the look-ahead H, plus the module's floor of the level): adaptive
conformal inference then corrects the issued quantiles online, series by series, so coverage holds
on a series the network never saw. State-dependent intervals (narrow at night, wide at a ramp) come
from the network; the long-run coverage from the conformal layer.

**Weights.** ``forecast/data/peak_learned.npz`` (with its card, ``peak_learned.json``: the command
that trained it, the data hash, the validation loss) ships with the package. A file of other
weights is named ``peak:learned`` too, through :func:`load_net` (the env's caches key on the
weights' hash).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from atoll.forecast.forecasters import DAY, Forecaster, ForecastError
from atoll.forecast.planning import DEFAULT_HORIZON, VOL_FLOOR, PeakForecaster

LAGS = 24  # 2 h of 5-min steps
DAY_WINDOW = tuple(range(-3, 6))  # yesterday's t - season + j: the same time, and its look-ahead
N_FEATURES = LAGS + len(DAY_WINDOW) + 1
OUT_LEVELS = (0.5, 0.9)
HIDDEN = 64
LEVEL_FLOOR = 1e-3  # req/s: the level of a series that has not served yet
# inputs are capped at this multiple of the level, and so are training targets: a burst out of a
# near-silent day is 10^5 levels, which would otherwise own the loss (the 0.9 quantile of a peak
# sits far below the cap, so the cap does not move it)
RATIO_CAP = 50.0
SHIPPED = Path(__file__).resolve().parent / "data" / "peak_learned.npz"


def features(history: np.ndarray, season: int = DAY) -> np.ndarray:
    """[N_FEATURES] the network's input at the step after ``history`` (at least ``season`` +
    ``LAGS`` steps; scaled by the level, :func:`level_of`)."""
    return features_and_level(history, season)[0]


def features_and_level(history: np.ndarray, season: int = DAY) -> tuple[np.ndarray, float]:
    """:func:`features` and the level they are scaled by."""
    y = np.asarray(history, dtype=float)
    if len(y) < season + max(LAGS, 3):
        raise ForecastError(f"peak:learned needs at least {season + max(LAGS, 3)} steps of history "
                            f"(a day and {LAGS} steps), got {len(y)}")
    t = len(y)
    level = level_of(y[t - season:])
    yesterday = np.array([y[t - season + j] if t - season + j < t else y[t - 1] for j in DAY_WINDOW])
    scaled = np.minimum(np.concatenate([y[t - LAGS:], yesterday]) / level, RATIO_CAP)
    return np.concatenate([scaled, [np.log10(level)]]), level


def level_of(last_day: np.ndarray) -> float:
    """The scale of a series at a step: the larger of its mean over the last day and over the last
    ``LAGS`` steps (a series waking from a silent day is scaled by what it does now)."""
    return max(float(np.mean(last_day)), float(np.mean(last_day[-LAGS:])), LEVEL_FLOOR)


def training_rows(y: np.ndarray, origins: np.ndarray, horizon: int = DEFAULT_HORIZON, season: int = DAY
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Inputs [N, N_FEATURES] and targets [N, horizon] (the peaks over 1..horizon steps, / level)
    for every origin t in ``origins`` (each needs ``season + LAGS`` steps before it and ``horizon``
    after): the same features :func:`features` builds one at a time, vectorized."""
    y = np.asarray(y, dtype=float)
    t = np.asarray(origins, dtype=np.int64)
    if len(t) and (t.min() < season + LAGS or t.max() + horizon > len(y)):
        raise ForecastError(f"origins must lie in [{season + LAGS}, {len(y) - horizon}]")
    csum = np.concatenate([[0.0], np.cumsum(y)])
    level = np.maximum(np.maximum((csum[t] - csum[t - season]) / season, (csum[t] - csum[t - LAGS]) / LAGS),
                       LEVEL_FLOOR)
    lags = y[t[:, None] + np.arange(-LAGS, 0)[None, :]]
    j = np.asarray(DAY_WINDOW)
    back = t[:, None] - season + j[None, :]
    yesterday = y[np.minimum(back, t[:, None] - 1)]
    scaled = np.minimum(np.concatenate([lags, yesterday], axis=1) / level[:, None], RATIO_CAP)
    x = np.concatenate([scaled, np.log10(level)[:, None]], axis=1)
    peaks = np.maximum.accumulate(y[t[:, None] + np.arange(horizon)[None, :]], axis=1) / level[:, None]
    return x, peaks


def forward(layers: tuple[tuple[np.ndarray, np.ndarray], ...], x: np.ndarray, horizon: int) -> np.ndarray:
    """[N, horizon, 2] the network's median and 0.9 quantile of the peak / level: ReLU layers
    ``h @ w + b``, the median non-decreasing in the look-ahead and the 0.9 quantile above it by a
    softplus. Any input width (the shipped inputs, or a variant's)."""
    h = np.asarray(x, dtype=np.float64)
    for i, (w, b) in enumerate(layers):
        h = h @ w + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0)
    med = np.maximum.accumulate(h[:, :horizon], axis=1)
    upper = np.maximum.accumulate(med + np.logaddexp(0.0, h[:, horizon:]), axis=1)
    return np.stack([med, upper], axis=2)


@dataclass(frozen=True)
class DemandNet:
    """The network's weights (numpy) and the card they came with."""

    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    horizon: int
    card: dict[str, object]
    digest: str

    def __post_init__(self) -> None:
        if not self.layers or self.layers[0][0].shape[0] != N_FEATURES:
            raise ForecastError(f"DemandNet: field 'layers' must start with {N_FEATURES} inputs, got "
                                f"{self.layers[0][0].shape[0] if self.layers else 'none'}")
        if self.layers[-1][0].shape[1] != 2 * self.horizon:
            raise ForecastError(f"DemandNet: field 'layers' must end with {2 * self.horizon} outputs "
                                f"(median and 0.9 per look-ahead), got {self.layers[-1][0].shape[1]}")

    def predict(self, x: np.ndarray) -> np.ndarray:
        """[N, horizon, 2] the median and 0.9 quantile of the peak / level for inputs [N, F]."""
        return forward(self.layers, x, self.horizon)

    def save(self, path: Path) -> Path:
        """Weights to ``path`` (.npz) and the card beside it (.json)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, Any] = {f"w{i}": w for i, (w, _) in enumerate(self.layers)}
        arrays |= {f"b{i}": b for i, (_, b) in enumerate(self.layers)}
        arrays["horizon"] = np.asarray(self.horizon)
        np.savez(path, **arrays)
        path.with_suffix(".json").write_text(json.dumps(self.card, indent=1, sort_keys=True) + "\n")
        return path


def load_net(path: Path | str = SHIPPED) -> DemandNet:
    """The weights at ``path`` (default: the shipped ones) with their card; a clear error when the
    file is missing or not this network's."""
    p = Path(path)
    if not p.is_file():
        raise ForecastError(f"peak:learned weights not found at {p}; train them with `atoll forecast train` "
                            f"or use the shipped {SHIPPED}")
    return _load(str(p.resolve()), p.stat().st_mtime_ns)


@lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int) -> DemandNet:
    try:
        with np.load(path) as z:
            n = sum(1 for k in z.files if k.startswith("w"))
            layers = tuple((np.asarray(z[f"w{i}"], dtype=np.float64),
                            np.asarray(z[f"b{i}"], dtype=np.float64)) for i in range(n))
            horizon = int(z["horizon"])
    except (OSError, KeyError, ValueError) as exc:
        raise ForecastError(f"{path}: not a peak:learned weights file ({exc})") from exc
    card_path = Path(path).with_suffix(".json")
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    # the digest is of the arrays, not the file's bytes: the same weights saved twice are one model
    h = hashlib.sha256(str(horizon).encode())
    for w, b in layers:
        h.update(np.ascontiguousarray(w).tobytes())
        h.update(np.ascontiguousarray(b).tobytes())
    return DemandNet(layers, horizon, card, h.hexdigest()[:16])


def shipped_digest() -> str:
    """The shipped weights' hash (the env's forecast caches key on it); ``none`` without them."""
    return load_net().digest if SHIPPED.is_file() else "none"


class PeakLearned(PeakForecaster):
    """``peak:learned`` (module docstring): the network's medians as the point peaks, its spread
    as the score scale, adaptive conformal quantiles on top."""

    def __init__(self, season: int = DAY, horizon: int = DEFAULT_HORIZON,
                 net: DemandNet | None = None) -> None:
        super().__init__(season, horizon, base="persistence")  # the base check; the members go unused
        self.net = net or load_net()
        if self.net.horizon < horizon:
            raise ForecastError(f"peak:learned: the weights predict {self.net.horizon} steps ahead, "
                                f"fewer than the planning horizon {horizon}")
        self.base, self.name = "learned", "peak:learned"
        self._buf = np.zeros(0)
        self._pred: np.ndarray | None = None

    # the point model is the network over the last season + LAGS steps
    def _fit(self, y: np.ndarray) -> None:
        self._buf = np.asarray(y[-(self.season + LAGS):], dtype=float).copy()
        self._pred = None

    def _step(self, y: float) -> None:
        self._buf = np.append(self._buf[1:], y) if len(self._buf) >= self.season + LAGS \
            else np.append(self._buf, y)
        self._pred = None

    def _now(self) -> tuple[np.ndarray, float]:
        """[horizon, 2] the network's (median, 0.9) peaks in req/s and the level."""
        if self._pred is None:
            x, level = features_and_level(self._buf, self.season)
            self._pred = self.net.predict(x[None, :])[0] * level
            self._level = level
        return self._pred, self._level

    def _mean(self, h: int) -> np.ndarray:
        med = self._now()[0][:, 0]
        return np.concatenate([med, np.full(max(h - len(med), 0), med[-1])])[:h]

    def _point_peaks(self, h: int) -> np.ndarray:
        return self._mean(h)

    @property
    def score_scale(self) -> float:
        if self._scale_now is None:
            pred, level = self._now()
            k = self.horizon - 1
            self._scale_now = float(pred[k, 1] - pred[k, 0]) + VOL_FLOOR * level
        return self._scale_now


def make_peak_learned(season: int, horizon: int) -> Forecaster:
    return PeakLearned(season, horizon)

