"""A learned preset chooser: a contextual bandit over the rules' presets, one linear head shared
by every model, trained offline from full-information runs.

The room before training (``benchmarks/room.py``) bounds what a policy with the rules' levers
could gain over the per-model rule: choosing each model's preset per hour in hindsight. A rule
switched by recent preemptions (:mod:`atoll.training.switched_rule`) takes part of that room with
one signal; this policy *learns* the switch from every per-model signal the observation carries.

**Arms.** The presets ``fixed:K@q[+RISK]`` of the room (e.g. ``fixed:1@0.9``, ``+h0.85``,
``+h0.7``). The *reference* is a rule's option per model (the per-model rule): the policy departs
from it only where it predicts a gain.

**Data** (:func:`collect`): on training days, for each seed, the reference rule and each preset
run uniformly (the same demand, availability and preemption draws), each step's effective cost
per model recorded (node $ + lost tokens x a price, :func:`~atoll.training.lever_oracle.step_costs`).
The contexts are the reference run's observations: per model, every feature of its own
(``<model>/...``), the fleet's (time of day, cost rate, spare on-demand) and the pools'
(preempted, refused), and a bias.

**Target.** Per step t, model m and preset p: the relative gain of p over the next ``horizon``
steps of the day, ``(C_p[t:t+H, m] - C_ref[t:t+H, m]) / (H x mean step cost of m under the
reference)``. Every arm's outcome is observed at every step (full information), so this is
regression, not exploration. It is approximate in the same way as the lever oracle's composed
estimate: a preset's cost comes from its own uniform run's state, not from switching into it.

**Model** (:func:`fit`): ridge regression per arm on standardized contexts, pooled over models
and seeds (one head for every model, so a model's scale does not matter and a fleet's models
share what they teach).

**Policy** (:class:`PresetBandit`): every ``hold`` steps (the horizon the gains were learned
over), for each model, the arm of least predicted gain when it is below ``-margin``, else the
reference option; held for the block, it re-plans with that preset every K steps of it (step 0
holds). ``margin`` is chosen on validation days, never on the test days
(``benchmarks/bandit.py``). The first plan is made at the reference rule's level and risk, so a
contest pairs the two from the same plan.

**A file** (:func:`save`, :func:`load`): the heads, the arms, the reference, the margin and the
observation layout they read (models, GPU types, observation version) in one JSON document;
``learned:file:PATH.json`` runs it wherever :func:`~atoll.training.evaluate.resolve_policy` reads a
policy (``atoll simulate --policy``, ``atoll evaluate --policies``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from atoll.envs.actions import ActionCodec
from atoll.envs.config import OBSERVATIONS
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.observation import FLEET_FEATURES, POOL_FEATURES, feature_names
from atoll.envs.vocabulary import PolicySpec, parse_policy
from atoll.solvers.errors import InputError
from atoll.solvers.problem import Risk
from atoll.training.lever_oracle import OptionMenu, most_used, option_risk, preset_of, step_costs
from atoll.training.per_model import Option

# A model's re-plan age is the same under every every-step preset: it says nothing of the arm.
_SKIPPED = ("since_reopt",)


def reference_options(spec: PolicySpec, n_models: int) -> tuple[Option, ...]:
    """A ``fixed:K@q[+RISK]`` rule (every model) or a ``per-model:...`` assignment as one option
    per model."""
    if spec.is_per_model:
        if len(spec.entries) != n_models:
            raise InputError(f"preset bandit: reference {str(spec)!r} gives {len(spec.entries)} entries for "
                             f"{n_models} models")
        return tuple(spec.entries)
    return (preset_of(spec),) * n_models


def context_layout(names: Sequence[str], models: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Column indices ``(models, features)`` into an observation with entry ``names``
    (:attr:`FleetEnv.feature_names`), and the features' names (the model's prefix dropped)."""
    index = {n: i for i, n in enumerate(names)}
    shared = [f[0] for f in FLEET_FEATURES if f[0] in index]
    shared += [n for n in names if any(n.startswith(f"{f[0]}/") for f in POOL_FEATURES)]
    own = [n.split("/", 1)[1] for n in names if n.startswith(f"{models[0]}/")]
    own = [f for f in own if f not in _SKIPPED]
    cols = np.array([[index[f"{m}/{f}"] for f in own] + [index[s] for s in shared] for m in models],
                    dtype=int)
    return cols, own + shared


@dataclass(frozen=True)
class BanditData:
    """Contexts ``(rows, features)`` and relative gains ``(rows, arms)`` (module docstring), one row
    per step, model and seed of the training days."""

    contexts: np.ndarray
    gains: np.ndarray
    features: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.contexts.ndim != 2 or self.gains.ndim != 2 or len(self.contexts) != len(self.gains):
            raise InputError(f"BanditData: fields 'contexts' {self.contexts.shape} and 'gains' "
                             f"{self.gains.shape} must be 2-d with one row each per sample")
        if self.contexts.shape[1] != len(self.features):
            raise InputError(f"BanditData: field 'features' names {len(self.features)} columns, contexts "
                             f"have {self.contexts.shape[1]}")


class _Recorder:
    """A policy's wrapper that keeps each observation it is shown (the contexts)."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.observations: list[np.ndarray] = []
        self.name = getattr(policy, "name", "recorded")
        for attr in ("planning_quantile", "risk", "action_levels", "risk_presets"):
            if hasattr(policy, attr):
                setattr(self, attr, getattr(policy, attr))

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        self.observations.append(np.asarray(observation, dtype=float).copy())
        return np.asarray(self.policy.act(observation, info))

    def reset_options(self) -> dict[str, Any]:
        return dict(self.policy.reset_options())


def window_sums(costs: np.ndarray, horizon: int, episode_steps: int) -> np.ndarray:
    """``costs`` ``(steps, models)`` summed over the next ``horizon`` steps of the same day."""
    if costs.shape[0] % episode_steps:
        raise InputError(f"preset bandit: {costs.shape[0]} steps are not whole days of {episode_steps}")
    days = costs.reshape(-1, episode_steps, costs.shape[1])
    c = np.concatenate([np.zeros((days.shape[0], 1, days.shape[2])), np.cumsum(days, axis=1)], axis=1)
    ends = np.minimum(np.arange(episode_steps) + horizon, episode_steps)
    return (c[:, ends] - c[:, :episode_steps]).reshape(costs.shape)


def collect(env: FleetEnv, reference: Any, arms: Sequence[Any], *, days: Sequence[int], seed: int,
            horizon: int, lost_usd_per_mtok: float, env_for: Any) -> tuple[np.ndarray, np.ndarray]:
    """One seed's rows: contexts ``(steps x models, features)`` from the reference run and the
    relative gains ``(steps x models, arms)`` of each arm (a policy run uniformly) over it.
    ``env_for(policy)`` is the env a policy runs on (its level and risk)."""
    recorder = _Recorder(reference)
    ref_costs, _ = step_costs(env_for(reference), recorder, days=days, seed=seed,
                              lost_usd_per_mtok=lost_usd_per_mtok)
    cols, _ = context_layout(env.feature_names, env.models)
    obs = np.stack(recorder.observations)  # (steps, entries)
    contexts = obs[:, cols].reshape(-1, cols.shape[1])  # rows: step-major, then model
    steps = env.config.episode_steps
    ref_window = window_sums(ref_costs, horizon, steps)
    scale = np.maximum(ref_costs.mean(axis=0), 1e-9) * horizon  # a model's typical window cost
    gains = []
    for arm in arms:
        costs, _ = step_costs(env_for(arm), arm, days=days, seed=seed, lost_usd_per_mtok=lost_usd_per_mtok)
        gains.append(((window_sums(costs, horizon, steps) - ref_window) / scale).reshape(-1))
    return contexts, np.stack(gains, axis=1)


@dataclass(frozen=True)
class LinearHeads:
    """Ridge regression per arm on standardized contexts: ``predict(x) = ((x - mean) / std) @ w + b``."""

    features: tuple[str, ...]
    mean: np.ndarray
    std: np.ndarray
    weights: np.ndarray  # (features, arms)
    bias: np.ndarray  # (arms,)

    def predict(self, contexts: np.ndarray) -> np.ndarray:
        return ((contexts - self.mean) / self.std) @ self.weights + self.bias

    def to_dict(self) -> dict[str, Any]:
        return {"features": list(self.features), "mean": self.mean.tolist(), "std": self.std.tolist(),
                "weights": self.weights.tolist(), "bias": self.bias.tolist()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> LinearHeads:
        try:
            return cls(tuple(doc["features"]), np.asarray(doc["mean"], float), np.asarray(doc["std"], float),
                       np.asarray(doc["weights"], float), np.asarray(doc["bias"], float))
        except KeyError as exc:
            raise InputError(f"preset bandit: heads lack the key {exc.args[0]!r}; save them with "
                             f"LinearHeads.to_dict") from exc


def fit(data: BanditData, *, alpha: float = 10.0) -> LinearHeads:
    """Ridge heads (penalty ``alpha`` on standardized contexts, the bias unpenalized)."""
    if not alpha >= 0:
        raise InputError(f"preset bandit: alpha must be >= 0, got {alpha!r}")
    x, y = data.contexts, data.gains
    mean, std = x.mean(axis=0), x.std(axis=0)
    std = np.where(std > 1e-9, std, 1.0)  # a constant feature contributes nothing
    z = (x - mean) / std
    ym = y.mean(axis=0)
    # least squares, not solve: a constant feature (all zeros once standardized) leaves the system
    # singular at alpha 0, and the minimum-norm answer gives it no weight
    w = np.linalg.lstsq(z.T @ z + alpha * np.eye(z.shape[1]), z.T @ (y - ym), rcond=None)[0]
    return LinearHeads(data.features, mean, std, w, ym)


@dataclass
class PresetBandit(OptionMenu):
    """Model i re-plans with the arm of least predicted gain when it is below ``-margin``, else with
    ``reference[i]`` (module docstring). Configured at ``first`` (level, risk), or the reference's
    most common level and risk."""

    arms: tuple[Option, ...]
    reference: tuple[Option, ...]
    heads: LinearHeads
    columns: np.ndarray  # (models, features): observation indices (context_layout)
    margin: float = 0.0
    hold: int = 1
    name: str = "preset-bandit"
    first: tuple[float, Risk] | None = None
    observation_size: int | None = None  # the layout's entries (checked at every step when given)
    planning_quantile: float | None = field(init=False, default=None)
    risk: Risk | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not self.arms or self.heads.weights.shape[1] != len(self.arms):
            raise InputError(f"PresetBandit: field 'heads' predicts {self.heads.weights.shape[1]} arms, "
                             f"'arms' holds {len(self.arms)}")
        if self.columns.shape != (len(self.reference), len(self.heads.features)):
            raise InputError(f"PresetBandit: field 'columns' must be (models, features) = "
                             f"({len(self.reference)}, {len(self.heads.features)}), got {self.columns.shape}")
        if not self.margin >= 0:
            raise InputError(f"PresetBandit: field 'margin' must be >= 0, got {self.margin!r}")
        if not (isinstance(self.hold, int) and self.hold >= 1):
            raise InputError(f"PresetBandit: field 'hold' must be an int >= 1 step, got {self.hold!r}")
        if self.first is not None:
            self.planning_quantile, self.risk = float(self.first[0]), self.first[1]
        else:
            self.planning_quantile, self.risk = most_used(self.reference, [1] * len(self.reference))
        codec = ActionCodec.for_config(self.planning_quantile, self.action_levels, self.risk,
                                       self.risk_presets)
        # choice index 0 is the model's reference option, 1 + a the arm a
        self._codes = np.array([[codec.encode("full", o[1], option_risk(o)) for o in (ref, *self.arms)]
                                for ref in self.reference], dtype=np.int8)
        self._every = np.array([[o[0] for o in (ref, *self.arms)] for ref in self.reference], dtype=int)
        self.choices: list[np.ndarray] = []  # each step's choice per model (for reports)
        self._held = np.zeros(len(self.reference), dtype=int)

    @property
    def options(self) -> tuple[Option, ...]:
        return (*self.reference, *self.arms)

    def choose(self, observation: np.ndarray) -> np.ndarray:
        """[models] 0 (the reference) or 1 + the arm chosen."""
        if self.observation_size is not None and len(observation) != self.observation_size:
            raise InputError(f"{self.name}: observations of {len(observation)} entries, its heads read "
                             f"{self.observation_size} (another fleet or observation version); run it on "
                             f"the fleet and world it was trained on")
        predicted = self.heads.predict(np.asarray(observation, dtype=float)[self.columns])
        best = predicted.argmin(axis=1)
        gain = predicted[np.arange(len(best)), best]
        return np.where(gain < -self.margin, best + 1, 0)

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        step = int(info.get("step", 0))
        if step % self.hold == 0:  # a choice holds for its block, as the gains it learned from
            self._held = self.choose(observation)
        chosen = self._held
        self.choices.append(chosen)
        rows = np.arange(len(self.reference))
        every = self._every[rows, chosen]
        due = (step > 0) & (step % every == 0)
        return np.where(due, self._codes[rows, chosen], 0).astype(np.int8)

    def reset_options(self) -> dict[str, Any]:
        return {}


KIND, VERSION = "atoll-preset-bandit", 1


def save(path: Path, heads: LinearHeads, *, arms: Sequence[str], reference: str, margin: float,
         horizon: int, env: FleetEnv, provenance: Mapping[str, Any]) -> None:
    """The learned heads with what they choose among, the observation layout of ``env`` they read
    and how they were made (one JSON file, :func:`load` reads it)."""
    from atoll.solvers.files import atomic_write_text

    layout = {"models": list(env.models), "gpu_types": list(env.gpu_types),
              "observation": env.config.observation}
    doc = {"kind": KIND, "version": VERSION, "arms": list(arms), "reference": reference, "margin": margin,
           "horizon": horizon, "layout": layout, "heads": heads.to_dict(), "provenance": dict(provenance)}
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")


def is_bandit_file(path: Path) -> bool:
    """A ``.json`` policy file is a preset bandit's (a PPO policy file is a folder)."""
    return path.suffix == ".json"


def load(path: Path, n_models: int, name: str | None = None) -> PresetBandit:
    """The policy a :func:`save` file holds, for a fleet of ``n_models`` models."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"preset bandit file {str(path)!r} does not exist; benchmarks/bandit.py writes one "
                         f"per cell (bandit.json in its run folder)") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"preset bandit file {str(path)!r} is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("version") != VERSION:
        raise InputError(f"{str(path)!r} is not a preset bandit file (kind {KIND!r}, version {VERSION}); got "
                         f"kind {doc.get('kind') if isinstance(doc, dict) else None!r}")
    try:
        layout, arms, reference = doc["layout"], doc["arms"], doc["reference"]
        margin, hold = float(doc["margin"]), int(doc["horizon"])
    except KeyError as exc:
        raise InputError(f"preset bandit file {str(path)!r} lacks the key {exc.args[0]!r}") from None
    models = list(layout["models"])
    if len(models) != n_models:
        raise InputError(f"preset bandit file {str(path)!r} was trained for {len(models)} models "
                         f"({', '.join(models)}), this fleet has {n_models}")
    if layout["observation"] not in OBSERVATIONS:
        raise InputError(f"preset bandit file {str(path)!r}: observation {layout['observation']!r} is not "
                         f"one of {', '.join(OBSERVATIONS)}")
    names = feature_names(models, layout["gpu_types"], closed_loop=layout["observation"] in ("v2", "v3"),
                          risk=layout["observation"] == "v3")
    columns, _ = context_layout(names, models)
    heads = LinearHeads.from_dict(doc["heads"])
    return PresetBandit(tuple(preset_of(parse_policy(a)) for a in arms),
                        reference_options(parse_policy(reference), n_models), heads, columns, margin=margin,
                        hold=hold, name=name or f"learned:file:{path}", observation_size=len(names))
