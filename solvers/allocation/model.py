"""The allocation ILP of one round as a PuLP model, its MIP start and its plan.

Sets: templates t (each of one service s(t) of model m(t), one region), node configs c.
Data: n_tc nodes of config c in t; p_t = sum_c n_tc x price(region, c) ($/h); theta_t tokens/s;
d_s demand; A_rc availability; r_t running instances; K start-up weight. A co-located template
serves both services of its model (:attr:`~atoll.solvers.types.Template.covers`): it has a term
theta_ts in each of their demand (and risk) rows, so the sums over "t of s" below run over every
template serving s.

    x_t in Z>=0                       instances (variables only for re-optimized models)
    a_t >= x_t - r_t, a_t >= 0        instances added beyond the running ones
    sum_t n_tc x_t <= A_rc - F_rc     per (region, config); F = usage of the models held fixed
    cost mode:  sum_{t of s} theta_t x_t >= d_s - H_s  (H_s: capacity a grow model keeps, see
                                                     :mod:`~atoll.solvers.allocation.reduction`)
    minimize    sum_t p_t x_t + K sum_t p_t a_t

Slices: for a (region, config) some template uses a slice of ("2/8xH100" is 0.25 of an
8xH100 node; n_tc fractional), the row above becomes integer nodes y_rc and their idle share
i_rc >= 0,

    y_rc - i_rc - sum_t n_tc x_t = F_rc,   0 <= y_rc <= A_rc,   objective += price_rc x i_rc

so the objective is what the bought nodes cost (p_t counts a slice's share; the idle GPUs of the
last node are paid too). ceil(use) nodes suffice because slices and nodes have power-of-two GPU
counts: first-fit decreasing packs them (:mod:`atoll.solvers.packing`), so the aggregate row is
exact. Variables ``nodes<j>_<region>_<config>`` and ``idle<j>_...``, row ``pack<j>_...``.

Goodput mode (scarcity) is lexicographic. Stage 1 maximizes sum_m f_m, 0 <= f_m <= 1, with
f_m d_s <= sum_{t of s} theta_t x_t for both services of model m: f_m is the share of model m's
requests served, since a request needs both its prefill and its decode. Every model weighs the
same, whatever its token volume. Stage 2 minimizes the cost objective with sum_m f_m >= F* - eps.
Optional restriction: one GPU type (or one node config) per model: binary y_mg over the model's
types (configs) g, sum_g y_mg = 1, x_t <= u_t y_m,g(t).

Variable and row names say what they are: ``inst<i>_<template>`` (x_t), ``added<i>_<template>``
(a_t), ``fraction<j>_<model>`` (f_m), ``uses<j>_<g>_<model>_<gpu type>`` (y_mg);
``avail<j>_<region>_<config>``, ``demand<j>_<service>``, ``share<j>_<service>``. The numbered
prefix keeps names unique after PuLP's character translation and keeps PuLP's name-sorted
column order the same from one round to the next.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import pulp

from atoll.solvers.allocation.reduction import RoundInstance
from atoll.solvers.problem import Allocation, gpu_type_of, is_spot_region, model_of

STAGES = ("cost", "share", "cost_at_share")
_NOT_IN_NAME = re.compile(r"[^0-9A-Za-z.@]+")


def label(text: str) -> str:
    """``text`` as a name fragment LP files accept: runs of other characters become ``_``."""
    return _NOT_IN_NAME.sub("_", text).strip("_")


@dataclass
class Model:
    """A built round: the PuLP problem and its variables by what they stand for."""

    prob: pulp.LpProblem
    count: dict[str, pulp.LpVariable]  # template key -> instances x_t
    added: dict[str, pulp.LpVariable] = field(default_factory=dict)  # template key -> a_t
    removed: dict[str, pulp.LpVariable] = field(default_factory=dict)  # template key -> e_t
    fraction: dict[str, pulp.LpVariable] = field(default_factory=dict)  # model -> f_m
    # (model, GPU type or config) -> y_mg, under the one-type / one-config rule
    choice: dict[tuple[str, str], pulp.LpVariable] = field(default_factory=dict)
    kind_of: dict[str, str] = field(default_factory=dict)  # template key -> its g, under the rule
    # sliced (region, config) -> (nodes y_rc, idle share i_rc)
    nodes: dict[tuple[str, str], tuple[pulp.LpVariable, pulp.LpVariable]] = field(default_factory=dict)

    def values(self) -> dict[str, float | None]:
        """Instances per template key as the last solve left them."""
        return {key: var.varValue for key, var in self.count.items()}


def build_model(inst: RoundInstance, stage: str, floor_share: float | None = None) -> Model:
    """stage: "cost" (demand rows), "share" (goodput stage 1) or "cost_at_share" (stage 2)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; valid stages: {', '.join(STAGES)}")
    p = inst.problem
    sense = pulp.LpMaximize if stage == "share" else pulp.LpMinimize
    prob = pulp.LpProblem("allocation", sense)
    rule = p.per_model_rule
    names = {k: label(k) for k in inst.free}
    x = {k: prob.add_variable(f"inst{i:06d}_{names[k]}", 0, inst.bound[k], cat=pulp.LpInteger)
         for i, k in enumerate(inst.free)}
    model = Model(prob, x)
    by_rc: dict[tuple[str, str], list[tuple[pulp.LpVariable, float]]] = defaultdict(list)
    by_service: dict[str, list[tuple[pulp.LpVariable, float]]] = defaultdict(list)
    by_model_type: dict[tuple[str, str], list[str]] = defaultdict(list)
    objective: list[tuple[pulp.LpVariable, float]] = []
    for i, (key, var) in enumerate(x.items()):
        t = p.template(key)
        for c, k in t.node_use:
            if (t.region, c) in inst.rows:
                by_rc[(t.region, c)].append((var, float(k)))
        for s, thr in t.covers:
            by_service[s].append((var, thr))
        first = t.nodes[0][0]
        kind = first if rule == "config" else gpu_type_of(first)
        by_model_type[(t.service.model, kind)].append(key)
        if rule is not None:
            model.kind_of[key] = kind
        cost = p.template_cost(key)
        r = inst.running[key]
        if r == 0:
            objective.append((var, cost * (1.0 + p.startup_weight)))
        else:
            objective.append((var, cost))
            if p.startup_weight > 0:
                add = model.added[key] = prob.add_variable(f"added{i:06d}_{names[key]}", 0,
                                                           inst.bound[key])
                objective.append((add, cost * p.startup_weight))
                prob += (pulp.LpAffineExpression([(add, 1.0), (var, -1.0)]) >= -r,
                         f"startup{i:06d}_{names[key]}")
            if p.removal_weight > 0:  # e_t >= r_t - x_t: the running instances removed
                rem = model.removed[key] = prob.add_variable(f"removed{i:06d}_{names[key]}", 0, r)
                objective.append((rem, cost * p.removal_weight))
                prob += (pulp.LpAffineExpression([(rem, 1.0), (var, 1.0)]) >= r,
                         f"removal{i:06d}_{names[key]}")
    objective += node_rows(inst, prob, by_rc, model.nodes, pays=stage != "share")
    if rule is not None:
        n_rows = 0
        for j, m in enumerate(inst.models):
            types = sorted(g for (mm, g) in by_model_type if mm == m)
            y = {g: prob.add_variable(f"uses{j:05d}_{i:02d}_{label(m)}_{label(g)}", cat=pulp.LpBinary)
                 for i, g in enumerate(types)}
            model.choice.update({(m, g): v for g, v in y.items()})
            if y:
                prob += pulp.lpSum(y.values()) == 1, f"onetype{j:05d}_{label(m)}"
            for g, yv in y.items():
                for key in by_model_type[(m, g)]:
                    n_rows += 1
                    prob += (pulp.LpAffineExpression([(x[key], 1.0), (yv, -float(inst.bound[key]))])
                             <= 0, f"type{n_rows:06d}_{label(g)}_{names[key]}")
    objective = service_rows(inst, prob, by_service, model.fraction, stage, floor_share) or objective
    if p.risk:
        by_region: dict[str, list[tuple[str, pulp.LpVariable, float]]] = defaultdict(list)
        for key, var in model.count.items():
            t = p.template(key)
            for s, thr in t.covers:
                by_region[s].append((t.region, var, thr))
        risk_rows(inst, prob, by_region, model.fraction, stage)
    prob.setObjective(pulp.LpAffineExpression(objective))
    return model


def node_rows(inst: RoundInstance, prob: pulp.LpProblem,
              by_rc: Mapping[tuple[str, str], list[tuple[pulp.LpVariable, float]]],
              nodes: dict[tuple[str, str], tuple[pulp.LpVariable, pulp.LpVariable]],
              pays: bool) -> list[tuple[pulp.LpVariable, float]]:
    """The availability row of each enforced (region, config) and, for a sliced one, its integer
    nodes and idle share (added to ``nodes``); the idle shares' objective terms when ``pays``."""
    p = inst.problem
    objective: list[tuple[pulp.LpVariable, float]] = []
    sliced = p.index.sliced_rcs
    for j, (rc, terms) in enumerate(sorted(by_rc.items())):
        name = f"{j:05d}_{label(rc[0])}_{label(rc[1])}"
        if rc not in sliced:
            if rc in inst.rows:
                prob += pulp.LpAffineExpression(terms) <= inst.residual[rc], f"avail{name}"
            continue
        cap = p.available(rc)
        y = prob.add_variable(f"nodes{name}", 0, None if math.isinf(cap) else math.floor(cap + 1e-9),
                              cat=pulp.LpInteger)
        idle = prob.add_variable(f"idle{name}", 0)
        nodes[rc] = (y, idle)
        prob += (pulp.LpAffineExpression([(y, 1.0), (idle, -1.0), *((v, -k) for v, k in terms)])
                 == inst.fixed_use.get(rc, 0.0), f"pack{name}")
        if pays:
            objective.append((idle, p.prices[rc]))
    return objective


def service_rows(inst: RoundInstance, prob: pulp.LpProblem,
                 by_service: Mapping[str, list[tuple[pulp.LpVariable, float]]],
                 fraction: dict[str, pulp.LpVariable], stage: str,
                 floor_share: float | None) -> list[tuple[pulp.LpVariable, float]] | None:
    """Each service's row: its demand (cost stage), or its served fraction f_m (goodput stages,
    which add the f_m to ``fraction``); the share stage's objective (sum f_m), else None."""
    p = inst.problem
    if stage == "cost":
        for j, s in enumerate(inst.services):
            prob += pulp.LpAffineExpression(by_service[s]) >= inst.target(s), f"demand{j:05d}_{label(s)}"
        return None
    for j, m in enumerate(inst.models):
        fraction[m] = prob.add_variable(f"fraction{j:05d}_{label(m)}", 0, 1)
    for j, s in enumerate(inst.services):
        prob += (pulp.LpAffineExpression([*by_service[s], (fraction[model_of(s)], -p.planning_demand(s))])
                 >= -inst.held.get(s, 0.0), f"share{j:05d}_{label(s)}")
    if stage == "share":
        return [(v, 1.0) for v in fraction.values()]
    prob += pulp.lpSum(fraction.values()) >= floor_share, "share_floor"
    return None


def risk_rows(inst: RoundInstance, prob: pulp.LpProblem,
              terms: Mapping[str, list[tuple[str, pulp.LpVariable, float]]],
              fraction: Mapping[str, pulp.LpVariable], stage: str) -> None:
    """The rows of each model's :class:`~atoll.solvers.problem.Risk`, per service s with planning
    demand D_s (x f_m in goodput mode) and capacity terms theta_t x_t (``terms``: service ->
    (region, variable, throughput); floors H as constants):

        spread sigma, per spot pool z:  sum_{t not in z} theta_t x_t >= (1 - sigma) D_s - H_{not z}
        on-demand floor phi:           sum_{t on-demand} theta_t x_t >= phi D_s - H_{on-demand}

    Named ``spread<j>_<service>_<pool>`` and ``floor<j>_<service>``."""
    p = inst.problem
    held: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for key, n in inst.floor.items():
        t = p.template(key)
        for s, thr in t.covers:
            held[s].append((t.region, n * thr))
    pools = {r for ts in terms.values() for r, _, _ in ts} | {r for hs in held.values() for r, _ in hs}
    spot = sorted(z for z in pools if is_spot_region(z))
    for j, s in enumerate(inst.services):
        risk = p.risk_of(model_of(s))
        rows: list[tuple[float, frozenset[str], str]] = []  # (share of D_s, pools that count, name)
        if risk.spread < 1:
            rows += [(1 - risk.spread, frozenset(pools - {z}), f"spread{j:05d}_{label(s)}_{label(z)}")
                     for z in spot]
        if risk.ondemand_floor > 0:
            rows.append((risk.ondemand_floor, frozenset(r for r in pools if not is_spot_region(r)),
                         f"floor{j:05d}_{label(s)}"))
        need = p.planning_demand(s)
        share = fraction.get(model_of(s)) if stage != "cost" else None
        for coef, counted, name in rows:
            lhs = [(v, th) for r, v, th in terms.get(s, []) if r in counted]
            const = sum(h for r, h in held[s] if r in counted)
            if share is not None:  # goodput: the served fraction f_m of the demand
                prob += pulp.LpAffineExpression([*lhs, (share, -coef * need)]) >= -const, name
            else:
                prob += pulp.LpAffineExpression(lhs) >= coef * need - const, name


def start_values(inst: RoundInstance, model: Model, start: Allocation) -> dict[str, float]:
    """A full MIP start from an allocation (variable name -> value): x clipped to its bound, a,
    f and the one-type / one-config binaries implied by x (a model without instances in the
    start takes its first choice)."""
    p = inst.problem
    values: dict[str, float] = {}
    cap: dict[str, float] = defaultdict(float)
    for key, var in model.count.items():
        v = min(max(start[key] - inst.floor.get(key, 0), 0), inst.bound[key])
        values[var.name] = v
        if key in model.added:
            values[model.added[key].name] = max(0, v - inst.running[key])
        if key in model.removed:
            values[model.removed[key].name] = max(0, inst.running[key] - v)
        for s, thr in p.template(key).covers:
            cap[s] += v * thr
    used: dict[str, set[str]] = defaultdict(set)
    for key, var in model.count.items():
        if values[var.name] > 0 and key in model.kind_of:
            used[p.template(key).service.model].add(model.kind_of[key])
    first_choice: set[str] = set()
    for (m, g), var in model.choice.items():
        pick = g in used[m] if used[m] else m not in first_choice
        first_choice.add(m)
        values[var.name] = 1.0 if pick else 0.0
    use: dict[tuple[str, str], float] = defaultdict(float)
    for key, var in model.count.items() if model.nodes else ():  # node use matters to sliced pools only
        t = p.template(key)
        for c, k in t.node_use:
            use[(t.region, c)] += k * values[var.name]
    finish_start(inst, values, cap, use, model.fraction, model.nodes)
    return values


def finish_start(inst: RoundInstance, values: dict[str, float], capacity: Mapping[str, float],
                 use: Mapping[tuple[str, str], float], fraction: Mapping[str, pulp.LpVariable],
                 nodes: Mapping[tuple[str, str], tuple[pulp.LpVariable, pulp.LpVariable]]) -> None:
    """Complete a MIP start in ``values`` from the capacity per service and the node use per
    (region, config) of its columns: each f_m from that capacity and the floors' (held), each
    sliced pool's nodes as ceil(held use + use) and the rest of them idle."""
    p = inst.problem
    for m, var in fraction.items():
        values[var.name] = min([1.0] + [(capacity.get(s, 0.0) + inst.held.get(s, 0.0)) / p.demand[s]
                                        for s in inst.services if model_of(s) == m])
    for rc, (y, idle) in nodes.items():
        u = inst.fixed_use.get(rc, 0.0) + use.get(rc, 0.0)
        values[y.name] = float(math.ceil(u - 1e-9))
        values[idle.name] = values[y.name] - u


def extract(inst: RoundInstance, values: Mapping[str, float | None]) -> Allocation | str:
    """The plan the solver found (instances per template key), with the fixed models and the grow
    models' floors added back; a message if a value is not a non-negative integer."""
    counts = inst.constants()
    for key, v in values.items():
        if v is None or abs(v - round(v)) > 1e-5 or v < -1e-6:
            return f"solver returned a non-integer value {v!r} for {key}"
        if round(v):
            counts[key] = counts.get(key, 0) + int(round(v))
    return Allocation.of(counts)
