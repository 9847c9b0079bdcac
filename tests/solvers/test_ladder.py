"""The ladder of baselines: monotone on random instances, homo-node exact against brute force,
the greedy Homo inside homo-node's feasible set, and the one-config rule checked."""

from __future__ import annotations

import pytest
from alloc_instances import brute_force, random_problem, template

from atoll.solvers.allocation import Allocation, AllocationProblem, evaluate_plan, solve_allocation
from atoll.solvers.errors import InputError
from atoll.solvers.ladder import GREEDY, PER_REPLICA, RUNGS, restricted, solve_ladder
from atoll.solvers.types import Phase

TOL = 1e-6


def _instance(seed: int, mode: str = "cost") -> AllocationProblem:
    return random_problem(700 + seed, n_models=3, regions=("r1", "r2"), max_templates=14,
                          avail_max=6, demand_max=15, mode=mode, with_running=seed % 4 == 0)


@pytest.mark.parametrize("seed", range(24))
@pytest.mark.parametrize("mode", ["cost", "goodput"])
def test_each_rung_never_cheaper_than_the_rung_above(seed, mode):
    ladder = solve_ladder(_instance(seed, mode))
    assert [r.name for r in ladder.rungs] == list(RUNGS)
    for upper, lower in zip(ladder.rungs, ladder.rungs[1:], strict=False):
        if upper.allocation is None:
            continue  # nothing above: the lower rung may have a plan or not
        assert lower.allocation is not None, (upper.name, lower.name, lower.message)
        if mode == "cost":
            assert upper.ok and lower.ok
            assert lower.cost_per_hour <= upper.cost_per_hour + TOL, (upper.name, lower.name)
        else:
            assert lower.goodput_fraction >= upper.goodput_fraction - TOL, (upper.name, lower.name)
            if lower.goodput_fraction <= upper.goodput_fraction + TOL:
                assert lower.cost_per_hour <= upper.cost_per_hour + TOL, (upper.name, lower.name)


@pytest.mark.parametrize("seed", range(12))
def test_joint_rung_is_the_full_ilp(seed):
    problem = _instance(seed)
    ladder = solve_ladder(problem)
    full = solve_allocation(problem.with_changes(running=None, startup_weight=0.0, reoptimize=None))
    joint = ladder.rung("joint")
    assert (joint.allocation is None) == (full.allocation is None)
    if full.allocation is not None:
        assert joint.cost_per_hour == pytest.approx(full.cost_per_hour, rel=1e-4)


def _tiny(seed: int, mode: str) -> AllocationProblem:
    """Two models, single-node templates plenty: brute force over homo-node's set is small."""
    return random_problem(900 + seed, n_models=2, regions=("r1",), max_templates=7, avail_max=3,
                          demand_max=10, mode=mode)


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("mode", ["cost", "goodput"])
def test_homo_node_matches_brute_force(seed, mode):
    problem = _tiny(seed, mode)
    homo = restricted(problem, "homo-node")
    assert all(len(t.nodes) == 1 and t.nodes[0][1] == 1 for t in homo.templates)
    best = brute_force(homo.with_changes(gap=0.0))
    rung = solve_ladder(problem.with_changes(gap=0.0)).rung("homo-node")
    if best is None:  # no plan: only cost mode can be without one
        assert rung.allocation is None
        return
    if mode == "cost" and best[0] < 1 - TOL:
        assert rung.allocation is None
        return
    assert rung.status == "optimal", rung.message
    assert rung.goodput_fraction == pytest.approx(best[0], abs=1e-6)
    assert rung.cost_per_hour == pytest.approx(best[1], abs=1e-6)


@pytest.mark.parametrize("seed", range(12))
def test_greedy_homo_is_a_homo_node_plan_never_cheaper_than_its_ilp(seed):
    problem = _instance(seed)
    ladder = solve_ladder(problem)
    greedy, exact = ladder.rung(GREEDY), ladder.rung("homo-node")
    if greedy.allocation is None:
        return
    homo = restricted(problem, "homo-node")
    ev = evaluate_plan(homo, greedy.allocation)
    assert ev.feasible, ev.violations  # single nodes, one config per model, within availability
    assert exact.ok
    assert exact.cost_per_hour <= greedy.cost_per_hour + TOL


def test_per_replica_reading_can_undercut_single_type():
    # model m: decode best on one 1xA node, prefill best on one 1xB node. One config per model
    # forces both on one config; per replica each service takes its own.
    r = "r1"
    ts = (template("m", Phase.DECODE, r, {"1xA": 1}, 10.0), template("m", Phase.DECODE, r, {"1xB": 1}, 2.0),
          template("m", Phase.PREFILL, r, {"1xA": 1}, 2.0), template("m", Phase.PREFILL, r, {"1xB": 1}, 10.0))
    problem = AllocationProblem(ts, {"m/decode": 10.0, "m/prefill": 10.0}, {(r, "1xA"): 9, (r, "1xB"): 9},
                                {(r, "1xA"): 1.0, (r, "1xB"): 1.0}, gap=0.0)
    ladder = solve_ladder(problem)
    assert ladder.rung("homo-node").cost_per_hour == pytest.approx(6.0)  # 1 + 5 nodes of one config
    assert ladder.rung("single-type").cost_per_hour == pytest.approx(6.0)  # A and B are two GPU types
    assert ladder.rung(PER_REPLICA).cost_per_hour == pytest.approx(2.0)
    assert ladder.steps()[0]["ratio"] == pytest.approx(1.0)
    assert ladder.total_ratio("homo-node") == pytest.approx(3.0)


def test_one_config_rule_is_checked_by_the_evaluator():
    r = "r1"
    a = template("m", Phase.DECODE, r, {"1xA": 1}, 5.0)
    b = template("m", Phase.DECODE, r, {"2xA": 1}, 5.0)
    problem = AllocationProblem((a, b), {"m/decode": 10.0}, {(r, "1xA"): 9, (r, "2xA"): 9},
                                {(r, "1xA"): 1.0, (r, "2xA"): 1.5}, one_config_per_model=True)
    ev = evaluate_plan(problem, Allocation.of({a.key: 1, b.key: 1}))
    assert not ev.feasible and any("node configs" in v for v in ev.violations)
    res = solve_allocation(problem)
    assert res.cost_per_hour == pytest.approx(2.0)  # two 1xA, not 1xA + 2xA
    assert evaluate_plan(problem, res.allocation).feasible


def test_unknown_rung_names_the_valid_ones():
    ladder = solve_ladder(_instance(1))
    with pytest.raises(InputError, match="homo-node-greedy"):
        ladder.rung("homo")
    with pytest.raises(InputError, match="valid rungs"):
        restricted(_instance(1), "nope")
