"""Check any plan against an allocation problem without a solver.

Recomputes from the templates and prices alone: feasibility (known template keys, integral and
non-negative counts, availability per (region, config), demand in cost mode, models outside the
re-optimized subset at their running counts, one GPU type or one node config per model when
the problem asks),
node cost, start-up cost, capacity and served demand per service, served share per model.
Used to cross-check the ILP's extraction path and to score the baselines on equal terms.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from atoll.solvers.problem import (
    Allocation,
    AllocationProblem,
    gpu_type_of,
    is_spot_region,
    served_shares,
)

_TOL = 1e-6


@dataclass(frozen=True)
class PlanEvaluation:
    """feasible = no violations; objective = cost_per_hour + K x startup_cost_per_hour + R x the $/h
    of the running instances the plan removes."""

    feasible: bool
    violations: tuple[str, ...]
    cost_per_hour: float
    startup_cost_per_hour: float
    objective: float
    node_usage: Mapping[tuple[str, str], float]
    capacity: Mapping[str, float]
    served: Mapping[str, float]
    served_share: Mapping[str, float]
    goodput_fraction: float


def _planned_share(problem: AllocationProblem, model: str,
                   by_pool: Mapping[str, Mapping[str, float]]) -> float:
    """The share of model's planning demand its capacity serves (goodput mode's f_m)."""
    share = 1.0
    for s in problem.demand:
        if s.rpartition("/")[0] == model and problem.planning_demand(s) > 0:
            share = min(share, sum(by_pool[s].values()) / problem.planning_demand(s))
    return share


def _risk_violations(problem: AllocationProblem, counts: Mapping[str, float]) -> list[str]:
    """Each re-optimized model's spread and on-demand floor (``Risk``), against the planning
    demand (times the model's served share in goodput mode)."""
    if not problem.risk:
        return []
    by_pool: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # service -> pool -> cap
    for key, n in counts.items():
        try:
            t = problem.template(key)
        except KeyError:
            continue
        for name, thr in t.covers:
            by_pool[name][t.region] += n * thr
    spot = sorted({r for caps in by_pool.values() for r in caps if is_spot_region(r)})
    out: list[str] = []
    for s in sorted(problem.demand):
        m = s.rpartition("/")[0]
        risk = problem.risk_of(m)
        if m not in problem.free_models or risk.neutral:
            continue
        caps = by_pool[s]
        share = 1.0 if problem.mode == "cost" else _planned_share(problem, m, by_pool)
        need = problem.planning_demand(s) * share
        total = sum(caps.values())
        if risk.spread < 1:
            for z in spot:
                rest = total - caps.get(z, 0.0)
                if rest < (1 - risk.spread) * need * (1 - _TOL) - _TOL:
                    out.append(f"{s}: losing spot pool {z} leaves {rest:.6g} tokens/s, below "
                               f"{1 - risk.spread:g} x {need:.6g} (spread {risk.spread:g})")
        if risk.ondemand_floor > 0:
            od = sum(c for r, c in caps.items() if not is_spot_region(r))
            if od < risk.ondemand_floor * need * (1 - _TOL) - _TOL:
                out.append(f"{s}: on-demand capacity {od:.6g} tokens/s below {risk.ondemand_floor:g} x "
                           f"{need:.6g} (on-demand floor)")
    return out


def evaluate_plan(problem: AllocationProblem,
                  allocation: Allocation | Mapping[str, float]) -> PlanEvaluation:
    counts: Mapping[str, float] = (allocation.as_dict() if isinstance(allocation, Allocation)
                                   else dict(allocation))
    running = (problem.running or Allocation()).as_dict()
    violations: list[str] = []
    usage: dict[tuple[str, str], float] = defaultdict(float)
    capacity: dict[str, float] = defaultdict(float)
    cost = startup = 0.0
    types_by_model: dict[str, set[str]] = defaultdict(set)
    configs_by_model: dict[str, set[str]] = defaultdict(set)
    for key, n in counts.items():
        try:
            t = problem.template(key)
        except KeyError:
            violations.append(f"unknown template key {key!r}")
            continue
        if not (isinstance(n, int | float) and math.isfinite(n)):
            violations.append(f"{key}: count {n!r} is not a number")
            continue
        if n < 0:
            violations.append(f"{key}: negative count {n}")
        if n != round(n):
            violations.append(f"{key}: count {n} is not an integer")
        price = 0.0
        for c, k in t.node_use:  # a slice at its share of the node
            usage[(t.region, c)] += k * n
            price += k * problem.prices[(t.region, c)]
        cost += n * price
        startup += max(0.0, n - running.get(key, 0)) * price
        for name, thr in t.covers:
            capacity[name] += n * thr
        if n > 0:
            types_by_model[t.service.model].update(gpu_type_of(c) for c, _ in t.nodes)
            configs_by_model[t.service.model].update(c for c, _ in t.nodes)
    sliced = problem.index.sliced_rcs
    for rc, used in sorted(usage.items()):
        if rc in sliced:
            # slices buy whole nodes: ceil(used) of them, all paid (exact for power-of-two
            # slices, atoll.solvers.packing)
            nodes = math.ceil(used - 1e-9)
            cost += (nodes - used) * problem.prices[rc]
            used = nodes
        if used > problem.available(rc) + _TOL:
            violations.append(f"{rc[0]}/{rc[1]}: uses {used:g} nodes, {problem.available(rc):g} available")
    served, shares, goodput = served_shares(problem.demand, capacity, problem.models)
    if problem.mode == "cost":
        for s in sorted(problem.demand):
            d = problem.planning_demand(s)
            if s.rpartition("/")[0] in problem.free_models and capacity.get(s, 0.0) < d * (1 - _TOL):
                violations.append(f"{s}: capacity {capacity.get(s, 0.0):.6g} below demand {d:.6g} tokens/s")
    violations += _risk_violations(problem, counts)
    if problem.reoptimize is not None:
        for key in sorted(set(counts) | set(running)):
            try:
                model = problem.template(key).service.model
            except KeyError:
                continue
            if model not in problem.reoptimize and counts.get(key, 0) != running.get(key, 0):
                violations.append(f"{key}: model {model} is held fixed at {running.get(key, 0)} "
                                  f"instances, plan has {counts.get(key, 0)}")
    for key in sorted(running):
        try:
            model = problem.template(key).service.model
        except KeyError:
            continue
        if model in problem.grow and counts.get(key, 0) < running[key]:
            violations.append(f"{key}: model {model} may only grow from {running[key]} instances, "
                              f"plan has {counts.get(key, 0)}")
    if problem.one_gpu_type_per_model:
        for m, types in sorted(types_by_model.items()):
            if len(types) > 1:
                violations.append(f"{m}: uses GPU types {sorted(types)}, one allowed")
    if problem.one_config_per_model:
        for m, configs in sorted(configs_by_model.items()):
            if len(configs) > 1:
                violations.append(f"{m}: uses node configs {sorted(configs)}, one allowed")
    return PlanEvaluation(
        feasible=not violations, violations=tuple(violations), cost_per_hour=cost,
        startup_cost_per_hour=startup,
        objective=cost + problem.startup_weight * startup + problem.removal_weight * problem.removed_cost(
            {k: int(round(v)) for k, v in counts.items() if isinstance(v, int | float) and math.isfinite(v)}),
        node_usage=dict(usage), capacity=dict(capacity), served=served, served_share=shares,
        goodput_fraction=goodput,
    )
