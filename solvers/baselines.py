"""Baselines that isolate where the ILP's gain comes from.

- ``homo``: every replica on nodes of one config (a template whose nodes are all one config);
  greedy, round-robin over services: each service short of its demand adds the homogeneous
  template with the best *useful* tokens/s per dollar, min(throughput, demand left) / $/h,
  among those that fit the availability left, until demand is met or nothing fits. Shows the
  gain of mixing configs inside a replica and across them.
- ``single-type``: the exact ILP with each model restricted to templates of one GPU type; the
  type per model is chosen jointly and exactly by binary variables (equivalent to trying every
  type for every model). Shows the gain of mixing GPU types.
- ``independent``: each model solved alone by the exact ILP, in the problem's model order,
  against the availability the models before it left. Shows the gain of joint allocation.
- ``ilp``: the joint ILP itself, so every method reports through one type.

Models outside ``problem.reoptimize`` stay at their running counts in every method.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from atoll.solvers.allocation import solve_allocation
from atoll.solvers.allocation.evaluate import PlanEvaluation, evaluate_plan
from atoll.solvers.problem import Allocation, AllocationProblem, AllocationResult, SolveStatus, model_of
from atoll.solvers.registry import Registry
from atoll.solvers.types import Template

FEASIBLE = "feasible"  # status of a heuristic plan: no optimality claim


class EvaluatedPlan:
    """Figures read off a plan's :class:`PlanEvaluation` (NaN and not ``ok`` without a plan): the
    shared part of a method's and a ladder rung's result."""

    evaluation: PlanEvaluation | None

    @property
    def cost_per_hour(self) -> float:
        return math.nan if self.evaluation is None else self.evaluation.cost_per_hour

    @property
    def goodput_fraction(self) -> float:
        return math.nan if self.evaluation is None else self.evaluation.goodput_fraction

    @property
    def ok(self) -> bool:
        """A plan exists and it satisfies every constraint of the problem."""
        return self.evaluation is not None and self.evaluation.feasible


@dataclass(frozen=True)
class MethodResult(EvaluatedPlan):
    """One method's plan on one problem. status: a :class:`SolveStatus` value for ILP-based
    methods, "feasible"/"infeasible" for the Homo greedy. ``evaluation`` scores the plan (a
    partial plan when the method could not meet the demand) with :func:`evaluate_plan`."""

    method: str
    status: str
    allocation: Allocation | None
    evaluation: PlanEvaluation | None
    gap: float
    build_seconds: float
    solve_seconds: float
    message: str = ""


def _from_solve(method: str, problem: AllocationProblem, res: AllocationResult) -> MethodResult:
    ev = None if res.allocation is None else evaluate_plan(problem, res.allocation)
    return MethodResult(method, res.status.value, res.allocation, ev, res.gap, res.build_seconds,
                        res.solve_seconds, res.message)


def _fixed_and_residual(problem: AllocationProblem) -> tuple[dict[str, int], dict[tuple[str, str], float]]:
    running = problem.running or Allocation()
    fixed = {k: n for k, n in running.counts if problem.template(k).service.model not in problem.free_models}
    residual = {rc: problem.available(rc) for rc in problem.prices}
    for key, n in fixed.items():
        for c, k in problem.template(key).node_use:
            residual[(problem.template(key).region, c)] -= k * n
    return fixed, residual


def _free_services(problem: AllocationProblem) -> list[str]:
    order = {m: i for i, m in enumerate(problem.models)}
    services = [s for s, d in problem.demand.items() if d > 0 and model_of(s) in problem.free_models]
    return sorted(services, key=lambda s: (order[model_of(s)], s))


def _useful_per_dollar(problem: AllocationProblem, t: Template, *, left: float) -> tuple[float, float, str]:
    cost = problem.template_cost(t.key)
    return min(t.throughput, left) / max(cost, 1e-12), -cost, t.key  # ties: cheaper, then by key


def homo(problem: AllocationProblem) -> MethodResult:
    t0 = time.perf_counter()
    counts, residual = _fixed_and_residual(problem)
    services = _free_services(problem)
    options: dict[str, list[Template]] = {
        s: [t for t in problem.templates_of(s) if len(t.nodes) == 1] for s in services}
    capacity: dict[str, float] = defaultdict(float)

    def fits(t: Template) -> bool:
        return all(residual[(t.region, c)] >= k for c, k in t.node_use)

    progress = True
    while progress:
        progress = False
        for s in services:
            left = problem.demand[s] - capacity[s]
            if left <= 0:
                continue
            cands = [t for t in options[s] if fits(t)]
            if not cands:
                continue
            best = max(cands, key=partial(_useful_per_dollar, problem, left=left))
            counts[best.key] = counts.get(best.key, 0) + 1
            capacity[s] += best.throughput
            for c, k in best.node_use:
                residual[(best.region, c)] -= k
            progress = True
    allocation = Allocation.of(counts)
    ev = evaluate_plan(problem, allocation)
    short = [s for s in services if capacity[s] < problem.demand[s] * (1 - 1e-9)]
    status, msg = FEASIBLE, ""
    if short and problem.mode == "cost":
        status = SolveStatus.INFEASIBLE.value
        msg = "homogeneous replicas cannot meet the demand of " + ", ".join(short) + " within availability"
    return MethodResult("homo", status, allocation, ev, math.nan, 0.0, time.perf_counter() - t0, msg)


def single_type(problem: AllocationProblem) -> MethodResult:
    res = solve_allocation(problem.with_changes(one_gpu_type_per_model=True))
    return _from_solve("single-type", problem, res)


def independent(problem: AllocationProblem) -> MethodResult:
    counts, residual = _fixed_and_residual(problem)
    running = problem.running or Allocation()
    statuses: list[SolveStatus] = []
    messages: list[str] = []
    build = solve = 0.0
    for m in [m for m in problem.models if m in problem.free_models]:
        templates = tuple(t for t in problem.templates if t.service.model == m)
        keys = {t.key for t in templates}
        sub = AllocationProblem(
            templates, {s: d for s, d in problem.demand.items() if model_of(s) == m},
            {rc: max(v, 0.0) for rc, v in residual.items()}, problem.prices,
            running=Allocation(tuple((k, n) for k, n in running.counts if k in keys)),
            startup_weight=problem.startup_weight, mode=problem.mode, time_limit=problem.time_limit,
            gap=problem.gap)
        res = solve_allocation(sub)
        build += res.build_seconds
        solve += res.solve_seconds
        statuses.append(res.status)
        if res.allocation is None:
            messages.append(f"{m}: {res.status.value} — {res.message}")
            continue
        for key, n in res.allocation.counts:
            counts[key] = n
            t = problem.template(key)
            for c, k in t.node_use:
                residual[(t.region, c)] -= k * n
    worst = next((s for s in (SolveStatus.ERROR, SolveStatus.INFEASIBLE, SolveStatus.FEASIBLE_TIME_LIMIT,
                              SolveStatus.FEASIBLE)
                  if s in statuses), SolveStatus.OPTIMAL)
    allocation = Allocation.of(counts)
    return MethodResult("independent", worst.value, allocation, evaluate_plan(problem, allocation),
                        math.nan, build, solve, "; ".join(messages))


def ilp(problem: AllocationProblem) -> MethodResult:
    return _from_solve("ilp", problem, solve_allocation(problem))


METHODS: Registry[Callable[[AllocationProblem], MethodResult]] = Registry(
    "method", {"ilp": ilp, "homo": homo, "single-type": single_type, "independent": independent})


def run_method(problem: AllocationProblem, method: str) -> MethodResult:
    """Run a method by name; an unknown name lists the valid ones."""
    return METHODS[method](problem)
