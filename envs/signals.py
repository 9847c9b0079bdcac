"""The one place :class:`~atoll.envs.observation.Signals` are made, for the env and the controller.

Both sides hold a :class:`~atoll.envs.fleet.FleetState` of the same :class:`~atoll.envs.fleet_model.
FleetModel` and keep the same short memory of the steps behind them; from those and the
forecast (requests/s, made by the same forecaster class) :func:`fleet_signals` computes every
entry: demand, forecasts x the models' request shapes, ready and planned capacity, the
unserved share over the last ``UNSERVED_WINDOW`` steps, each model's share of the billed cost
(running, starting and draining nodes), availability headroom and the cost rate.
:func:`unserved_shares` is how a step's outcome enters that memory, on both sides.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from atoll.envs.fleet import FleetState
from atoll.envs.fleet_model import FleetModel
from atoll.envs.observation import Signals
from atoll.envs.vocabulary import Pool

UNSERVED_WINDOW = 3  # steps the unserved share is averaged over


def served_shares(demand: np.ndarray, ready: np.ndarray) -> np.ndarray:
    """[M] share of each model's requests served: min over its phases of min(demand, ready) /
    demand (a request needs both phases); 1 where a phase has no demand."""
    served = np.minimum(demand, ready)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(demand > 0, served / np.where(demand > 0, demand, 1.0), 1.0)
    return frac.min(axis=1)


def unserved_shares(demand: np.ndarray, ready: np.ndarray) -> np.ndarray:
    """[M] share of each model's demand not served within the SLO in a step (0 without demand)."""
    return np.where(demand.sum(axis=1) > 0, 1.0 - served_shares(demand, ready), 0.0)


def push_window(window: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """The unserved window [UNSERVED_WINDOW, M] with ``shares`` as its newest row."""
    out = np.roll(window, 1, axis=0)
    out[0] = shares
    return out


def risk_shares(preempted: np.ndarray, held: np.ndarray, failed: np.ndarray, requested: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """([G] preempted share, [G] refused share) per GPU type over the risk window: nodes preempted
    / (those + nodes held), nodes refused / nodes requested (0 where none were)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        pre = np.where(preempted > 0, preempted / np.maximum(preempted + held, 1e-9), 0.0)
        fail = np.where(requested > 0, failed / np.maximum(requested, 1e-9), 0.0)
    return pre, fail


def fleet_signals(fleet: FleetModel, state: FleetState, caps: Mapping[Pool, int], *,
                  demand: np.ndarray, forecast_mean: np.ndarray, forecast_upper: np.ndarray,
                  forecast_first: np.ndarray, forecast_last: np.ndarray,
                  since: np.ndarray, unserved_window: np.ndarray, last_cost: np.ndarray,
                  last_seconds: float, cost_scale_usd_h: float | None, preempted: np.ndarray,
                  since_preempt: np.ndarray, seconds_of_day: float,
                  factors: Mapping[str, float] | None = None, latency_ratio: np.ndarray | None = None,
                  waiting_share: np.ndarray | None = None) -> Signals:
    """The decision's inputs.

    demand: [M, 2] tokens/s of the last step; forecast_mean/upper: [M] requests/s (times the request
    shape) or [M, 2] tokens/s per phase, the maxima over the look-ahead; forecast_first/last: the
    same units, the mean forecast of the look-ahead's first and last step; since: [M] steps since
    each model's last re-optimization; unserved_window: [UNSERVED_WINDOW, M] unserved shares of
    the last steps (zeros before any); last_cost: [M] $
    billed over the last ``last_seconds``; cost_scale_usd_h: the initial plan's $/h (None: no plan
    yet, the ratio is 1); preempted: [M] whether an instance was preempted at the last boundary;
    since_preempt: [M] steps since the last preemption (``SINCE_CAP`` or more: none seen).
    Closed loop (``atoll/Fleet-v2``): ``factors`` (family -> learned capacity factor) makes
    every capacity the planner's corrected belief and gives the ``correction`` feature;
    ``latency_ratio`` and ``waiting_share`` ([M]) are what the servers reported over the last
    step.
    """
    ready, planned = fleet.capacity(state, 0.0, factors)
    correction = None
    if factors is not None:
        model_planned = fleet.capacity(state, 0.0)[1]
        with np.errstate(divide="ignore", invalid="ignore"):
            safe = np.where(model_planned > 0, model_planned, 1.0)
            ratio = np.where(model_planned > 0, planned / safe, 1.0)
        correction = ratio.min(axis=1)
    total = float(last_cost.sum())

    def tokens(forecast: np.ndarray) -> np.ndarray:
        # [M] request rates are multiplied by the request shape; [M, 2] arrays already are
        # tokens/s per phase (the controller forecasts each phase from its own measured rate)
        f = np.nan_to_num(np.asarray(forecast, dtype=float), nan=0.0)
        return f if f.ndim == 2 else fleet.tokens(f)

    m = len(fleet.models)
    rate = total * 3600.0 / last_seconds if last_seconds > 0 else 0.0
    return Signals(
        demand=np.asarray(demand, dtype=float),
        forecast_mean=tokens(forecast_mean),
        forecast_upper=tokens(forecast_upper),
        forecast_first=tokens(forecast_first),
        forecast_last=tokens(forecast_last),
        ready_capacity=ready, planned_capacity=planned, since_reopt=np.asarray(since, dtype=float),
        unserved_share=np.asarray(unserved_window, dtype=float).mean(axis=0),
        cost_share=last_cost / total if total > 0 else np.zeros(m),
        preempted=np.asarray(preempted, dtype=float), since_preempt=np.asarray(since_preempt, dtype=float),
        headroom=fleet.headroom(state, caps), spare_ondemand=fleet.spare_ondemand(state, caps),
        seconds_of_day=float(seconds_of_day) % 86400.0,
        cost_rate_ratio=rate / max(cost_scale_usd_h, 1e-9) if cost_scale_usd_h is not None else 1.0,
        latency_ratio=latency_ratio, waiting_share=waiting_share, correction=correction)
