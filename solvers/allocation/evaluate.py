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
from dataclasses import dataclass, field

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


@dataclass
class _Tally:
    """What a plan's counts add up to, template by template, before any whole-node rounding."""

    violations: list[str] = field(default_factory=list)
    usage: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    capacity: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cost: float = 0.0
    startup: float = 0.0
    types_by_model: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    configs_by_model: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


def _tally(problem: AllocationProblem, counts: Mapping[str, float], running: Mapping[str, int]) -> _Tally:
    """Node use, capacity and cost of each template's count (a slice at its share of the node), and
    the counts that are no plan at all (unknown keys, non-numbers, negatives, fractions): one pass,
    so a 1e5-template plan is read once."""
    out = _Tally()
    for key, n in counts.items():
        try:
            t = problem.template(key)
        except KeyError:
            out.violations.append(f"unknown template key {key!r}")
            continue
        if not (isinstance(n, int | float) and math.isfinite(n)):
            out.violations.append(f"{key}: count {n!r} is not a number")
            continue
        if n < 0:
            out.violations.append(f"{key}: negative count {n}")
        if n != round(n):
            out.violations.append(f"{key}: count {n} is not an integer")
        price = 0.0
        for c, k in t.node_use:  # a slice at its share of the node
            out.usage[(t.region, c)] += k * n
            price += k * problem.prices[(t.region, c)]
        out.cost += n * price
        out.startup += max(0.0, n - running.get(key, 0)) * price
        for name, thr in t.covers:
            out.capacity[name] += n * thr
        if n > 0:
            out.types_by_model[t.service.model].update(gpu_type_of(c) for c, _ in t.nodes)
            out.configs_by_model[t.service.model].update(c for c, _ in t.nodes)
    return out


def _node_violations(problem: AllocationProblem, usage: Mapping[tuple[str, str], float],
                     cost: float) -> tuple[float, list[str]]:
    """(the cost with sliced pools' nodes bought whole, the pools used past their availability).
    Slices buy whole nodes: ceil(used) of them, all paid (exact for power-of-two slices,
    atoll.solvers.packing); the rounding is added to ``cost`` pool by pool, in sorted order."""
    violations: list[str] = []
    sliced = problem.index.sliced_rcs
    for rc, used in sorted(usage.items()):
        if rc in sliced:
            nodes = math.ceil(used - 1e-9)
            cost += (nodes - used) * problem.prices[rc]
            used = nodes
        if used > problem.available(rc) + _TOL:
            violations.append(f"{rc[0]}/{rc[1]}: uses {used:g} nodes, {problem.available(rc):g} available")
    return cost, violations


def _demand_violations(problem: AllocationProblem, capacity: Mapping[str, float]) -> list[str]:
    """In cost mode every re-optimized service must be covered: the services whose capacity is
    below their planning demand."""
    if problem.mode != "cost":
        return []
    out: list[str] = []
    for s in sorted(problem.demand):
        d = problem.planning_demand(s)
        if s.rpartition("/")[0] in problem.free_models and capacity.get(s, 0.0) < d * (1 - _TOL):
            out.append(f"{s}: capacity {capacity.get(s, 0.0):.6g} below demand {d:.6g} tokens/s")
    return out


def _held_violations(problem: AllocationProblem, counts: Mapping[str, float],
                     running: Mapping[str, int]) -> list[str]:
    """Templates of models the problem holds fixed (outside ``reoptimize``) whose count moved, and
    of models that may only grow whose count fell below the running one."""
    out: list[str] = []
    if problem.reoptimize is not None:
        for key in sorted(set(counts) | set(running)):
            try:
                model = problem.template(key).service.model
            except KeyError:
                continue
            if model not in problem.reoptimize and counts.get(key, 0) != running.get(key, 0):
                out.append(f"{key}: model {model} is held fixed at {running.get(key, 0)} "
                           f"instances, plan has {counts.get(key, 0)}")
    for key in sorted(running):
        try:
            model = problem.template(key).service.model
        except KeyError:
            continue
        if model in problem.grow and counts.get(key, 0) < running[key]:
            out.append(f"{key}: model {model} may only grow from {running[key]} instances, "
                       f"plan has {counts.get(key, 0)}")
    return out


def _one_per_model_violations(problem: AllocationProblem, tally: _Tally) -> list[str]:
    """Models that use more than one GPU type or node config when the problem allows one."""
    out: list[str] = []
    if problem.one_gpu_type_per_model:
        for m, types in sorted(tally.types_by_model.items()):
            if len(types) > 1:
                out.append(f"{m}: uses GPU types {sorted(types)}, one allowed")
    if problem.one_config_per_model:
        for m, configs in sorted(tally.configs_by_model.items()):
            if len(configs) > 1:
                out.append(f"{m}: uses node configs {sorted(configs)}, one allowed")
    return out


def evaluate_plan(problem: AllocationProblem,
                  allocation: Allocation | Mapping[str, float]) -> PlanEvaluation:
    """The plan's cost, capacity and served demand, and every rule of the problem it breaks (the
    module docstring), recomputed from the templates and prices alone."""
    counts: Mapping[str, float] = (allocation.as_dict() if isinstance(allocation, Allocation)
                                   else dict(allocation))
    running = (problem.running or Allocation()).as_dict()
    tally = _tally(problem, counts, running)
    cost, node_violations = _node_violations(problem, tally.usage, tally.cost)
    served, shares, goodput = served_shares(problem.demand, tally.capacity, problem.models)
    violations = [*tally.violations, *node_violations, *_demand_violations(problem, tally.capacity),
                  *_risk_violations(problem, counts), *_held_violations(problem, counts, running),
                  *_one_per_model_violations(problem, tally)]
    whole = {k: int(round(v)) for k, v in counts.items() if isinstance(v, int | float) and math.isfinite(v)}
    objective = (cost + problem.startup_weight * tally.startup
                 + problem.removal_weight * problem.removed_cost(whole))
    return PlanEvaluation(
        feasible=not violations, violations=tuple(violations), cost_per_hour=cost,
        startup_cost_per_hour=tally.startup, objective=objective,
        node_usage=dict(tally.usage), capacity=dict(tally.capacity), served=served, served_share=shares,
        goodput_fraction=goodput,
    )
