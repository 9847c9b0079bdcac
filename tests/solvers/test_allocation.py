import math

import highspy
import numpy as np
import pulp
import pytest
from alloc_instances import brute_force, matches_brute_force, random_problem, template

from atoll.solvers.allocation import Allocation, AllocationProblem, SolveStatus, solve_allocation
from atoll.solvers.allocation.evaluate import evaluate_plan
from atoll.solvers.allocation.highs import WarmHiGHS
from atoll.solvers.types import Phase, Stage, Template

R = "r1"


def _hand_problem(avail_b: int = 4, **kw) -> AllocationProblem:
    small = template("m", Phase.DECODE, R, {"1xA": 1}, 4.0)  # $1/h, 4 tok/s
    big = template("m", Phase.DECODE, R, {"1xB": 1}, 10.0)  # $2.5/h, 10 tok/s
    return AllocationProblem((small, big), {"m/decode": 10.0}, {(R, "1xA"): 8, (R, "1xB"): avail_b},
                             {(R, "1xA"): 1.0, (R, "1xB"): 2.5}, **kw)


def test_hand_computed_case():
    res = solve_allocation(_hand_problem())
    assert res.status is SolveStatus.OPTIMAL
    assert res.objective == pytest.approx(2.5)  # one big instance beats three small ($3)
    assert res.allocation.total_instances == 1
    res = solve_allocation(_hand_problem(avail_b=0))
    assert res.objective == pytest.approx(3.0)
    assert res.served["m/decode"] == pytest.approx(10.0)
    assert res.served_share == {"m": pytest.approx(1.0)}
    assert res.gap <= 1e-4


@pytest.mark.parametrize("seed", range(12))
def test_cost_mode_matches_brute_force(seed):
    problem = random_problem(seed, n_models=2, max_templates=5)
    res = solve_allocation(problem)
    best = brute_force(problem)
    if best is None:
        assert res.status is SolveStatus.INFEASIBLE
        assert "goodput" in res.message
    else:
        assert res.status is SolveStatus.OPTIMAL
        assert res.objective == pytest.approx(best[1], abs=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_goodput_mode_is_lexicographic_and_exact(seed):
    problem = random_problem(100 + seed, mode="goodput", max_templates=5, avail_max=3)
    res = solve_allocation(problem)
    best = brute_force(problem)
    assert best is not None  # the empty plan is always feasible in goodput mode
    assert res.status is SolveStatus.OPTIMAL
    assert res.goodput_fraction == pytest.approx(best[0], abs=1e-6)
    assert res.objective == pytest.approx(best[1], abs=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_running_plan_startup_and_reoptimize_subset_exact(seed):
    mode = "cost" if seed % 2 else "goodput"
    problem = random_problem(200 + seed, with_running=True, mode=mode, max_templates=5)
    res = solve_allocation(problem)
    if matches_brute_force(problem, res) is None:
        return
    ev = evaluate_plan(problem, res.allocation)
    assert ev.feasible, ev.violations  # models outside the subset kept their running counts


@pytest.mark.parametrize("seed", range(10))
def test_one_gpu_type_per_model_exact(seed):
    problem = random_problem(300 + seed, one_type=True, max_templates=5, demand_max=6)
    res = solve_allocation(problem)
    best = brute_force(problem)
    if best is None:
        assert res.status is SolveStatus.INFEASIBLE
    else:
        assert res.objective == pytest.approx(best[1], abs=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_extraction_matches_evaluator_and_cbc(seed):
    problem = random_problem(400 + seed, n_models=3, regions=("r1", "r2"), max_templates=10,
                             avail_max=6, demand_max=15)
    res = solve_allocation(problem)
    cbc = solve_allocation(problem, solver="cbc")
    assert res.status is cbc.status
    if res.status is SolveStatus.OPTIMAL:
        ev = evaluate_plan(problem, res.allocation)
        assert ev.feasible, ev.violations
        assert ev.objective == pytest.approx(res.objective)
        assert ev.cost_per_hour == pytest.approx(res.cost_per_hour)
        assert dict(ev.served) == pytest.approx(dict(res.served))
        assert cbc.objective == pytest.approx(res.objective, abs=1e-6)


def test_infeasible_names_the_service_and_suggests_goodput():
    problem = _hand_problem(avail_b=0).with_changes(demand={"m/decode": 100.0})
    res = solve_allocation(problem)
    assert res.status is SolveStatus.INFEASIBLE
    assert "m/decode" in res.message and "goodput" in res.message
    assert res.allocation is None and math.isnan(res.objective)
    served = solve_allocation(problem.with_changes(mode="goodput"))
    assert served.status is SolveStatus.OPTIMAL
    assert served.served["m/decode"] == pytest.approx(32.0)  # 8 small instances
    assert served.served_share["m"] == pytest.approx(0.32)
    quiet = solve_allocation(problem, diagnose=False)  # the same verdict, without naming why
    assert quiet.status is SolveStatus.INFEASIBLE and quiet.allocation is None
    assert "not diagnosed" in quiet.message and "m/decode" not in quiet.message


def test_service_without_templates_is_infeasible_by_name():
    problem = _hand_problem().with_changes(demand={"m/decode": 1.0, "m/prefill": 1.0})
    res = solve_allocation(problem)
    assert res.status is SolveStatus.INFEASIBLE and "m/prefill" in res.message


def test_fixed_models_over_availability_are_reported():
    p = _hand_problem()
    other = template("n", Phase.DECODE, R, {"1xB": 1}, 5.0)
    running = Allocation.of({other.key: 5})
    problem = AllocationProblem((*p.templates, other), {"m/decode": 10.0, "n/decode": 5.0},
                                p.availability, p.prices, running=running, reoptimize=frozenset({"m"}))
    res = solve_allocation(problem)
    assert res.status is SolveStatus.INFEASIBLE and "1xB" in res.message


def test_startup_penalty_only_on_added_instances():
    p = _hand_problem()
    small_key = p.templates[0].key
    running = Allocation.of({small_key: 3})  # three small ones already run ($3/h)
    res = solve_allocation(p.with_changes(running=running, startup_weight=1.0))
    assert res.allocation == running  # switching to big costs 2.5 + 1.0 x 2.5 = 5 > 3
    res = solve_allocation(p.with_changes(running=running, startup_weight=0.1))
    assert res.allocation.as_dict() == {p.templates[1].key: 1}  # 2.5 + 0.25 < 3
    assert res.startup_cost_per_hour == pytest.approx(2.5)


def test_warm_start_is_accepted_by_highs():
    # fractional LP relaxation; heuristics and branching off, so only the start gives an incumbent
    def run(start):
        prob = pulp.LpProblem("t", pulp.LpMinimize)
        xs = [prob.add_variable(f"x{i}", 0, 50, cat="Integer") for i in range(4)]
        thr, cost = [3.1, 4.7, 7.9, 13.7], [1.0, 1.45, 2.5, 4.3]
        prob += pulp.lpSum(c * x for c, x in zip(cost, xs, strict=True))
        prob += pulp.lpSum(t * x for t, x in zip(thr, xs, strict=True)) >= 900.5
        prob += xs[2] + xs[3] <= 40
        backend = WarmHiGHS(start=start, msg=False, mip_max_nodes=0, mip_heuristic_effort=0.0,
                            presolve="off")
        prob.solve(backend)
        return prob, backend

    prob, backend = run(None)
    assert prob.sol_status == pulp.LpSolutionNoSolutionFound
    start = {"x0": 50, "x1": 50, "x3": 40}  # 155 + 235 + 548 >= 900.5, objective 294.5
    prob, backend = run(start)
    assert backend.start_status == highspy.HighsStatus.kOk
    assert prob.sol_status == pulp.LpSolutionIntegerFeasible
    assert prob.solverModel.getInfo().objective_function_value == pytest.approx(294.5)


def test_warm_start_through_solve_allocation():
    for seed in range(20):  # the first feasible instance of a seeded family
        problem = random_problem(seed, n_models=3, regions=("r1", "r2"), max_templates=14,
                                 avail_max=6, demand_max=20)
        cold = solve_allocation(problem)
        if cold.status is SolveStatus.OPTIMAL and cold.allocation.total_instances >= 3:
            break
    assert cold.status is SolveStatus.OPTIMAL
    warm = solve_allocation(problem, warm_start=cold.allocation)
    assert warm.warm_start_accepted is True
    assert warm.objective == pytest.approx(cold.objective)
    assert solve_allocation(problem).allocation == cold.allocation  # deterministic


def test_bad_input_is_named():
    p = _hand_problem()
    with pytest.raises(ValueError, match="m/decode"):
        p.with_changes(demand={"m/decode": -1.0})
    with pytest.raises(ValueError, match="valid models: m"):
        p.with_changes(reoptimize=frozenset({"nope"}))
    with pytest.raises(ValueError, match="mode"):
        p.with_changes(mode="fast")
    with pytest.raises(ValueError, match="unknown template keys"):
        p.with_changes(running=Allocation.of({"x": 1}))
    with pytest.raises(ValueError, match="prices"):
        p.with_changes(prices={})
    with pytest.raises(ValueError, match="valid solvers: highs, cbc"):
        solve_allocation(p, solver="gurobi")
    with pytest.raises(ValueError, match="integer"):
        Allocation((("k", 1.5),))  # type: ignore[arg-type]


def test_template_index_is_shared_and_costs_match_prices():
    p = random_problem(3, n_models=3, regions=("r1", "r2"), max_templates=10)
    q = p.with_changes(demand={s: 2 * d for s, d in p.demand.items()})
    assert q.index is p.index  # same template tuple: indexed once
    for seed in range(10):  # other libraries push p's index out of the cache ...
        random_problem(100 + seed)
    assert p.with_changes(startup_weight=1.0).index is p.index  # ... with_changes still reuses it
    for t in p.templates:
        assert p.template_cost(t.key) == pytest.approx(sum(k * p.prices[(t.region, c)] for c, k in t.nodes))
    cheaper = p.with_changes(prices={rc: v / 2 for rc, v in p.prices.items()})
    assert cheaper.index is p.index
    assert cheaper.costs == pytest.approx(p.costs / 2)


def test_trusted_templates_equal_validated_ones():
    t = template("m", Phase.DECODE, "r1", {"1xA": 2, "1xB": 1}, 5.0)
    stages = tuple(Stage.trusted(s.layers, s.nodes) for s in t.stages)
    u = Template.trusted(t.service, t.region, t.nodes, stages, t.throughput)
    assert u == t and u.key == t.key and hash(u) == hash(t)


def test_rescaled_index_equals_a_rebuilt_one_and_its_solve_too():
    """The capacity correction's index (shared rows, new throughputs) is the index a full
    rebuild of the scaled templates gives, and the ILP solves both to the same plan."""
    from atoll.solvers.problem import TemplateIndex

    p = random_problem(6, n_models=3, regions=("r1", "r2"), max_templates=10)
    rng = np.random.default_rng(6)
    scale = np.where(rng.random(len(p.templates)) < 0.5, 1.0, rng.uniform(0.6, 1.4, len(p.templates)))
    derived = p.index.rescaled(scale)
    scaled = tuple(Template.trusted(t.service, t.region, t.nodes, t.stages, t.throughput * f)
                   for t, f in zip(p.templates, scale, strict=True))
    rebuilt = TemplateIndex(scaled)
    assert derived.templates == scaled and derived.keys == rebuilt.keys
    assert np.array_equal(derived.throughput, rebuilt.throughput)
    assert dict(derived.by_key) == dict(rebuilt.by_key)
    assert dict(derived.by_service) == dict(rebuilt.by_service)
    for name in ("service", "kind", "ptr", "rc", "k", "sliced"):
        assert np.array_equal(getattr(derived, name), getattr(rebuilt, name)), name
    # unchanged templates are the base's objects; a problem over the new tuple reuses the index
    assert all(a is b for a, b, f in zip(derived.templates, p.templates, scale, strict=True) if f == 1.0)
    q = p.with_changes(templates=derived.templates)
    assert q.index is derived
    for k in rebuilt.keys:
        assert q.template(k) is derived.by_key[k] and q.template(k) == rebuilt.by_key[k]
    assert "no-such-key" not in derived.by_key and len(derived.by_key) == len(rebuilt.keys)
    with pytest.raises(KeyError, match="unknown template key"):
        q.template("no-such-key")
    r = p.with_changes(templates=scaled)
    a, b = solve_allocation(q), solve_allocation(r)
    assert a.status == b.status == SolveStatus.OPTIMAL and a.allocation == b.allocation
    assert a.objective == pytest.approx(b.objective)
    with pytest.raises(ValueError, match="scale"):
        p.index.rescaled(scale[:-1])
    with pytest.raises(ValueError, match="scale"):
        p.index.rescaled(np.zeros_like(scale))
