"""The controller's *observe* step as pure functions: from what the servers, the plan and the
pool event log say, the :class:`~atoll.envs.observation.Signals` the simulator's env builds.

The controller's fleet is the env's :class:`~atoll.envs.fleet_model.FleetModel` and its state a
:class:`~atoll.envs.fleet.FleetState`, and :func:`atoll.envs.signals.fleet_signals` makes the
signals on both sides, so a policy sees live what it saw in training (the parity tests replay a
day through both and compare every observation):

- :func:`signals`: demand, forecasts, the fleet, cost and the unserved window (``Fleet-v1``),
  with the servers' latency ratio and waiting share (:func:`server_view`) for ``Fleet-v2``;
- :func:`risk_signals`: the observation of risk ``Fleet-v3`` / ``-v4`` add, from the servers'
  gated signals, the delivered plan and the pool event log (:mod:`atoll.control.risk_signals`);
- :func:`account` and :func:`learn_interval`: the interval since the last tick as the env's
  step (cost, unserved shares) and what it teaches the capacity correction;
- :func:`rate_limits` and :func:`scaled`: the rate guard's ceilings and the metrics' clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from atoll.control import deliver
from atoll.control.guard_rails import GuardTables
from atoll.control.live_demand import ModelForecast
from atoll.control.live_fleet import STEP_S, LiveFleet
from atoll.control.rates import RateReport
from atoll.control.risk_signals import (
    PoolEventLog,
    QueueGrowth,
    pool_shares,
    report,
    requested_by_type,
    share_over,
)
from atoll.control.state import ControllerState
from atoll.envs.correction import CapacityCorrection
from atoll.envs.fleet import FleetState
from atoll.envs.latency import PREFILL_SCALE, ServiceLatency
from atoll.envs.observation import SINCE_CAP, Signals, observation_size
from atoll.envs.saturation import SATURATED_RATIO
from atoll.envs.servers import learn, service_latencies
from atoll.envs.signals import UNSERVED_WINDOW, fleet_signals, unserved_shares

Latencies = tuple[Sequence[ServiceLatency], Sequence[ServiceLatency]]  # (prefill, decode) per model


def observation_kind(policy: Any, fleet: LiveFleet, has_events: bool) -> tuple[bool, bool]:
    """(closed loop, risk): which observation ``policy`` takes on ``fleet`` — ``Fleet-v1``'s,
    ``-v2``'s (the servers' signals too) or ``-v3`` / ``-v4``'s (and the risk, which needs the pool
    event log: ``has_events``). A ValueError names the sizes, or the missing log, and the fix."""
    m, g = len(fleet.models), len(fleet.gpu_types)
    expected = observation_size(m, g)
    closed = observation_size(m, g, closed_loop=True)
    risky = observation_size(m, g, closed_loop=True, risk=True)
    size = getattr(policy, "observation_size", expected)
    if size not in (expected, closed, risky):
        raise ValueError(f"policy {policy.name!r} takes observations of {size} values, but this fleet "
                         f"({m} models, {g} GPU types) gives {expected} (atoll/Fleet-v1), {closed} "
                         f"(atoll/Fleet-v2) or {risky} (atoll/Fleet-v3 and -v4); use a policy "
                         f"trained on scenario {fleet.scenario!r}")
    if size == risky and not has_events:
        raise ValueError(f"policy {policy.name!r} observes the risk the fleet runs (atoll/Fleet-v3, "
                         f"-v4): preemptions and refused acquisitions per GPU type come from a pool "
                         f"event log; give one (atoll control --pool-events FILE; an empty file for a "
                         f"fleet that has seen none)")
    return size in (closed, risky), size == risky


def server_view(models: Sequence[str], latency: Latencies, fresh: Sequence[str], rates: RateReport
                ) -> tuple[np.ndarray, np.ndarray]:
    """([M] max over phases of mean latency / budget, [M] waiting / (waiting + running)) as the
    env's ``ServerReport`` gives them (0 for models without fresh rates or histograms)."""
    m = len(models)
    ratio, share = np.zeros(m), np.zeros(m)
    pre, dec = latency
    for i, name in enumerate(models):
        r = rates.models.get(name)
        if name not in fresh or r is None:
            continue
        parts = [v / b for v, b in ((r.ttft_mean_s, pre[i].budget_s), (r.itl_mean_s, dec[i].budget_s))
                 if v is not None and math.isfinite(v)]
        ratio[i] = max(parts, default=0.0)
        total = (r.waiting or 0.0) + (r.running or 0.0)
        share[i] = (r.waiting or 0.0) / total if total > 0 else 0.0
    return ratio, share


def last_demand(models: Sequence[str], state: ControllerState) -> np.ndarray:
    """[M, 2] tokens/s of each model's latest history point (0 without one)."""
    out = np.zeros((len(models), 2))
    for i, m in enumerate(models):
        points = state.history.get(m, ())
        if points:
            out[i] = (points[-1].prompt_tokens_per_s, points[-1].generation_tokens_per_s)
    return out


def signals(fleet: LiveFleet, state: ControllerState, fs: FleetState, forecasts: Mapping[str, ModelForecast],
            *, now: float, interval_s: float, last_cost: np.ndarray, last_seconds: float,
            factors: Mapping[str, float] | None, view: tuple[np.ndarray, np.ndarray] | None) -> Signals:
    """The env's signals of the fleet in state ``fs`` now; ``view``: the servers' (latency ratio,
    waiting share) for a policy that observes the closed loop, else None."""
    m = len(fleet.models)
    # [M, 2] tokens/s: each phase's own forecast (fleet_signals takes them as they are)
    fmean, fupper, ffirst, flast = np.zeros((m, 2)), np.zeros((m, 2)), np.zeros((m, 2)), np.zeros((m, 2))
    for i, model in enumerate(fleet.models):
        f = forecasts.get(model)
        if f is not None:
            fmean[i], fupper[i], ffirst[i], flast[i] = f.mean, f.upper, f.first, f.last
    window = np.zeros((UNSERVED_WINDOW, m))
    for i, model in enumerate(fleet.models):
        for j, share in enumerate(state.unserved.get(model, ())[:UNSERVED_WINDOW]):
            window[j, i] = share
    since = np.array([(state.tick - state.last_reoptimized[model]) * interval_s / STEP_S
                      if model in state.last_reoptimized else SINCE_CAP for model in fleet.models])
    return fleet_signals(fleet.model, fs, fleet.availability,
                         demand=last_demand(fleet.models, state), forecast_mean=fmean, forecast_upper=fupper,
                         forecast_first=ffirst, forecast_last=flast, since=since,
                         unserved_window=window, last_cost=last_cost,
                         last_seconds=last_seconds, cost_scale_usd_h=state.cost_scale_usd_h,
                         # vLLM exports no preemption: live, none is seen (as a fleet without any)
                         preempted=np.zeros(m), since_preempt=np.full(m, SINCE_CAP),
                         seconds_of_day=now, factors=factors,
                         latency_ratio=view[0] if view is not None else None,
                         waiting_share=view[1] if view is not None else None)


def risk_signals(fleet: LiveFleet, fs: FleetState, base: Signals, rates: RateReport, fresh: Sequence[str], *,
                 now: float, latency: Latencies, queue: QueueGrowth, events: PoolEventLog,
                 requested: Sequence[tuple[float, str, float]]) -> tuple[Signals, dict[str, Any]]:
    """``base`` with the observation of risk (:mod:`atoll.control.risk_signals`), and the tick's
    account of it: per model what fed it, the pool event log's events, ignored lines and held
    events. ``queue`` keeps each model's last waiting count (updated here); ``requested`` is the
    state's log of nodes requested."""
    m, gpu_types = len(fleet.models), fleet.gpu_types
    growth, miss = np.zeros(m), np.zeros(m)
    pre_b, dec_b = latency
    for i, name in enumerate(fleet.models):
        r = rates.models.get(name)
        if name not in fresh or r is None:
            continue
        growth[i] = queue.update(name, r.waiting, r.running)
        miss[i] = max(share_over(r.ttft_buckets, pre_b[i].budget_s),
                      share_over(r.itl_buckets, dec_b[i].budget_s))
    spread, ondemand = fleet.model.risk_exposure(fs)
    held = fleet.model.held_by_gpu_type(fs)
    asked = requested_by_type(requested, gpu_types, now)
    try:
        seen, ignored = events.read(now)
    except OSError as exc:  # the watcher's file went away: no events seen, and said so
        pre, fail = np.zeros(len(gpu_types)), np.zeros(len(gpu_types))
        account = report([], [], [], error=f"pool event log {events.path}: {exc}")
    else:
        pre, fail, held_out = pool_shares(seen, gpu_types, held, asked, now)
        account = report(seen, ignored, held_out)
    account.update({"queue_growth": dict(zip(fleet.models, growth.tolist(), strict=True)),
                    "latency_miss": dict(zip(fleet.models, miss.tolist(), strict=True)),
                    "preempted_share": dict(zip(gpu_types, pre.tolist(), strict=True)),
                    "refused_share": dict(zip(gpu_types, fail.tolist(), strict=True))})
    return replace(base, queue_growth=growth, latency_miss=miss, spread=spread, ondemand_share=ondemand,
                   preempted_share=pre, failed_share=fail), account


def account(fleet: LiveFleet, state: ControllerState, now: float, fresh: Sequence[str]
            ) -> tuple[np.ndarray, float, dict[str, tuple[float, ...]]]:
    """The interval since the last tick as the env's step: ($ per model billed over it, its
    seconds, the state's unserved windows with the fresh models' shares of it pushed in).
    Without a last tick: the cost of holding the fleet one step (what the env reports at
    reset)."""
    model = fleet.model
    last = state.last_tick_s
    if last is None or now <= last:
        return model.cost(deliver.fleet_state(fleet, state, now), STEP_S), STEP_S, dict(state.unserved)
    elapsed = now - last
    before = deliver.fleet_state(fleet, state, last)
    ready, _ = model.capacity(before, elapsed)
    demand = last_demand(fleet.models, state)
    shares = unserved_shares(demand, ready)
    window = dict(state.unserved)
    for i, m in enumerate(fleet.models):
        if m in fresh:
            window[m] = (float(np.clip(shares[i], 0.0, 1.0)), *window.get(m, ()))[:UNSERVED_WINDOW]
    return model.cost(before, elapsed), elapsed, window


def learn_interval(correction: CapacityCorrection, fleet: LiveFleet, state: ControllerState, now: float,
                   fresh: Sequence[str], rates: RateReport) -> dict[str, float] | None:
    """Feed the interval since the last tick to the capacity correction, as the env feeds a
    step (:func:`atoll.envs.servers.learn`): per phase the served token rate, the mean TTFT /
    inter-token latency the histograms gave and the requests waiting, against the model's
    capacity of each family that was ready over the interval. vLLM's waiting gauge is per
    model: it is counted against the phase whose mean latency is higher against its mean at
    capacity (the one a queue builds in; the simulator knows each phase's queue), and
    against the other too when that one is at its mean at capacity as well. Models
    without fresh rates or latency histograms teach nothing. Returns service -> the
    capacity it taught (``correction`` learned it; the caller persists ``correction.as_dict()``),
    or None without an interval (no tick before, or the clock did not move)."""
    last = state.last_tick_s
    if last is None or now <= last:
        return None
    elapsed = now - last
    m = len(fleet.models)
    served, latency, waiting = np.zeros((m, 2)), np.full((m, 2), np.nan), np.zeros((m, 2))
    # the latency model's tokens per request are the traffic's as measured (the request-length
    # histograms), the profiled shape only without them: burstiness and a decode request's
    # duration depend on them
    shape = np.array(fleet.model.shape, dtype=float)
    for i, name in enumerate(fleet.models):
        r = rates.models.get(name)
        if r is not None and r.prompt_tokens_per_request and r.generation_tokens_per_request:
            shape[i] = (r.prompt_tokens_per_request, r.generation_tokens_per_request)
    pre, dec = service_latencies(fleet.model.specs, shape)
    for i, name in enumerate(fleet.models):
        r = rates.models.get(name)
        if name not in fresh or r is None:
            continue
        served[i] = (r.prompt_tokens_per_s or 0.0, r.generation_tokens_per_s or 0.0)
        ttft = r.ttft_mean_s if r.ttft_mean_s is not None else np.nan
        itl = r.itl_mean_s if r.itl_mean_s is not None else np.nan
        latency[i] = (ttft, itl)
        # against the on-time mean at capacity (prefill 3/4 of its budget, decode its budget)
        at_capacity = np.array([PREFILL_SCALE * pre[i].budget_s, dec[i].budget_s])
        ratios = np.nan_to_num(np.array([ttft, itl]) / at_capacity, nan=-1.0)
        # a phase at or past its latency at capacity is queueing too (both can be)
        busy = ratios >= SATURATED_RATIO
        busy[int(np.argmax(ratios))] = True
        waiting[i, busy] = r.waiting or 0.0
    model = fleet.model
    before = deliver.fleet_state(fleet, state, last, deployed=True)
    return learn(correction, fleet.models, pre, dec, model.ready_by_family(before, elapsed),
                 served, latency, waiting, model.instances_ready(before, elapsed), elapsed,
             model.changing(before, elapsed), fade_silent=True)


def rate_limits(fleet: LiveFleet, state: ControllerState, guards: GuardTables, now: float, *,
                interval_s: float, outlier_factor: float, time_scale: float
                ) -> dict[str, tuple[float, float]]:
    """model -> the highest believable (prompt, generation) tokens/s in the metrics' time:
    the fleet's ceiling, and once the model has a recent range, ``outlier_factor`` x its
    recent maximum — or, after a gap, the last one known — (at least one instance's throughput,
    so traffic coming back is not held)."""
    window = max(3600.0, 3 * interval_s)
    out: dict[str, tuple[float, float]] = {}
    for i, m in enumerate(fleet.models):
        points = state.history.get(m, ())
        recent = [p for p in points[-4096:] if p.time_s > now - window]
        if len(recent) < 3:
            # after a gap (an outage, a restart days later) the last range known still bounds
            # what is believable: a counter lying over a 30-day interval must not pass as a
            # rate below the fleet's ceiling
            recent = list(points[-12:])
        pair = []
        for ph in range(2):
            limit = float(guards.ceiling[i, ph]) or math.inf
            if len(recent) >= 3:
                top = max((p.prompt_tokens_per_s, p.generation_tokens_per_s)[ph] for p in recent)
                limit = min(limit, outlier_factor * max(top, float(guards.one_instance[i, ph])))
            pair.append(limit * time_scale)
        out[m] = (pair[0], pair[1])
    return out


def scaled(report: RateReport, k: float) -> RateReport:
    """``report`` per trace second: rates per second of the metrics' clock / ``k`` (the
    ``time_scale``)."""
    if k == 1.0:
        return report
    # rates per second of the metrics' clock -> per trace second; tokens per request and the
    # servers' latencies are not rates and stay as measured
    return RateReport(report.time_s, {
        m: replace(r, prompt_tokens_per_s=(r.prompt_tokens_per_s or 0.0) / k,
                   generation_tokens_per_s=(r.generation_tokens_per_s or 0.0) / k,
                   requests_per_s=None if r.requests_per_s is None else r.requests_per_s / k,
                   aborted_per_s=None if r.aborted_per_s is None else r.aborted_per_s / k)
        if r.ok else r
        for m, r in report.models.items()})
