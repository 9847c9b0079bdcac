"""Why a cost-mode allocation is infeasible: services that cannot be met even alone within the
availability left to them, or services that can each be met alone but not together."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

import pulp

from atoll.solvers.allocation.highs import WarmHiGHS
from atoll.solvers.allocation.reduction import RoundInstance
from atoll.solvers.problem import AllocationProblem

FEAS_TOL = 1e-6


def max_capacity_alone(problem: AllocationProblem, service: str,
                       residual: Mapping[tuple[str, str], float]) -> float:
    """Most tokens/s ``service`` can get on its own within ``residual`` availability (exact)."""
    prob = pulp.LpProblem("alone", pulp.LpMaximize)
    terms = []
    by_rc: dict[tuple[str, str], list[tuple[pulp.LpVariable, float]]] = defaultdict(list)
    for i, (t, thr) in enumerate(problem.serving(service)):
        rooms = [residual.get((t.region, c), 0) // k for c, k in t.node_use
                 if not math.isinf(residual.get((t.region, c), 0))]  # inf // k is nan
        if not rooms:  # unlimited availability (None): this template alone meets any demand
            return math.inf
        ub = int(min(rooms))
        if ub <= 0:
            continue
        v = prob.add_variable(f"x{i:06d}", 0, ub, cat=pulp.LpInteger)
        terms.append((v, thr))
        for c, k in t.node_use:
            by_rc[(t.region, c)].append((v, float(k)))
    if not terms:
        return 0.0
    for j, (rc, row) in enumerate(sorted(by_rc.items())):
        prob += pulp.LpAffineExpression(row) <= residual[rc], f"avail{j:05d}"
    prob.setObjective(pulp.LpAffineExpression(terms))
    prob.solve(WarmHiGHS(msg=False, timeLimit=30.0))
    return float(pulp.value(prob.objective) or 0.0)


def diagnose_infeasible(inst: RoundInstance) -> str:
    """The message of an infeasible cost-mode round, naming the services short of capacity."""
    p = inst.problem
    short = []
    bare = []
    for s in inst.services:
        if not p.serving(s):
            bare.append(s)  # no template at all: availability is not the reason
            continue
        cap = max_capacity_alone(p, s, inst.residual)
        need = inst.target(s)  # a grow model's kept instances already cover part of it
        if cap < need * (1 - FEAS_TOL):
            kept = f", {inst.held[s]:.6g} kept" if inst.held.get(s) else ""
            short.append(f"{s} (demand {p.demand[s]:.6g} tokens/s{kept}, at most {cap:.6g} more alone)")
    parts = []
    if bare:
        parts.append("have no serving template (no offered node config can run the model; `atoll check "
                     "--fleet` says why): " + ", ".join(bare))
    if short:
        parts.append("cannot be met even alone within availability: " + "; ".join(short))
    what = ("; services ".join(parts) if parts else
            "can each be met alone but not together: they compete for the same node configs")
    return (f"demand is infeasible in cost mode; services {what}. "
            "Goodput mode (`atoll solve --goodput`; mode='goodput' in Python) serves as much as possible")
