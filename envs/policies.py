"""Trigger policies: which models to re-optimize at each step.

Every policy — rule-based here, learned in ``training`` — has one interface:
``act(observation, info) -> action`` (a 0/1 vector, one entry per model) and
``reset_options() -> dict`` (options the environment's ``reset`` needs for it; the ``never``
policy starts from a plan for the day's peak, ``hindsight`` plans with the true demand).

- ``fixed:K``: every model every K steps (K=1 at 5-min steps is close to Coral's 6-minute
  re-solve period).
- ``threshold[:LOW:HIGH]``: re-plan a model when its forecast upper quantile over the
  look-ahead / planned capacity leaves [LOW, HIGH] (default [0.5, 1.0]), when it recently lost
  more than 1% of its demand with nothing starting, or after one of its instances was preempted.
- ``never``: one plan for the day's peak (forecast as the previous day's peak), never changed.
- ``hindsight``: re-plans every model every step for the *true* demand over the look-ahead — a
  reference bound, not a deployable policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from atoll.envs.observation import RATIO_CAP, model_feature
from atoll.solvers.errors import InputError, UnknownNameError

LOST_SHARE = 0.01  # recent unserved share that counts as losing demand


class Policy(Protocol):
    name: str

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray: ...

    def reset_options(self) -> dict[str, Any]: ...


@dataclass
class FixedInterval:
    n_models: int
    every: int
    name: str = ""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"fixed:K needs K >= 1 steps, got {self.every}")
        self.name = self.name or f"fixed:{self.every}"

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
class Never:
    n_models: int
    name: str = "never"

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        return np.zeros(self.n_models, dtype=np.int8)

    def reset_options(self) -> dict[str, Any]:
        return {"initial_plan": "peak"}


@dataclass
class Hindsight:
    n_models: int
    name: str = "hindsight"
    _ones: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._ones = np.ones(self.n_models, dtype=np.int8)

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        return self._ones.copy()

    def reset_options(self) -> dict[str, Any]:
        return {"planning": "oracle"}


RULES: dict[str, Callable[[int, list[str]], Policy]] = {
    "fixed": lambda n, args: FixedInterval(n, int(args[0])),
    "threshold": lambda n, args: Threshold(n, float(args[0]), float(args[1])) if args else Threshold(n),
    "never": lambda n, args: Never(n),
    "hindsight": lambda n, args: Hindsight(n),
}


def make_policy(spec: str, n_models: int) -> Policy:
    """A rule policy from its name: ``fixed:K``, ``threshold``, ``threshold:LOW:HIGH``, ``never``,
    ``hindsight``."""
    kind, *args = spec.strip().split(":")
    if kind not in RULES:
        raise UnknownNameError(f"unknown policy {spec!r}; valid: fixed:K, threshold[:LOW:HIGH], never, "
                               f"hindsight{', learned:<model uri>' if kind == 'learned' else ''}")
    try:
        if kind == "fixed" and len(args) != 1 or kind == "threshold" and len(args) not in (0, 2) \
                or kind in ("never", "hindsight") and args:
            raise ValueError("wrong number of arguments")
        policy = RULES[kind](n_models, args)
    except ValueError as exc:
        raise InputError(f"bad policy {spec!r} ({exc}); use fixed:K (K >= 1 steps), "
                         f"threshold or threshold:LOW:HIGH, never, hindsight") from exc
    policy.name = spec.strip()
    return policy
