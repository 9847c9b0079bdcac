"""A replayed fleet that serves what its plan can, in a world that differs from the model.

:class:`ServedFleet` lets ``atoll replay`` export what vLLM servers of a *running plan* would
report, instead of the trace's demand as if it were all served: it follows the plans a controller
delivers (a ``json:DIR`` sink's ``latest.json``, or any callable), moves a
:class:`~atoll.envs.fleet.FleetState` the way a cluster does (additions serve after their
start-up; removals stop at once — the controller delivers its changes make-before-break),
serves each model's demand against the **true** capacity — the model's throughput times a
factor per template family drawn from a ``capacity_error`` spec
(:mod:`atoll.envs.capacity_error`) — and accumulates, through the simulator's own
:func:`atoll.envs.servers.server_report`, the counters and histograms vLLM
exports: tokens processed, TTFT and inter-token latency (sum, count, buckets), request lengths,
and the running / waiting / KV-cache gauges. A controller reading them can therefore learn the
true capacities exactly as the simulator's planner does.

Time is the trace's (seconds); the fleet is advanced in sub-steps of at most ``substep_s``.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from atoll.envs.capacity_error import CapacityError
from atoll.envs.fleet import FleetState
from atoll.envs.fleet_model import FleetModel
from atoll.envs.latency import VLLM_ITL_BUCKETS_S, VLLM_TTFT_BUCKETS_S, histogram_counts
from atoll.envs.saturation import abandoned_requests
from atoll.envs.servers import server_report, service_latencies
from atoll.solvers.errors import InputError
from atoll.solvers.problem import Allocation

PlanSource = Callable[[], Mapping[str, int] | None]


def latest_plan(directory: Path | str) -> PlanSource:
    """A plan source reading ``DIR/latest.json`` of a ``json:DIR`` sink (None while there is none,
    or while it cannot be read: the fleet keeps what it runs)."""
    path = Path(directory) / "latest.json"

    def read() -> Mapping[str, int] | None:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        plan = doc.get("plan") if isinstance(doc, dict) else None
        if not isinstance(plan, dict):
            return None
        return {str(k): int(n) for k, n in plan.items() if isinstance(n, int) and not isinstance(n, bool)}

    return read


@dataclass
class Histogram:
    """A cumulative Prometheus histogram: counts per upper edge (then +Inf), sum, count."""

    edges: tuple[float, ...]
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0))
    total: float = 0.0

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.edges) + 1:
            self.counts = np.zeros(len(self.edges) + 1)

    def add(self, counts: np.ndarray, total: float) -> None:
        self.counts = self.counts + np.asarray(counts, dtype=float)
        self.total += float(total)

    @property
    def count(self) -> float:
        return float(self.counts.sum())

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs, +Inf last, as the exposition format wants them."""
        c = np.cumsum(self.counts)
        pairs = [(f"{e:g}", float(v)) for e, v in zip(self.edges, c[:-1], strict=True)]
        return [*pairs, ("+Inf", float(c[-1]))]


@dataclass
class ModelServed:
    """What one model's servers have exported so far."""

    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    aborted: float = 0.0  # requests given up unserved (vLLM: finished with reason "abort")
    ttft: Histogram = field(default_factory=lambda: Histogram(VLLM_TTFT_BUCKETS_S))
    itl: Histogram = field(default_factory=lambda: Histogram(VLLM_ITL_BUCKETS_S))
    prompt_lengths: Histogram = field(default_factory=lambda: Histogram((128.0, 512.0, 2048.0, 8192.0)))
    output_lengths: Histogram = field(default_factory=lambda: Histogram((64.0, 256.0, 1024.0, 4096.0)))


class ServedFleet:
    """A fleet of ``model`` running the plans ``plan_source`` gives, in the world ``capacity_error``
    draws with ``seed`` (see the module docstring). ``demand_at(t)`` gives, at trace time t, the
    [M] request rates and [M, 2] tokens per request of ``model.models``."""

    def __init__(self, model: FleetModel, plan_source: PlanSource, *, capacity_error: str | float = 0.0,
                 seed: int = 0, substep_s: float = 60.0) -> None:
        if not (isinstance(substep_s, int | float) and math.isfinite(substep_s) and substep_s > 0):
            raise InputError(f"ServedFleet: field 'substep_s' must be > 0 seconds, got {substep_s!r}")
        self.model = model
        self.plan_source = plan_source
        self.spec = CapacityError.parse(capacity_error)
        self.truth = {} if self.spec.exact else self.spec.draw(model.families(), np.random.default_rng(seed))
        self.substep_s = float(substep_s)
        self.state = FleetState()
        self.plan: dict[str, int] = {}
        self.served = {m: ModelServed() for m in model.models}
        self.time_s: float | None = None
        self._lock = threading.Lock()

    def _follow(self) -> None:
        plan = self.plan_source()
        if plan is None:
            return
        known = {k: n for k, n in plan.items() if k in self.model.templates and n > 0}
        if known != self.plan:
            self.plan = known
            # the cluster does what it is told: the controller makes its changes make-before-break
            # by what it delivers (additions first, removals later), so removals stop at once here
            for key in known:
                self.model.startup.of(self.model.templates[key])
            self.state.apply_plan(Allocation.of(known), self.model.startup.seconds, self.model.config.drain_s)

    def advance(self, until_s: float,
                demand_at: Callable[[float], tuple[np.ndarray, np.ndarray]]) -> None:
        """Serve from the last call's time to ``until_s`` (trace seconds)."""
        with self._lock:
            if self.time_s is None:
                self.time_s = until_s
                self._follow()
                return
            self._follow()
            while self.time_s < until_s - 1e-9:
                dt = min(self.substep_s, until_s - self.time_s)
                rates, shape = demand_at(self.time_s)
                self._serve(rates, shape, dt)
                self.state.advance(dt)
                self.time_s += dt

    def _serve(self, rates: np.ndarray, shape: np.ndarray, dt: float) -> None:
        fleet = self.model
        demand = np.asarray(rates, dtype=float)[:, None] * shape
        ready = fleet.capacity(self.state, dt, self.truth or None)[0]
        instances = fleet.instances_ready(self.state, dt)
        safe = np.where(shape > 0, shape, 1.0)
        pre, dec = service_latencies(fleet.specs, safe)
        report = server_report(pre, dec, demand, ready, instances, dt)
        ttft = histogram_counts(report.prefill)
        # vLLM's inter-token histogram gains one observation per generated token
        itl = histogram_counts(report.decode, observations=report.decode.served_tps * dt)
        before = np.array([self.served[name].waiting for name in fleet.models])
        aborted = abandoned_requests(report.lost_requests, before, report.waiting)
        for i, name in enumerate(fleet.models):
            s = self.served[name]
            s.aborted += float(aborted[i])
            served_pre, served_dec = report.prefill.served_tps[i], report.decode.served_tps[i]
            s.prompt_tokens += served_pre * dt
            s.generation_tokens += served_dec * dt
            s.waiting, s.running, s.kv_usage = (float(report.waiting[i]), float(report.running[i]),
                                                float(report.kv_usage[i]))
            requests = report.prefill.served_requests[i]
            s.ttft.add(ttft[i], report.ttft_mean_s[i] * requests)
            s.itl.add(itl[i], report.itl_mean_s[i] * served_dec * dt)
            if requests > 0:
                s.prompt_lengths.add(_one_bucket(s.prompt_lengths.edges, shape[i, 0], requests),
                                     served_pre * dt)
                s.output_lengths.add(_one_bucket(s.output_lengths.edges, shape[i, 1], requests),
                                     requests * shape[i, 1])


def _one_bucket(edges: Sequence[float], value: float, count: float) -> np.ndarray:
    out = np.zeros(len(edges) + 1)
    out[int(np.searchsorted(np.asarray(edges), value))] = count
    return out
