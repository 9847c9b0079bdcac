"""A removal price (``removal_weight`` R): each running instance a re-plan removes costs R x its
$/h in the objective, so a re-plan keeps what runs unless dropping it pays. Exact against brute
force (the evaluator prices removals independently of the solver), hand-computed, and it removes
no more than the unpriced re-plan does."""

from __future__ import annotations

import random

import pytest
from alloc_instances import matches_brute_force, random_problem

from atoll.solvers.allocation import evaluate_plan, solve_allocation
from atoll.solvers.problem import Allocation, AllocationProblem, SolveStatus
from atoll.solvers.types import Phase, Service, Stage, Template


@pytest.mark.parametrize("weight", [0.5, 2.0])
@pytest.mark.parametrize("seed", range(10))
def test_removal_price_matches_brute_force(seed: int, weight: float) -> None:
    rng = random.Random(8100 + seed)
    base = random_problem(8100 + seed, n_models=2, max_templates=6, avail_max=3, with_running=True,
                          mode="cost" if seed % 3 else "goodput")
    running = Allocation.of({t.key: rng.randint(0, 2) for t in base.templates})
    if not evaluate_plan(base.with_changes(running=None, reoptimize=None, mode="goodput"), running).feasible:
        running = Allocation.of({})  # over availability: start from nothing
    problem = base.with_changes(running=running, removal_weight=weight)
    res = solve_allocation(problem, warm_start=running)
    best = matches_brute_force(problem, res)
    if best is None:
        return
    cold = solve_allocation(problem)
    assert cold.objective == pytest.approx(best[1], abs=1e-6)


def test_a_hand_computed_removal_price() -> None:
    """Demand 10 tokens/s; running: one $4/h instance of 20 tokens/s. A $1/h instance of 10
    tokens/s would do. Unpriced, the re-plan swaps ($1 + K x $1 added). With R = 0.5 the swap
    costs $1 + $0.5 x 4 = $3 < $4 and still happens; with R = 1 it costs $5 > $4: the running
    instance stays."""
    svc = Service("m", Phase.DECODE)
    big = Template(svc, "r", (("1xB", 1),), (Stage(1, ("1xB",)),), 20.0)
    small = Template(svc, "r", (("1xS", 1),), (Stage(1, ("1xS",)),), 10.0)
    prices = {("r", "1xB"): 4.0, ("r", "1xS"): 1.0}
    running = Allocation.of({big.key: 1})
    base = AllocationProblem((big, small), {svc.name: 10.0}, {rc: 2 for rc in prices}, prices,
                             running=running)
    assert dict(solve_allocation(base).allocation.counts) == {small.key: 1}
    assert dict(solve_allocation(base.with_changes(removal_weight=0.5)).allocation.counts) == {small.key: 1}
    kept = solve_allocation(base.with_changes(removal_weight=1.0))
    assert dict(kept.allocation.counts) == {big.key: 1} and kept.objective == pytest.approx(4.0)


def test_removal_price_of_a_service_without_demand_keeps_its_instance() -> None:
    svc = Service("m", Phase.DECODE)
    t = Template(svc, "r", (("1xS", 1),), (Stage(1, ("1xS",)),), 10.0)
    problem = AllocationProblem((t,), {svc.name: 0.0}, {("r", "1xS"): 2}, {("r", "1xS"): 1.0},
                                running=Allocation.of({t.key: 1}), removal_weight=2.0)
    res = solve_allocation(problem)
    assert res.status is SolveStatus.OPTIMAL and dict(res.allocation.counts) == {t.key: 1}
    assert res.objective == pytest.approx(1.0)  # keep it ($1/h) rather than pay 2 x $1 to drop it


def test_bad_removal_weight_is_named() -> None:
    with pytest.raises(ValueError, match="removal_weight"):
        random_problem(1).with_changes(removal_weight=-1.0)
