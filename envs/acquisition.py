"""The env's market: the availability process a config builds, and how acquisitions and preemptions
meet it.

- :func:`build_availability` — the process of ``FleetConfig.availability`` (a fleet file's pools
  in their markets, ``ample``, ``scarce``, ``hedged`` or ``spot``; :mod:`atoll.envs.availability`).
- :class:`MarketView` — what the planner (and the policy) sees of the market under
  ``spot_acquisition="trace"``: each spot pool at what it offers, or at the nodes it holds while
  it is believed full for the back-off after a failed acquisition or a preemption
  (:data:`atoll.envs.availability.ACQUIRE_BACKOFF_S`, doubling per failure in a row); and the
  observation's risk windows — nodes preempted, requested and refused per GPU type over the last
  :data:`~atoll.envs.observation.RISK_WINDOW` steps.

Randomness: a requested spot node fails with the env's own generator (``np_random``), passed in
by the env at the point of its step where it always drew it.
"""

from __future__ import annotations

import math

import numpy as np

from atoll.envs.availability import (
    ACQUIRE_BACKOFF_MAX_S,
    ACQUIRE_BACKOFF_S,
    HedgedAvailability,
    MarketAvailability,
    SpotAvailability,
    StaticAvailability,
    load_spot_trace,
    market_availability,
)
from atoll.envs.config import MARKET_KINDS, FleetConfig
from atoll.envs.fleet import FleetState
from atoll.envs.fleet_model import FleetModel
from atoll.envs.observation import RISK_WINDOW
from atoll.envs.planner import PlanOutcome
from atoll.envs.signals import risk_shares
from atoll.envs.vocabulary import Pool
from atoll.solvers.paths import shared_data_dir
from atoll.solvers.problem import gpu_type_of
from atoll.solvers.scenarios import ample_availability, fleet_markets, scarce_availability
from atoll.solvers.tiers import split_tier, tiered_region

__all__ = ["Availability", "MarketView", "build_availability"]

Availability = StaticAvailability | SpotAvailability | HedgedAvailability | MarketAvailability


def build_availability(config: FleetConfig, fleet: FleetModel) -> Availability:
    """The availability process of ``config``'s market for ``fleet``'s library."""
    c = config
    spec = c.scenario_spec
    templates = fleet.base.templates
    if spec.markets and c.availability in MARKET_KINDS:  # a fleet file's pools in their markets
        return market_availability(spec, fleet_markets(spec, c.availability), correlation=c.preemption)
    if c.availability == "ample":
        return StaticAvailability(ample_availability(spec))
    if c.availability == "scarce":
        return StaticAvailability(scarce_availability(spec, templates))
    if c.availability == "hedged":
        plain = [t for t in templates if split_tier(t.region)[1] == "on-demand"]
        ample = ample_availability(spec)
        quota = ample if c.ondemand_quota == "ample" else scarce_availability(spec, plain)
        data = shared_data_dir()
        spot_pools = {(tiered_region(r, "spot"), cfg): n for (r, cfg), n in ample.items()}
        return HedgedAvailability(
            StaticAvailability(quota),
            SpotAvailability(spot_pools, {tiered_region(r, "spot"): load_spot_trace(data, r)
                                          for r in spec.regions}, correlation=c.preemption))
    data = shared_data_dir()
    return SpotAvailability(ample_availability(spec), {r: load_spot_trace(data, r) for r in spec.regions},
                            correlation=c.preemption)


class MarketView:
    """The pools believed full and the risk windows of one env (see the module docstring).

    ``offered`` is each spot pool's offer under ``spot_acquisition="trace"`` (empty otherwise: the
    planner sees the market's current caps and no pool is ever believed full).
    """

    def __init__(self, fleet: FleetModel, offered: dict[Pool, int]) -> None:
        self.fleet = fleet
        self.offered = offered
        self.gpu_index = {g: j for j, g in enumerate(fleet.gpu_types)}
        self.reset()

    def reset(self) -> None:
        """Forget every back-off and empty the risk windows (an episode's start)."""
        g = len(self.fleet.gpu_types)
        self.full_until: dict[Pool, float] = {}
        self.fail_streak: dict[Pool, int] = {}
        self.preempted_nodes = np.zeros((RISK_WINDOW, g))
        self.requested_nodes = np.zeros((RISK_WINDOW, g))
        self.failed_nodes = np.zeros((RISK_WINDOW, g))

    def roll(self) -> None:
        """Start a step in the risk windows: each moves one step back, the newest row empty."""
        for window in (self.preempted_nodes, self.requested_nodes, self.failed_nodes):
            window[:] = np.roll(window, 1, axis=0)
            window[0] = 0.0

    def nodes_by_type(self, instances: dict[str, int]) -> np.ndarray:
        """[G] nodes (a slice: its share) the given instances per template key use, per GPU type."""
        out = np.zeros(len(self.fleet.gpu_types))
        for key, n in instances.items():
            for config, k in self.fleet.templates[key].node_use:
                out[self.gpu_index[gpu_type_of(config)]] += n * k
        return out

    def cells_of(self, instances: dict[str, int]) -> set[Pool]:
        return {(self.fleet.templates[k].region, config) for k, n in instances.items() if n
                for config, _ in self.fleet.templates[k].node_use}

    def block(self, cell: Pool, now: float) -> None:
        """Believe ``cell`` full from ``now`` for the back-off of its failures in a row (see
        :data:`atoll.envs.availability.ACQUIRE_BACKOFF_S`)."""
        if cell not in self.offered:
            return
        streak = self.fail_streak[cell] = self.fail_streak.get(cell, 0) + 1
        backoff = min(ACQUIRE_BACKOFF_S * 2 ** (streak - 1), ACQUIRE_BACKOFF_MAX_S)
        self.full_until[cell] = now + backoff

    def planning_caps(self, cap: dict[Pool, int], state: FleetState, now: float) -> dict[Pool, int]:
        """What the planner (and the policy) sees of availability: the market's current caps
        ``cap``; under ``spot_acquisition="trace"`` each spot pool at what it offers, or at the
        nodes it holds while it is believed full after a failed acquisition or a preemption."""
        if not self.offered:
            return cap
        held = self.fleet.nodes_held(state)
        caps = dict(cap)
        for cell, offered in self.offered.items():
            full = self.full_until.get(cell, -math.inf) >= now  # a back-off ending now still holds
            caps[cell] = held.get(cell, 0) if full else offered
        return caps

    def apply(self, state: FleetState, outcome: PlanOutcome, cap: dict[Pool, int], now: float,
              startup_rng: np.random.Generator | None, rng: np.random.Generator | None) -> dict[str, int]:
        """Apply a plan (start-ups drawn from ``startup_rng``); the instances whose spot nodes the
        market did not have at ``cap`` (per key), drawn from ``rng`` when acquisitions can fail
        (None: every requested node arrives)."""
        if outcome.allocation is None:
            return {}
        self.fleet.apply(state, outcome.allocation, startup_rng)
        requested = self.nodes_by_type(state.fresh)
        failed: dict[str, int] = {}
        if rng is not None:
            failed = state.fail_acquisitions(cap, self.fleet.templates, rng)
            refused = self.cells_of(failed)
            for cell in self.cells_of(state.fresh) - refused:
                self.fail_streak.pop(cell, None)  # an acquisition there succeeded
            for cell in refused:
                self.block(cell, now)
        self.requested_nodes[0] += requested
        self.failed_nodes[0] += self.nodes_by_type(failed)
        return failed

    def preempted(self, lost: dict[str, int], now: float) -> np.ndarray:
        """Count a boundary's preemptions (instances per key) in the risk window and believe
        their spot pools full; [M] instances lost per model."""
        lost_by_model = np.zeros(len(self.fleet.models), dtype=int)
        for key, n in lost.items():
            lost_by_model[self.fleet.info(key)[0]] += n
        self.preempted_nodes[0] += self.nodes_by_type(lost)
        if self.offered:  # a preempted spot pool is believed full for a while
            for cell in self.cells_of(lost):
                self.block(cell, now)
        return lost_by_model

    def risk_shares(self, state: FleetState) -> tuple[np.ndarray, np.ndarray]:
        """([G] preempted share, [G] refused share) over the risk window
        (:func:`atoll.envs.signals.risk_shares`)."""
        held = self.fleet.held_by_gpu_type(state)
        return risk_shares(self.preempted_nodes.sum(axis=0), held, self.failed_nodes.sum(axis=0),
                           self.requested_nodes.sum(axis=0))
