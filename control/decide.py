"""The controller's *decide* step as pure functions: which models the tick re-optimizes, and
their re-plan.

- :func:`decide` reads the policy's action through the env's codec (the same codes mean the same
  re-optimizations as in the simulator), holds the models without fresh data (their instances stay
  as they are: a metrics gap never scales a model down), and adds the models that must be
  re-planned whatever the policy says: no capacity for their demand, below their floor, or on
  templates the fleet no longer has;
- :func:`solve` plans the chosen models on their own forecasts at the level and risk each
  re-optimization names, the others fixed, warm-started from the running plan
  (:meth:`atoll.envs.fleet_model.FleetModel.replan`: the simulator's ILP rows), then holds the
  plan to the guard rails (:mod:`atoll.control.guard_rails`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atoll.control import deliver, guard_rails
from atoll.control.live_demand import ModelForecast
from atoll.control.live_fleet import LiveFleet
from atoll.control.plans import PlanRecord
from atoll.control.rates import RateReport
from atoll.control.state import ControllerState
from atoll.envs.actions import ActionCodec
from atoll.envs.fleet import FleetState
from atoll.envs.observation import Signals
from atoll.envs.vocabulary import Reoptimization
from atoll.solvers.problem import Allocation, Risk

Desired = tuple[tuple[float, str, int], ...]  # (time, service, instances the solver wanted)


@dataclass(frozen=True)
class Decision:
    """Which models the tick re-optimizes and why; which it holds (no usable data) and why."""

    policy: str
    chosen: dict[str, str] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)
    unchanged: tuple[str, ...] = ()
    # model -> the re-optimization it gets (``full@0.9``, ``grow@0.95``; see atoll.envs.actions)
    reopt: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "chosen": dict(self.chosen), "held": dict(self.held),
                "unchanged": list(self.unchanged), "reoptimization": dict(self.reopt)}


@dataclass(frozen=True)
class SolveLimits:
    """What a re-plan is held to: the growth cap (``growth_factor`` x + ``growth_add`` instances
    per service and tick) and the scale-down window (s; 0: none)."""

    growth_factor: float
    growth_add: int
    scale_down_window_s: float


def decide(action: np.ndarray, *, codec: ActionCodec, policy: str, fleet: LiveFleet, state: ControllerState,
           fresh: Sequence[str], rates: RateReport, s: Signals) -> Decision:
    """The tick's decision from the policy's ``action`` (one code per model; see the module
    docstring). A code outside the codec's is a ValueError naming the policy and the codes."""
    chosen: dict[str, str] = {}
    held: dict[str, str] = {}
    unchanged: list[str] = []
    reopt: dict[str, str] = {}
    codes = [int(v) for v in np.asarray(action).ravel()]
    if any(not 0 <= c < codec.n for c in codes):
        raise ValueError(f"policy {policy!r} answered {codes}; codes per model are "
                         f"0..{codec.n - 1} ({', '.join(codec.names())})")
    # from the second tick: the first only reads the counters, and whether a model has
    # servers (its series) is known after it
    running = fleet.known(state.running)
    below = guard_rails.below_floor(fleet, running) if state.tick >= 1 else {}
    for i, model in enumerate(fleet.models):
        if model not in fresh:
            r = rates.models.get(model)
            held[model] = (f"{r.status.value}: {r.reason}" if r is not None else "missing: no series") + \
                "; its instances are kept as they are"
            continue
        need = s.demand[i].max() > 0 or s.forecast_upper[i].max() > 0
        if s.planned_capacity[i].max() <= 0 and need:
            chosen[model] = "no capacity planned for its demand yet"
            reopt[model] = codec.decode(1).label()
        elif i < len(codes) and codes[i]:
            reopt[model] = codec.decode(codes[i]).label()
            with np.errstate(divide="ignore", invalid="ignore"):
                planned, ready = s.planned_capacity[i], s.ready_capacity[i]
                up = np.max(np.where(planned > 0, s.forecast_upper[i] / planned, np.inf))
                now = np.max(np.where(ready > 0, s.demand[i] / ready, np.inf))
            chosen[model] = (f"{policy} ({reopt[model]}): forecast upper / planned capacity "
                             f"{up:.2f}, "
                             f"demand / ready capacity {now:.2f}, unserved {s.unserved_share[i]:.1%}")
        else:
            unchanged.append(model)
    leaving = deliver.retiring_unscheduled(fleet, state)
    changed = sorted({str(state.templates.get(k, {}).get("model") or k.split("/")[0])
                      for k in leaving} & set(fleet.models))
    for model in changed:
        if model not in chosen:
            # its instances on templates the fleet lacks are replaced before they leave
            held.pop(model, None)
            chosen[model] = "fleet changed: its running templates are not in the fleet (retiring)"
            reopt[model] = codec.decode(1).label()
    for model, floor in below.items():
        if model not in chosen:
            # whatever its data: the floor is not demand, and a model at zero has no series
            held.pop(model, None)
            chosen[model] = f"below its floor of {floor} instance(s) (min_instances)"
            reopt[model] = codec.decode(1).label()
    unchanged = [m for m in unchanged if m not in below and m not in changed]
    return Decision(policy, chosen, held, tuple(unchanged), reopt)


@dataclass
class _Wanted:
    """What the chosen models ask the solver for: each model's (prefill, decode) tokens/s row in
    fleet order (zeros for the others), the models solved, those that only grow, the models
    skipped and why, their forecasts' shapes and the risk presets their re-optimizations name."""

    tokens: np.ndarray
    solved: set[str] = field(default_factory=set)
    grow: set[str] = field(default_factory=set)
    skipped: dict[str, str] = field(default_factory=dict)
    shapes: dict[str, dict[str, Any]] = field(default_factory=dict)
    risks: dict[str, Risk] = field(default_factory=dict)


def _wanted(decision: Decision, forecasts: Mapping[str, ModelForecast], fleet: LiveFleet,
            fresh: Sequence[str] | None) -> _Wanted:
    """Each chosen model's demand, its forecast at the level its re-optimization names. A model
    without fresh demand or with a non-finite forecast is skipped (its floor is still planned):
    the solver is never handed a demand nobody measured."""
    fresh_set = set(fleet.models if fresh is None else fresh)
    out = _Wanted(np.zeros((len(fleet.models), 2)))
    for i, name in enumerate(fleet.models):
        if name not in decision.chosen:
            continue
        f = forecasts.get(name)
        if name not in fresh_set or f is None:
            out.skipped[name] = "no fresh demand: only its floor is planned"
            continue
        reopt = Reoptimization.parse(decision.reopt.get(name, "full"))
        if reopt.risk is not None:
            out.risks[name] = reopt.risk
        want = np.asarray(f.upper if reopt.level is None else f.upper_at(reopt.level), dtype=float)
        if not np.all(np.isfinite(want)):  # never hand the solver a non-finite demand
            out.skipped[name] = f"its forecast is not finite ({want.tolist()}): held"
            continue
        out.tokens[i] = want
        out.solved.add(name)
        if f.shape is not None:
            out.shapes[name] = f.shape.as_dict()
        if reopt.kind == "grow":
            out.grow.add(name)
    return out


def _service_demand(fleet: LiveFleet, wanted: _Wanted) -> dict[str, float]:
    """The solved models' demand per service ("model/phase", tokens/s), for the report and the
    plan record."""
    demand: dict[str, float] = {}
    for i, name in enumerate(fleet.models):
        if name in wanted.solved:
            demand[f"{name}/prefill"] = float(wanted.tokens[i, 0])
            demand[f"{name}/decode"] = float(wanted.tokens[i, 1])
    return demand


def _replan(wanted: _Wanted, demand: dict[str, float], before: dict[str, int], *, fleet: LiveFleet,
            fs: FleetState, risk: Risk | None, factors: Mapping[str, float] | None
            ) -> tuple[dict[str, Any], Allocation | None]:
    """(the solve report, the solver's allocation: None when it found none). Without a model to
    solve the delivered plan stands, so the guard rails still add what a floor asks."""
    report: dict[str, Any]
    if not wanted.solved:
        report = {"status": "not solved", "mode": None, "solver_seconds": 0.0, "cached": False,
                  "message": "no model with fresh demand chosen", "demand_tokens_per_s": demand}
        return report, Allocation.of(before)
    model = fleet.model
    solved = wanted.solved
    # tests swap fleet.replanner; with learned factors the corrected library replaces it
    replanner = model.corrected_replanner(factors) if factors else fleet.replanner
    if replanner is model.replanner:
        replanner = fleet.replanner
    # a rule's +RISK, or the preset a per-model rule chose: the same ILP rows as in the
    # simulator (a larger demand for a headroom, the spread and on-demand floor rows)
    risk_of = {m: r for m in solved if (r := wanted.risks.get(m) or risk) is not None}
    out = model.replan(fs, frozenset(solved), wanted.tokens, fleet.availability,
                       replanner=replanner, grow=frozenset(wanted.grow), risk=risk_of or None)
    configured = fleet.model.config.risk
    report = {"status": out.status.value, "mode": out.mode, "solver_seconds": out.solver_seconds,
              "cached": out.cached, "message": out.message, "demand_tokens_per_s": demand,
              "risk": {m: risk_of.get(m, configured).label() for m in sorted(solved)}}
    return report, out.allocation


def _guarded(allocation: Allocation, before: dict[str, int], desired: Desired, *, fleet: LiveFleet,
             fs: FleetState, now: float, solved: set[str], limits: SolveLimits,
             guards: guard_rails.GuardTables) -> tuple[Allocation, Desired, dict[str, Any]]:
    """(the allocation held to the guard rails, the scale-down window's new log, what each rail
    did): growth capped, scale-downs held over the window, floors added, in that order."""
    plan, capped = guard_rails.cap_growth(fleet, allocation.as_dict(), before,
                                          growth_factor=limits.growth_factor,
                                          growth_add=limits.growth_add)
    plan, held, desired = guard_rails.hold_scale_down(
        fleet, plan, before, fs, now=now, solved=solved, window_s=limits.scale_down_window_s,
        desired=desired)
    plan, floors = guard_rails.add_floors(fleet, plan, fs, guards)
    report = {"growth_capped": capped, "floor_added": floors, **({"scale_down_held": held} if held else {})}
    return Allocation.of(plan), desired, report


def solve(decision: Decision, forecasts: Mapping[str, ModelForecast], *, fleet: LiveFleet,
          state: ControllerState, fs: FleetState, now: float, fresh: Sequence[str] | None,
          risk: Risk | None, factors: Mapping[str, float] | None, limits: SolveLimits,
          guards: guard_rails.GuardTables) -> tuple[dict[str, Any] | None, PlanRecord | None, Desired]:
    """The re-plan of ``decision``'s models (the module docstring): the tick's ``solve`` report,
    the new plan's record (None: held or unchanged) and the scale-down window's log of what
    the solver wanted (the state's ``desired``). ``fs``: the delivered plan now; ``risk``: the
    policy's configured risk (None: the fleet's); ``factors``: the capacity correction's."""
    if not decision.chosen:
        return None, None, state.desired
    # each phase planned on its own forecast at the decision's level (tokens/s)
    wanted = _wanted(decision, forecasts, fleet, fresh)
    demand = _service_demand(fleet, wanted)
    before = fs.planned().as_dict()
    desired = state.desired
    report, allocation = _replan(wanted, demand, before, fleet=fleet, fs=fs, risk=risk, factors=factors)
    if wanted.skipped:
        report["not_solved"] = wanted.skipped
    if allocation is not None:
        allocation, desired, report["guard_rails"] = _guarded(
            allocation, before, desired, fleet=fleet, fs=fs, now=now, solved=wanted.solved, limits=limits,
            guards=guards)
    if allocation is None or allocation.as_dict() == before:
        report["result"] = "held: no plan" if allocation is None else "unchanged"
        return report, None, desired
    report["result"] = "new plan"
    seq = state.plan_sequence + 1
    reason = "; ".join(f"{m}: {why}" for m, why in decision.chosen.items())
    record = PlanRecord.from_allocation(seq, now, allocation, state.running,
                                        fleet.templates, demand, reason, shapes=wanted.shapes,
                                        owner=state.controller_id, correction=factors)
    return report, deliver.priced(fleet, record), desired
