"""A warm-started solve is a cold solve: from any feasible start (the running plan, a previous
rung's plan, a random feasible plan, the optimum itself) the allocation ILP reaches the same
optimum as a cold solve and as brute force, and ``optimal`` always means a proven gap within the
tolerance. The one-row case at the top is a block HiGHS's presolve once let stop at its start."""

from __future__ import annotations

import json
import math
import random

import pulp
import pytest
from alloc_instances import brute_force, matches_brute_force, random_problem, with_spot_tier
from test_slices import _brute_cost, _synthetic

from atoll.solvers.allocation import evaluate_plan, solve_allocation
from atoll.solvers.allocation.highs import SolverRun, status_of
from atoll.solvers.problem import (
    Allocation,
    AllocationProblem,
    AllocationResult,
    SolveStatus,
    within_tolerance,
)
from atoll.solvers.types import Phase, Service, Stage, Template

# One prefill block of Qwen3-32B on aws:us-east-2 (L4/A10G/L40S/H100, vllm runtime, Azure
# conversation sizes at 5 req/s): per template $/h, tokens/s and the most instances that fit.
PREFILL_BLOCK = [
    (6.88, 9534.638567164, 1), (13.76, 18486.48735912, 1), (7.6848, 10153.96432813, 1),
    (8.741, 11495.05395638, 1), (3.722, 4165.678099477, 2), (20.64, 26522.81541144, 1),
    (14.5648, 19044.68791102, 1), (15.621, 20321.08055771, 1), (8.4896, 10476.00763478, 1),
    (10.602, 12960.99538899, 1), (3.4706, 3438.385750932, 2), (4.5268, 4827.542165489, 2),
    (5.583, 6144.144574259, 1), (27.52, 33882.45854677, 1), (22.501, 27714.03826221, 1),
    (12.463, 14837.3377447, 1), (6.3878, 6758.559031684, 1), (34.4, 40657.28822213, 1),
    (29.381, 35857.29335189, 1), (41.28, 46899.96628239, 1), (36.261, 43550.85771964, 1),
]
PREFILL_DEMAND = 5773.487039141


def _cheapest_cover(items: list[tuple[float, float, int]], demand: float) -> float:
    """Least cost of integer counts (each at most its bound) whose throughput covers ``demand``:
    exhaustive depth-first search, pruned only by cost (costs are positive)."""
    best = math.inf

    def go(i: int, cost: float, left: float) -> None:
        nonlocal best
        if cost >= best:
            return
        if left <= 1e-9:
            best = cost
            return
        if i == len(items):
            return
        price, thr, ub = items[i]
        for n in range(ub + 1):
            go(i + 1, cost + n * price, left - n * thr)

    go(0, 0.0, demand)
    return best


def _one_row_block(items: list[tuple[float, float, int]], demand: float) -> AllocationProblem:
    """One prefill service in one region with a template per item (its $/h, tokens/s and the
    most instances available), on a GPU type of its own, and ``demand`` tokens/s to cover."""
    svc = Service("m", Phase.PREFILL)
    templates, prices, avail = [], {}, {}
    for i, (price, thr, ub) in enumerate(items):
        config = f"1xG{i}"
        templates.append(Template(svc, "r", ((config, 1),), (Stage(1, (config,)),), thr))
        prices[("r", config)] = price
        avail[("r", config)] = ub
    return AllocationProblem(tuple(templates), {svc.name: demand}, avail, prices)


def _block_problem() -> AllocationProblem:
    return _one_row_block(PREFILL_BLOCK, PREFILL_DEMAND)


def test_one_row_block_warm_from_any_column_reaches_the_optimum() -> None:
    problem = _block_problem()
    best = _cheapest_cover(PREFILL_BLOCK, PREFILL_DEMAND)
    assert best == pytest.approx(5.583)
    cold = solve_allocation(problem)
    assert cold.status is SolveStatus.OPTIMAL and cold.objective == pytest.approx(best)
    for t in problem.templates:
        if t.throughput < PREFILL_DEMAND:
            continue  # not a feasible start on its own
        warm = solve_allocation(problem, warm_start=Allocation.of({t.key: 1}))
        assert warm.status is SolveStatus.OPTIMAL, (t.key, warm.message)
        assert warm.objective == pytest.approx(best, rel=1e-9), t.key
        assert warm.gap <= problem.gap


def _random_block(seed: int) -> tuple[list[tuple[float, float, int]], float, AllocationProblem]:
    """A one-service block shaped like a real prefill block: 8-22 templates of 3k-47k tokens/s
    at $0.6-1.2 per 1k tokens/s and an hour, one or two instances each."""
    rng = random.Random(seed)
    items = []
    for _ in range(rng.randint(8, 22)):
        thr = rng.uniform(3000, 47000)
        items.append((round(thr * rng.uniform(0.0006, 0.0012), 4), thr, rng.choice([1, 1, 2])))
    demand = rng.uniform(3000, 25000)
    return items, demand, _one_row_block(items, demand)


@pytest.mark.parametrize("seed", range(12))
def test_random_one_row_blocks_warm_from_every_feasible_column(seed: int) -> None:
    items, demand, problem = _random_block(seed)
    best = _cheapest_cover(items, demand)
    if math.isinf(best):
        assert solve_allocation(problem).status is SolveStatus.INFEASIBLE
        return
    for t in problem.templates:
        if t.throughput < demand:
            continue
        warm = solve_allocation(problem, warm_start=Allocation.of({t.key: 1}))
        assert warm.status is SolveStatus.OPTIMAL, (t.key, warm.message)
        assert warm.objective == pytest.approx(best, rel=1e-9), t.key


def test_solver_run_reports_the_objective_its_columns_cost() -> None:
    """At the solver layer: the point a run returns costs what the run says, and a run labelled
    optimal is proven by its own point against the dual bound."""
    prob = pulp.LpProblem("block", pulp.LpMinimize)
    x = [prob.add_variable(f"x{i:02d}", 0, ub, cat=pulp.LpInteger)
         for i, (_, _, ub) in enumerate(PREFILL_BLOCK)]
    prob += pulp.LpAffineExpression([(v, p) for v, (p, _, _) in zip(x, PREFILL_BLOCK, strict=True)])
    prob += pulp.LpAffineExpression([(v, t) for v, (_, t, _) in zip(x, PREFILL_BLOCK, strict=True)]) \
        >= PREFILL_DEMAND, "demand"
    start = {v.name: float(i == 0) for i, v in enumerate(x)}
    run = SolverRun(prob, "highs", None, 1e-4, start)
    assert status_of(run) is SolveStatus.OPTIMAL
    assert run.column_objective == pytest.approx(5.583)
    assert run.reported_objective == pytest.approx(run.column_objective)
    assert run.guard_resolves == len(run.guard_reasons) <= 2


def _random_feasible(problem: AllocationProblem, rng: random.Random) -> Allocation | None:
    """A random plan that is feasible for ``problem`` (None when 200 draws find none)."""
    keys = [t.key for t in problem.templates]
    held = dict(problem.running.counts) if problem.running is not None else {}
    for _ in range(200):
        counts = {}
        for k in keys:
            model = problem.template(k).service.model
            if model not in problem.free_models:
                counts[k] = held.get(k, 0)
            else:  # a grow model's running instances are a floor
                floor = held.get(k, 0) if model in problem.grow else 0
                counts[k] = max(floor, rng.randint(0, 3))
        plan = Allocation.of(counts)
        if evaluate_plan(problem, plan).feasible:
            return plan
    return None


def _starts(problem: AllocationProblem, cold: AllocationResult, rng: random.Random) -> list[Allocation]:
    starts = [s for s in (cold.allocation, problem.running, _random_feasible(problem, rng)) if s is not None]
    rung = solve_allocation(problem.with_changes(one_gpu_type_per_model=True))
    if rung.allocation is not None:  # a previous rung's plan, as the ladder starts from
        starts.append(rung.allocation)
    return starts


@pytest.mark.parametrize("decompose", [True, False])
@pytest.mark.parametrize("seed", range(16))
def test_warm_equals_cold_equals_brute_force(seed: int, decompose: bool) -> None:
    rng = random.Random(7000 + seed)
    problem = random_problem(7000 + seed, n_models=rng.choice([1, 2]), max_templates=10,
                             avail_max=3, with_running=seed % 2 == 1,
                             mode="cost" if seed % 4 else "goodput")
    if seed % 4 == 3 and problem.free_models:  # a grow re-optimization: running counts are floors
        problem = problem.with_changes(grow=frozenset(sorted(problem.free_models)[:1]))
    cold = solve_allocation(problem, decompose=decompose)
    best = matches_brute_force(problem, cold)
    if best is None:
        return
    for start in _starts(problem, cold, rng):
        warm = solve_allocation(problem, warm_start=start, decompose=decompose)
        assert warm.status is SolveStatus.OPTIMAL, (start, warm.message)
        assert warm.goodput_fraction == pytest.approx(best[0], abs=1e-6)
        assert warm.objective == pytest.approx(best[1], abs=1e-6), start
        if not math.isnan(warm.gap):
            assert within_tolerance(warm.gap * abs(warm.objective), warm.objective, problem.gap)


def test_sliced_warm_start_reaches_the_brute_force_node_cost() -> None:
    rng = random.Random(35)
    checked = 0
    for _ in range(12):
        templates, demand, prices, avail = _synthetic(rng)
        problem = AllocationProblem(templates, demand, avail, prices)
        best = _brute_cost(problem, 5)
        if math.isinf(best):
            continue
        start = _random_feasible(problem, rng)
        if start is None:
            continue
        warm = solve_allocation(problem, warm_start=start)
        assert warm.status is SolveStatus.OPTIMAL, warm.message
        assert warm.cost_per_hour == pytest.approx(best, rel=1e-6)
        checked += 1
    assert checked >= 4


def test_tiered_warm_start_reaches_the_cold_optimum() -> None:
    """Hedged markets: each template also in the region's spot tier, at its own price and pool."""
    for seed in range(8):
        rng = random.Random(350 + seed)
        base = random_problem(350 + seed, n_models=2, max_templates=5, avail_max=2)
        problem = with_spot_tier(base, rng)
        spot = problem.templates[len(base.templates):]
        cold = solve_allocation(problem)
        if cold.allocation is None:
            continue
        best = brute_force(problem) if len(problem.templates) <= 8 else None
        if best is not None:
            assert cold.objective == pytest.approx(best[1], abs=1e-6)
        start = _random_feasible(problem, rng)
        for s in (start, Allocation.of({t.key: 1 for t in spot if evaluate_plan(
                problem, Allocation.of({t.key: 1})).feasible})):
            if s is None or not evaluate_plan(problem, s).feasible:
                continue
            warm = solve_allocation(problem, warm_start=s)
            assert warm.status is SolveStatus.OPTIMAL, warm.message
            assert warm.objective == pytest.approx(cold.objective, abs=1e-6)


def test_an_unproven_optimal_label_is_downgraded() -> None:
    """Whatever path produced it, a result whose plan sits above the dual bound by more than the
    tolerance is not reported as optimal."""
    problem = _block_problem()
    plan = Allocation.of({problem.templates[0].key: 1})  # $6.88 against the $5.583 optimum
    res = AllocationResult.from_allocation(problem, SolveStatus.OPTIMAL, plan, bound=5.583)
    assert res.status is SolveStatus.FEASIBLE
    assert "gap" in res.message
    ok = AllocationResult.from_allocation(problem, SolveStatus.OPTIMAL, plan, bound=6.88)
    assert ok.status is SolveStatus.OPTIMAL


@pytest.mark.parametrize(("region", "rate"), [("aws:us-east-2", 5), ("gcp:us-central1", 16)])
def test_every_rung_of_the_ladder_that_says_optimal_is(tmp_path, capsys, region: str, rate: int) -> None:
    """The ladder solves each rung warm from the rung above: its optimal rungs are proven, and
    its joint rung costs what a cold solve of the same problem costs."""
    from atoll.control.cli import main

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "name: one-model\nruntime: vllm\nmodels: [Qwen3-32B]\nregions:\n"
        f'  - {{name: "{region}", catalog: true, gpu_types: [L4, A10G, L40S, H100]}}\n'
        f'workloads:\n  Qwen3-32B: {{source: "azure:conv", mean_rate: {rate}}}\n')
    assert main(["solve", "--fleet", str(fleet), "--json"]) == 0
    cold = json.loads(capsys.readouterr().out)
    assert cold["status"] == "optimal"
    main(["solve", "--fleet", str(fleet), "--decompose", "--json"])
    ladder = json.loads(capsys.readouterr().out)
    rungs = {r["rung"]: r for r in ladder["rungs"]}
    for r in ladder["rungs"]:
        if r["status"] == "optimal" and r["gap"] is not None:
            assert r["gap"] <= 1e-4 + 1e-9, r
    assert rungs["joint"]["cost_per_hour"] == pytest.approx(cold["cost_per_hour"], rel=1e-6)
    assert rungs["independent"]["cost_per_hour"] == pytest.approx(cold["cost_per_hour"], rel=1e-6)


def test_a_maximizing_stage_is_checked_in_its_own_sense() -> None:
    """Goodput mode's first stage maximizes the served share: HiGHS sees it negated, and its
    objective and dual bound are read back in the stage's own sense, so a proven run needs no
    repeat and its bound is an upper bound."""
    from atoll.solvers.allocation.model import build_model
    from atoll.solvers.allocation.reduction import RoundInstance

    for seed in range(100, 106):
        problem = random_problem(seed, mode="goodput", max_templates=5, avail_max=3)
        inst = RoundInstance(problem, None)
        if not inst.free:
            continue
        cold = solve_allocation(problem)
        model = build_model(inst, "share")
        from atoll.solvers.allocation.model import start_values

        run = SolverRun(model.prob, "highs", None, 1e-4, start_values(inst, model, cold.allocation))
        assert run.guard_resolves == 0, run.guard_reasons
        assert run.reported_objective == pytest.approx(run.column_objective)
        assert run.bound is not None and run.bound >= run.column_objective - 1e-9
        assert status_of(run) is SolveStatus.OPTIMAL
