"""Online capacity correction: what the servers report -> a factor per template family.

One code path for the simulator and the live controller. Each interval, per service that had
ready instances, the caller turns what the servers reported (served tokens/s and the mean TTFT
or inter-token latency, :func:`atoll.envs.latency.implied_capacity`) into an **implied capacity**
``y`` (tokens/s) with a weight, and passes the model's predicted capacity of every family ready
over the interval (``exposure``: family -> tokens/s). The estimator keeps the last ``window``
observations per service and fits the factors ``k`` of that service's families:

    minimize  sum_t w_t h((y_t - a_t . k) / A_t)  +  prior_weight x sum_f (k_f - 1)^2

where ``a_t`` is the exposure, ``A_t`` its sum (so residuals are relative: a 10% miss counts the
same on a small and a large service) and ``h`` the Huber loss — iteratively reweighted least
squares, scale from the median absolute residual (at least ``min_scale``), observations beyond
``reject_z`` scales dropped. The prior is ``prior_weight`` pseudo-observations at k = 1: while
evidence is thin a factor stays near 1, and a family never seen stays exactly 1. Factors are
clipped to [``low``, ``high``].

Why a regression and not a ratio per family: vLLM reports per model (and phase), not per
template, so an interval in which two families served a service tells only their weighted sum;
intervals with different mixes separate them.

The state is a plain JSON-able dict (:meth:`CapacityCorrection.as_dict`), which the controller
persists with the rest of its state, so factors survive restarts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atoll.solvers.errors import InputError


@dataclass(frozen=True)
class CorrectionSettings:
    """window: observations kept per service (5-min steps: 48 = 4 hours, so a drifting capacity is
    followed); prior_weight: pseudo-observations at factor 1; low/high: bounds of a factor;
    huber: Huber threshold in robust scales; reject_z: observations farther than this many
    scales are dropped; min_scale: floor of the robust scale (relative), so a run of identical
    observations does not turn the next honest one into an outlier."""

    window: int = 48
    prior_weight: float = 1.0
    low: float = 0.5
    high: float = 1.5
    huber: float = 1.5
    reject_z: float = 5.0
    min_scale: float = 0.02

    def __post_init__(self) -> None:
        owner = "CorrectionSettings"
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise InputError(f"{owner}: field 'window' must be an integer >= 1, got {self.window!r}")
        for name in ("prior_weight", "huber", "reject_z", "min_scale"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise InputError(f"{owner}: field {name!r} must be finite and > 0, got {v!r}")
        if not (0 < self.low <= 1 <= self.high and math.isfinite(self.high)):
            raise InputError(f"{owner}: fields 'low' and 'high' must satisfy 0 < low <= 1 <= high, "
                             f"got {self.low!r}, {self.high!r}")


@dataclass
class _Obs:
    exposure: dict[str, float]
    implied: float
    weight: float


@dataclass
class CapacityCorrection:
    """Per-family capacity factors learned from observations (see the module docstring)."""

    settings: CorrectionSettings = field(default_factory=CorrectionSettings)
    _obs: dict[str, list[_Obs]] = field(default_factory=dict)
    _factors: dict[str, float] = field(default_factory=dict)
    _evidence: dict[str, float] = field(default_factory=dict)

    def observe(self, service: str, exposure: Mapping[str, float], implied: float,
                weight: float = 1.0) -> bool:
        """Record one interval of ``service``; returns whether it was usable (finite, positive
        exposure and implied capacity, weight > 0) and re-fits that service's factors."""
        exp = {f: float(v) for f, v in exposure.items() if math.isfinite(v) and v > 0}
        usable = math.isfinite(implied) and implied > 0 and math.isfinite(weight) and weight > 0
        if not exp or not usable:
            return False
        window = self._obs.setdefault(service, [])
        window.append(_Obs(exp, float(implied), float(weight)))
        del window[: max(0, len(window) - self.settings.window)]
        self._fit(service)
        return True

    def factor(self, family: str) -> float:
        return self._factors.get(family, 1.0)

    def factors(self) -> dict[str, float]:
        """Every family with a learned factor (the others are 1)."""
        return dict(self._factors)

    def evidence(self) -> dict[str, float]:
        """Per family, the summed weight of the observations it took part in (pseudo-count)."""
        return dict(self._evidence)

    def _fit(self, service: str) -> None:
        s = self.settings
        obs = self._obs[service]
        fams = sorted({f for o in obs for f in o.exposure})
        col = {f: j for j, f in enumerate(fams)}
        a = np.zeros((len(obs), len(fams)))
        y = np.zeros(len(obs))
        w0 = np.zeros(len(obs))
        for i, o in enumerate(obs):
            total = sum(o.exposure.values())
            for f, v in o.exposure.items():
                a[i, col[f]] = v / total
            y[i] = o.implied / total
            w0[i] = o.weight
        k = self._solve(a, y, w0)
        for _ in range(10):  # IRLS: Huber weights from the robust scale of the residuals
            r = y - a @ k
            scale = max(1.4826 * float(np.median(np.abs(r))), s.min_scale)
            z = np.abs(r) / scale
            hub = np.where(z <= s.huber, 1.0, s.huber / np.maximum(z, 1e-12))
            hub = np.where(z > s.reject_z, 0.0, hub)
            k_new = self._solve(a, y, w0 * hub)
            if np.max(np.abs(k_new - k)) < 1e-7:
                k = k_new
                break
            k = k_new
        k = np.clip(k, s.low, s.high)
        for f, j in col.items():
            self._factors[f] = float(k[j])
            self._evidence[f] = float((w0 * (a[:, j] > 0)).sum())

    def _solve(self, a: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
        lam = self.settings.prior_weight
        n = a.shape[1]
        lhs = (a.T * w) @ a + lam * np.eye(n)
        rhs = (a.T * w) @ y + lam * np.ones(n)
        return np.asarray(np.linalg.solve(lhs, rhs))

    # ----- persistence ---------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        return {"factors": dict(self._factors), "evidence": dict(self._evidence),
                "observations": {svc: [[o.exposure, o.implied, o.weight] for o in obs]
                                 for svc, obs in self._obs.items()}}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any],
                  settings: CorrectionSettings | None = None) -> CapacityCorrection:
        """The inverse of :meth:`as_dict`; malformed content raises ``InputError`` naming the part."""
        out = cls(settings or CorrectionSettings())
        obs = doc.get("observations", {})
        if not isinstance(obs, dict):
            raise InputError("capacity correction: 'observations' must map services to lists")
        for svc, rows in obs.items():
            if not isinstance(rows, list):
                raise InputError(f"capacity correction: observations of {svc!r} must be a list")
            for row in rows[-out.settings.window:]:
                if not (isinstance(row, list) and len(row) == 3 and isinstance(row[0], dict)):
                    raise InputError(f"capacity correction: an observation of {svc!r} must be "
                                     f"[exposure, implied, weight], got {row!r}")
                try:
                    exp = {str(f): float(v) for f, v in row[0].items()}
                    implied, weight = float(row[1]), float(row[2])
                except (TypeError, ValueError) as exc:
                    raise InputError(f"capacity correction: an observation of {svc!r} is not numeric: "
                                     f"{row!r}") from exc
                if not all(math.isfinite(v) for v in (*exp.values(), implied, weight)):
                    raise InputError(f"capacity correction: an observation of {svc!r} is not finite: {row!r}")
                out._obs.setdefault(str(svc), []).append(_Obs(exp, implied, weight))
        for svc in out._obs:
            out._fit(svc)
        return out
