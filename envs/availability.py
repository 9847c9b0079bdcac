"""Availability processes: how many nodes of each (region, config) can be held at each step.

- ``static`` (the solver scenarios' ``ample`` and ``scarce``): a fixed cap per (region, config).
- ``hedged`` (:class:`HedgedAvailability`): a ``spot`` pool per (region, config) beside an
  on-demand quota that does not move.
- ``market`` (:class:`MarketAvailability`): a fleet file's market per pool. An on-demand pool
  has its static cap; a spot pool follows its own trace (absolute nodes over the workloads' time,
  :class:`atoll.solvers.fleet.PoolTrace`) or, in a catalog region without one, the region's
  bundled trace below; a hedged pool has both, the on-demand quota never moving. Spot tiers live
  in tiered regions (:mod:`atoll.solvers.tiers`), so a drop preempts spot instances only.
- ``spot``: the cap moves with real spot availability traces (SkyPilot's "Can't Be Late"
  traces, ../shared/data/spot-traces-cantbelate, NSDI'24). Each trace counts the spot nodes
  obtainable out of 16 every 300 s. A (region, config) cap at time t is
  ``floor(base_cap x trace(t) / 16)``. Which trace drives which region (the traces are AWS V100
  only, so every region borrows one; the assignment keeps one trace per region so that configs in
  a region share its spot market):

  ========================  ==================================================
  region                    trace (availability/16-node/aws-08-27-2023/)
  ========================  ==================================================
  aws:us-east-2             us-east-2b_v100_1.json (the region's own zone)
  aws:ap-northeast-2        us-west-2a_v100_1.json (no Asian trace exists)
  gcp:us-central1           us-west-2c_v100_1.json (no GCP GPU trace of that length)
  ========================  ==================================================

  Configs of one region read the region's trace at different seeded offsets (drawn at reset from
  the environment's generator), so they are not preempted in lockstep; the same seed gives the
  same offsets, hence the same capacities. With ``correlation="zone"`` (``FleetConfig.preemption``)
  the configs of one GPU type in one region — one instance family in one zone — share the offset
  of the first of them, so a drop interrupts them together: SpotHedge/SkyServe (Mao et al.,
  EuroSys'25) find co-interruptions of one instance type in one zone within 3 minutes in over 92%
  of cases, inside one 5-minute step. Every config still draws its offset, so the two settings
  consume the generator alike and meet the same later draws.

Every process also tells what its spot pools offer at most (:meth:`SpotAvailability.offered`):
under ``FleetConfig.spot_acquisition="trace"`` that, not the trace's current count, is what the
planner sees of a spot pool until a failed acquisition or a preemption there shows it full
(for ``ACQUIRE_BACKOFF_S``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from atoll.envs.vocabulary import Pool

SPOT_TRACE_DIR = Path("spot-traces-cantbelate") / "availability" / "16-node" / "aws-08-27-2023"
SPOT_TRACES: dict[str, str] = {
    "aws:us-east-2": "us-east-2b_v100_1.json",
    "aws:ap-northeast-2": "us-west-2a_v100_1.json",
    "gcp:us-central1": "us-west-2c_v100_1.json",
}
SPOT_TRACE_NODES = 16
# after a failed acquisition or a preemption a spot pool is believed full for a back-off that
# doubles with each failure in a row until an acquisition there succeeds: the Kubernetes Cluster
# Autoscaler's node-group back-off, --initial-node-group-backoff-duration (5 minutes) and
# --max-node-group-backoff-duration (30 minutes) by default
ACQUIRE_BACKOFF_S = 300.0
ACQUIRE_BACKOFF_MAX_S = 1800.0
# re-plans within one decision after a refusal: an insufficient-capacity error returns within
# seconds and Karpenter falls back to other instance types in the same provisioning round
ACQUIRE_RETRIES = 3
CORRELATIONS: tuple[str, ...] = ("independent", "zone")


@dataclass(frozen=True)
class SpotTrace:
    """Spot nodes obtainable (out of ``nodes``) every ``gap_seconds``."""

    values: tuple[int, ...]
    gap_seconds: float
    nodes: int
    source: str

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"SpotTrace {self.source}: field 'values' is empty")
        if min(self.values) < 0 or max(self.values) > self.nodes:
            raise ValueError(f"SpotTrace {self.source}: values must lie in 0..{self.nodes}")

    def fraction(self, seconds: float) -> float:
        i = int(seconds // self.gap_seconds) % len(self.values)
        return self.values[i] / self.nodes


def load_spot_trace(data: Path, region: str) -> SpotTrace:
    if region not in SPOT_TRACES:
        raise KeyError(f"no spot trace for region {region!r}; regions with one: "
                       f"{', '.join(sorted(SPOT_TRACES))}")
    path = data / SPOT_TRACE_DIR / SPOT_TRACES[region]
    if not path.exists():
        raise FileNotFoundError(f"spot trace missing: {path} — check ATOLL_SHARED_DATA")
    doc = json.loads(path.read_text())
    return SpotTrace(values=tuple(int(v) for v in doc["data"]),
                     gap_seconds=float(doc["metadata"]["gap_seconds"]), nodes=SPOT_TRACE_NODES,
                     source=str(path))


@dataclass
class StaticAvailability:
    """A fixed cap per (region, config)."""

    caps: Mapping[Pool, int]

    def reset(self, rng: np.random.Generator) -> None:  # noqa: ARG002 - same interface as spot
        return None

    def offered(self) -> dict[Pool, int]:
        """No spot pools: nothing moves."""
        return {}

    def capacity(self, seconds: float) -> dict[Pool, int]:  # noqa: ARG002
        return dict(self.caps)


@dataclass
class SpotAvailability:
    """Caps that follow real spot traces, one trace per region, seeded offsets per config."""

    base: Mapping[Pool, int]
    traces: Mapping[str, SpotTrace]
    offsets: dict[Pool, float] = field(default_factory=dict)
    correlation: str = "independent"

    def __post_init__(self) -> None:
        missing = sorted({r for r, _ in self.base} - set(self.traces))
        if missing:
            raise ValueError(f"SpotAvailability: no trace for regions {missing}")
        if self.correlation not in CORRELATIONS:
            raise ValueError(f"SpotAvailability: correlation must be one of {', '.join(CORRELATIONS)}, "
                             f"got {self.correlation!r}")

    def reset(self, rng: np.random.Generator) -> None:
        from atoll.solvers.problem import gpu_type_of

        self.offsets = {}
        shared: dict[tuple[str, str], float] = {}
        for cell in sorted(self.base):
            trace = self.traces[cell[0]]
            span = len(trace.values) * trace.gap_seconds
            own = float(rng.integers(0, len(trace.values))) * trace.gap_seconds % span
            if self.correlation == "zone":  # one instance family in one zone moves as one
                own = shared.setdefault((cell[0], gpu_type_of(cell[1])), own)
            self.offsets[cell] = own

    def offered(self) -> dict[Pool, int]:
        """The most nodes each spot pool offers (its base cap)."""
        return dict(self.base)

    def capacity(self, seconds: float) -> dict[Pool, int]:
        if not self.offsets:
            raise RuntimeError("SpotAvailability.capacity called before reset(rng)")
        return {cell: math.floor(cap * self.traces[cell[0]].fraction(seconds + self.offsets[cell]))
                for cell, cap in self.base.items()}


@dataclass
class HedgedAvailability:
    """A hedged market: a static on-demand quota beside trace-driven spot pools (whose cells are
    the tiered regions of :mod:`atoll.solvers.tiers`); only the spot pools move."""

    on_demand: StaticAvailability
    spot: SpotAvailability

    def reset(self, rng: np.random.Generator) -> None:
        self.spot.reset(rng)

    def offered(self) -> dict[Pool, int]:
        return self.spot.offered()

    def capacity(self, seconds: float) -> dict[Pool, int]:
        return {**self.on_demand.capacity(seconds), **self.spot.capacity(seconds)}


@dataclass
class MarketAvailability:
    """A market per pool (see the module docstring): ``static`` caps of every tier that does not
    move (on-demand pools, hedged pools' quotas), ``own`` spot tiers on their own traces (the
    episode's own time, no random offset) and ``bundled`` spot tiers on their region's bundled
    trace (seeded offsets, as :class:`SpotAvailability`)."""

    static: Mapping[Pool, int]
    own: Mapping[Pool, Any]
    bundled: SpotAvailability | None = None

    def reset(self, rng: np.random.Generator) -> None:
        if self.bundled is not None:
            self.bundled.reset(rng)

    def offered(self) -> dict[Pool, int]:
        out = {cell: int(max(trace.nodes)) for cell, trace in self.own.items()}
        if self.bundled is not None:
            out.update(self.bundled.offered())
        return out

    def capacity(self, seconds: float) -> dict[Pool, int]:
        out = dict(self.static)
        out.update({cell: int(trace.at(seconds)) for cell, trace in self.own.items()})
        if self.bundled is not None:
            out.update(self.bundled.capacity(seconds))
        return out


def untraced_spot_pools(markets: Mapping[Pool, str], traces: Mapping[Pool, Any]) -> list[Pool]:
    """Spot or hedged pools with no trace of their own in a region without a bundled trace: no
    availability process can move them."""
    return sorted(cell for cell, m in markets.items()
                  if m != "on-demand" and cell not in traces and cell[0] not in SPOT_TRACES)


def market_availability(spec: Any, markets: Mapping[Pool, str], data: Path | None = None,
                        correlation: str = "independent") -> MarketAvailability:
    """The availability process of a scenario's pools under ``markets`` (every offered cell ->
    on-demand, spot or hedged); ValueError naming the pools when a spot pool has no trace."""
    from atoll.solvers.scenarios import market_caps
    from atoll.solvers.tiers import split_tier, tiered_region

    traces = dict(spec.pool_traces)
    missing = untraced_spot_pools(markets, traces)
    if missing:
        shown = ", ".join(f"{r}/{c}" for r, c in missing[:4])
        raise ValueError(f"spot pool(s) {shown} have no availability trace: a spot market moves with one. "
                         f"Give each a trace in the fleet file (availability.traces: a CSV time_s,nodes or "
                         f"a preemption log time_s,event,nodes), or keep them on-demand; bundled traces "
                         f"exist for {', '.join(sorted(SPOT_TRACES))} only")
    caps = market_caps(spec, markets)
    own = {(tiered_region(r, "spot"), c): t for (r, c), t in traces.items()
           if markets.get((r, c)) != "on-demand"}
    base = {cell: n for cell, n in caps.items() if split_tier(cell[0])[1] == "spot" and cell not in own}
    static = {cell: n for cell, n in caps.items() if split_tier(cell[0])[1] == "on-demand"}
    bundled = None
    if base:
        from atoll.solvers.paths import shared_data_dir

        where = data or shared_data_dir()
        regions = sorted({split_tier(r)[0] for r, _ in base})
        bundled = SpotAvailability(base, {tiered_region(r, "spot"): load_spot_trace(where, r)
                                          for r in regions}, correlation=correlation)
    return MarketAvailability(static, own, bundled)
