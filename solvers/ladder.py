"""The ladder of baselines: where the joint ILP's saving comes from (its figures:
docs/results/decomposition.md).

Each rung is the exact allocation ILP over a restricted template set, solved by one code path
(:func:`atoll.solvers.allocation.solve_allocation`); from the most restricted to the full ILP:

- ``homo-node``: every replica is one node, and each model uses one node config for all its
  replicas (both services) — the Coral paper's Homo, solved exactly;
- ``homo-config``: one node config per model, replicas may be pipelines of several such nodes;
- ``single-type``: one GPU type per model, any mix of node sizes of that type in a replica;
- ``independent``: heterogeneous replicas, models planned one at a time (in the problem's model
  order), each against what the models before it took and what the ``single-type`` plan gives
  the models after it (so a later model always keeps room for that plan);
- ``joint``: the full ILP, every model planned together;
- ``co-located`` (only when the problem holds co-located templates, ``pd: auto``): the joint ILP
  that may also serve a model with replicas that run prefill and decode together. Every rung
  above it plans with a replica per phase (the co-located templates are left out of them), so
  joint/co-located says what co-location buys.

The ladder is monotone by construction: each rung's feasible set holds the rung above's plan
(homo-node ⊂ homo-config ⊂ single-type template sets and rules; in ``independent`` each model's
sub-problem holds that model's single-type plan; ``joint`` holds any plan), each rung is
warm-started from the plan above, and a rung keeps the plan above when the solver, stopping at
its relative gap, returns one that is worse. So each rung costs at most the rung above (in goodput
mode: serves at least as much, then costs at most as much). The ratio of each rung to the next
says what one relaxation buys: homo-node/homo-config = multi-node pipelines vs one node per
replica, homo-config/single-type = mixing node sizes of one GPU type, single-type/independent =
mixing GPU types, independent/joint = planning the models together.

Beside the ladder (not rungs of it): ``homo-node-greedy`` is the paper's own wording of Homo:
per model, the (region, single-node config) with the least cost of replicas covering its demand
(best goodput per dollar), replicated; a model whose best config is short of nodes takes the next
one. ``homo-node-per-replica`` is the other reading of "each replica one node": the exact ILP
over single-node templates with no one-config-per-model rule (each replica, and each service,
may pick its own config). It need not cost more than ``single-type`` (it mixes GPU types across
a model's replicas), which is why it is not a rung.

Every rung plans from scratch: running plans, start-up weights and fixed models are dropped.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from atoll.solvers.allocation import solve_allocation
from atoll.solvers.allocation.evaluate import PlanEvaluation, evaluate_plan
from atoll.solvers.baselines import EvaluatedPlan
from atoll.solvers.errors import InputError
from atoll.solvers.problem import Allocation, AllocationProblem, AllocationResult, SolveStatus, model_of
from atoll.solvers.types import Template, node_config_of

RUNGS: tuple[str, ...] = ("homo-node", "homo-config", "single-type", "independent", "joint")
COLOCATED = "co-located"  # the rung after joint, for problems with co-located templates
GREEDY = "homo-node-greedy"
PER_REPLICA = "homo-node-per-replica"
SIDE: tuple[str, ...] = (GREEDY, PER_REPLICA)
_TOL = 1e-9


@dataclass(frozen=True)
class Rung(EvaluatedPlan):
    """One rung's plan. ``status``: a :class:`SolveStatus` value ("optimal" = every ILP of the
    rung proven within the problem's gap), "feasible" for the greedy, "infeasible"/"error"
    without a plan. ``model_cost``: $/h of each model's instances."""

    name: str
    status: str
    allocation: Allocation | None
    evaluation: PlanEvaluation | None
    seconds: float
    templates: int
    model_cost: Mapping[str, float] = field(default_factory=dict)
    message: str = ""
    gap: float = math.nan  # proven relative gap of the rung's ILP(s); the worst over sub-problems

    def as_dict(self) -> dict[str, Any]:
        return {"rung": self.name, "status": self.status, "cost_per_hour": _num(self.cost_per_hour),
                "goodput_fraction": _num(self.goodput_fraction), "seconds": round(self.seconds, 4),
                "templates": self.templates, "instances": 0 if self.allocation is None
                else self.allocation.total_instances,
                "model_cost": {m: round(c, 6) for m, c in self.model_cost.items()},
                "gap": None if not math.isfinite(self.gap) else self.gap, "message": self.message}


def _num(v: float) -> float | None:
    return None if not math.isfinite(v) else round(v, 6)


def _ratio(a: float, b: float) -> float | None:
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else None


@dataclass(frozen=True)
class Ladder:
    """The rungs of one problem (``RUNGS`` order) and the greedy Homo beside them."""

    rungs: tuple[Rung, ...]
    side: tuple[Rung, ...]
    models: tuple[str, ...]
    mode: str

    def rung(self, name: str) -> Rung:
        for r in (*self.rungs, *self.side):
            if r.name == name:
                return r
        raise InputError(f"unknown rung {name!r}; valid rungs: {', '.join((*RUNGS, *SIDE))}")

    def steps(self) -> list[dict[str, Any]]:
        """Each rung over the next: total and per model cost ratios (None when a side has no
        plan or costs nothing), and goodput of both sides."""
        out = []
        for upper, lower in zip(self.rungs, self.rungs[1:], strict=False):
            out.append({
                "step": f"{upper.name}/{lower.name}",
                "ratio": _ratio(upper.cost_per_hour, lower.cost_per_hour),
                "per_model": {m: _ratio(upper.model_cost.get(m, math.nan), lower.model_cost.get(m, math.nan))
                              for m in self.models},
                "goodput": [_num(upper.goodput_fraction), _num(lower.goodput_fraction)],
            })
        return out

    def total_ratio(self, upper: str, lower: str = "joint") -> float | None:
        return _ratio(self.rung(upper).cost_per_hour, self.rung(lower).cost_per_hour)

    @property
    def all_optimal(self) -> bool:
        """Every ILP rung proven optimal (within the problem's gap)."""
        return all(r.status == SolveStatus.OPTIMAL.value for r in self.rungs)

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "models": list(self.models),
                "rungs": [r.as_dict() for r in self.rungs], "side": [r.as_dict() for r in self.side],
                "steps": self.steps(),
                "over_joint": {r.name: self.total_ratio(r.name) for r in (*self.rungs, *self.side)},
                "all_ilp_rungs_optimal": self.all_optimal}


# --- restricted problems ------------------------------------------------------------------------

def _one_node(t: Template) -> bool:
    return len(t.nodes) == 1 and t.nodes[0][1] == 1


def _one_config(t: Template) -> bool:
    return len(t.nodes) == 1


RESTRICTIONS: Mapping[str, tuple[Callable[[Template], bool] | None, dict[str, bool]]] = {
    "homo-node": (_one_node, {"one_config_per_model": True}),
    "homo-config": (_one_config, {"one_config_per_model": True}),
    PER_REPLICA: (_one_node, {}),
    "single-type": (None, {"one_gpu_type_per_model": True}),
    "independent": (None, {}),
    "joint": (None, {}),
    COLOCATED: (None, {}),
}


def fresh(problem: AllocationProblem) -> AllocationProblem:
    """``problem`` planned from scratch: no running plan, no start-up weight, every model free."""
    return problem.with_changes(running=None, startup_weight=0.0, reoptimize=None,
                                one_gpu_type_per_model=False, one_config_per_model=False)


def restricted(problem: AllocationProblem, rung: str) -> AllocationProblem:
    """The problem of one ILP rung (any of ``RESTRICTIONS``; ``independent`` is ``joint``'s)."""
    if rung not in RESTRICTIONS:
        raise InputError(f"unknown rung {rung!r}; valid rungs: {', '.join(RESTRICTIONS)}")
    keep, flags = RESTRICTIONS[rung]
    base = fresh(problem)
    if rung != COLOCATED and base.index.any_colocated:  # every other rung: a replica per phase
        base = base.with_changes(templates=tuple(t for t in base.templates if not t.colocated))
    if keep is not None:
        base = base.with_changes(templates=tuple(t for t in base.templates if keep(t)))
    return base.with_changes(**flags) if flags else base


# --- solving ------------------------------------------------------------------------------------

def _better(problem: AllocationProblem, a: PlanEvaluation, b: PlanEvaluation) -> bool:
    """a strictly better than b: cost mode by objective; goodput mode by served share, then cost."""
    if problem.mode == "goodput" and abs(a.goodput_fraction - b.goodput_fraction) > _TOL:
        return a.goodput_fraction > b.goodput_fraction
    return a.objective < b.objective - _TOL * max(1.0, abs(b.objective))


def _model_cost(problem: AllocationProblem, allocation: Allocation | None) -> dict[str, float]:
    cost: dict[str, float] = {m: 0.0 for m in problem.models}
    for key, n in (allocation.counts if allocation is not None else ()):
        cost[problem.template(key).service.model] += n * problem.template_cost(key)
    return cost


def _keep_better(base: AllocationProblem, sub: AllocationProblem, plan: Allocation | None,
                 above: Allocation | None) -> Allocation | None:
    """``plan`` unless the plan from the rung above is feasible here and better."""
    if above is None or any(k not in sub.index.position for k, _ in above.counts):
        return plan
    ev_above = evaluate_plan(sub, above)
    if not ev_above.feasible:
        return plan
    if plan is None or _better(base, ev_above, evaluate_plan(sub, plan)):
        return above
    return plan


def _rung_from(name: str, base: AllocationProblem, sub: AllocationProblem, res: AllocationResult,
               above: Allocation | None, seconds: float) -> Rung:
    plan = res.allocation if res.allocation is not None and evaluate_plan(sub, res.allocation).feasible \
        else None
    plan = _keep_better(base, sub, plan, above)
    status = res.status.value
    if plan is not None and res.allocation is None:  # the rung above's plan fits: not infeasible
        status, res_msg = "feasible", f"solver: {res.status.value} ({res.message}); kept the plan above"
    else:
        res_msg = res.message
    ev = None if plan is None else evaluate_plan(base, plan)
    return Rung(name, status, plan, ev, seconds, len(sub.templates), _model_cost(base, plan), res_msg,
                res.gap)


def _solve_rung(name: str, base: AllocationProblem, above: Allocation | None) -> Rung:
    t0 = time.perf_counter()
    sub = restricted(base, name)
    start = above if above is not None and all(k in sub.index.position for k, _ in above.counts) else None
    res = solve_allocation(sub, warm_start=start)
    return _rung_from(name, base, sub, res, above, time.perf_counter() - t0)


def _usage(problem: AllocationProblem, counts: Mapping[str, int]) -> dict[tuple[str, str], float]:
    use: dict[tuple[str, str], float] = defaultdict(float)
    for key, n in counts.items():
        t = problem.template(key)
        for c, k in t.node_use:
            use[(t.region, c)] += k * n
    return use


def _independent(base: AllocationProblem, single: Allocation | None) -> Rung:
    """Models one at a time: model k against the availability left by models 1..k-1 (their
    independent plans) and by models k+1..n (their single-type plans)."""
    t0 = time.perf_counter()
    per_phase = restricted(base, "joint")  # the joint rung's problem: a replica per phase
    reserved: dict[str, dict[str, int]] = defaultdict(dict)  # model -> its single-type counts
    for key, n in (single.counts if single is not None else ()):
        reserved[base.template(key).service.model][key] = n
    taken: dict[str, int] = {}
    gaps: list[float] = []
    statuses: list[str] = []
    messages: list[str] = []
    models = base.models
    for i, m in enumerate(models):
        held = dict(taken)
        for later in models[i + 1:]:
            for key, n in reserved[later].items():
                held[key] = held.get(key, 0) + n
        use = _usage(base, held)
        avail = None if base.availability is None else {
            rc: max(v - use.get(rc, 0), 0.0) for rc, v in base.availability.items()}
        templates = tuple(t for t in per_phase.templates if t.service.model == m)
        demand = {s: d for s, d in base.demand.items() if model_of(s) == m}
        if not templates or not any(d > 0 for d in demand.values()):
            statuses.append(SolveStatus.OPTIMAL.value)
            continue
        sub = AllocationProblem(templates, demand, avail, base.prices, mode=base.mode,
                                time_limit=base.time_limit, gap=base.gap)
        mine = Allocation.of(reserved[m]) if reserved[m] else None
        res = solve_allocation(sub, warm_start=mine)
        gaps.append(res.gap)
        part = _keep_better(sub, sub, res.allocation, mine)
        statuses.append(res.status.value if res.allocation is not None or part is None else "feasible")
        if part is None:
            messages.append(f"{m}: {res.status.value} — {res.message}")
            continue
        taken.update(part.as_dict())
    worst = next((s for s in ("error", "infeasible", "feasible_time_limit", "feasible") if s in statuses),
                 SolveStatus.OPTIMAL.value)
    allocation = Allocation.of(taken)
    status = worst
    if base.mode == "cost" and messages:
        status = SolveStatus.INFEASIBLE.value
    plan: Allocation | None = allocation
    if base.mode == "cost" and messages:
        plan = None  # some model's demand cannot be met: no plan, as for the ILP rungs
    plan = _keep_better(base, per_phase, plan, single)
    ev = evaluate_plan(base, plan) if plan is not None else None
    worst_gap = max(gaps) if gaps and all(math.isfinite(g) for g in gaps) else math.nan
    return Rung("independent", status, plan, ev, time.perf_counter() - t0, len(base.templates),
                _model_cost(base, plan), "; ".join(messages), worst_gap)


def homo_node_greedy(problem: AllocationProblem) -> Rung:
    """The paper's Homo in its own words (module docstring): per model, in the problem's model
    order, the (region, single-node config) whose replicas cover the model's demand at the least
    cost, replicated; configs short of nodes give way to the next best. In goodput mode a model
    no config can cover takes as many replicas of its best config as the nodes left allow."""
    t0 = time.perf_counter()
    base = fresh(problem)
    residual = {rc: (math.inf if base.availability is None else base.available(rc)) for rc in base.prices}
    counts: dict[str, int] = {}
    short: list[str] = []
    for m in base.models:
        services = [s for s, d in base.demand.items() if model_of(s) == m and d > 0]
        if not services:
            continue
        best_of: dict[tuple[str, str], dict[str, Template]] = defaultdict(dict)
        for s in services:
            for t in base.templates_of(s):
                if _one_node(t):
                    rc = (t.region, node_config_of(t.nodes[0][0]))
                    if rc not in best_of or s not in best_of[rc] or t.throughput > best_of[rc][s].throughput:
                        best_of[rc][s] = t
        options = []
        for rc, by_service in best_of.items():
            if len(by_service) < len(services):
                continue  # the config cannot serve one of the model's services
            need = {s: math.ceil(base.demand[s] / by_service[s].throughput - 1e-9) for s in services}
            options.append((sum(need.values()) * base.prices[rc], rc, need, by_service))
        options.sort(key=lambda o: (o[0], o[1]))
        fit = next((o for o in options if sum(o[2].values()) <= residual[o[1]]), None)
        if fit is not None:
            _, rc, need, by_service = fit
        else:
            short.append(m)
            # goodput: replicas of the best config with nodes left, alternating the services
            part = next((o for o in options if residual[o[1]] >= 1), None)
            if base.mode != "goodput" or part is None:
                continue
            _, rc, full, by_service = part
            left = int(min(residual[rc], sum(full.values())))
            need = dict.fromkeys(services, 0)
            while left > 0:
                for s in services:
                    if left > 0 and need[s] < full[s]:
                        need[s] += 1
                        left -= 1
        for s, n in need.items():
            if n:
                key = by_service[s].key
                counts[key] = counts.get(key, 0) + n
                residual[rc] -= n
    allocation = Allocation.of(counts)
    ev = evaluate_plan(base, allocation)
    status = "feasible" if ev.feasible else SolveStatus.INFEASIBLE.value
    msg = ("single-node replicas of one config cannot meet the demand of " + ", ".join(short)
           if short else "")
    plan = allocation if ev.feasible or base.mode == "goodput" else None
    return Rung(GREEDY, status if plan is not None else SolveStatus.INFEASIBLE.value, plan,
                ev if plan is not None else None, time.perf_counter() - t0,
                sum(1 for t in base.templates if _one_node(t)), _model_cost(base, plan), msg)


def solve_ladder(problem: AllocationProblem) -> Ladder:
    """Every rung of ``problem`` (module docstring), top to bottom, and the greedy Homo."""
    base = fresh(problem)
    rungs: list[Rung] = []
    above: Allocation | None = None
    single: Allocation | None = None
    names = (*RUNGS, COLOCATED) if base.index.any_colocated else RUNGS
    for name in names:
        rung = _independent(base, single) if name == "independent" else _solve_rung(name, base, above)
        rungs.append(rung)
        if rung.allocation is not None and (base.mode == "goodput" or rung.ok):
            above = rung.allocation
        if name == "single-type":
            single = above if rung.allocation is not None else None
    side = (homo_node_greedy(base), _solve_rung(PER_REPLICA, base, None))
    return Ladder(tuple(rungs), side, tuple(base.models), base.mode)


def decompose(problem: AllocationProblem, *, hypothetical: bool = False, **context: Any) -> dict[str, Any]:
    """The ladder of ``problem`` as one JSON-ready document: ``context`` (scenario, mix, ...),
    each rung's cost, goodput and per-model cost, each rung over the next (total and per model),
    every rung over joint. ``hypothetical``: the problem uses the what-if catalog; the document
    then says so in ``catalog`` and ``warning``."""
    from atoll.solvers.catalog import WHAT_IF_2GPU, WHAT_IF_NOTE

    doc: dict[str, Any] = {**context, "catalog": WHAT_IF_2GPU if hypothetical else "default"}
    if hypothetical:
        doc["warning"] = WHAT_IF_NOTE
    doc.update(solve_ladder(problem).as_dict())
    return doc
