"""The controller's guard rails as pure functions of the fleet, the plans and the settings.

What a live re-plan is held to before it is delivered (``solve.guard_rails`` in each tick's
report; tests in ``tests/control/test_live_faults.py``):

- **floors**: every model and phase keeps at least its fleet's ``min_instances`` (default 1: a
  model planned to zero has no server left whose counters could show its traffic coming back);
  :func:`add_floors` raises a service to it with its cheapest templates that fit the nodes left;
- **growth cap**: a service grows by at most ``growth_factor`` x its instances + ``growth_add``
  per tick (:func:`cap_growth`), so a lying signal cannot buy a fleet in one tick;
- **scale-down hold**: a service shrinks only to the most instances the solver wanted for it over
  the scale-down window (:func:`hold_scale_down`, HPA's stabilization);
- **fit**: an instance is added only where every pool it uses still holds the ceil of its use
  within its cap (:func:`add_if_it_fits`).

:func:`guard_tables` precomputes, once per fleet, each service's templates by price, one
instance's best throughput and the fleet's ceiling (the rate guard's outlier bound).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atoll.control.live_fleet import LiveFleet
from atoll.envs.fleet import FleetState

PHASES = ("prefill", "decode")
Cell = tuple[str, str]  # (region, node config)
Report = dict[str, dict[str, int]]


@dataclass(frozen=True)
class GuardTables:
    """Per (model index, phase index): the template keys by price; per model and phase, one
    instance's best throughput and the most the fleet could serve with every node (tokens/s)."""

    by_price: Mapping[tuple[int, int], Sequence[str]]
    one_instance: np.ndarray
    ceiling: np.ndarray


def guard_tables(fleet: LiveFleet) -> GuardTables:
    model = fleet.model
    n = len(fleet.models)
    best_instance, best_node = np.zeros((n, 2)), np.zeros((n, 2))
    priced: dict[tuple[int, int], list[tuple[float, str]]] = {}
    for key, t in fleet.templates.items():
        per_h = model.info(key)[3]
        nodes = sum(k for _, k in t.node_use) or 1  # a slice: its share of a node
        for mi, ph, thr in model.rows(key):  # a co-located template serves both phases
            best_instance[mi, ph] = max(best_instance[mi, ph], thr)
            best_node[mi, ph] = max(best_node[mi, ph], thr / nodes)
            priced.setdefault((mi, ph), []).append((per_h, key))
    by_price = {svc: [k for _, k in sorted(v)] for svc, v in priced.items()}
    total_nodes = float(sum(fleet.availability.values()))
    return GuardTables(by_price, best_instance, best_node * total_nodes)


def service_counts(fleet: LiveFleet, plan: Mapping[str, int]) -> np.ndarray:
    """[M, 2] instances per model and phase of ``plan`` (keys the fleet does not know: none)."""
    counts = np.zeros((len(fleet.models), 2), dtype=int)
    for key, n in plan.items():
        if key in fleet.templates:
            for mi, ph, _ in fleet.model.rows(key):
                counts[mi, ph] += n
    return counts


def below_floor(fleet: LiveFleet, plan: Mapping[str, int]) -> dict[str, int]:
    """model -> its floor, for models with fewer planned instances than it in a phase."""
    counts = service_counts(fleet, plan)
    out = {}
    for i, m in enumerate(fleet.models):
        floor = fleet.min_instances.get(m, (1, 1))
        if any(counts[i, ph] < floor[ph] for ph in range(2)):
            out[m] = max(floor)
    return out


def _changes(fleet: LiveFleet, a: Mapping[str, int], b: Mapping[str, int], service: tuple[int, int]
             ) -> list[tuple[int, str]]:
    """(a[k] - b[k], k) for the service's keys where a holds more, largest first."""
    return sorted(((n - b.get(k, 0), k) for k, n in a.items()
                   if n > b.get(k, 0) and k in fleet.templates
                   and any(row[:2] == service for row in fleet.model.rows(k))),
                  key=lambda e: (-e[0], e[1]))


def cap_growth(fleet: LiveFleet, plan: Mapping[str, int], before: Mapping[str, int], *, growth_factor: float,
               growth_add: int) -> tuple[dict[str, int], Report]:
    """At most ``growth_factor`` x + ``growth_add`` instances per service per tick: added instances
    beyond it are dropped, largest additions first (reported per service)."""
    out = dict(plan)
    old, new = service_counts(fleet, before), service_counts(fleet, out)
    report: Report = {}
    for i, m in enumerate(fleet.models):
        for ph, phase in enumerate(PHASES):
            cap = math.floor(growth_factor * old[i, ph]) + growth_add
            excess = int(new[i, ph]) - cap
            if excess <= 0:
                continue
            for extra, key in _changes(fleet, out, before, (i, ph)):
                take = min(extra, excess)
                out[key] -= take
                excess -= take
                if excess <= 0:
                    break
            report[f"{m}/{phase}"] = {"before": int(old[i, ph]), "solved": int(new[i, ph]), "capped_to": cap}
    return {k: n for k, n in out.items() if n > 0}, report


def hold_scale_down(fleet: LiveFleet, plan: Mapping[str, int], before: Mapping[str, int], fs: FleetState, *,
                    now: float, solved: Collection[str], window_s: float,
                    desired: Sequence[tuple[float, str, int]]
                    ) -> tuple[dict[str, int], Report, tuple[tuple[float, str, int], ...]]:
    """A service shrinks only to the most instances the solver wanted for it over the last
    ``window_s`` (HPA's scale-down stabilization): a dip the demand takes back within the window
    removes nothing, and costs no start-ups on the way back. The running instances the plan would
    remove beyond that are kept — from the templates losing the most, where their nodes are still
    free — and reported per service. Returns the plan, the report and ``desired`` (the state's
    log of (time, service, instances wanted)) with this tick's wishes, older ones dropped."""
    out = dict(plan)
    if window_s <= 0:
        return out, {}, tuple(desired)
    wanted, old = service_counts(fleet, out), service_counts(fleet, before)
    recent = [d for d in desired if now - window_s < d[0] <= now]
    # every service's wish this tick: a model not re-solved wants what it holds
    recent += [(now, f"{m}/{phase}", int(wanted[i, ph])) for i, m in enumerate(fleet.models)
               for ph, phase in enumerate(PHASES)]
    peak: dict[str, int] = {}
    for _, service, n in recent:
        peak[service] = max(peak.get(service, 0), n)
    used = nodes_used(fleet, out, fs)
    caps = fleet.availability
    report: Report = {}
    for i, m in enumerate(fleet.models):
        for ph, phase in enumerate(PHASES):
            service = f"{m}/{phase}"
            keep = min(peak.get(service, 0), int(old[i, ph])) - int(wanted[i, ph])
            if m not in solved or keep <= 0:
                continue
            kept = 0
            for extra, key in _changes(fleet, before, out, (i, ph)):
                while kept < keep and extra > 0 and add_if_it_fits(fleet, out, key, used, caps):
                    kept += 1
                    extra -= 1
            if kept:
                report[service] = {"before": int(old[i, ph]), "solved": int(wanted[i, ph]),
                                   "held_at": int(wanted[i, ph]) + kept}
    return out, report, tuple(recent)


def nodes_used(fleet: LiveFleet, plan: Mapping[str, int], fs: FleetState) -> dict[Cell, float]:
    """Nodes per (region, node config) the plan and the draining instances use: slices count their
    share of a node (node_use), and a pool holds the ceil of its use (as the env bills and the ILP
    buys)."""
    used: dict[Cell, float] = dict(fleet.model.draining_by_cell(fs))
    for key, n in plan.items():
        t = fleet.templates.get(key)
        if t is not None:
            for cfg, k in t.node_use:
                used[(t.region, cfg)] = used.get((t.region, cfg), 0) + n * k
    return used


def add_if_it_fits(fleet: LiveFleet, plan: dict[str, int], key: str, used: dict[Cell, float],
                   caps: Mapping[Cell, float]) -> bool:
    """Add one instance of ``key`` to ``plan`` when every pool it uses still holds the ceil of its
    use within its cap (``used`` counts it then); False when it does not fit."""
    t = fleet.templates[key]
    if not all(math.ceil(used.get((t.region, c), 0) + k - 1e-9) <= caps.get((t.region, c), 0)
               for c, k in t.node_use):
        return False
    plan[key] = plan.get(key, 0) + 1
    for c, k in t.node_use:
        used[(t.region, c)] = used.get((t.region, c), 0) + k
    return True


def add_floors(fleet: LiveFleet, plan: Mapping[str, int], fs: FleetState, tables: GuardTables
               ) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
    """Raise every service to its ``min_instances`` with its cheapest templates that fit the nodes
    left (reported per service; ``short`` when the nodes ran out)."""
    out = dict(plan)
    counts = service_counts(fleet, out)
    used = nodes_used(fleet, out, fs)
    caps = fleet.availability
    report: dict[str, dict[str, Any]] = {}
    for i, m in enumerate(fleet.models):
        floor = fleet.min_instances.get(m, (1, 1))
        for ph, phase in enumerate(PHASES):
            need = floor[ph] - int(counts[i, ph])
            if need <= 0:
                continue
            added = 0
            for key in tables.by_price.get((i, ph), []):
                while added < need and add_if_it_fits(fleet, out, key, used, caps):
                    added += 1
                if added >= need:
                    break
            report[f"{m}/{phase}"] = {"floor": floor[ph], "added": added,
                                      **({"short": need - added} if added < need else {})}
    return out, report
