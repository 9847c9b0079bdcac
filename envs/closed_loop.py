"""The env's closed loop: the true world, what its servers report each step and what the planner
learns from it (``atoll/Fleet-v2`` and later; FleetEnv's docstring, "The world and the servers").

:class:`ServerLoop` holds the true capacity factors drawn at reset
(:mod:`atoll.envs.capacity_error`), the generator of the servers' sampling noise, the planner's
online :class:`~atoll.envs.correction.CapacityCorrection`, and the last step's server signals the
observation reads (latency ratio, waiting share, queue growth, latency misses). Outside the closed
loop (``FleetConfig.closed_loop`` false) a step computes no server report and the signals stay 0.

Randomness: at reset two child seeds are drawn from the env's generator (the world's draw, the
servers' noise) whatever the capacity-error spec, so the exact and the mis-modelled worlds of one
seed meet the same availability, preemption and noise draws.
"""

from __future__ import annotations

import numpy as np

from atoll.envs.config import FleetConfig
from atoll.envs.correction import CapacityCorrection
from atoll.envs.fleet import FleetState
from atoll.envs.fleet_model import FleetModel
from atoll.envs.servers import ServerReport, learn, server_report, service_latencies

__all__ = ["ServerLoop"]


class ServerLoop:
    """The servers of one env (see the module docstring)."""

    def __init__(self, config: FleetConfig, fleet: FleetModel) -> None:
        self.config, self.fleet = config, fleet
        m = len(fleet.models)
        # the TTFT and inter-token latency models per service (None outside the closed loop)
        self.latency = service_latencies(fleet.specs, fleet.shape) if config.closed_loop else None
        self.correction = CapacityCorrection()
        self.truth: dict[str, float] = {}
        self.rng = np.random.default_rng(0)
        self.last_report: ServerReport | None = None
        self.exposed: list[str] = []  # the families that served at the last step (with correction)
        self.latency_ratio, self.waiting_share = np.zeros(m), np.zeros(m)
        self.queue_growth, self.latency_miss, self.last_waiting = np.zeros(m), np.zeros(m), np.zeros(m)

    def reset(self, np_random: np.random.Generator) -> None:
        """An episode's start: a fresh correction and signals; in the closed loop, the world's
        true factors and the servers' generator from two child seeds of ``np_random``."""
        m = len(self.fleet.models)
        self.correction = CapacityCorrection()
        self.latency_ratio, self.waiting_share = np.zeros(m), np.zeros(m)
        self.queue_growth, self.latency_miss, self.last_waiting = np.zeros(m), np.zeros(m), np.zeros(m)
        self.last_report = None
        if self.config.closed_loop:
            # two child seeds whatever the spec, so the exact and the mis-modelled worlds meet the
            # same availability, preemption and server-noise draws for one seed
            world_seed, server_seed = (int(v) for v in np_random.integers(0, 2**63 - 1, size=2))
            spec = self.config.capacity_error_spec
            self.truth = ({} if spec.exact else
                          spec.draw(self.fleet.families(), np.random.default_rng(world_seed)))
            self.rng = np.random.default_rng(server_seed)

    def serve(self, state: FleetState, demand: np.ndarray, rates: np.ndarray, dt: float
              ) -> tuple[np.ndarray, ServerReport | None]:
        """(capacity truly ready over the next ``dt`` seconds [M, 2] tokens/s, the servers'
        report for the step's ``demand`` [M, 2] tokens/s at ``rates`` [M] req/s, None outside the
        closed loop); the correction learns from the report, and the signals follow it."""
        fleet = self.fleet
        ready, _ = fleet.capacity(state, dt)
        report = None
        if self.latency is not None:  # the servers' view: true capacity, latency, queues
            if self.truth:
                ready = fleet.capacity(state, dt, self.truth)[0]
            instances = fleet.instances_ready(state, dt)
            report = server_report(*self.latency, demand, ready, instances, dt, self.rng)
            if self.config.correction:
                exposure = fleet.ready_by_family(state, dt)
                self.exposed = sorted({f for fams in exposure.values() for f in fams})
                learn(self.correction, fleet.models, *self.latency, exposure,
                      np.minimum(demand, ready), report.mean_latency(), report.phase_waiting(), instances, dt,
                      fleet.changing(state, dt))
            self.latency_ratio, self.waiting_share = report.latency_ratio, report.waiting_share
            self._queue_signals(report, rates)
        self.last_report = report
        return ready, report

    def _queue_signals(self, report: ServerReport, rates: np.ndarray) -> None:
        """The queue's growth over the step (relative to waiting + running, in [-1, 1]) and the
        share of the step's requests over a latency budget."""
        total = report.waiting + report.running
        with np.errstate(divide="ignore", invalid="ignore"):
            change = report.waiting - self.last_waiting
            growth = np.where(total > 0, change / np.where(total > 0, total, 1.0), 0.0)
        self.queue_growth = np.clip(growth, -1.0, 1.0)
        self.last_waiting = np.asarray(report.waiting, dtype=float)
        self.latency_miss = np.where(rates > 0, 1.0 - np.asarray(report.slo_share, dtype=float), 0.0)
