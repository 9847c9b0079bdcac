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
- :func:`requested_log`: the nodes each delivery started, the refused share's denominator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from atoll.control.live_demand import ModelForecast
from atoll.control.live_fleet import STEP_S, LiveFleet
from atoll.control.rates import RateReport
from atoll.control.risk_signals import (
    WINDOW_S,
    PoolEventLog,
    QueueGrowth,
    pool_shares,
    report,
    requested_by_type,
    share_over,
)
from atoll.control.state import ControllerState
from atoll.envs.fleet import FleetState
from atoll.envs.latency import ServiceLatency
from atoll.envs.observation import SINCE_CAP, Signals
from atoll.envs.signals import UNSERVED_WINDOW, fleet_signals
from atoll.solvers.problem import gpu_type_of

Latencies = tuple[Sequence[ServiceLatency], Sequence[ServiceLatency]]  # (prefill, decode) per model


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
    held = np.zeros(len(gpu_types))
    index = {t: k for k, t in enumerate(gpu_types)}
    for (_, config), n in fleet.model.nodes_held(fs).items():
        held[index[gpu_type_of(config)]] += n
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


def requested_log(fleet: LiveFleet, log: Sequence[tuple[float, str, float]], fresh: Mapping[str, int],
                  now: float) -> tuple[tuple[float, str, float], ...]:
    """``log`` with a delivery's started instances ``fresh`` added (per GPU type, a slice counting
    its share of a node) and entries past the window dropped."""
    added: dict[str, float] = {}
    for key, n in fresh.items():
        template = fleet.templates.get(key)
        if template is None or n <= 0:
            continue
        for config, k in template.node_use:
            gpu = gpu_type_of(config)
            added[gpu] = added.get(gpu, 0.0) + n * k
    kept = tuple(e for e in log if e[0] > now - WINDOW_S)
    return (*kept, *((now, g, n) for g, n in sorted(added.items())))
