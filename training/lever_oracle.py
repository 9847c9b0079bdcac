"""The lever oracle: how much any policy with a rule's levers could gain over the per-model rule.

A rule's levers are its *presets*: ``fixed:K@q[+RISK]`` options (interval, planning level,
headroom, spread, on-demand floor) it re-plans with. A policy with the same levers chooses one
preset per model at each step; the best it could do is bounded by choosing, in hindsight, the
best preset for each model and each block of hours — at the rule's own forecast (the forecast is
held fixed: a better forecast is the demand oracles' room, not the levers').

**Composed** (:func:`compose`): every preset runs uniformly (one preset, every model) on the same
days and seed, each step's effective cost of each model recorded (node $ + lost tokens x a
price, :func:`step_costs`); the oracle takes, per seed, model and block, the preset of least cost
in that block. The sum of those cells is an *estimate*: models share GPU pools and the spot
market, so a model's cost under preset A depends on the others' presets.

**Run** (:class:`ScheduledRule`): the composed choice is then run as a real policy on the same
days and seed, each model re-planned with its block's preset, so the oracle's figure is a
measured one; both are reported.

**A rule switched by the clock** (:func:`clock_schedule`): the same choice made per hour of the
day on validation days, and run on other days — a state-dependent rule, not an oracle.

**Paired** (:func:`paired_ratio`): figures are ratios per seed (same demand, availability,
preemption draws), summarized as a mean with a 95% t interval over seeds; a ratio whose interval
holds 1 is a tie.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atoll.envs.actions import ActionCodec
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.rollout import Episode, run_policy
from atoll.envs.vocabulary import PolicySpec
from atoll.solvers.errors import InputError
from atoll.solvers.problem import NEUTRAL_RISK, Risk
from atoll.training.evaluate import env_at_level, seed_value
from atoll.training.per_model import Option


def preset_of(spec: PolicySpec) -> Option:
    """``fixed:K@q[+RISK]`` as the option ``(K, q)`` or ``(K, q, risk)``; the level is required
    (a preset plans at a level of its own)."""
    if spec.kind != "fixed" or spec.every is None or spec.level is None:
        raise InputError(f"lever oracle: preset {str(spec)!r} must be fixed:K@q[+RISK] (an interval and a "
                         f"level)")
    risk = spec.risk
    if risk is None or risk.neutral:
        return (spec.every, spec.level)
    return (spec.every, spec.level, risk)


def option_risk(option: Option) -> Risk:
    """The risk an option ``(K, q)`` or ``(K, q, risk)`` takes (neutral without one)."""
    return option[2] if len(option) > 2 else NEUTRAL_RISK


def most_used(options: Sequence[Option], uses: Sequence[int]) -> tuple[float, Risk]:
    """The level and the risk ``options`` use most, each weighted by its ``uses`` (ties: the
    greater): what a rule that mixes presets configures its env at, so its first plan takes them."""
    levels: Counter[float] = Counter()
    risks: Counter[Risk] = Counter()
    for option, n in zip(options, uses, strict=True):
        levels[float(option[1])] += int(n)
        risks[option_risk(option)] += int(n)
    return max(levels, key=lambda q: (levels[q], q)), max(risks, key=lambda r: (risks[r], r))


def risk_menu(configured: Risk, options: Sequence[Option]) -> tuple[Risk, ...]:
    """Every option's risk, the configured one first (the env's ``risk`` action menu)."""
    return (configured, *sorted({option_risk(o) for o in options} - {configured}))


class OptionMenu:
    """What the env of a policy that re-plans each model with one of a menu of options is configured
    with (read by :func:`~atoll.training.evaluate.env_at_level`): every level its options use among
    the action levels, and every risk in its ``risk`` action menu, the configured one first. A
    subclass sets ``planning_quantile`` and ``risk`` (its first plan's) and names its ``options``."""

    planning_quantile: float | None
    risk: Risk | None

    @property
    def options(self) -> tuple[Option, ...]:
        raise NotImplementedError

    @property
    def action_levels(self) -> tuple[float, ...]:
        assert self.planning_quantile is not None
        return tuple(sorted({float(o[1]) for o in self.options} | {self.planning_quantile}))

    @property
    def risk_presets(self) -> tuple[Risk, ...]:
        """Every option's risk, the configured one first (the env's ``risk`` action menu)."""
        assert self.risk is not None
        return risk_menu(self.risk, self.options)


def step_costs(env: FleetEnv, policy: Any, *, days: Sequence[int], seed: int, lost_usd_per_mtok: float
               ) -> tuple[np.ndarray, Episode]:
    """Run ``policy`` over ``days`` (evaluation ``seed``); each step's effective cost per model
    ($, shape ``(steps, models)``: node cost + lost tokens x the price) and the episode."""
    rows: list[list[float]] = []
    price = lost_usd_per_mtok / 1e6

    def record(info: Mapping[str, Any]) -> None:
        rows.append([info["models"][m]["cost_usd"] + info["models"][m]["unserved_tokens"] * price
                     for m in env.models])

    episode = run_policy(env, policy, days=days, seed=seed, on_step=record)
    return np.asarray(rows, dtype=float), episode


def measured(env: FleetEnv, policy: Any, *, days: Sequence[int], seed: int, lost_usd_per_mtok: float
             ) -> tuple[np.ndarray, dict[str, float]]:
    """Run ``policy`` on the env at its level (:func:`~atoll.training.evaluate.env_at_level`) over
    ``days``, contest seed ``seed`` (:func:`~atoll.training.evaluate.seed_value`): its step costs
    per model (:func:`step_costs`) and totals (effective $, node $, SLO attainment, time-limited
    solves, re-optimizations)."""
    costs, episode = step_costs(env_at_level(env, policy, {}), policy, days=days, seed=seed_value(seed),
                                lost_usd_per_mtok=lost_usd_per_mtok)
    t = episode.totals()
    return costs, {"effective_usd": float(costs.sum()), "cost_usd": t["cost_usd"],
                   "slo_attainment": t["slo_attainment"], "time_limited_solves": t["time_limited_solves"],
                   "reoptimizations": t["reoptimizations"]}


def compose(costs: np.ndarray, block_steps: int) -> tuple[np.ndarray, float]:
    """The least-cost preset per block and model: ``costs`` is ``(presets, steps, models)``;
    returns the schedule ``(blocks, models)`` of preset indices (ties: the first preset) and its
    estimated cost (the sum of the chosen cells)."""
    if costs.ndim != 3 or costs.shape[0] < 1:
        raise InputError(f"compose: costs must be (presets, steps, models), got shape {costs.shape}")
    if not (isinstance(block_steps, int) and block_steps >= 1):
        raise InputError(f"compose: block_steps must be an int >= 1, got {block_steps!r}")
    p, steps, m = costs.shape
    blocks = -(-steps // block_steps)
    padded = np.zeros((p, blocks * block_steps, m))
    padded[:, :steps] = costs
    per_block = padded.reshape(p, blocks, block_steps, m).sum(axis=2)  # (presets, blocks, models)
    schedule = per_block.argmin(axis=0)
    estimate = float(np.take_along_axis(per_block, schedule[None], axis=0).sum())
    return schedule, estimate


def clock_schedule(costs: np.ndarray, days: int, block_steps: int) -> np.ndarray:
    """A rule switched by the clock: per model and block of the day, the preset of least cost
    summed over ``days`` whole days of ``costs`` ``(presets, steps, models)`` (chosen on
    validation days, then tiled over the days it runs); ``(blocks per day, models)``."""
    p, steps, m = costs.shape
    if days < 1 or steps % days:
        raise InputError(f"clock_schedule: {steps} steps are not {days} whole days")
    schedule, _ = compose(costs.reshape(p, days, steps // days, m).sum(axis=1), block_steps)
    return schedule


@dataclass
class ScheduledRule:
    """Re-plan model i with preset ``schedule[b, i]`` during block ``b`` (``block_steps`` steps;
    the blocks run on through ``days`` in order): fully at the preset's level taking its risk
    every K steps of the day (step 0 holds, as ``fixed:K`` does). Configured, like a per-model
    rule, at its most common level and risk, with every level and risk it uses in its action."""

    presets: tuple[Option, ...]
    schedule: np.ndarray
    block_steps: int
    days: tuple[int, ...]
    episode_steps: int
    name: str = "lever-oracle"
    planning_quantile: float | None = field(init=False, default=None)
    risk: Risk | None = field(init=False, default=None)
    _codes: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.schedule = np.asarray(self.schedule, dtype=int)
        if self.schedule.ndim != 2 or not self.presets:
            raise InputError(f"ScheduledRule: field 'schedule' must be (blocks, models) of preset indices, "
                             f"got shape {self.schedule.shape}")
        if self.schedule.min() < 0 or self.schedule.max() >= len(self.presets):
            raise InputError(f"ScheduledRule: field 'schedule' holds a preset index outside "
                             f"0..{len(self.presets) - 1}")
        needed = -(-len(self.days) * self.episode_steps // self.block_steps)
        if self.schedule.shape[0] < needed:
            raise InputError(f"ScheduledRule: field 'schedule' has {self.schedule.shape[0]} blocks; "
                             f"{len(self.days)} days of {self.episode_steps} steps need {needed}")
        # the env is configured at the level and risk the schedule uses most
        uses = np.bincount(self.schedule.ravel(), minlength=len(self.presets))
        self.planning_quantile, self.risk = most_used(self.presets, uses.tolist())
        codec = ActionCodec.for_config(self.planning_quantile, self.action_levels, self.risk,
                                       self.risk_presets)
        self._codes = np.array([codec.encode("full", o[1], option_risk(o)) for o in self.presets],
                               dtype=np.int8)
        self._every = np.array([o[0] for o in self.presets], dtype=int)
        self._day_index = {d: i for i, d in enumerate(self.days)}

    @property
    def action_levels(self) -> tuple[float, ...]:
        return tuple(sorted({float(o[1]) for o in self.presets}))

    @property
    def risk_presets(self) -> tuple[Risk, ...]:
        """Every preset's risk, the configured one first (the env's ``risk`` action menu)."""
        assert self.risk is not None
        return risk_menu(self.risk, self.presets)

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        step = int(info.get("step", 0))
        day = int(info.get("day", self.days[0]))
        if day not in self._day_index:
            raise InputError(f"ScheduledRule: day {day} is not among its days {list(self.days)}")
        block = (self._day_index[day] * self.episode_steps + step) // self.block_steps
        chosen = self.schedule[min(block, self.schedule.shape[0] - 1)]
        due = (step > 0) & (step % self._every[chosen] == 0)
        return np.where(due, self._codes[chosen], 0).astype(np.int8)

    def reset_options(self) -> dict[str, Any]:
        return {}


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float], confidence: float = 0.95
                 ) -> dict[str, Any]:
    """Per-seed ratios ``numerator / denominator`` (the same seeds, in order): their mean, std and
    a ``confidence`` t interval of the mean (None with one seed); ``tie`` when it holds 1."""
    a, b = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise InputError(f"paired_ratio: numerator and denominator must be paired per seed, got "
                         f"{len(a)} and {len(b)} values")
    if np.any(b <= 0):
        raise InputError("paired_ratio: the denominator's costs must be > 0")
    return mean_interval(a / b, confidence)


def mean_interval(ratios: Sequence[float] | np.ndarray, confidence: float = 0.95) -> dict[str, Any]:
    """Ratios already paired per seed (a policy's over a rule's on the same seed): their mean, std
    (ddof 1) and a ``confidence`` t interval of the mean (None with one seed); ``tie`` when it
    holds 1."""
    # scipy.stats takes ~0.5 s to import: every `atoll simulate` reads policies through a module
    # that imports this one, and only a report needs an interval
    from scipy import stats

    r = np.asarray(ratios, dtype=float)
    if r.ndim != 1 or len(r) == 0 or not np.isfinite(r).all():
        raise InputError(f"mean_interval: ratios must be a non-empty list of finite numbers, got "
                         f"{r.tolist()}")
    mean, n = float(r.mean()), len(r)
    if n == 1:
        return {"mean": mean, "std": 0.0, "low": None, "high": None, "seeds": 1, "per_seed": r.tolist(),
                "tie": None}
    sd = float(r.std(ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return {"mean": mean, "std": sd, "low": mean - half, "high": mean + half, "seeds": n,
            "per_seed": r.tolist(), "tie": bool(mean - half <= 1.0 <= mean + half)}
