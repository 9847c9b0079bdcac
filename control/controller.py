"""The live controller: observe -> decide -> solve -> apply, one tick at a time.

A tick:

1. **deliver** the plan an earlier tick could not deliver (``ControllerState.pending``), first;
2. **observe**: read vLLM's counters and gauges per model (``atoll.control.metrics``, retried with
   backoff), turn them into token rates (``atoll.control.rates``: counter resets, new replicas,
   missing or NaN series), append the fresh rates to the history and forecast the planning
   demand (``atoll.control.live_demand``);
3. **decide**: build the observation with the env's own :func:`atoll.envs.observation.build_observation`
   and ask the policy which models to re-optimize. Models without a fresh rate are *held*: the
   policy cannot choose them and the solver keeps their instances as they are — a metrics gap
   never scales a model down, let alone to zero. A model with fresh demand and no capacity at
   all is always chosen;
4. **solve** the exact ILP for the chosen models, the others fixed, warm-started from the
   running plan (:class:`atoll.envs.planner.Replanner`: cost mode, then goodput mode; a time-out
   keeps the incumbent when the solver has one, else the fleet holds);
5. **apply**: a changed plan becomes a :class:`~atoll.control.plans.PlanRecord`, persisted as pending
   *before* the sink sees it, then delivered (retried); only a delivered plan becomes the
   running plan. A failed delivery stays pending and is retried next tick;
6. **persist** the state atomically (``atoll.control.state``), so a controller killed at any point
   resumes from the last tick it finished, with its running plan, pending plan, history and
   rate baselines.

Metrics unavailable (after the retries): the tick holds every model, reports the data as
stale (seconds since the last good read) and still persists.

Time comes only from the injected ``clock`` (seconds; wall time by default) and waits only from
``sleep``, so tests script both.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from atoll.control.live_demand import LiveForecast, ModelForecast
from atoll.control.live_fleet import STEP_S, LiveFleet
from atoll.control.metrics import MetricsSource, MetricsUnavailable, read_with_retry
from atoll.control.plans import PlanRecord, SinkResult
from atoll.control.rates import RateReport, RateTracker
from atoll.control.sinks import PlanSink, deliver
from atoll.control.state import HISTORY_LIMIT, ControllerState, HistoryPoint, load_state, save_state
from atoll.envs.fleet_env import UNSERVED_WINDOW
from atoll.envs.observation import SINCE_CAP, Signals, build_observation, observation_space
from atoll.envs.policies import Policy
from atoll.solvers.problem import Allocation


@dataclass(frozen=True)
class ControllerSettings:
    """interval_s: seconds between ticks (controller clock); look_ahead_s and planning_quantile:
    what the plan must cover, as in the env; forecaster: its name (``ets``...); time_scale:
    trace seconds per second of the metrics' own clock (a replay sped up X times has X, and its
    measured rates are divided by X); read/sink attempts and first backoff waits (s)."""

    interval_s: float = 60.0
    look_ahead_s: float = 900.0
    forecaster: str = "ets"
    planning_quantile: float = 0.9
    time_scale: float = 1.0
    read_attempts: int = 3
    read_backoff_s: float = 0.5
    sink_attempts: int = 3
    sink_backoff_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("interval_s", "look_ahead_s", "time_scale"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"ControllerSettings: field {name!r} must be > 0, got {v!r}")
        for name in ("read_backoff_s", "sink_backoff_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"ControllerSettings: field {name!r} must be >= 0, got {v!r}")
        for name in ("read_attempts", "sink_attempts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ControllerSettings: field {name!r} must be an integer >= 1, got {v!r}")
        if not 0 < self.planning_quantile < 1:
            raise ValueError(f"ControllerSettings: field 'planning_quantile' must be in (0, 1), "
                             f"got {self.planning_quantile!r}")


@dataclass(frozen=True)
class Decision:
    """Which models the tick re-optimizes and why; which it holds (no usable data) and why."""

    policy: str
    chosen: dict[str, str] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)
    unchanged: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "chosen": dict(self.chosen), "held": dict(self.held),
                "unchanged": list(self.unchanged)}


@dataclass(frozen=True)
class TickReport:
    """What one tick saw and did (``as_dict`` is what ``atoll control --json`` prints)."""

    tick: int
    time_s: float
    metrics: dict[str, Any]
    forecast: dict[str, dict[str, Any]]
    decision: Decision
    solve: dict[str, Any] | None
    plan_changed: bool
    diff: list[dict[str, Any]]
    sink_result: dict[str, Any] | None
    earlier_delivery: dict[str, Any] | None
    plan_sequence: int
    pending: bool
    seconds: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return {"tick": self.tick, "time_s": self.time_s, "metrics": self.metrics, "forecast": self.forecast,
                "decision": self.decision.as_dict(), "solve": self.solve, "plan_changed": self.plan_changed,
                "diff": self.diff, "sink_result": self.sink_result, "earlier_delivery": self.earlier_delivery,
                "plan_sequence": self.plan_sequence, "pending": self.pending, "seconds": self.seconds}


class Controller:
    """Runs ticks against a metrics source, a policy and a plan sink, persisting to ``state_dir``."""

    def __init__(self, fleet: LiveFleet, source: MetricsSource, policy: Policy, sink: PlanSink,
                 state_dir: Path | str, *, settings: ControllerSettings | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        self.fleet, self.source, self.policy, self.sink = fleet, source, policy, sink
        self.settings = s = settings or ControllerSettings()
        self.state_dir = Path(state_dir)
        self.clock, self.sleep = clock, sleep
        expected = observation_space(len(fleet.models), len(fleet.gpu_types)).shape[0]
        size = getattr(policy, "observation_size", expected)
        if size != expected:
            raise ValueError(f"policy {policy.name!r} takes observations of {size} values, but this fleet "
                             f"({len(fleet.models)} models, {len(fleet.gpu_types)} GPU types) gives "
                             f"{expected}; use a policy trained on scenario {fleet.scenario!r}")
        loaded = load_state(self.state_dir)  # StateError (names the file and the fix) propagates
        self.resumed = loaded is not None
        # a week of points at this interval, so a daily-seasonal forecaster gets its two days
        limit = max(HISTORY_LIMIT, math.ceil(7 * 86400 / s.interval_s))
        self.state = loaded if loaded is not None else ControllerState(history_limit=limit)
        self.tracker = RateTracker(fleet.models, baseline=self.state.last_metrics)
        self.forecaster = LiveForecast(forecaster=s.forecaster, quantile=s.planning_quantile,
                                       horizon=max(1, math.ceil(s.look_ahead_s / STEP_S)), step_s=STEP_S)

    # ----- the tick ------------------------------------------------------------------------
    def tick(self) -> TickReport:
        t_start = time.perf_counter()
        seconds: dict[str, float] = {}
        now = float(self.clock())
        tick_no = self.state.tick
        earlier = self._deliver_pending()
        t = time.perf_counter()
        try:
            snapshot = read_with_retry(self.source, self.settings.read_attempts, self.settings.read_backoff_s,
                                       self.sleep)
        except MetricsUnavailable as exc:
            seconds["read"] = time.perf_counter() - t
            return self._hold_stale(now, tick_no, str(exc), earlier, seconds, t_start)
        rates = self._scaled(self.tracker.update(snapshot))
        seconds["read"] = time.perf_counter() - t
        t = time.perf_counter()
        state = self.state
        fresh = [m for m in self.fleet.models if m in rates.models and rates.models[m].ok]
        for m in fresh:
            r = rates.models[m]
            assert r.prompt_tokens_per_s is not None and r.generation_tokens_per_s is not None
            state = state.with_history(m, HistoryPoint(now, r.prompt_tokens_per_s, r.generation_tokens_per_s))
        self.state = state
        forecasts = self.forecaster.forecast(state.history, now, self.fleet.models)
        signals = self._signals(now, forecasts)
        obs = build_observation(signals)
        action = np.asarray(self.policy.act(obs, {"step": tick_no, "seconds": now}))
        decision = self._decide(action, fresh, rates, signals)
        seconds["decide"] = time.perf_counter() - t
        t = time.perf_counter()
        solve, record = self._solve(decision, forecasts, now)
        seconds["solve"] = time.perf_counter() - t
        t = time.perf_counter()
        sink_result = self._apply(record, now) if record is not None else None
        seconds["sink"] = time.perf_counter() - t
        last = dict(self.state.last_reoptimized)
        last.update({m: tick_no for m in decision.chosen})
        self.state = replace(self.state, tick=tick_no + 1, last_tick_s=now, last_reoptimized=last,
                             last_metrics=self.tracker.baseline)
        t = time.perf_counter()
        save_state(self.state_dir, self.state)
        seconds["persist"] = time.perf_counter() - t
        seconds["total"] = time.perf_counter() - t_start
        ignored = sorted(set(rates.models) - set(self.fleet.models))
        metrics = {"ok": True, "source": snapshot.source, "stale_s": 0.0,
                   "rates": {m: r.as_dict() for m, r in rates.models.items() if m in self.fleet.models},
                   "ignored_models": ignored}
        return TickReport(tick_no, now, metrics, {m: f.as_dict() for m, f in forecasts.items()}, decision,
                          solve, record is not None, self._diff_rows(record), sink_result, earlier,
                          self.state.plan_sequence, self.state.pending is not None, seconds)

    # ----- steps ---------------------------------------------------------------------------
    def _scaled(self, report: RateReport) -> RateReport:
        k = self.settings.time_scale
        if k == 1.0:
            return report
        return RateReport(report.time_s, {
            m: replace(r, prompt_tokens_per_s=(r.prompt_tokens_per_s or 0.0) / k,
                       generation_tokens_per_s=(r.generation_tokens_per_s or 0.0) / k) if r.ok else r
            for m, r in report.models.items()})

    def _ready_plan(self, now: float) -> dict[str, int]:
        """The running plan without the instances still starting."""
        ready = dict(self.state.running)
        for key, n, at in self.state.starting:
            if at > now and key in ready:
                ready[key] = max(0, ready[key] - n)
        return ready

    def _signals(self, now: float, forecasts: Mapping[str, ModelForecast]) -> Signals:
        fleet, state = self.fleet, self.state
        m = len(fleet.models)
        demand, fmean, fupper = np.zeros((m, 2)), np.zeros((m, 2)), np.zeros((m, 2))
        for i, model in enumerate(fleet.models):
            f = forecasts.get(model)
            if f is not None:
                demand[i], fmean[i], fupper[i] = f.last, f.mean, f.upper
        planned = fleet.capacity(state.running)
        ready = fleet.capacity(self._ready_plan(now))
        unserved = np.zeros(m)
        for i, model in enumerate(fleet.models):
            points = state.history.get(model, ())[-UNSERVED_WINDOW:]
            shares = []
            for p in points:
                d = np.array([p.prompt_tokens_per_s, p.generation_tokens_per_s])
                served = np.where(d > 0, np.minimum(d, ready[i]) / np.where(d > 0, d, 1.0), 1.0)
                shares.append(1.0 - float(served.min()))
            unserved[i] = float(np.mean(shares)) if shares else 0.0
        cost = fleet.cost_by_model(state.running)
        total = float(cost.sum())
        since = np.array([(state.tick - state.last_reoptimized[model]) * self.settings.interval_s / STEP_S
                          if model in state.last_reoptimized else SINCE_CAP for model in fleet.models])
        scale = state.cost_scale_usd_h
        return Signals(demand=demand, forecast_mean=fmean, forecast_upper=fupper, ready_capacity=ready,
                       planned_capacity=planned, since_reopt=since, unserved_share=unserved,
                       cost_share=cost / total if total > 0 else np.zeros(m), preempted=np.zeros(m),
                       headroom=fleet.headroom(state.running), seconds_of_day=now % 86400.0,
                       cost_rate_ratio=total / scale if scale else 1.0)

    def _decide(self, action: np.ndarray, fresh: list[str], rates: RateReport, s: Signals) -> Decision:
        chosen: dict[str, str] = {}
        held: dict[str, str] = {}
        unchanged: list[str] = []
        for i, model in enumerate(self.fleet.models):
            if model not in fresh:
                r = rates.models.get(model)
                held[model] = (f"{r.status.value}: {r.reason}" if r is not None else "missing: no series") + \
                    "; its instances are kept as they are"
                continue
            need = s.demand[i].max() > 0 or s.forecast_upper[i].max() > 0
            if s.planned_capacity[i].max() <= 0 and need:
                chosen[model] = "no capacity planned for its demand yet"
            elif i < len(action) and action[i]:
                with np.errstate(divide="ignore", invalid="ignore"):
                    planned, ready = s.planned_capacity[i], s.ready_capacity[i]
                    up = np.max(np.where(planned > 0, s.forecast_upper[i] / planned, np.inf))
                    now = np.max(np.where(ready > 0, s.demand[i] / ready, np.inf))
                chosen[model] = (f"{self.policy.name}: forecast upper / planned capacity {up:.2f}, "
                                 f"demand / ready capacity {now:.2f}, unserved {s.unserved_share[i]:.1%}")
            else:
                unchanged.append(model)
        return Decision(self.policy.name, chosen, held, tuple(unchanged))

    def _solve(self, decision: Decision, forecasts: Mapping[str, ModelForecast], now: float
               ) -> tuple[dict[str, Any] | None, PlanRecord | None]:
        if not decision.chosen:
            return None, None
        demand: dict[str, float] = {}
        for model in decision.chosen:
            upper = forecasts[model].upper
            demand[f"{model}/prefill"], demand[f"{model}/decode"] = float(upper[0]), float(upper[1])
        running = Allocation.of(self.fleet.known(self.state.running))
        out = self.fleet.replanner.plan(frozenset(decision.chosen), demand, self.fleet.availability, running)
        solve = {"status": out.status.value, "mode": out.mode, "solver_seconds": out.solver_seconds,
                 "cached": out.cached, "message": out.message, "demand_tokens_per_s": demand}
        if out.allocation is None or out.allocation.as_dict() == self.fleet.known(self.state.running):
            solve["result"] = "held: no plan" if out.allocation is None else "unchanged"
            return solve, None
        solve["result"] = "new plan"
        seq = self.state.plan_sequence + 1
        reason = "; ".join(f"{m}: {why}" for m, why in decision.chosen.items())
        record = PlanRecord.from_allocation(seq, now, out.allocation, self.state.running,
                                            self.fleet.templates, demand, reason)
        return solve, record

    def _apply(self, record: PlanRecord, now: float) -> dict[str, Any]:
        # pending first and on disk: a crash from here on re-delivers it, never loses it
        self.state = replace(self.state, pending=record, plan_sequence=record.sequence)
        save_state(self.state_dir, self.state)
        return self._deliver(record, now).as_dict()

    def _deliver(self, record: PlanRecord, now: float) -> SinkResult:
        result = deliver(self.sink, record, self.settings.sink_attempts, self.settings.sink_backoff_s,
                         self.sleep)
        if result.ok:
            starting = [(k, n, at) for k, n, at in self.state.starting if at > now]
            for key, change in record.diff.items():
                if change > 0 and key in self.fleet.templates:
                    starting.append((key, change, now + self.fleet.startup.of(self.fleet.templates[key])))
            keep = [(k, min(n, record.plan.get(k, 0)), at) for k, n, at in starting]
            scale = self.state.cost_scale_usd_h or float(self.fleet.cost_by_model(record.plan).sum()) or None
            self.state = replace(self.state, running=dict(record.plan), pending=None,
                                 starting=tuple(e for e in keep if e[1] > 0), cost_scale_usd_h=scale)
            save_state(self.state_dir, self.state)
        return result

    def _deliver_pending(self) -> dict[str, Any] | None:
        pending = self.state.pending
        if pending is None:
            return None
        return self._deliver(pending, float(self.clock())).as_dict()

    def _hold_stale(self, now: float, tick_no: int, error: str, earlier: dict[str, Any] | None,
                    seconds: dict[str, float], t_start: float) -> TickReport:
        reads = [points[-1].time_s for points in self.state.history.values() if points]
        stale = now - max(reads) if reads else None
        held = {m: "metrics unavailable; its instances are kept as they are" for m in self.fleet.models}
        self.state = replace(self.state, tick=tick_no + 1, last_tick_s=now)
        save_state(self.state_dir, self.state)
        seconds["total"] = time.perf_counter() - t_start
        metrics = {"ok": False, "source": self.source.url, "error": error, "stale_s": stale, "rates": {}}
        return TickReport(tick_no, now, metrics, {}, Decision(self.policy.name, {}, held), None, False, [],
                          None, earlier, self.state.plan_sequence, self.state.pending is not None, seconds)

    def _diff_rows(self, record: PlanRecord | None) -> list[dict[str, Any]]:
        """Instances to add (> 0) and remove (< 0) per template and region."""
        if record is None:
            return []
        rows = []
        for key, change in record.diff.items():
            d = record.templates.get(key, {})
            rows.append({"template": key, "model": d.get("model"), "phase": d.get("phase"),
                         "region": d.get("region"), "nodes": d.get("nodes"), "change": change,
                         "action": "add" if change > 0 else "remove", "instances": record.plan.get(key, 0)})
        return rows
