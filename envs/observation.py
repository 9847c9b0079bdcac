"""The observation vector, built in one place for the simulator and the live controller.

Both fill a :class:`Signals` from what they know (the env from its state, the controller from
metrics and its persisted plan) and call :func:`build_observation`; a policy trained in the env
therefore sees the same features, scaled the same way, in production.

Layout: ``MODEL_FEATURES`` for model 0, then model 1, ..., then ``headroom/<gpu type>`` for each
GPU type, then ``FLEET_FEATURES``; the ``v2`` observation (``atoll/Fleet-v2``) appends
``CLOSED_LOOP_FEATURES`` for model 0, then model 1, ... — appended, so every ``v1`` index keeps its
meaning; the ``v3`` observation (``atoll/Fleet-v3``) appends to ``v2``'s ``RISK_FEATURES`` for
model 0, model 1, ..., then ``POOL_FEATURES`` for each GPU type (``preempted/<gpu type>``,
``refused/<gpu type>``, the first type's pair first). Every entry is finite and lies
in its stated bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

RATIO_CAP = 4.0  # demand/capacity ratios above 4 carry no more information for the decision
SINCE_CAP = 288  # steps since a re-optimization saturate at one day (of 5-min steps)
COST_CAP = 4.0  # cost rate relative to the episode's initial plan

# name, unit, low, high (of the value in the vector)
MODEL_FEATURES: tuple[tuple[str, str, float, float], ...] = (
    ("demand_ratio", "max over phases of last step's demand / ready capacity, / 4", 0.0, 1.0),
    ("forecast_mean_ratio", "max over phases and look-ahead of forecast mean / planned capacity, / 4",
     0.0, 1.0),
    ("forecast_upper_ratio", "same with the planning quantile, / 4", 0.0, 1.0),
    ("starting_share", "capacity still starting / planned capacity (min over phases)", 0.0, 1.0),
    ("since_reopt", "steps since the model's last re-optimization / 288, capped at 1", 0.0, 1.0),
    ("unserved_share", "share of its demand (tokens) not served within SLO, mean of the last 3 steps",
     0.0, 1.0),
    ("cost_share", "its share of last step's fleet cost", 0.0, 1.0),
    ("preempted", "1 if an instance of the model was preempted at the last step boundary", 0.0, 1.0),
    ("forecast_trend", "max over phases of (forecast mean at the end of the look-ahead - at its start) "
     "/ planned capacity, / 4", -1.0, 1.0),
    ("interval_width", "max over phases and look-ahead of (planning quantile - mean) / planned capacity, / 4",
     0.0, 1.0),
    ("surplus", "min over phases of (planned capacity - planning quantile) / planned capacity", -1.0, 1.0),
    ("since_preempt", "steps since one of its instances was last preempted / 288, capped at 1", 0.0, 1.0),
)
FLEET_FEATURES: tuple[tuple[str, str, float, float], ...] = (
    ("time_sin", "sin(2 pi x seconds of day / 86400)", -1.0, 1.0),
    ("time_cos", "cos(2 pi x seconds of day / 86400)", -1.0, 1.0),
    ("cost_rate", "last step's fleet cost rate / the initial plan's, / 4", 0.0, 1.0),
    ("spare_ondemand", "hedged market: on-demand nodes offered and not held / offered (0 otherwise)",
     0.0, 1.0),
)

# the closed loop's features (``atoll/Fleet-v2``), per model: what the servers report and what the
# planner learned from it
CLOSED_LOOP_FEATURES: tuple[tuple[str, str, float, float], ...] = (
    ("latency_ratio", "max over phases of last step's mean latency (TTFT, inter-token) / its SLO budget, "
     "capped at 2, / 2", 0.0, 1.0),
    ("waiting_share", "requests waiting / (waiting + running) at the end of the last step", 0.0, 1.0),
    ("correction", "min over phases of (planned capacity x learned factors) / planned capacity, "
     "(ratio - 0.5) / 1", 0.0, 1.0),
)
LATENCY_CAP = 2.0
RISK_WINDOW = 12  # steps the preemption and acquisition counts look back (one hour of 5-min steps)

# the observations of risk (``atoll/Fleet-v3``): per model, then per GPU type (its pools in every
# region and tier)
RISK_FEATURES: tuple[tuple[str, str, float, float], ...] = (
    ("queue_growth", "change of requests waiting over the last step / (waiting + running) at its end, "
     "clipped to [-1, 1]", -1.0, 1.0),
    ("latency_miss", "share of the last step's requests over a latency budget (TTFT or inter-token)",
     0.0, 1.0),
    ("spread", "largest share of its planned capacity on one spot pool (a region's spot market), max over "
     "phases", 0.0, 1.0),
    ("ondemand_share", "share of its planned capacity on on-demand nodes, min over phases", 0.0, 1.0),
)
POOL_FEATURES: tuple[tuple[str, str, float, float], ...] = (
    ("preempted", "nodes of the GPU type preempted over the last 12 steps / (those + nodes held now)",
     0.0, 1.0),
    ("refused", "nodes of the GPU type requested and refused (failed acquisitions) over the last 12 steps "
     "/ nodes requested", 0.0, 1.0),
)


@dataclass(frozen=True)
class Signals:
    """What a decision is made from. Per-model arrays have one row per model; per-phase arrays
    have columns (prefill, decode); demand and capacity in tokens/s."""

    demand: np.ndarray  # [M, 2] last step's demand
    forecast_mean: np.ndarray  # [M, 2] max over the look-ahead
    forecast_upper: np.ndarray  # [M, 2] max over the look-ahead, planning quantile
    forecast_first: np.ndarray  # [M, 2] forecast mean of the look-ahead's first step
    forecast_last: np.ndarray  # [M, 2] forecast mean of the look-ahead's last step
    ready_capacity: np.ndarray  # [M, 2]
    planned_capacity: np.ndarray  # [M, 2] ready + starting
    since_reopt: np.ndarray  # [M] steps
    unserved_share: np.ndarray  # [M] in [0, 1]
    cost_share: np.ndarray  # [M] in [0, 1]
    preempted: np.ndarray  # [M] 0/1
    since_preempt: np.ndarray  # [M] steps since the model's last preemption (SINCE_CAP: never)
    headroom: np.ndarray  # [G] per GPU type: (capacity - held) / capacity, 0 when none offered
    seconds_of_day: float
    cost_rate_ratio: float  # last step's $/h over the initial plan's $/h
    spare_ondemand: float  # hedged: share of the on-demand quota not held; 0 otherwise
    # closed-loop signals (the v2 observation); None: not observed (v1)
    latency_ratio: np.ndarray | None = None  # [M] max over phases of mean latency / SLO budget
    waiting_share: np.ndarray | None = None  # [M] waiting / (waiting + running)
    correction: np.ndarray | None = None  # [M] min over phases of corrected / model planned capacity
    # observations of risk (the v3 observation); None: not observed
    queue_growth: np.ndarray | None = None  # [M] change of waiting / (waiting + running), in [-1, 1]
    latency_miss: np.ndarray | None = None  # [M] share of requests over a latency budget
    spread: np.ndarray | None = None  # [M] largest share of planned capacity on one spot pool
    ondemand_share: np.ndarray | None = None  # [M] share of planned capacity on on-demand
    preempted_share: np.ndarray | None = None  # [G] nodes preempted in the window / (those + held)
    failed_share: np.ndarray | None = None  # [G] nodes not obtained in the window / requested


def feature_names(models: Sequence[str], gpu_types: Sequence[str], closed_loop: bool = False,
                  risk: bool = False) -> list[str]:
    """Every entry's name in order; ``risk`` (the ``v3`` observation) implies ``closed_loop``."""
    names = [f"{m}/{f[0]}" for m in models for f in MODEL_FEATURES]
    names += [f"headroom/{g}" for g in gpu_types]
    names += [f[0] for f in FLEET_FEATURES]
    if closed_loop or risk:
        names += [f"{m}/{f[0]}" for m in models for f in CLOSED_LOOP_FEATURES]
    if risk:
        names += [f"{m}/{f[0]}" for m in models for f in RISK_FEATURES]
        names += [f"{f[0]}/{g}" for g in gpu_types for f in POOL_FEATURES]
    return names


def observation_size(n_models: int, n_gpu_types: int, closed_loop: bool = False, risk: bool = False) -> int:
    extra = len(CLOSED_LOOP_FEATURES) * n_models if closed_loop or risk else 0
    if risk:
        extra += len(RISK_FEATURES) * n_models + len(POOL_FEATURES) * n_gpu_types
    return len(MODEL_FEATURES) * n_models + n_gpu_types + len(FLEET_FEATURES) + extra


def observation_space(n_models: int, n_gpu_types: int, closed_loop: bool = False,
                      risk: bool = False) -> spaces.Box:
    def block(features: tuple[tuple[str, str, float, float], ...], n: int, col: int) -> np.ndarray:
        return np.tile([f[col] for f in features], n)

    bounds = []
    for col in (2, 3):
        parts = [block(MODEL_FEATURES, n_models, col), np.full(n_gpu_types, float(col == 3)),
                 np.asarray([f[col] for f in FLEET_FEATURES])]
        if closed_loop or risk:
            parts.append(block(CLOSED_LOOP_FEATURES, n_models, col))
        if risk:
            parts += [block(RISK_FEATURES, n_models, col), block(POOL_FEATURES, n_gpu_types, col)]
        bounds.append(np.concatenate(parts).astype(np.float32))
    return spaces.Box(low=bounds[0], high=bounds[1], dtype=np.float32)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den capped at RATIO_CAP; demand against no capacity is the cap, no demand is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, RATIO_CAP, 0.0))
    return np.clip(r, 0.0, RATIO_CAP)


def _signed_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den in [-RATIO_CAP, RATIO_CAP]; against no capacity, +-RATIO_CAP by num's sign."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.sign(num) * RATIO_CAP)
    return np.clip(r, -RATIO_CAP, RATIO_CAP)


def build_observation(s: Signals, closed_loop: bool = False, risk: bool = False) -> np.ndarray:
    """The float32 observation vector (see the module docstring for the layout); ``closed_loop``
    appends ``CLOSED_LOOP_FEATURES`` (the ``v2`` observation), ``risk`` those and then
    ``RISK_FEATURES`` and ``POOL_FEATURES`` (the ``v3`` observation); a risk signal left None
    reads as none seen (0)."""
    demand = _ratio(s.demand, s.ready_capacity).max(axis=1) / RATIO_CAP
    fmean = _ratio(s.forecast_mean, s.planned_capacity).max(axis=1) / RATIO_CAP
    fupper = _ratio(s.forecast_upper, s.planned_capacity).max(axis=1) / RATIO_CAP
    starting = s.planned_capacity - s.ready_capacity
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(s.planned_capacity > 0, starting / np.where(s.planned_capacity > 0,
                                                                      s.planned_capacity, 1.0), 0.0)
    starting_share = np.clip(share.min(axis=1), 0.0, 1.0)
    since = np.minimum(np.asarray(s.since_reopt, dtype=float), SINCE_CAP) / SINCE_CAP
    planned = s.planned_capacity
    trend = _signed_ratio(s.forecast_last - s.forecast_first, planned).max(axis=1) / RATIO_CAP
    width = _ratio(np.maximum(s.forecast_upper - s.forecast_mean, 0.0), planned).max(axis=1) / RATIO_CAP
    with np.errstate(divide="ignore", invalid="ignore"):
        surplus = np.where(planned > 0, (planned - s.forecast_upper) / np.where(planned > 0, planned, 1.0),
                           np.where(s.forecast_upper > 0, -1.0, 0.0))
    surplus = np.clip(surplus.min(axis=1), -1.0, 1.0)
    preempt = np.minimum(np.asarray(s.since_preempt, dtype=float), SINCE_CAP) / SINCE_CAP
    per_model = np.stack([demand, fmean, fupper, starting_share, since,
                          np.clip(s.unserved_share, 0.0, 1.0), np.clip(s.cost_share, 0.0, 1.0),
                          np.clip(s.preempted, 0.0, 1.0), trend, width, surplus, preempt], axis=1)
    angle = 2.0 * np.pi * (s.seconds_of_day % 86400.0) / 86400.0
    cost = min(max(s.cost_rate_ratio, 0.0), COST_CAP) / COST_CAP if np.isfinite(s.cost_rate_ratio) else 1.0
    parts = [per_model.ravel(), np.clip(s.headroom, 0.0, 1.0),
             [np.sin(angle), np.cos(angle), cost, np.clip(s.spare_ondemand, 0.0, 1.0)]]
    if closed_loop or risk:
        m = len(s.since_reopt)
        lat = s.latency_ratio if s.latency_ratio is not None else np.zeros(m)
        wait = s.waiting_share if s.waiting_share is not None else np.zeros(m)
        corr = s.correction if s.correction is not None else np.ones(m)
        lat = np.clip(np.nan_to_num(np.asarray(lat, dtype=float), nan=0.0), 0.0, LATENCY_CAP) / LATENCY_CAP
        corr = np.clip(np.nan_to_num(np.asarray(corr, dtype=float), nan=1.0) - 0.5, 0.0, 1.0)
        parts.append(np.stack([lat, np.clip(np.asarray(wait, dtype=float), 0.0, 1.0), corr], axis=1).ravel())
    if risk:
        m, g = len(s.since_reopt), len(s.headroom)

        def arr(v: np.ndarray | None, n: int, lo: float = 0.0) -> np.ndarray:
            a = np.zeros(n) if v is None else np.nan_to_num(np.asarray(v, dtype=float), nan=0.0)
            return np.clip(a, lo, 1.0)

        parts.append(np.stack([arr(s.queue_growth, m, -1.0), arr(s.latency_miss, m), arr(s.spread, m),
                               arr(s.ondemand_share, m)], axis=1).ravel())
        parts.append(np.stack([arr(s.preempted_share, g), arr(s.failed_share, g)], axis=1).ravel())
    return np.nan_to_num(np.concatenate(parts), nan=0.0).astype(np.float32)


_MODEL_FEATURE_INDEX = {f[0]: i for i, f in enumerate(MODEL_FEATURES)}


def model_feature(observation: np.ndarray, model_index: int, name: str) -> float:
    """One per-model feature of an observation vector (used by the rule policies every step)."""
    if name not in _MODEL_FEATURE_INDEX:
        raise KeyError(f"unknown model feature {name!r}; valid: {', '.join(_MODEL_FEATURE_INDEX)}")
    return float(observation[model_index * len(MODEL_FEATURES) + _MODEL_FEATURE_INDEX[name]])
