"""The env's observation: its short memory of the steps behind it, and the vector it builds from
that memory, the fleet, the market and the forecast.

:class:`Memory` is what FleetEnv remembers between steps for its observation — steps since each
model's re-optimization and preemption, the unserved window, the last step's cost and the initial
plan's cost rate. :func:`observe` builds the observation with the functions the live controller
uses too (:func:`atoll.envs.signals.fleet_signals`, :func:`atoll.envs.observation.build_observation`),
adding the closed-loop block (``v2``) and the observation of risk (``v3``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from atoll.envs.acquisition import MarketView
from atoll.envs.closed_loop import ServerLoop
from atoll.envs.demand import DemandBook
from atoll.envs.fleet import FleetState
from atoll.envs.fleet_model import FleetModel
from atoll.envs.observation import SINCE_CAP, build_observation
from atoll.envs.signals import UNSERVED_WINDOW, fleet_signals, push_window
from atoll.envs.vocabulary import Pool

__all__ = ["Memory", "observe"]


@dataclass
class Memory:
    """What the observation remembers of the steps behind (per model unless said)."""

    since: np.ndarray  # steps since the last re-optimization (int)
    unserved: np.ndarray  # [UNSERVED_WINDOW, M] unserved shares of the last steps, newest first
    preempted: np.ndarray  # whether an instance was preempted at the last boundary (bool)
    since_preempt: np.ndarray  # steps since the last preemption, capped at SINCE_CAP (int)
    last_cost: np.ndarray  # $ billed over the last step
    cost_scale: float  # the initial plan's $/h

    @classmethod
    def start(cls, n_models: int, cost: np.ndarray, step_s: float) -> Memory:
        """An episode's start, from the initial plan's cost over one step of ``step_s`` seconds."""
        m = n_models
        return cls(since=np.zeros(m, dtype=int), unserved=np.zeros((UNSERVED_WINDOW, m)),
                   preempted=np.zeros(m, dtype=bool), since_preempt=np.full(m, SINCE_CAP, dtype=int),
                   last_cost=cost, cost_scale=max(cost.sum() * 3600.0 / step_s, 1e-9))

    def reoptimized(self, indices: list[int]) -> None:
        """The models at ``indices`` were re-optimized now; one step passes for every model (the
        count is observed at the next step)."""
        for i in indices:
            self.since[i] = 0
        self.since += 1

    def boundary(self, lost_by_model: np.ndarray, unserved: np.ndarray, cost: np.ndarray) -> None:
        """A step ended: instances lost per model at its boundary, each model's unserved share and
        the $ it billed."""
        self.preempted = lost_by_model > 0
        self.since_preempt = np.where(self.preempted, 0, np.minimum(self.since_preempt + 1, SINCE_CAP))
        self.unserved = push_window(self.unserved, unserved)
        self.last_cost = cost


def observe(fleet: FleetModel, state: FleetState, caps: Mapping[Pool, int], book: DemandBook, g: int,
            memory: Memory, servers: ServerLoop, market: MarketView, *, step_s: float,
            factors: Mapping[str, float] | None, closed_loop: bool, risk: bool) -> np.ndarray:
    """The observation at global step ``g``, the planner seeing ``caps`` of availability and
    capacities corrected by ``factors`` (None: the model's); ``closed_loop`` and ``risk`` append
    the ``v2`` and ``v3`` blocks."""
    signals = fleet_signals(
        fleet, state, caps,
        demand=fleet.tokens(book.rates[:, g - 1]),
        forecast_mean=book.mean[:, g, :].max(axis=1),
        forecast_upper=book.upper[:, g, :].max(axis=1),
        forecast_first=book.mean[:, g, 0], forecast_last=book.mean[:, g, -1],
        since=memory.since, since_preempt=memory.since_preempt, unserved_window=memory.unserved,
        last_cost=memory.last_cost,
        last_seconds=step_s, cost_scale_usd_h=memory.cost_scale, preempted=memory.preempted,
        seconds_of_day=(g % book.steps_per_day) * step_s, factors=factors,
        latency_ratio=servers.latency_ratio if closed_loop else None,
        waiting_share=servers.waiting_share if closed_loop else None)
    if risk:
        spread, ondemand = fleet.risk_exposure(state)
        pre, fail = market.risk_shares(state)
        signals = replace(signals, queue_growth=servers.queue_growth, latency_miss=servers.latency_miss,
                          spread=spread, ondemand_share=ondemand, preempted_share=pre, failed_share=fail)
    return build_observation(signals, closed_loop=closed_loop, risk=risk)
