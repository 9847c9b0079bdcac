"""The controller's *deliver* step: a plan to the sink, make-before-break, persisted first.

:class:`Delivery` takes the controller's state and returns the next one; it never keeps a state of
its own. A plan that replaces instances of a service goes out in two phases: first the additions
(the replaced instances keep serving), then, once the additions are ready, the removals. Both are
on disk (:func:`atoll.control.state.save_state`) before the sink sees the first, so a crash from
there on re-delivers what was not delivered and never loses or repeats it. A delivery that fails
stays ``pending`` and is delivered first at the next tick. Only a delivered plan becomes the
running plan; its transition is the env's (added instances start, removed ones drain).

:func:`fleet_state` reads the delivered plan back as the env's
:class:`~atoll.envs.fleet.FleetState` at any time: what starts, serves, is replaced and drains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from atoll.control import churn
from atoll.control.churn import diff_counts
from atoll.control.live_fleet import LiveFleet
from atoll.control.plan_view import plan_bill
from atoll.control.plans import PlanRecord, SinkResult
from atoll.control.risk_signals import WINDOW_S
from atoll.control.sinks import PlanSink, deliver
from atoll.control.state import ControllerState, save_state
from atoll.envs.fleet import FleetState
from atoll.solvers.packing import Packing, describe_packing, repack
from atoll.solvers.problem import Allocation, gpu_type_of


def _absolute(bucket: Mapping[str, list[list[float]]], now: float) -> tuple[tuple[str, int, float], ...]:
    """(key, count, absolute end time) of a FleetState's starting or draining entries."""
    return tuple((k, int(c), now + left) for k, entries in sorted(bucket.items())
                 for c, left in entries if c > 0)


def fleet_state(fleet: LiveFleet, state: ControllerState, at_s: float, *,
                deployed: bool = False) -> FleetState:
    """The env's :class:`FleetState` of the delivered plan at time ``at_s``: instances still
    starting, replaced ones still serving (make-before-break) and removed ones still draining
    then, from the persisted absolute times. ``deployed``: what the servers really run — replaced
    instances whose removal has not been delivered yet still serve (the env's model drains them as
    their replacements are ready; the capacity correction must compare the servers' signals with
    what served them)."""
    known = fleet.known(state.running)
    fs = FleetState(running=dict(known))
    drain_s = fleet.config.drain_s
    for key, n, ready_at in state.starting:
        if key in known and ready_at > at_s + 1e-9:
            take = min(n, fs.running[key])
            fs.running[key] -= take
            fs.starting.setdefault(key, []).append([float(take), ready_at - at_s])
    for key, n, until in state.replacing:  # in the delivered plan until the removal phase
        if key in known and not (deployed and state.final is not None):
            take = min(n, fs.running[key])
            fs.running[key] -= take
            if until > at_s + 1e-9:
                fs.replaced.setdefault(key, []).append([float(take), until - at_s, drain_s])
            elif until + drain_s > at_s + 1e-9:
                fs.draining.setdefault(key, []).append([float(take), until + drain_s - at_s])
    for key, n, until in state.draining:
        if key in fleet.templates and until > at_s + 1e-9:
            fs.draining.setdefault(key, []).append([float(n), until - at_s])
    return fs


def retiring(fleet: LiveFleet, state: ControllerState) -> dict[str, int]:
    """Delivered instances on templates this fleet does not have (the fleet changed): they keep
    serving until their replacements are ready, then leave."""
    return {k: n for k, n in state.running.items() if k not in fleet.templates}


def retiring_unscheduled(fleet: LiveFleet, state: ControllerState) -> dict[str, int]:
    """Retiring instances no make-before-break change is replacing yet."""
    scheduled = {k for k, _, _ in state.replacing}
    return {k: n for k, n in retiring(fleet, state).items() if k not in scheduled}


def priced(fleet: LiveFleet, record: PlanRecord) -> PlanRecord:
    """``record`` with every line's price tier (the tier it is bought and billed at, so a spot
    line's pods select spot capacity) and its bill at those tiers (:func:`plan_bill`). Retiring
    templates the fleet no longer knows keep their delivered description."""
    templates = {k: ({**d, "tier": fleet.tier(k)} if k in fleet.templates else d)
                 for k, d in record.templates.items()}
    return replace(record, templates=templates, bill=plan_bill(fleet.model, record.plan, fleet.default_tier))


def retire_record(fleet: LiveFleet, state: ControllerState, now: float,
                  correction: Mapping[str, float] | None) -> PlanRecord:
    """A plan change that only retires: the running plan without the templates the fleet lacks."""
    known = fleet.known(state.running)
    why = ", ".join(sorted(retiring_unscheduled(fleet, state)))
    return priced(fleet, PlanRecord.from_allocation(
        state.plan_sequence + 1, now, Allocation.of(known), state.running, fleet.templates, {},
        f"fleet changed: {why} retire", owner=state.controller_id, correction=correction))


def diff_rows(record: PlanRecord | None) -> list[dict[str, Any]]:
    """Instances to add (> 0) and remove (< 0) per template and region."""
    if record is None:
        return []
    rows = []
    for key, change in record.diff.items():
        d = record.templates.get(key, {})
        rows.append({"template": key, "model": d.get("model"), "phase": d.get("phase"),
                     "region": d.get("region"), "tier": d.get("tier"), "nodes": d.get("nodes"),
                     "change": change,
                     "action": "add" if change > 0 else "remove", "instances": record.plan.get(key, 0)})
    return rows


@dataclass
class Delivery:
    """Delivers plans to ``sink`` (``attempts`` tries, backoff from ``backoff_s`` through
    ``sleep``) and persists each step to ``state_dir``; ``sliced``: the fleet has slices, so each
    plan carries its packing and running slices stay on their nodes."""

    fleet: LiveFleet
    sink: PlanSink
    state_dir: Path
    attempts: int
    backoff_s: float
    sleep: Callable[[float], None]
    sliced: bool

    def apply(self, state: ControllerState, record: PlanRecord, now: float
              ) -> tuple[ControllerState, dict[str, Any]]:
        """Deliver ``record`` make-before-break (the module docstring): the next state, and the
        sink's result of the first phase."""
        fleet = self.fleet
        fs = fleet_state(fleet, state, now)
        fleet.model.apply(fs, Allocation.of(fleet.known(record.plan)))
        kept = {k: sum(int(e[0]) for e in entries) for k, entries in fs.replaced.items()}
        kept = {k: n for k, n in kept.items() if n}
        # every retiring instance, scheduled or not: a newer plan during a change keeps them too
        leaving = {k: n for k, n in retiring(fleet, state).items() if k in state.templates}
        templates = fleet.templates
        doc = state.packing
        running = None if not self.sliced or doc is None else Packing.from_json(doc["nodes"])
        if not kept and not leaving:
            if self.sliced:
                record = replace(record, packing=describe_packing(repack(templates, record.plan, running)))
            record = priced(fleet, record)
            state = replace(state, pending=record, final=None, plan_sequence=record.sequence)
        else:
            interim_plan = dict(record.plan)
            for key, n in kept.items():
                interim_plan[key] = interim_plan.get(key, 0) + n
            # make-before-break counts nodes: the interim keeps every replaced slice on its node
            # and adds the new ones; the removal phase releases a node only once none of its
            # slices is left
            interim_nodes = repack(templates, interim_plan, running) if self.sliced else None
            final_nodes = repack(templates, record.plan, interim_nodes) if self.sliced else None
            demand = record.demand
            note = "; instances on templates the fleet no longer has retire" if leaving else ""
            interim = PlanRecord.from_allocation(
                record.sequence, now, Allocation.of(interim_plan),
                {k: n for k, n in state.running.items() if k not in leaving}, templates, demand,
                f"{record.reason} [make-before-break 1/2: additions; the replaced instances keep serving"
                f"{note}]", record.shapes, owner=record.owner, packing=interim_nodes)
            if leaving:  # delivered as they run, described as they were delivered
                interim = replace(interim, plan={**interim.plan, **leaving},
                                  templates={**interim.templates, **{k: state.templates[k] for k in leaving}})
                interim_plan = dict(interim.plan)
            interim = priced(fleet, interim)
            final = PlanRecord.from_allocation(
                record.sequence + 1, now, Allocation.of(record.plan), interim_plan, templates, demand,
                f"{record.reason} [make-before-break 2/2: removals, once the additions are ready]",
                record.shapes, owner=record.owner, packing=final_nodes)
            state = replace(state, pending=interim, final=priced(fleet, final), plan_sequence=final.sequence)
        save_state(self.state_dir, state)
        assert state.pending is not None
        state, result = self.deliver(state, state.pending, now)
        return state, result.as_dict()

    def deliver(self, state: ControllerState, record: PlanRecord, now: float
                ) -> tuple[ControllerState, SinkResult]:
        """``record`` to the sink; delivered, it becomes the running plan (the env's transition,
        or a change's removal phase) and the state is saved. Not delivered, the state is as it was."""
        result = deliver(self.sink, record, self.attempts, self.backoff_s, self.sleep)
        if not result.ok:
            return state, result
        fleet, drain_s = self.fleet, self.fleet.config.drain_s
        if state.final is not None and record.sequence == state.final.sequence:
            # the removal phase: the replaced instances leave (they drain from when their
            # replacements became ready, as in the env)
            draining = (*[e for e in state.draining if e[2] > now],
                        *[(k, n, until + drain_s) for k, n, until in state.replacing
                          if until + drain_s > now and k in fleet.templates])
            state = replace(state, running=dict(record.plan), final=None, replacing=(),
                            draining=draining, packing=record.packing, **_delivered(state, record, now))
        else:
            # the env's transition: added instances start, removed ones are cancelled, drain, or
            # (make-before-break) keep serving until their replacements are ready
            fs = fleet_state(fleet, state, now)
            target = state.final.plan if state.final is not None else record.plan
            fleet.model.apply(fs, Allocation.of(fleet.known(target)))
            scale = state.cost_scale_usd_h
            if not scale:
                planned = FleetState(running=fleet.known(target))
                scale = float(fleet.model.cost(planned, 3600.0).sum()) or None
            replacing = tuple((k, int(e[0]), now + e[1]) for k, entries in sorted(fs.replaced.items())
                              for e in entries if e[0] > 0)
            starting = _absolute(fs.starting, now)
            # instances on templates the fleet no longer has keep serving until every addition
            # is ready (a fleet change is a plan change, delivered make-before-break)
            leaving = {k: n for k, n in record.plan.items() if k not in fleet.templates}
            if leaving and state.final is not None:
                ready_at = max((at for _, _, at in starting), default=now)
                replacing = (*replacing, *((k, n, ready_at) for k, n in sorted(leaving.items())))
            state = replace(state, running=dict(record.plan), pending=None,
                            starting=starting, draining=_absolute(fs.draining, now),
                            replacing=replacing, cost_scale_usd_h=scale, packing=record.packing,
                            requested=requested_log(fleet, state.requested, fs.fresh, now),
                            **_delivered(state, record, now))
        save_state(self.state_dir, state)
        return state, result

    def pending(self, state: ControllerState, now: float) -> tuple[ControllerState, dict[str, Any] | None]:
        """Deliver what an earlier tick left: a plan not yet delivered, or the removal phase of a
        make-before-break change once the additions are ready (their start-up time has passed: the
        sink cannot tell when a replica serves)."""
        if state.pending is not None:
            state, result = self.deliver(state, state.pending, now)
            return state, result.as_dict()
        final = state.final
        if final is not None and all(until <= now + 1e-9 for _, _, until in state.replacing):
            state, result = self.deliver(state, final, now)
            return state, result.as_dict()
        return state, None


def _delivered(state: ControllerState, record: PlanRecord, now: float) -> dict[str, Any]:
    """The state fields a delivery updates besides the plan: the delivered templates'
    descriptions and the churn log."""
    added, removed = diff_counts(state.running, record.plan)
    return {"templates": {k: record.templates[k] for k in record.plan if k in record.templates},
            "churn": churn.record(state.churn, now, added, removed)}


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
