"""A rule switched by the fleet's state: each model re-plans with a *calm* preset, and with an
*alert* preset while a signal of its own is on.

The room before training (``benchmarks/room.py``) puts the most room in the hedged cells, where
choosing each model's preset per block of hours in hindsight beats the per-model rule by 5-8%.
A clock does not carry that choice from validation days to test days; this rule tries the
fleet's state instead, with the rules' own levers (the same presets) and nothing learned:

- the signal is one per-model feature of the observation (:data:`atoll.envs.observation.
  MODEL_FEATURES`) against a threshold, e.g. ``since_preempt <= 12/288``: one of the model's
  instances was preempted within the last hour;
- each step, a model whose signal is on re-plans fully with its alert preset, the others with
  their calm one (every K steps of the preset, step 0 holding, as ``fixed:K`` does).

The env is configured at the calm presets' most common level and risk, or at ``first`` (the
level and risk of the first plan, which a contest sets to its reference rule's so that both
start from the same plan), with every level and risk the rule uses in its action, as a per-model
rule is. Which presets, signal and threshold: chosen on validation days
(``benchmarks/switched.py``), never on the test days.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atoll.envs.actions import ActionCodec
from atoll.envs.observation import MODEL_FEATURES, model_feature
from atoll.solvers.errors import InputError
from atoll.solvers.problem import Risk
from atoll.training.lever_oracle import OptionMenu, most_used, option_risk
from atoll.training.per_model import Option

FEATURES = tuple(f[0] for f in MODEL_FEATURES)


@dataclass(frozen=True)
class Signal:
    """``feature`` (a per-model observation feature) ``<=`` ``threshold`` (``above``: ``>=``)."""

    feature: str
    threshold: float
    above: bool = False

    def __post_init__(self) -> None:
        if self.feature not in FEATURES:
            raise InputError(f"Signal: field 'feature' must be one of {', '.join(FEATURES)}, got "
                             f"{self.feature!r}")
        if not isinstance(self.threshold, int | float) or not np.isfinite(self.threshold):
            raise InputError(f"Signal: field 'threshold' must be a finite number, got {self.threshold!r}")

    def on(self, observation: np.ndarray, model_index: int) -> bool:
        value = model_feature(observation, model_index, self.feature)
        return value >= self.threshold if self.above else value <= self.threshold

    @property
    def label(self) -> str:
        return f"{self.feature}{'>=' if self.above else '<='}{self.threshold:g}"


@dataclass
class SwitchedRule(OptionMenu):
    """Model i re-plans with ``alert[i]`` while ``signal`` is on for it, else with ``calm[i]``
    (options ``(K, q)`` or ``(K, q, risk)``; module docstring)."""

    calm: tuple[Option, ...]
    alert: tuple[Option, ...]
    signal: Signal
    name: str = "switched"
    first: tuple[float, Risk] | None = None
    planning_quantile: float | None = field(init=False, default=None)
    risk: Risk | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not self.calm or len(self.calm) != len(self.alert):
            raise InputError(f"SwitchedRule: fields 'calm' and 'alert' must give one option per model, got "
                             f"{len(self.calm)} and {len(self.alert)}")
        if self.first is not None:
            self.planning_quantile, self.risk = float(self.first[0]), self.first[1]
        else:
            self.planning_quantile, self.risk = most_used(self.calm, [1] * len(self.calm))
        codec = ActionCodec.for_config(self.planning_quantile, self.action_levels, self.risk,
                                       self.risk_presets)
        self._codes = np.array([[codec.encode("full", o[1], option_risk(o)) for o in pair]
                                for pair in zip(self.calm, self.alert, strict=True)], dtype=np.int8)
        self._every = np.array([[o[0] for o in pair] for pair in zip(self.calm, self.alert, strict=True)],
                               dtype=int)

    @property
    def options(self) -> tuple[Option, ...]:
        return (*self.calm, *self.alert)

    def alerts(self, observation: np.ndarray) -> np.ndarray:
        """[models] whether each model's signal is on."""
        return np.array([self.signal.on(observation, i) for i in range(len(self.calm))], dtype=bool)

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        step = int(info.get("step", 0))
        chosen = self.alerts(observation).astype(int)
        rows = np.arange(len(self.calm))
        every = self._every[rows, chosen]
        due = (step > 0) & (step % every == 0)
        return np.where(due, self._codes[rows, chosen], 0).astype(np.int8)

    def reset_options(self) -> dict[str, Any]:
        return {}


def uniform(calm: Option, alert: Option, signal: Signal, n_models: int, name: str = "",
            first: tuple[float, Risk] | None = None) -> SwitchedRule:
    """The same calm and alert presets for every model."""
    return SwitchedRule((calm,) * n_models, (alert,) * n_models, signal, name=name or "switched", first=first)


def describe(calm: Sequence[str], alert: Sequence[str], signal: Signal) -> str:
    """A name for reports: ``switched(calm -> alert when signal)``."""
    c, a = ",".join(dict.fromkeys(calm)), ",".join(dict.fromkeys(alert))
    return f"switched({c} -> {a} when {signal.label})"
