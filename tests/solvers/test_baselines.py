import pytest
from alloc_instances import random_problem, template

from atoll.solvers.baselines import METHODS, run_method
from atoll.solvers.problem import AllocationProblem, gpu_type_of
from atoll.solvers.registry import UnknownNameError
from atoll.solvers.types import Phase

R = "r1"


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("mode", ["cost", "goodput"])
def test_ilp_never_worse_than_any_baseline(seed, mode):
    problem = random_problem(500 + seed, n_models=3, regions=("r1", "r2"), max_templates=12,
                             avail_max=6, demand_max=15, mode=mode, with_running=seed % 3 == 0)
    best = run_method(problem, "ilp")
    for name in ("homo", "single-type", "independent"):
        other = run_method(problem, name)
        if not other.ok:
            continue
        assert best.ok, (name, best.message)
        if mode == "cost":
            assert best.evaluation.objective <= other.evaluation.objective + 1e-6, name
        else:
            assert best.goodput_fraction >= other.goodput_fraction - 1e-6, name
            if best.goodput_fraction <= other.goodput_fraction + 1e-6:
                assert best.evaluation.objective <= other.evaluation.objective + 1e-6, name


def _mixing_problem(**kw) -> AllocationProblem:
    # the mixed replica (1xA + 1xB) is the cheapest way to 10 tok/s; homogeneous ones waste
    mixed = template("m", Phase.DECODE, R, {"1xA": 1, "1xB": 1}, 10.0)
    homo_a = template("m", Phase.DECODE, R, {"1xA": 2}, 6.0)
    homo_b = template("m", Phase.DECODE, R, {"1xB": 1}, 5.0)
    return AllocationProblem((mixed, homo_a, homo_b), {"m/decode": 10.0},
                             {(R, "1xA"): 10, (R, "1xB"): 10}, {(R, "1xA"): 1.0, (R, "1xB"): 2.0}, **kw)


def test_homo_uses_only_homogeneous_replicas_and_mixing_wins():
    problem = _mixing_problem()
    h = run_method(problem, "homo")
    assert h.ok and h.status == "feasible"
    assert all(len(problem.template(k).nodes) == 1 for k, _ in h.allocation.counts)
    # best useful tok/s per $: 2xA gives 6/2 = 3, then 1xB gives min(5, 4)/2 = 2 vs 2xA 4/2 = 2 (cheaper wins)
    assert h.cost_per_hour == pytest.approx(4.0)
    assert run_method(problem, "ilp").cost_per_hour == pytest.approx(3.0)


def test_single_type_keeps_one_gpu_type_per_model():
    problem = _mixing_problem()
    res = run_method(problem, "single-type")
    assert res.ok
    types = {gpu_type_of(c) for k, _ in res.allocation.counts for c, _ in problem.template(k).nodes}
    assert len(types) == 1
    assert res.cost_per_hour == pytest.approx(4.0)  # 2 x 1xB ($4) or 2 x 2xA ($4)


def test_independent_order_costs_more_than_joint():
    # m0 (solved first) grabs the cheap A nodes it could do without; m1 then must use dear B
    a0 = template("m0", Phase.DECODE, R, {"1xA": 1}, 10.0)
    b0 = template("m0", Phase.DECODE, R, {"1xB": 1}, 10.0)
    a1 = template("m1", Phase.DECODE, R, {"1xA": 1}, 10.0)
    c1 = template("m1", Phase.DECODE, R, {"1xC": 1}, 10.0)
    problem = AllocationProblem((a0, b0, a1, c1), {"m0/decode": 10.0, "m1/decode": 10.0},
                                {(R, "1xA"): 1, (R, "1xB"): 1, (R, "1xC"): 1},
                                {(R, "1xA"): 1.0, (R, "1xB"): 2.0, (R, "1xC"): 5.0})
    ind = run_method(problem, "independent")
    joint = run_method(problem, "ilp")
    assert ind.ok and joint.ok
    assert ind.cost_per_hour == pytest.approx(6.0) and joint.cost_per_hour == pytest.approx(3.0)


def test_homo_reports_infeasible_with_partial_plan():
    problem = _mixing_problem().with_changes(availability={(R, "1xA"): 1, (R, "1xB"): 1})
    h = run_method(problem, "homo")
    assert h.status == "infeasible" and "m/decode" in h.message
    assert h.evaluation.served["m/decode"] == pytest.approx(5.0)


def test_unknown_method_lists_valid_ones():
    with pytest.raises(UnknownNameError, match="homo, ilp, independent, single-type"):
        run_method(_mixing_problem(), "greedy")
    assert set(METHODS) == {"ilp", "homo", "single-type", "independent"}
