"""The ``grow`` re-optimization: a model's running instances are a floor (x_t >= r_t), exact
against brute force, never removing an instance, through both the joint and the block path."""

import random

import pytest
from alloc_instances import matches_brute_force, random_problem, template

from atoll.solvers.allocation import Allocation, AllocationProblem, SolveStatus, solve_allocation
from atoll.solvers.allocation.evaluate import evaluate_plan
from atoll.solvers.types import Phase

R = "r1"


def _grow_problem(seed: int, mode: str) -> AllocationProblem:
    base = random_problem(500 + seed, with_running=True, mode=mode, max_templates=5, n_models=2)
    rng = random.Random(seed)
    free = sorted(base.free_models)
    grow = frozenset(rng.sample(free, rng.randint(1, len(free))))
    # running counts up to 2 so that floors bind
    running = Allocation.of({k: rng.randint(0, 2) for k, _ in (base.running or Allocation()).counts} |
                            {t.key: rng.randint(0, 1) for t in base.templates})
    return base.with_changes(running=running, grow=grow)


@pytest.mark.parametrize("decompose", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_grow_matches_brute_force(seed, decompose):
    mode = "cost" if seed % 3 else "goodput"
    problem = _grow_problem(seed, mode)
    res = solve_allocation(problem, warm_start=problem.running, decompose=decompose)
    # brute force: evaluate_plan refuses plans below a grow model's floor
    if matches_brute_force(problem, res) is None:
        return
    ev = evaluate_plan(problem, res.allocation)
    assert ev.feasible, ev.violations


@pytest.mark.parametrize("seed", range(40))
def test_grow_never_removes_an_instance(seed):
    """Property over random states: every template of a grow model keeps at least its running
    count, whatever the demand (here often far below what is running)."""
    rng = random.Random(seed)
    problem = _grow_problem(seed, rng.choice(["cost", "goodput"]))
    scaled = {s: d * rng.choice([0.0, 0.3, 1.0]) for s, d in problem.demand.items()}
    problem = problem.with_changes(demand=scaled)
    res = solve_allocation(problem, warm_start=problem.running)
    if res.allocation is None:
        return
    running = problem.running.as_dict()
    for key, n in running.items():
        if problem.template(key).service.model in problem.grow:
            assert res.allocation[key] >= n, (key, n, res.allocation[key])


def test_hand_computed_grow():
    """Running: one small instance (4 tok/s, $1/h). Demand 10 tok/s, K = 0. full picks one big
    instance (10 tok/s, $2.5/h); grow keeps the small one and adds what is cheapest for the
    remaining 6: two small ones ($2) beat a big one ($2.5): 3 small, $3/h."""
    small = template("m", Phase.DECODE, R, {"1xA": 1}, 4.0)
    big = template("m", Phase.DECODE, R, {"1xB": 1}, 10.0)
    problem = AllocationProblem((small, big), {"m/decode": 10.0}, {(R, "1xA"): 8, (R, "1xB"): 4},
                                {(R, "1xA"): 1.0, (R, "1xB"): 2.5}, running=Allocation.of({small.key: 1}),
                                gap=0.0)
    full = solve_allocation(problem)
    assert full.allocation.as_dict() == {big.key: 1} and full.objective == pytest.approx(2.5)
    grow = solve_allocation(problem.with_changes(grow=frozenset({"m"})))
    assert grow.allocation.as_dict() == {small.key: 3}
    assert grow.objective == pytest.approx(3.0)
    # demand already covered by the kept instance: nothing added, nothing removed
    low = solve_allocation(problem.with_changes(grow=frozenset({"m"}), demand={"m/decode": 2.0}))
    assert low.status is SolveStatus.OPTIMAL and low.allocation.as_dict() == {small.key: 1}


def test_grow_outside_the_reoptimized_models_is_named():
    small = template("m", Phase.DECODE, R, {"1xA": 1}, 4.0)
    other = template("n", Phase.DECODE, R, {"1xA": 1}, 4.0)
    with pytest.raises(ValueError, match="field 'grow'.*'n'"):
        AllocationProblem((small, other), {"m/decode": 1.0}, None, {(R, "1xA"): 1.0},
                          reoptimize=frozenset({"m"}), grow=frozenset({"n"}))
