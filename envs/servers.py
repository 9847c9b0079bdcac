"""The servers' view of a step, and what the capacity correction learns from it.

One code path for the simulator, the replay exporter and the live controller:

- :func:`server_report` — from each model's demand and the capacity that is *truly* ready
  (tokens/s per phase), what its vLLM servers report over the step (:mod:`atoll.envs.latency`):
  requests running and waiting, KV-cache use, the TTFT and inter-token latency histograms and
  their means (``sum / count``, as a Prometheus histogram gives them), and the share of requests
  that met both budgets (the latency-based SLO attainment). With a generator, the means carry the
  sampling noise of the step's requests (the simulator passes its seeded one).
- :func:`implied_capacities` — the inverse: from served tokens/s and the observed mean latency
  (what the counters and histograms say), the capacity the servers must have had. It inverts the
  full forward model (late requests included) by bisection on the capacity, so the simulator's
  observation and the controller's go through the same function; at or above the latency of a
  saturated server the capacity is what was served.
- :func:`learn` — feeds one interval of every service with ready instances to a
  :class:`~atoll.envs.correction.CapacityCorrection`, with the model's predicted capacity per
  family as the exposure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from atoll.envs.correction import CapacityCorrection
from atoll.envs.latency import (
    PhaseSignals,
    ServiceArrays,
    ServiceLatency,
    capacity_weight,
    observed_latency,
    phase_signals,
    utilization_from_latency,
)
from atoll.solvers.types import ModelSpec, Phase

PHASES: tuple[str, str] = ("prefill", "decode")
RHO_MIN = 0.02  # below this utilization latency says nothing about capacity
RHO_TOP = 0.999  # an unsaturated server is at most this busy
# Relative standard error of one interval's mean latency as evidence of load: the latency model's
# own misfit against a discrete-event simulation is 3-8% (atoll.envs.latency), so 5%; the
# weight of an implied capacity is its elasticity^2 / this^2 (a precision, as the prior's).
LATENCY_REL_SD = 0.05
_BISECT_STEPS = 24  # log-capacity bracket ln(50) / 2^24: a relative error below 1e-6
# bisection steps evaluated per call of the latency model: every midpoint the next levels could
# visit (2^levels - 1 of them) in one call, then the steps replayed (see _bisect_levels)
_BISECT_LEVELS = 4


@dataclass(frozen=True)
class ServerReport:
    """One step of every model's servers ([M] arrays; ``prefill`` and ``decode`` hold the full
    per-phase signals). ``ttft_mean_s`` / ``itl_mean_s`` are what the histograms' sum / count
    show (sampled when a generator was given); ``slo_share`` is the share of the step's demanded
    requests meeting both budgets."""

    prefill: PhaseSignals
    decode: PhaseSignals
    ttft_mean_s: np.ndarray
    itl_mean_s: np.ndarray
    slo_share: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    kv_usage: np.ndarray

    @property
    def latency_ratio(self) -> np.ndarray:
        """[M] max over phases of the observed mean latency / its budget."""
        return np.maximum(self.ttft_mean_s / self.prefill.budget_s, self.itl_mean_s / self.decode.budget_s)

    @property
    def waiting_share(self) -> np.ndarray:
        total = self.waiting + self.running
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(total > 0, self.waiting / np.where(total > 0, total, 1.0), 0.0)

    @property
    def lost_requests(self) -> np.ndarray:
        """[M] requests of the step no phase served (a request lost in either phase is lost)."""
        return np.maximum(self.prefill.requests - self.prefill.served_requests,
                          self.decode.requests - self.decode.served_requests)

    def mean_latency(self) -> np.ndarray:
        """[M, 2] observed mean latency per phase (TTFT, inter-token)."""
        return np.stack([self.ttft_mean_s, self.itl_mean_s], axis=1)

    def phase_waiting(self) -> np.ndarray:
        """[M, 2] requests waiting per phase."""
        return np.stack([self.prefill.waiting, self.decode.waiting], axis=1)


def service_latencies(models: Sequence[ModelSpec | str], shape: np.ndarray
                      ) -> tuple[list[ServiceLatency], list[ServiceLatency]]:
    """(prefill, decode) latency constants per model (a spec, as ``FleetModel.specs`` holds them,
    or a built-in model's name): budgets from the model's SLO, tokens per request from its request
    shape ([M, 2] input, output)."""
    pre = [ServiceLatency.from_model(m, Phase.PREFILL, float(shape[i, 0])) for i, m in enumerate(models)]
    dec = [ServiceLatency.from_model(m, Phase.DECODE, float(shape[i, 1])) for i, m in enumerate(models)]
    return pre, dec


def _noisy_mean(s: PhaseSignals, n: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """The observed mean latency, with the sampling error of a mean over ``n`` observations."""
    mean = s.observed_latency_s
    if rng is None:
        return mean
    sd = np.maximum((s.high_s - s.low_s) / math.sqrt(12.0), (s.p90_s - s.p50_s) / 1.2816)
    with np.errstate(divide="ignore", invalid="ignore"):
        se = np.where(n >= 1, sd / np.sqrt(np.maximum(n, 1.0)), 0.0)
    return np.maximum(mean + se * rng.standard_normal(mean.shape), 0.0)


def server_report(prefill: Sequence[ServiceLatency], decode: Sequence[ServiceLatency], demand: np.ndarray,
                  ready: np.ndarray, instances: np.ndarray, step_s: float,
                  rng: np.random.Generator | None = None) -> ServerReport:
    """What the servers report over a step: ``demand`` and truly ``ready`` capacity [M, 2]
    tokens/s, ``instances`` [M, 2] ready (fractional for part of the step)."""
    n = np.maximum(np.asarray(instances, dtype=float), 1.0)
    p = phase_signals(demand[:, 0], ready[:, 0], prefill, step_s=step_s, instances=n[:, 0])
    d = phase_signals(demand[:, 1], ready[:, 1], decode, step_s=step_s, instances=n[:, 1])
    ttft = _noisy_mean(p, p.served_requests, rng)
    # vLLM's inter-token histogram gains one observation per generated token
    itl = _noisy_mean(d, d.served_tps * step_s, rng)
    busy = demand.sum(axis=1) > 0
    slo = np.where(busy, np.minimum(p.on_time_share, d.on_time_share), 1.0)
    return ServerReport(p, d, ttft, itl, slo, p.running + d.running, p.waiting + d.waiting, d.kv_usage)


def _bisect_levels(lo: np.ndarray, hi: np.ndarray, levels: int,
                   above_at: Callable[[np.ndarray, int], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``levels`` steps of the bisection ``mid = (lo + hi) / 2; lo, hi = (mid, hi) if above(mid)
    else (lo, mid)`` on every row, with one call of ``above_at`` (points [k x rows], flattened
    node-major, and k) over all 2^levels - 1 midpoints the steps could visit. The midpoints are
    computed by the same arithmetic from the same ends, and the steps then follow the evaluated
    signs, so the result is the step-by-step bisection's to the bit (the model is elementwise);
    the latency model costs about the same per call for 15 rows per service as for one."""
    nodes = 2**levels - 1
    node_lo, node_hi = np.empty((nodes, len(lo))), np.empty((nodes, len(lo)))
    node_lo[0], node_hi[0] = lo, hi
    mids = np.empty((nodes, len(lo)))
    for i in range(nodes):  # heap order: node i's children are 2i+1 (not above) and 2i+2 (above)
        mids[i] = 0.5 * (node_lo[i] + node_hi[i])
        if 2 * i + 2 < nodes:
            node_lo[2 * i + 1], node_hi[2 * i + 1] = node_lo[i], mids[i]
            node_lo[2 * i + 2], node_hi[2 * i + 2] = mids[i], node_hi[i]
    above = above_at(mids.ravel(), nodes).reshape(nodes, len(lo))
    cols = np.arange(len(lo))
    at = np.zeros(len(lo), dtype=np.intp)
    for _ in range(levels):
        mid, up = mids[at, cols], above[at, cols]
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
        at = 2 * at + 1 + up
    return lo, hi


def implied_capacities(services: Sequence[ServiceLatency], served: np.ndarray, observed_mean_s: np.ndarray,
                       waiting: np.ndarray, instances: np.ndarray, step_s: float
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(capacity tokens/s, informative, weight) per service (of either phase), from served tokens/s, the
    observed mean latency (sum / count) and the requests waiting. **Saturated** — more requests
    waiting than a server exactly at capacity for what was served would hold — the capacity is
    what was served (latency alone cannot tell: past capacity the model's mean latency falls
    again as the excess stays queued). Otherwise the latency is inverted on utilization in
    [``RHO_MIN``, 1). Uninformative: nothing served, no latency, or a latency at the idle floor;
    weight = (d ln latency / d ln load)^2 (1 when saturated) / ``LATENCY_REL_SD``^2: the
    precision of the implied capacity."""
    served = np.asarray(served, dtype=float)
    obs = np.asarray(observed_mean_s, dtype=float)
    n = np.maximum(np.asarray(instances, dtype=float), 1.0)
    size = len(services)
    cap = np.full(size, np.nan)
    weight = np.zeros(size)
    ok = (served > 0) & np.isfinite(obs) & (obs > 0)
    if not ok.any():
        return cap, ok, weight
    srv = np.where(ok, served, 1.0)
    arrays = ServiceArrays.of(services)  # once: the inversion evaluates the model 9 times

    def latency_at(capacity: np.ndarray) -> np.ndarray:
        return observed_latency(srv, capacity, arrays, step_s=step_s, instances=n)[0]

    full = phase_signals(srv, srv, services, step_s=step_s, instances=n, summary_only=True, arrays=arrays)
    saturated = ok & (np.asarray(waiting, dtype=float) >= full.waiting * (1.0 - 1e-9))
    floor = latency_at(srv / RHO_MIN)
    inside = ok & ~saturated & (obs > floor)
    # bisect only the services whose latency says something (the model is elementwise: the same
    # values as over every service, a quarter to a third fewer rows a step)
    rows = np.flatnonzero(inside)
    est = np.full(size, np.nan)
    if len(rows):
        s_srv, s_n, s_obs = srv[rows], n[rows], obs[rows]
        lo, hi = np.log(s_srv / RHO_TOP), np.log(s_srv / RHO_MIN)  # latency falls as capacity rises
        wide: dict[int, ServiceArrays] = {}  # the constants tiled k times, made once per k

        def above_at(mids: np.ndarray, k: int) -> np.ndarray:
            if k not in wide:
                wide[k] = arrays.take(np.tile(rows, k))
            return observed_latency(np.tile(s_srv, k), np.exp(mids), wide[k], step_s=step_s,
                                    instances=np.tile(s_n, k))[0] > np.tile(s_obs, k)

        done = 0
        while done < _BISECT_STEPS:
            levels = min(_BISECT_LEVELS, _BISECT_STEPS - done)
            lo, hi = _bisect_levels(lo, hi, levels, above_at)
            done += levels
        est[rows] = np.exp(0.5 * (lo + hi))
    cap = np.where(saturated, served, np.where(inside, est, np.nan))
    budgets = np.array([s.budget_s for s in services])
    shares = np.array([s.fixed_share for s in services])
    phases = [s.phase for s in services]
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(inside, srv / np.where(inside, cap, 1.0), 1.0)
    lat_on_curve = np.asarray(observed_latency(srv, srv / np.clip(rho, RHO_MIN, 1.0), arrays, step_s=step_s,
                                               instances=n)[1])
    w = capacity_weight(lat_on_curve, budgets, shares, phases)
    weight = np.where(saturated, 1.0, np.where(inside, w, 0.0)) / LATENCY_REL_SD**2
    informative = saturated | (inside & (utilization_from_latency(lat_on_curve, budgets, shares, phases) > 0))
    return cap, informative, weight


def learn(correction: CapacityCorrection, models: Sequence[str],
          prefill: Sequence[ServiceLatency], decode: Sequence[ServiceLatency],
          exposure: Mapping[tuple[int, int], Mapping[str, float]], served: np.ndarray,
          observed_mean_s: np.ndarray, waiting: np.ndarray, instances: np.ndarray,
          step_s: float, changing: set[tuple[int, int]] | frozenset[tuple[int, int]] = frozenset(),
          fade_silent: bool = False) -> dict[str, float]:
    """Feed one interval to ``correction``: per service with ready capacity (``exposure``: (model
    index, phase index) -> family -> the model's tokens/s), the capacity implied by ``served``
    ``observed_mean_s`` and ``waiting`` (requests) [M, 2]. Returns service -> implied capacity of
    the usable ones. Services in ``changing`` (their capacity changed during the interval,
    :meth:`atoll.envs.fleet_model.FleetModel.changing`) teach nothing: the interval's averages mix
    two fleets, and when an instance became ready is where a live controller's bookkeeping and
    the cluster disagree most. ``fade_silent``: a serving, steady service whose interval taught
    nothing (no usable signal) fades toward the prior (:meth:`CapacityCorrection.fade`)."""
    used: dict[str, float] = {}
    # both phases in one inversion: the model is elementwise per service, and its 9 evaluations
    # a step cost the same for 2M services as for M
    m = len(models)

    def phases(a: np.ndarray) -> np.ndarray:  # [M, 2] -> [2M]: prefill then decode
        return np.concatenate([a[:, 0], a[:, 1]])

    both = implied_capacities([*prefill, *decode], phases(served), phases(observed_mean_s), phases(waiting),
                              phases(instances), step_s)
    for ph in range(2):
        cap, informative, weight = (a[ph * m:(ph + 1) * m] for a in both)
        for i, model in enumerate(models):
            fams = exposure.get((i, ph))
            if not fams or not informative[i] or (i, ph) in changing:
                continue
            name = f"{model}/{PHASES[ph]}"
            if correction.observe(name, fams, float(cap[i]), float(weight[i])):
                used[name] = float(cap[i])
        if fade_silent:
            for i, model in enumerate(models):
                name = f"{model}/{PHASES[ph]}"
                if exposure.get((i, ph)) and (i, ph) not in changing and name not in used:
                    correction.fade(name)
    return used
