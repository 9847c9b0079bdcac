"""Online capacity correction: what the servers report -> a factor per template family.

One code path for the simulator and the live controller. Each interval, per service that had
ready instances, the caller turns what the servers reported (served tokens/s, the mean TTFT or
inter-token latency and the requests waiting, :func:`atoll.envs.servers.implied_capacities`) into
an **implied capacity** ``y`` (tokens/s) with a weight (its precision), and passes the model's
predicted capacity of every family ready over the interval (``exposure``: family -> tokens/s).
Per service the estimator keeps the sufficient statistics of a weighted ridge regression

    minimize  sum_t g^(age_t) w_t ((y_t - a_t . k) / A_t)^2  +  prior_weight x sum_f (k_f - 1)^2

where ``a_t`` is the exposure, ``A_t`` its sum (residuals are relative: a 10% miss counts the
same on a small and a large service) and ``g`` the forgetting factor (``half_life``
observations), so a family keeps what was learned of it after the planner stops using it, and a
capacity that drifts is followed. The prior is ``prior_weight`` at k = 1 (a precision: 25 is a
standard deviation of 0.2, the calibration's held-out spread): while evidence is thin a factor
stays near 1, and a family never seen stays exactly 1. Factors are clipped to [``low``, ``high``].

**One bad interval**: an observation whose relative residual against the current fit exceeds
``reject_z`` robust scales (an EWMA of absolute residuals, at least ``min_scale``) while every
family in it already has evidence is held back; a second such interval in a row on the service is
a real change, and both are absorbed.

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
from atoll.solvers.validation import check_fraction, check_number


@dataclass(frozen=True)
class CorrectionSettings:
    """half_life: observations after which an observation counts half (5-min steps: 288 = a day);
    prior_weight: the precision of the prior at factor 1 (1 / relative variance: 25 is a standard
    deviation of 0.2), in the units of the observations' weights; low/high: bounds of a factor;
    reject_z: an interval farther than this many robust scales from the fit is held back (see
    the module docstring); min_scale: floor of the robust scale (relative), so a run of exact
    observations does not turn the next honest one into an outlier; publish_step: the planner's
    factor of a family moves only when the estimate leaves it by more than this (relative), so a
    factor wobbling by a fraction of a percent does not rebuild the corrected library each step;
    max_step: the most (relative) a published factor moves in one fit, so one interval — an honest
    surprise or a signal that lied past every gate — moves the plan by a bounded step, and a
    real change is followed over a few; publish_band: a factor is published only when it moves by
    more than this many of its own standard errors (1 / sqrt(prior_weight + evidence)), so an
    estimate wobbling within its error band never flips the planner's choice of template (0: off;
    the live controller uses 2)."""

    half_life: float = 288.0
    prior_weight: float = 25.0
    low: float = 0.5
    high: float = 2.0
    reject_z: float = 6.0
    min_scale: float = 0.03
    publish_step: float = 0.02
    max_step: float = 0.1
    publish_band: float = 0.0

    def __post_init__(self) -> None:
        owner = "CorrectionSettings"
        for name in ("half_life", "prior_weight", "reject_z", "min_scale", "max_step"):
            check_number(owner, name, getattr(self, name))
        check_number(owner, "publish_band", self.publish_band, allow_zero=True)
        check_fraction(owner, "publish_step", self.publish_step, high_open=True)
        if not (0 < self.low <= 1 <= self.high and math.isfinite(self.high)):
            raise InputError(f"{owner}: fields 'low' and 'high' must satisfy 0 < low <= 1 <= high, "
                             f"got {self.low!r}, {self.high!r}")


@dataclass
class _Service:
    """The regression's sufficient statistics of one service (relative units)."""

    families: list[str] = field(default_factory=list)
    gram: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # sum g w a a'
    moment: np.ndarray = field(default_factory=lambda: np.zeros(0))  # sum g w a y
    scale: float = 0.0  # EWMA of |relative residual|
    held: list[tuple[dict[str, float], float, float]] = field(default_factory=list)  # a held-back interval

    def column(self, family: str) -> int:
        if family not in self.families:
            self.families.append(family)
            n = len(self.families)
            gram = np.zeros((n, n))
            gram[: n - 1, : n - 1] = self.gram
            self.gram, self.moment = gram, np.append(self.moment, 0.0)
        return self.families.index(family)


@dataclass
class CapacityCorrection:
    """Per-family capacity factors learned from observations (see the module docstring)."""

    settings: CorrectionSettings = field(default_factory=CorrectionSettings)
    _services: dict[str, _Service] = field(default_factory=dict)
    _factors: dict[str, float] = field(default_factory=dict)
    _evidence: dict[str, float] = field(default_factory=dict)
    _published: dict[str, float] = field(default_factory=dict)
    rejected: int = 0

    def observe(self, service: str, exposure: Mapping[str, float], implied: float,
                weight: float = 1.0) -> bool:
        """Record one interval of ``service``; returns whether it was absorbed (finite, positive
        exposure, implied capacity and weight, and not held back as a lone outlier)."""
        exp = {f: float(v) for f, v in exposure.items() if math.isfinite(v) and v > 0}
        usable = math.isfinite(implied) and implied > 0 and math.isfinite(weight) and weight > 0
        if not exp or not usable:
            return False
        svc = self._services.setdefault(service, _Service())
        total = sum(exp.values())
        predicted = sum(v * self._factors.get(f, 1.0) for f, v in exp.items())
        resid = abs(implied - predicted) / total
        known = all(self._evidence.get(f, 0.0) >= self.settings.prior_weight for f in exp)
        limit = self.settings.reject_z * max(svc.scale, self.settings.min_scale)
        outlier = known and resid > limit
        if outlier and not svc.held:
            svc.held = [(exp, float(implied), float(weight))]
            self.rejected += 1
            return False
        # a second outlier in a row is a change: the held interval counts too; a normal interval
        # after it shows the held one was a glitch, and it is dropped
        backlog, svc.held = (svc.held if outlier else []), []
        for e, y, w in [*backlog, (exp, float(implied), float(weight))]:
            self._absorb(service, svc, e, y, w)
        svc.scale = resid if svc.scale == 0 else 0.9 * svc.scale + 0.1 * resid
        self._fit(service)
        return True

    def _absorb(self, service: str, svc: _Service, exp: Mapping[str, float], implied: float,
                weight: float) -> None:
        decay = 0.5 ** (1.0 / self.settings.half_life)
        cols = [svc.column(f) for f in exp]
        svc.gram *= decay
        svc.moment *= decay
        total = sum(exp.values())
        a = np.zeros(len(svc.families))
        a[cols] = [v / total for v in exp.values()]
        svc.gram += weight * np.outer(a, a)
        svc.moment += weight * a * (implied / total)

    def factor(self, family: str) -> float:
        return self._factors.get(family, 1.0)

    def factors(self) -> dict[str, float]:
        """Every family with a learned factor (the others are 1): the current estimates."""
        return dict(self._factors)

    def planning_factors(self) -> dict[str, float]:
        """The factors the planner solves with: each estimate, moved only when it has left the
        last published value by more than ``publish_step`` (see :class:`CorrectionSettings`)."""
        return dict(self._published)

    def evidence(self) -> dict[str, float]:
        """Per family, the (decayed) precision its own observations give: the diagonal of the
        service's normal matrix — comparable with ``prior_weight``."""
        return dict(self._evidence)

    def _fit(self, service: str) -> None:
        s = self.settings
        svc = self._services[service]
        n = len(svc.families)
        k = np.linalg.solve(svc.gram + s.prior_weight * np.eye(n), svc.moment + s.prior_weight * np.ones(n))
        k = np.clip(k, s.low, s.high)
        for j, f in enumerate(svc.families):
            self._factors[f] = float(k[j])
            self._evidence[f] = float(svc.gram[j, j])
            old = self._published.get(f, 1.0)
            move = math.log(k[j] / old)
            band = s.publish_band / math.sqrt(s.prior_weight + float(svc.gram[j, j]))
            if abs(move) > max(math.log1p(s.publish_step), band):
                bound = math.log1p(s.max_step)
                self._published[f] = float(old * math.exp(max(-bound, min(bound, move))))

    def fade(self, service: str) -> None:
        """One interval without usable evidence for ``service``: its statistics age by one
        observation's forgetting, so a factor whose evidence stopped returns toward the prior."""
        svc = self._services.get(service)
        if svc is None or not svc.families:
            return
        decay = 0.5 ** (1.0 / self.settings.half_life)
        svc.gram *= decay
        svc.moment *= decay
        self._fit(service)

    # ----- persistence ---------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        return {"factors": dict(self._factors), "evidence": dict(self._evidence),
                "planning_factors": dict(self._published), "rejected": self.rejected,
                "services": {name: {"families": list(svc.families), "gram": svc.gram.tolist(),
                                    "moment": svc.moment.tolist(), "scale": svc.scale,
                                    "held": [[e, y, w] for e, y, w in svc.held]}
                             for name, svc in self._services.items()}}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any],
                  settings: CorrectionSettings | None = None) -> CapacityCorrection:
        """The inverse of :meth:`as_dict`; malformed content raises ``InputError`` naming the part."""
        out = cls(settings or CorrectionSettings())
        services = doc.get("services", {})
        if not isinstance(services, dict):
            raise InputError("capacity correction: 'services' must map services to their statistics")
        for name, part in services.items():
            where = f"capacity correction: service {name!r}"
            if not isinstance(part, dict):
                raise InputError(f"{where} must be an object, got {part!r}")
            try:
                fams = [str(f) for f in part["families"]]
                gram = np.array(part["gram"], dtype=float).reshape(len(fams), len(fams))
                moment = np.array(part["moment"], dtype=float).reshape(len(fams))
                scale = float(part.get("scale", 0.0))
                held = [({str(f): float(v) for f, v in e.items()}, float(y), float(w))
                        for e, y, w in part.get("held", [])]
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise InputError(f"{where} is malformed ({exc}); delete the state's 'correction' entry to "
                                 f"start learning again") from exc
            if not (np.all(np.isfinite(gram)) and np.all(np.isfinite(moment)) and math.isfinite(scale)):
                raise InputError(f"{where} holds non-finite statistics; delete the state's 'correction' "
                                 f"entry to start learning again")
            out._services[str(name)] = _Service(fams, gram, moment, scale, held)
        published = doc.get("planning_factors", {})
        if not isinstance(published, dict) or not all(
                isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in published.values()):
            raise InputError("capacity correction: 'planning_factors' must map families to finite "
                             "factors > 0")
        out._published = {str(f): float(v) for f, v in published.items()}
        rejected = doc.get("rejected", 0)
        out.rejected = int(rejected) if isinstance(rejected, int) and not isinstance(rejected, bool) else 0
        for name in out._services:
            if out._services[name].families:
                out._fit(name)
        return out
