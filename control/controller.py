"""The live controller: observe -> decide -> solve -> apply, one tick at a time.

A tick:

1. **observe**: read vLLM's counters and gauges per model (``atoll.control.metrics``, retried with
   backoff), turn them into token rates (``atoll.control.rates``: counter resets, new replicas,
   missing or NaN series; tokens per request and latency from vLLM's histograms) and append the
   fresh rates to the history; account the interval since
   the last tick as the env accounts a step (served against the capacity ready over it, billed
   for running, starting and draining nodes); then deliver the plan an earlier tick could not
   deliver (``ControllerState.pending``) and forecast the planning demand of each phase from its
   own measured token rate (``atoll.control.live_demand``; a request shape drifting from the
   one the templates were profiled at is reported in ``shape_drift``);
2. **decide**: build the observation exactly as the env does (:mod:`atoll.control.observe`: the
   controller's fleet is the env's :class:`~atoll.envs.fleet_model.FleetModel`, its state a
   :class:`~atoll.envs.fleet.FleetState`, and :func:`atoll.envs.signals.fleet_signals` makes the
   ``Signals`` on both sides; a policy trained on the charged world also reads the risk the fleet
   runs, from the servers and a pool event log) — and ask the policy which models to re-optimize.
   Models without a fresh rate are *held*: the policy cannot choose them and the solver keeps
   their instances as they are — a metrics gap never scales a model down, let alone to zero. A
   model with fresh demand and no capacity at all is always chosen;
3. **solve** (:mod:`atoll.control.decide`, as is step 2's decision) the exact ILP for the chosen
   models, the others fixed, warm-started from the running plan
   (:class:`atoll.envs.planner.Replanner`: cost mode, then goodput mode; a time-out keeps the
   incumbent when the solver has one, else the fleet holds), held to the guard rails;
4. **apply** (:mod:`atoll.control.deliver`): a changed plan becomes a
   :class:`~atoll.control.plans.PlanRecord`, persisted as pending *before* the sink sees it, then
   delivered make-before-break (retried); only a delivered plan becomes the running plan. A failed
   delivery stays pending and is retried next tick;
5. **persist** the state atomically (``atoll.control.state``), so a controller killed at any point
   resumes from the last tick it finished, with its running plan, pending plan, history and
   rate baselines.

Metrics unavailable (after the retries): the tick holds every model, reports the data as
stale (seconds since the last good read) and still persists.

Guard rails (:mod:`atoll.control.guard_rails`): every model and phase keeps at least its fleet's
``min_instances`` (default 1: a model planned to zero has no server left whose counters could
show its traffic coming back, so it would be held at zero for good); a rate beyond what the fleet could ever
serve, or ``outlier_factor`` x above the model's recent range, is held as an outlier until a
second interval confirms it (:mod:`atoll.control.rates`); a plan grows a service by at most
``growth_factor`` x its instances + ``growth_add`` per tick (reported in ``solve.guard_rails``);
nothing non-finite reaches the planner. The state records its clock (``time_scale``): a state
written at another time scale is refused, naming both.

Time comes only from the injected ``clock`` (seconds; wall time by default) and waits only from
``sleep``, so tests script both.
"""

from __future__ import annotations

import math
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from atoll.control import churn, decide, deliver, guard_rails, observe
from atoll.control.arrivals import LiveArrivals, PhaseDemand
from atoll.control.clock import iso, state_clock_offset
from atoll.control.decide import Decision
from atoll.control.live_demand import SHAPE_TOLERANCE, LiveForecast, ModelForecast, compact_history
from atoll.control.live_fleet import STEP_S, LiveFleet
from atoll.control.metrics import MetricsSnapshot, MetricsSource, MetricsUnavailable, read_with_retry
from atoll.control.plan_view import plan_view
from atoll.control.plans import PlanRecord
from atoll.control.plausibility import Verdict
from atoll.control.rates import FLAT_HOLD_S, RESET_FRACTION, RateReport, RateTracker
from atoll.control.risk_signals import PoolEventLog, QueueGrowth
from atoll.control.sinks import PlanSink
from atoll.control.state import (
    HISTORY_LIMIT,
    ControllerState,
    HistoryPoint,
    StateError,
    load_state,
    save_state,
    state_path,
    sweep_temporary,
)
from atoll.envs.actions import ActionCodec
from atoll.envs.correction import CapacityCorrection, CorrectionSettings
from atoll.envs.fleet import FleetState
from atoll.envs.observation import Signals, build_observation
from atoll.envs.policies import Policy
from atoll.envs.servers import service_latencies
from atoll.envs.vocabulary import DEFAULT_LEVEL
from atoll.forecast.planning import DEFAULT_FORECASTER
from atoll.solvers.problem import Risk
from atoll.solvers.validation import check_flag, check_fraction, check_integer, check_number

PUBLISH_BAND = 2.0  # standard errors a learned factor must move before the planner sees it


@dataclass(frozen=True)
class ControllerSettings:
    """interval_s: seconds between ticks (controller clock); look_ahead_s and planning_quantile:
    what the plan must cover, as in the env; forecaster: its name (default the env's,
    ``peak:auto``); time_scale: trace seconds per second of the metrics' own clock (a replay
    sped up X times has X, and its measured rates are divided by X); read/sink attempts and
    first backoff waits (s)."""

    interval_s: float = 60.0
    look_ahead_s: float = 900.0
    forecaster: str = DEFAULT_FORECASTER  # the env's (FleetConfig) default: parity
    planning_quantile: float = DEFAULT_LEVEL
    time_scale: float = 1.0
    read_attempts: int = 3
    read_backoff_s: float = 0.5
    sink_attempts: int = 3
    sink_backoff_s: float = 1.0
    flat_hold_s: float = FLAT_HOLD_S  # flat counters held this long before they read as zero (rates.py)
    reset_fraction: float = RESET_FRACTION  # a counter below this fraction of the last one restarted
    # a measured tokens/request this far (relative) off the profiled shape is reported as a drift
    shape_tolerance: float = SHAPE_TOLERANCE
    # guard rails: a service grows by at most growth_factor x its instances + growth_add per tick
    # (HPA's default scale-up policy is the larger of 100% and 4 pods); a rate above
    # outlier_factor x the model's recent range is held until a second interval confirms it
    growth_factor: float = 2.0
    growth_add: int = 4
    outlier_factor: float = 10.0
    # online capacity correction: learn a factor per template family from the servers'
    # latency and throughput, and plan with the corrected capacities
    correction: bool = True
    # the levels the policy's action codes mean (None: the fleet's); a rule assigning levels per
    # model (``per-model:``) brings its own, as it does in the simulator
    action_levels: tuple[float, ...] | None = None
    # the risk presets a per-model rule chooses among (its codes' meaning, as the simulator's
    # ``risk`` action); empty: one risk for every re-plan
    risk_presets: tuple[Risk, ...] = ()
    # scale-down stabilization (HPA's stabilizationWindowSeconds for scale-down): a service
    # shrinks only to the most instances the solver wanted for it over this window (controller
    # seconds); 0: off
    scale_down_window_s: float = 0.0

    def __post_init__(self) -> None:
        owner = "ControllerSettings"
        check_number(owner, "scale_down_window_s", self.scale_down_window_s, allow_zero=True)
        check_flag(owner, "correction", self.correction)
        # factors with a floor of 1 (no helper states these bounds)
        if not (isinstance(self.growth_factor, int | float) and math.isfinite(self.growth_factor)
                and self.growth_factor >= 1):
            raise ValueError(f"{owner}: field 'growth_factor' must be >= 1, got {self.growth_factor!r}")
        check_integer(owner, "growth_add", self.growth_add, minimum=0)
        if not (isinstance(self.outlier_factor, int | float) and math.isfinite(self.outlier_factor)
                and self.outlier_factor > 1):
            raise ValueError(f"{owner}: field 'outlier_factor' must be > 1, got {self.outlier_factor!r}")
        for name in ("interval_s", "look_ahead_s", "time_scale"):
            check_number(owner, name, getattr(self, name))
        for name in ("read_backoff_s", "sink_backoff_s", "flat_hold_s"):
            check_number(owner, name, getattr(self, name), allow_zero=True)
        for name in ("read_attempts", "sink_attempts"):
            check_integer(owner, name, getattr(self, name))
        for name in ("reset_fraction", "shape_tolerance", "planning_quantile"):
            check_fraction(owner, name, getattr(self, name), low_open=True, high_open=True)
        if self.action_levels is not None and (not self.action_levels or not all(
                isinstance(q, int | float) and 0 < q < 1 for q in self.action_levels)):
            raise ValueError(f"{owner}: field 'action_levels' must be levels in (0, 1), "
                             f"got {self.action_levels!r}")


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
    # model -> what drifted, for models whose measured request shape is off the profiled one
    shape_drift: dict[str, str] = field(default_factory=dict)
    # the capacity correction after this tick: planning factors, estimates, evidence, what it learned
    correction: dict[str, Any] = field(default_factory=dict)
    # wall-clock ISO time of the tick, the clock offset a resumed state needed, wall steps seen
    clock: dict[str, Any] = field(default_factory=dict)
    # instances added and removed per hour over the fleet's size (atoll.control.churn)
    churn: dict[str, Any] = field(default_factory=dict)
    # the running plan's $/h and per model demand, forecast, SLO estimate (atoll.control.plan_view)
    plan: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"tick": self.tick, "time_s": self.time_s, "wall_time": self.clock.get("wall_time"),
                "clock": dict(self.clock), "churn": dict(self.churn), "plan": dict(self.plan),
                "metrics": self.metrics, "forecast": self.forecast,
                "shape_drift": dict(self.shape_drift),
                "decision": self.decision.as_dict(), "solve": self.solve, "plan_changed": self.plan_changed,
                "diff": self.diff, "sink_result": self.sink_result, "earlier_delivery": self.earlier_delivery,
                "plan_sequence": self.plan_sequence, "pending": self.pending, "seconds": self.seconds,
                "correction": dict(self.correction)}


class Controller:
    """Runs ticks against a metrics source, a policy and a plan sink, persisting to ``state_dir``."""

    def __init__(self, fleet: LiveFleet, source: MetricsSource, policy: Policy, sink: PlanSink,
                 state_dir: Path | str, *, settings: ControllerSettings | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 wall: Callable[[], float] = time.time, events: PoolEventLog | None = None) -> None:
        self.fleet, self.source, self.policy, self.sink = fleet, source, policy, sink
        self.settings = s = settings or ControllerSettings()
        self.state_dir = Path(state_dir)
        self.clock, self.sleep = clock, sleep
        # a policy trained on atoll/Fleet-v2 sees the servers' signals; on -v3 / -v4 the risk too
        self._closed_obs, self._risk_obs = observe.observation_kind(policy, fleet, events is not None)
        self.events = events
        self._queue = QueueGrowth()
        self.risk = policy_risk(policy, s, fleet.config.action_levels)
        self.clock_offset = 0.0
        self.wall = wall
        loaded = load_state(self.state_dir)  # StateError (names the file and the fix) propagates
        self.resumed = loaded is not None
        if loaded is not None:
            self.clock_offset = state_clock_offset(self.state_dir, loaded.time_scale, loaded.last_tick_s,
                                                   float(self.clock()), time_scale=s.time_scale,
                                                   interval_s=s.interval_s)
        # a week of points at this interval, so a daily-seasonal forecaster gets its two days
        # (the history is compacted per bin past the last hour: see compact_history)
        limit = max(HISTORY_LIMIT, math.ceil(7 * 86400 / s.interval_s))
        self.state = loaded if loaded is not None else ControllerState(history_limit=limit)
        keep = set(fleet.models)  # a model that left the fleet is forgotten, not carried forever
        self.state = replace(
            self.state, time_scale=s.time_scale,
            controller_id=self.state.controller_id or new_controller_id(fleet.scenario),
            history={m: p for m, p in self.state.history.items() if m in keep},
            unserved={m: u for m, u in self.state.unserved.items() if m in keep},
            last_reoptimized={m: t for m, t in self.state.last_reoptimized.items() if m in keep})
        try:
            # the live planner moves a factor only past its own error band: noise must not flip
            # a running template for another
            self.correction = CapacityCorrection.from_dict(self.state.correction,
                                                           CorrectionSettings(publish_band=PUBLISH_BAND))
        except ValueError as exc:  # InputError is a ValueError
            raise StateError(f"{state_path(self.state_dir)}: {exc}") from exc
        self._latency = service_latencies(fleet.model.specs, fleet.model.shape)
        self.learned: dict[str, float] = {}
        self._view = (np.zeros(len(fleet.models)), np.zeros(len(fleet.models)))
        sweep_temporary(self.state_dir)  # left by a controller killed mid-save
        self.tracker = RateTracker(fleet.models, baseline=self.state.last_metrics,
                                   reset_fraction=s.reset_fraction,
                                   flat_hold_s=s.flat_hold_s / s.time_scale,  # samples: the metrics' clock
                                   only_expected=True)
        # a fleet with slices (several instances per node): each plan carries its packing, and
        # running slices stay on their nodes from one plan to the next
        sliced = any(t.has_slices for t in fleet.templates.values())
        self.delivery = deliver.Delivery(fleet, sink, self.state_dir, s.sink_attempts, s.sink_backoff_s,
                                         sleep, sliced)
        self.guards = guard_rails.guard_tables(fleet)
        self.view: dict[str, Any] = {}
        self.arrivals = LiveArrivals(fleet.models, self._latency, self.guards.one_instance, fleet.shapes,
                                     outlier_factor=s.outlier_factor, growth_factor=s.growth_factor,
                                     growth_add=s.growth_add)
        # model -> the (prefill, decode) tokens/s the running plan was solved for: the second
        # signal that confirms a queue or latency the plausibility gates hold
        self._planned: dict[str, tuple[float, float]] = {}
        for record in (self.state.final, self.state.pending):
            if record is not None:
                self._planned.update(planned_demand(record))
        # the env's action encoding: level 0 is the configured planning level (code 1 = full there)
        self.codec = live_codec(s, fleet, self.risk)
        self.forecaster = LiveForecast(shapes=fleet.shapes, forecaster=s.forecaster,
                                       quantile=s.planning_quantile, levels=self.codec.levels,
                                       horizon=max(1, math.ceil(s.look_ahead_s / STEP_S)), step_s=STEP_S,
                                       shape_tolerance=s.shape_tolerance)

    def now(self) -> float:
        """The controller's time: its clock plus the offset a resumed state needed."""
        return float(self.clock()) + self.clock_offset

    def _churn_report(self, now: float) -> dict[str, Any]:
        """The last hour's churn, the running plan's $/h, and the instances retiring."""
        size = sum(n for k, n in self.state.running.items())
        out = churn.figure(self.state.churn, now, size)
        if self.retiring:
            out["retiring"] = dict(self.retiring)
        return out

    def fleet_state(self, at_s: float, *, deployed: bool = False) -> FleetState:
        """The delivered plan as the env's state at ``at_s`` (:func:`atoll.control.deliver.fleet_state`)."""
        return deliver.fleet_state(self.fleet, self.state, at_s, deployed=deployed)

    @property
    def retiring(self) -> dict[str, int]:
        """Delivered instances on templates this fleet does not have (the fleet changed)."""
        return deliver.retiring(self.fleet, self.state)

    def _publish(self, forecasts: Mapping[str, ModelForecast]) -> None:
        """The tick's plan view (:mod:`atoll.control.plan_view`) to a sink that exports it."""
        observe = getattr(self.sink, "observe_tick", None)
        m = len(self.fleet.models)
        demand, forecast = np.full((m, 2), np.nan), np.full((m, 2), np.nan)
        for i, name in enumerate(self.fleet.models):
            points = self.state.history.get(name, ())
            if points:
                demand[i] = (points[-1].prompt_tokens_per_s, points[-1].generation_tokens_per_s)
            f = forecasts.get(name)
            if f is not None:
                forecast[i] = f.upper
        self.view = plan_view(self.fleet.model, self.fleet.known(self.state.running), demand, forecast,
                              self._latency, self._factors(), float(self.wall()), self.fleet.default_tier)
        if callable(observe):
            observe(self.view)

    def _clock_report(self) -> dict[str, Any]:
        """The tick's wall-clock ISO time, the resumed state's offset and any wall step seen."""
        report = getattr(self.clock, "report", None)
        seen = report().as_dict() if callable(report) else {}
        return {"wall_time": iso(float(self.wall())), "offset_s": self.clock_offset, **seen}

    # ----- the tick ------------------------------------------------------------------------
    def tick(self) -> TickReport:
        """One pass of the loop: read, observe, decide, solve, deliver, persist (each step's
        seconds in the report). Metrics that cannot be read hold every model as it is."""
        t_start = time.perf_counter()
        seconds: dict[str, float] = {}
        now = self.now()
        tick_no = self.state.tick
        t = time.perf_counter()
        try:
            snapshot = read_with_retry(self.source, self.settings.read_attempts, self.settings.read_backoff_s,
                                       self.sleep)
        except MetricsUnavailable as exc:
            seconds["read"] = time.perf_counter() - t
            self.state, earlier = self.delivery.pending(self.state, self.now())
            return self._hold_stale(now, tick_no, str(exc), earlier, seconds, t_start)
        rates, implausible = self._rates(snapshot, now)
        seconds["read"] = time.perf_counter() - t
        t = time.perf_counter()
        fresh, demand = self._record_demand(now, rates)
        last_cost, last_seconds = self._account(now, fresh, rates)
        self.state, earlier = self.delivery.pending(self.state, self.now())
        forecasts = self.forecaster.forecast(self.state.history, now, self.fleet.models)
        drift = {m: f.shape.message() for m, f in forecasts.items()
                 if f.shape is not None and f.shape.drifted}
        signals, risk_report = self._signals(now, fresh, rates, forecasts, last_cost, last_seconds)
        obs = build_observation(signals, closed_loop=self._closed_obs, risk=self._risk_obs)
        action = np.asarray(self.policy.act(obs, {"step": tick_no, "seconds": now}))
        decision = decide.decide(action, codec=self.codec, policy=self.policy.name, fleet=self.fleet,
                                 state=self.state, fresh=fresh, rates=rates, s=signals)
        seconds["decide"] = time.perf_counter() - t
        t = time.perf_counter()
        solve, record = self._solve(decision, forecasts, now, fresh)
        seconds["solve"] = time.perf_counter() - t
        t = time.perf_counter()
        sink_result = self._deliver(record, now)
        seconds["sink"] = time.perf_counter() - t
        self._advance(tick_no, now, decision)
        t = time.perf_counter()
        save_state(self.state_dir, self.state)
        seconds["persist"] = time.perf_counter() - t
        seconds["total"] = time.perf_counter() - t_start
        self.last_observation = obs
        self._publish(forecasts)
        metrics = self._metrics_report(snapshot, rates, demand, implausible, risk_report)
        return TickReport(tick_no, now, metrics, {m: f.as_dict() for m, f in forecasts.items()}, decision,
                          solve, record is not None, deliver.diff_rows(record), sink_result, earlier,
                          self.state.plan_sequence, self.state.pending is not None, seconds, drift,
                          self._correction_report(), self._clock_report(), self._churn_report(now),
                          self.view)

    # ----- the tick's steps ----------------------------------------------------------------
    def _rates(self, snapshot: MetricsSnapshot, now: float) -> tuple[RateReport, dict[str, Verdict]]:
        """The read's rates per trace second behind the guard rails: above what the fleet could
        serve is an outlier held once, and an implausible signal is held until a second one
        confirms it (the verdicts of those held or confirmed)."""
        st = self.settings
        limits = observe.rate_limits(self.fleet, self.state, self.guards, now, interval_s=st.interval_s,
                                     outlier_factor=st.outlier_factor, time_scale=st.time_scale)
        rates = observe.scaled(self.tracker.update(snapshot, limits), st.time_scale)
        return self.arrivals.gate_rates(rates, st.time_scale, self._planned)

    def _record_demand(self, now: float, rates: RateReport) -> tuple[list[str], dict[str, PhaseDemand]]:
        """(the models with a fresh rate, what each phase of them is planned from), appended to the
        history. A saturated phase is planned from its estimated arrivals, not from what it served."""
        state = self.state
        fresh = [m for m in self.fleet.models if m in rates.models and rates.models[m].ok]
        last_tick = state.last_tick_s
        since = last_tick if last_tick is not None and now > last_tick else now
        ready = self.fleet.model.instances_ready(self.fleet_state(since, deployed=True), now - since)
        demand = self.arrivals.demand(rates, fresh, ready, self.settings.time_scale)
        for m in fresh:
            r, d = rates.models[m], demand[m]
            state = state.with_history(m, HistoryPoint(now, d.planned[0], d.planned[1],
                                                       r.requests_per_s, r.prompt_tokens_per_request,
                                                       r.generation_tokens_per_request))
        # bounded in time, not ticks: a week in per-bin points past the last hour
        history = {m: compact_history(points, now, STEP_S) for m, points in state.history.items()}
        self.state = replace(state, history=history)
        return fresh, demand

    def _account(self, now: float, fresh: list[str], rates: RateReport) -> tuple[np.ndarray, float]:
        """The interval since the last tick, as the env's step: served against the capacity that
        was ready over it, billed for the nodes held over it (before this tick changes either);
        the servers' view, and what the capacity correction learns from the interval.
        (the interval's cost per model, its seconds)."""
        last_cost, last_seconds, unserved = observe.account(self.fleet, self.state, now, fresh)
        self.state = replace(self.state, unserved=unserved)
        self._view = observe.server_view(self.fleet.models, self._latency, fresh, rates)
        learned = observe.learn_interval(self.correction, self.fleet, self.state, now, fresh, rates) \
            if self.settings.correction else None
        if learned is not None:
            self.state = replace(self.state, correction=self.correction.as_dict())
        self.learned = learned or {}
        return last_cost, last_seconds

    def _signals(self, now: float, fresh: list[str], rates: RateReport,
                 forecasts: Mapping[str, ModelForecast], last_cost: np.ndarray, last_seconds: float
                 ) -> tuple[Signals, dict[str, Any] | None]:
        """The env's signals of the delivered plan now (with the servers' view for a closed-loop
        policy), and the risk signals and their report for a policy that reads them."""
        fs = self.fleet_state(now)
        signals = observe.signals(self.fleet, self.state, fs, forecasts, now=now,
                                  interval_s=self.settings.interval_s, last_cost=last_cost,
                                  last_seconds=last_seconds, factors=self._factors(),
                                  view=self._view if self._closed_obs else None)
        if not self._risk_obs:
            return signals, None
        assert self.events is not None  # the constructor refuses a risk policy without a log
        return observe.risk_signals(self.fleet, fs, signals, rates, fresh, now=now, latency=self._latency,
                                    queue=self._queue, events=self.events, requested=self.state.requested)

    def _solve(self, decision: Decision, forecasts: Mapping[str, ModelForecast], now: float,
               fresh: list[str]) -> tuple[dict[str, Any] | None, PlanRecord | None]:
        """The decision's re-plan (:func:`atoll.control.decide.solve`), or, with nothing to add,
        the plan that lets the retiring instances leave; (the solve report, the record to deliver)."""
        st = self.settings
        solve, record, desired = decide.solve(
            decision, forecasts, fleet=self.fleet, state=self.state, fs=self.fleet_state(now), now=now,
            fresh=fresh, risk=self.risk, factors=self._factors(), guards=self.guards,
            limits=decide.SolveLimits(st.growth_factor, st.growth_add, st.scale_down_window_s))
        self.state = replace(self.state, desired=desired)
        leaving = deliver.retiring_unscheduled(self.fleet, self.state)
        if record is None and leaving and self.state.final is None:
            # nothing to add: the retiring instances just leave
            record = deliver.retire_record(self.fleet, self.state, now, self._factors())
        return solve, record

    def _deliver(self, record: PlanRecord | None, now: float) -> dict[str, Any] | None:
        """``record`` to the sink (None: nothing to deliver); the demand it was solved for becomes
        the second signal the plausibility gates read."""
        if record is None:
            return None
        self.state, sink_result = self.delivery.apply(self.state, record, now)
        self._planned.update(planned_demand(record))
        return sink_result

    def _advance(self, tick_no: int, now: float, decision: Decision) -> None:
        """The state after this tick: its number, its time, the models it re-optimized and the
        rate tracker's baseline."""
        last = dict(self.state.last_reoptimized)
        last.update({m: tick_no for m in decision.chosen})
        self.state = replace(self.state, tick=tick_no + 1, last_tick_s=now, last_reoptimized=last,
                             last_metrics=self.tracker.baseline)

    def _metrics_report(self, snapshot: MetricsSnapshot, rates: RateReport, demand: Mapping[str, PhaseDemand],
                        implausible: Mapping[str, Verdict], risk_report: dict[str, Any] | None
                        ) -> dict[str, Any]:
        """The report's ``metrics``: the read, the fleet's rates, the demand planned from and the
        signals held as implausible."""
        ignored = sorted(set(snapshot.models) - set(self.fleet.models))
        metrics = {"ok": True, "source": snapshot.source, "stale_s": 0.0,
                   "rates": {m: r.as_dict() for m, r in rates.models.items() if m in self.fleet.models},
                   # names outside the fleet are neither tracked nor kept: shown, at most 20
                   "ignored_models": ignored[:20], "ignored_count": len(ignored),
                   "notes": list(snapshot.notes),
                   "demand": {m: d.as_dict() for m, d in demand.items()},
                   "implausible": {m: v.as_dict() for m, v in implausible.items()}}
        if risk_report is not None:
            metrics["risk"] = risk_report
        return metrics

    # ----- the fleet state -----------------------------------------------------------------
    def _factors(self) -> dict[str, float] | None:
        """The factors the planner solves with (None: correction off, the model's capacities)."""
        return self.correction.planning_factors() if self.settings.correction else None

    def _correction_report(self) -> dict[str, Any]:
        return {"enabled": self.settings.correction, "planning_factors": self.correction.planning_factors(),
                "estimates": self.correction.factors(), "evidence": self.correction.evidence(),
                "rejected_intervals": self.correction.rejected,
                "learned_this_tick": dict(self.learned)}

    # ----- steps ---------------------------------------------------------------------------
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
                          None, earlier, self.state.plan_sequence, self.state.pending is not None, seconds,
                          clock=self._clock_report())

def live_codec(settings: ControllerSettings, fleet: LiveFleet, risk: Risk | None) -> ActionCodec:
    """The action codec a controller with ``settings`` decodes with on ``fleet``, its policy's
    configured risk ``risk`` (None: the fleet's) being preset 0, as the simulator's env builds it."""
    return ActionCodec.for_config(settings.planning_quantile,
                                  settings.action_levels or fleet.config.action_levels,
                                  risk or fleet.model.config.risk, settings.risk_presets)


def policy_risk(policy: Policy, settings: ControllerSettings, fleet_levels: tuple[float, ...]) -> Risk | None:
    """The risk every live re-plan takes for ``policy`` unless it chooses a preset (None: the
    fleet's configured risk), after checking that the controller honours everything else the policy
    names: a rule's planning level (``@q``) must be the settings' and its action levels and risk
    presets the codec's (else its codes would mean other levels or risks). A ValueError names the
    part and the fix; nothing a policy asks for is dropped."""
    name = getattr(policy, "name", type(policy).__name__)
    options = policy.reset_options() if hasattr(policy, "reset_options") else {}
    planning = dict(options).get("planning", "forecast")
    if planning != "forecast":  # hindsight and the oracles: references, not policies
        raise ValueError(f"policy {name!r} plans for the {planning} demand, which only the simulator knows "
                         f"(a reference to compare with, not a policy): run it with atoll simulate or "
                         f"evaluate; live, run a rule, a per-model rule, a tuned policy file or a learned "
                         f"policy")
    presets = tuple(getattr(policy, "risk_presets", ()) or ())
    if presets != tuple(settings.risk_presets):
        shown = ", ".join(r.label() for r in presets) or "none"
        raise ValueError(f"policy {name!r} chooses among risk presets ({shown}), but the controller decodes "
                         f"presets ({', '.join(r.label() for r in settings.risk_presets) or 'none'}): set "
                         f"ControllerSettings.risk_presets to the policy's")
    q = getattr(policy, "planning_quantile", None)
    if q is not None and q != settings.planning_quantile:
        raise ValueError(f"policy {name!r} plans at level {q:g}, but the controller's planning level is "
                         f"{settings.planning_quantile:g}: set ControllerSettings.planning_quantile={q:g}")
    levels = getattr(policy, "action_levels", None)
    ours = settings.action_levels or fleet_levels
    if levels and tuple(levels) != tuple(ours):
        raise ValueError(f"policy {name!r} chooses among levels {', '.join(f'{v:g}' for v in levels)}, but "
                         f"the controller decodes levels {', '.join(f'{v:g}' for v in ours)}: set "
                         f"ControllerSettings.action_levels={tuple(levels)}")
    risk = getattr(policy, "risk", None)
    return risk if isinstance(risk, Risk) else None


def planned_demand(record: PlanRecord) -> dict[str, tuple[float, float]]:
    """model -> the (prefill, decode) tokens/s ``record`` was solved for."""
    out: dict[str, tuple[float, float]] = {}
    for key in record.demand:
        model, _, phase = key.rpartition("/")
        if phase == "prefill":
            out[model] = (float(record.demand[key]), float(record.demand.get(f"{model}/decode", 0.0)))
    return out


def new_controller_id(fleet_name: str) -> str:
    """A new controller's identity: its fleet's name and 6 random hex digits (two controllers
    of one fleet in a namespace must not prune each other's objects)."""
    stem = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", fleet_name.lower())).strip("-")[:30] or "atoll"
    return f"{stem}-{secrets.token_hex(3)}"
