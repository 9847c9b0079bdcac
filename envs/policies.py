"""Trigger policies: which models to re-optimize at each step.

Every policy — rule-based here, learned in ``training`` — has one interface:
``act(observation, info) -> action`` (one ``Fleet-v1`` code per model, :mod:`atoll.envs.actions`:
0 hold, 1 full and 2 grow at the env's planning level; the ``fixed``, ``threshold``, ``never``
and ``hindsight`` rules emit 0/1 only, which means the same in ``Fleet-v0``) and
``reset_options() -> dict`` (options the environment's ``reset`` needs for it; the ``never``
policy starts from a plan for the day's peak, ``hindsight`` plans with the true demand).

- ``fixed:K@q``: every model every K steps (K=1 at 5-min steps is close to Coral's 6-minute
  re-solve period), planning for the forecast's q quantile.
- ``threshold:LOW:HIGH@q``: re-plan a model when its forecast q quantile over the
  look-ahead / planned capacity leaves [LOW, HIGH] (default [0.5, 1.0]), when it recently lost
  more than 1% of its demand with nothing starting, or after one of its instances was preempted;
  the re-plan is for the q quantile.

The grammar of a policy's name is :mod:`atoll.envs.vocabulary`'s (parsed there into a
:class:`~atoll.envs.vocabulary.PolicySpec`). The rule family is ``fixed:K@q`` for K in
:data:`FIXED_INTERVALS` and ``threshold:LOW:HIGH@q`` for the bands in :data:`THRESHOLD_BANDS`, q
over every planning level (:data:`~atoll.envs.vocabulary.PLANNING_LEVELS`); :func:`rule_grid`
lists it. Without ``@q`` a rule plans at the environment's configured level
(``FleetConfig.planning_quantile``, :data:`~atoll.envs.vocabulary.DEFAULT_LEVEL` by default). A
rule's level is its ``planning_quantile`` attribute (None: the environment's); the evaluation runs
it on an environment configured for that level, so its observation's ``forecast_upper_ratio`` and
its re-plans read the same quantile. A rule's ``+RISK`` (the vocabulary's risk suffix) is its
``risk`` attribute, and it runs on an environment configured with that risk
(``FleetConfig.risk``): every re-plan it asks for takes that risk for every model. The grid
crosses the rules with a menu of risks (:func:`rule_grid`'s ``risks``).
- ``grow:K@q`` (a ``Fleet-v1`` rule): every step a ``grow`` re-optimization at q (add what the
  forecast needs, release nothing), and every K-th step a ``full`` one (release what is no
  longer needed). It is not in the contest's rule family; it is the learned policy's default
  bootstrap and is reported beside it.
- ``never``: one plan for the day's peak (forecast as the previous day's peak), never changed.
- ``hindsight``: re-plans every model every step for the *true* demand over the look-ahead — a
  reference bound, not a deployable policy.
- ``oracle-rate``: the same, for the trace's own underlying rate over the look-ahead instead of
  the sampled demand (a forecaster that knows the rate but not the sampling noise): with
  ``hindsight`` it splits the gap to the rules into "forecastable" and "noise".
- ``oracle-quantile[@q]``: the same, for each step's q quantile of the demand sampled anew from
  that rate (the realization unknown): the rule's own margin on a perfect forecast of the rate
  and its noise. A rule at q differs from it only through its forecast (its error, and the
  wider band that error gives the rule's q quantile).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from atoll.envs.observation import RATIO_CAP, model_feature
from atoll.envs.vocabulary import (
    PLANNING_LEVELS,
    POLICY_USAGE,
    PolicySpec,
    check_level,
    parse_risk,
)
from atoll.solvers.errors import InputError, UnknownNameError
from atoll.solvers.problem import Risk

LOST_SHARE = 0.01  # recent unserved share that counts as losing demand
FIXED_INTERVALS: tuple[int, ...] = (1, 2, 3, 6, 12)
# Bands (forecast upper / planned capacity) of the threshold rules in the grid: the default
# [0.5, 1], a tighter one that also releases capacity sooner, and a lazier one.
THRESHOLD_BANDS: tuple[tuple[float, float], ...] = ((0.5, 1.0), (0.7, 1.0), (0.3, 1.1))


class Policy(Protocol):
    name: str
    planning_quantile: float | None

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray: ...

    def reset_options(self) -> dict[str, Any]: ...


@dataclass
class FixedInterval:
    n_models: int
    every: int
    name: str = ""
    planning_quantile: float | None = None
    risk: Risk | None = None  # the rule's +RISK (None: the environment's)
    kind = "fixed"  # the rule's name in the grammar (a class attribute, not a field)

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"{self.kind}:K needs K >= 1 steps, got {self.every}")
        self.name = self.name or f"{self.kind}:{self.every}"

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        step = int(info.get("step", 0))
        due = step > 0 and step % self.every == 0
        return np.full(self.n_models, int(due), dtype=np.int8)

    def reset_options(self) -> dict[str, Any]:
        return {}


@dataclass
class Threshold:
    n_models: int
    low: float = 0.5
    high: float = 1.0
    name: str = "threshold"
    planning_quantile: float | None = None
    risk: Risk | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.low < self.high <= RATIO_CAP:
            raise ValueError(f"threshold band must satisfy 0 <= LOW < HIGH <= {RATIO_CAP}, "
                             f"got LOW={self.low}, HIGH={self.high}")

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        action = np.zeros(self.n_models, dtype=np.int8)
        for i in range(self.n_models):
            upper = model_feature(observation, i, "forecast_upper_ratio") * RATIO_CAP
            lost = model_feature(observation, i, "unserved_share") > LOST_SHARE and \
                model_feature(observation, i, "starting_share") == 0.0
            preempted = model_feature(observation, i, "preempted") > 0.0
            action[i] = int(upper > self.high or upper < self.low or preempted or lost)
        return action

    def reset_options(self) -> dict[str, Any]:
        return {}


@dataclass
class GrowEvery(FixedInterval):
    """``grow:K``: FixedInterval's schedule for the full re-plans, a grow at every other step."""

    kind = "grow"

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        step = int(info.get("step", 0))
        code = 0 if step == 0 else (1 if step % self.every == 0 else 2)  # full, else grow
        return np.full(self.n_models, code, dtype=np.int8)


@dataclass
class _Reference:
    """The fields of the rules that take no parameters (``never``, ``hindsight`` and the oracles):
    each class sets its own ``name``."""

    n_models: int
    name: str = ""
    planning_quantile: float | None = None
    risk: Risk | None = None


@dataclass
class Never(_Reference):
    name: str = "never"

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        return np.zeros(self.n_models, dtype=np.int8)

    def reset_options(self) -> dict[str, Any]:
        return {"initial_plan": "peak"}


@dataclass
class Hindsight(_Reference):
    name: str = "hindsight"
    _ones: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._ones = np.ones(self.n_models, dtype=np.int8)

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        return self._ones.copy()

    def reset_options(self) -> dict[str, Any]:
        return {"planning": "oracle"}


@dataclass
class OracleRate(Hindsight):
    """Re-plans every model every step for the maximum over the look-ahead of the trace's own
    rate (ServeGen's window rate; a smoothed rate of a request log's counts), never the sampled
    counts: what a forecaster that knew the rate but not the sampling noise would plan (a
    reference, not a policy)."""

    name: str = "oracle-rate"

    def reset_options(self) -> dict[str, Any]:
        return {"planning": "oracle-rate"}


@dataclass
class OracleQuantile(Hindsight):
    """Re-plans every model every step for the maximum over the look-ahead of each step's
    quantile, at its planning level (``@q``, else the env's), of the demand sampled anew from the
    trace's own rate: the rule's margin on a forecast that knew the rate and its sampling noise,
    but not the realization (a reference, not a policy)."""

    name: str = "oracle-quantile"

    def reset_options(self) -> dict[str, Any]:
        return {"planning": "oracle-quantile"}


RULES: dict[str, Callable[[int, PolicySpec], Policy]] = {
    "fixed": lambda n, s: FixedInterval(n, s.every or 0),
    "threshold": lambda n, s: Threshold(n, *s.band) if s.band else Threshold(n),
    "grow": lambda n, s: GrowEvery(n, s.every or 0),
    "never": lambda n, s: Never(n),
    "hindsight": lambda n, s: Hindsight(n),
    "oracle-rate": lambda n, s: OracleRate(n),
    "oracle-quantile": lambda n, s: OracleQuantile(n),
}


def make_policy(spec: PolicySpec, n_models: int) -> Policy:
    """A rule policy from its spec: ``fixed:K``, ``threshold``, ``threshold:LOW:HIGH``,
    ``grow:K``, ``oracle-quantile`` (each with an optional ``@q`` planning level), ``never``,
    ``hindsight``, ``oracle-rate``. Its ``name`` is the spec's canonical text (``str(spec)``)."""
    if not spec.is_rule:
        raise UnknownNameError(f"unknown policy {str(spec)!r}; valid: {POLICY_USAGE}"
                               f"{', learned:<model uri>' if spec.is_learned else ''}")
    try:
        policy = RULES[spec.kind](n_models, spec)
    except ValueError as exc:
        raise InputError(f"bad policy {str(spec)!r} ({exc}); use {POLICY_USAGE}") from exc
    policy.name = str(spec)
    policy.planning_quantile = spec.level
    policy.risk = spec.risk  # type: ignore[attr-defined]  # every rule class has the field
    return policy


def rule_specs(levels: Sequence[float] = PLANNING_LEVELS, intervals: Sequence[int] = FIXED_INTERVALS,
               bands: Sequence[tuple[float, float]] = THRESHOLD_BANDS,
               risks: Sequence[str | Risk] = ("neutral",)) -> list[PolicySpec]:
    """The rule family: ``fixed:K@q`` for every K and ``threshold:LOW:HIGH@q`` for every band, at
    every level q, each with every risk of ``risks`` (``neutral``: no suffix; e.g.
    ``("neutral", "h0.85", "h0.7")`` adds ``+h0.85`` and ``+h0.7`` twins of every rule)."""
    for q in levels:
        check_level(q)
    menu = [r if isinstance(r, Risk) else parse_risk(r) for r in risks]
    if not menu or len({r.label() for r in menu}) != len(menu):
        raise InputError(f"rule_grid: risks must be distinct risk labels (e.g. neutral, h0.7), "
                         f"got {list(risks)!r}")
    specs = [PolicySpec("fixed", every=k, level=q, risk=r) for r in menu for q in levels for k in intervals]
    specs += [PolicySpec("threshold", band=band, level=q, risk=r)
              for r in menu for q in levels for band in bands]
    return specs


def rule_grid(levels: Sequence[float] = PLANNING_LEVELS, intervals: Sequence[int] = FIXED_INTERVALS,
              bands: Sequence[tuple[float, float]] = THRESHOLD_BANDS,
              risks: Sequence[str | Risk] = ("neutral",)) -> list[str]:
    """The rule family's names (:func:`rule_specs`' ``str(spec)``, in its order)."""
    return [str(s) for s in rule_specs(levels, intervals, bands, risks)]
