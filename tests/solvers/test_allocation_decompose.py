"""Per-block solves of the cost-mode allocation ILP (``atoll.solvers.allocation.blocks``): exact
against brute force and against the joint ILP (``decompose=False``), joint when a built
availability row couples services, and the round's status, bound, start status and extraction
put back together."""

from __future__ import annotations

import math
import random

import highspy
import pytest
from alloc_instances import CONFIGS, brute_force, template

from atoll.solvers.allocation import Allocation, AllocationProblem, SolveStatus, solve_allocation
from atoll.solvers.allocation import solve as solve_module
from atoll.solvers.allocation.blocks import combined_start_status
from atoll.solvers.allocation.evaluate import evaluate_plan
from atoll.solvers.types import Phase, Service

M0D, M0P, M1D = Service("m0", Phase.DECODE), Service("m0", Phase.PREFILL), Service("m1", Phase.DECODE)


@pytest.fixture
def blocks_seen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of blocks of each round that reached ``split_blocks`` (joint rounds: 1)."""
    seen: list[int] = []
    original = solve_module.split_blocks

    def spy(inst):
        out = original(inst)
        seen.append(len(out))
        return out

    monkeypatch.setattr(solve_module, "split_blocks", spy)
    return seen


def _solve(problem: AllocationProblem, decompose: bool, **kw):
    return solve_allocation(problem, decompose=decompose, **kw)


def _random(seed: int, *, shared: bool, services: tuple[Service, ...] | None = None,
            per_service: int = 2, avail_max: int = 3, running: bool = False) -> AllocationProblem:
    """2-3 services with ``per_service`` templates each; every service in a region of its own
    unless ``shared`` (then all in one region, competing for the same node configs). Some
    availabilities are 0 (rows without room: they only remove templates)."""
    rng = random.Random(seed)
    if services is None:
        services = tuple(rng.sample([M0D, M0P, M1D, Service("m1", Phase.PREFILL)], rng.randint(2, 3)))
    regions = {s: "r0" if shared else f"r{i}" for i, s in enumerate(services)}
    templates = {}
    for s in services:
        while sum(t.service == s for t in templates.values()) < per_service:
            mix: dict[str, int] = {}
            for _ in range(rng.randint(1, 2)):
                c = rng.choice(CONFIGS)
                mix[c] = mix.get(c, 0) + 1
            t = template(s.model, s.phase, regions[s], mix, float(rng.randint(2, 12)))
            templates.setdefault(t.key, t)
    cells = {(r, c) for r in regions.values() for c in CONFIGS}
    prices = {rc: float(rng.randint(1, 6)) for rc in sorted(cells)}
    avail = {rc: 0 if rng.random() < 0.2 else rng.randint(1, avail_max) for rc in sorted(cells)}
    demand = {s.name: float(rng.randint(1, 8)) for s in services}
    kw: dict = {}
    if running:
        kw = {"running": Allocation.of({k: rng.randint(0, 1) for k in templates}),
              "startup_weight": rng.choice([0.5, 2.0])}
    return AllocationProblem(tuple(templates.values()), demand, avail, prices, gap=0.0, **kw)


def _check_exact(problem, res, best):
    if best is None:
        assert res.status is SolveStatus.INFEASIBLE
        assert "goodput" in res.message
        return
    assert res.status is SolveStatus.OPTIMAL, res.message
    assert res.objective == pytest.approx(best[1], abs=1e-6)
    assert res.gap == pytest.approx(0.0, abs=1e-6)  # the summed bound closes the gap
    ev = evaluate_plan(problem, res.allocation)
    assert ev.feasible, ev.violations
    assert ev.objective == pytest.approx(res.objective)


@pytest.mark.parametrize("seed", range(16))
def test_separate_services_are_solved_apart_exactly(seed, blocks_seen):
    # seeds 0 and 13 take two rounds: a row of one service is violated, then built in its block
    problem = _random(seed, shared=False, running=seed % 2 == 1, avail_max=2 if seed % 4 == 0 else 3)
    best = brute_force(problem)
    res = _solve(problem, True)
    _check_exact(problem, res, best)
    if res.status is SolveStatus.OPTIMAL:  # no row is shared: every round went block by block
        assert blocks_seen and all(n == len(problem.demand) for n in blocks_seen)
    blocks_seen.clear()
    joint = _solve(problem, False)
    assert blocks_seen == []  # switched off: never split
    assert joint.status is res.status
    if best is not None:
        assert joint.objective == pytest.approx(res.objective, abs=1e-6)


@pytest.mark.parametrize("seed", range(16))
def test_services_competing_for_nodes_stay_exact(seed, blocks_seen):
    problem = _random(100 + seed, shared=True, avail_max=4)
    best = brute_force(problem)
    res = _solve(problem, True)
    _check_exact(problem, res, best)
    joint = _solve(problem, False)
    assert joint.status is res.status
    if best is not None:
        assert joint.objective == pytest.approx(res.objective, abs=1e-6)


def _three_services(s3_region: str) -> AllocationProblem:
    """m0's two services share r1/1xA (3 nodes, $1) and spill to r1/1xB ($3); m1/decode sits in
    ``s3_region``. Round 0 (no row built) gives each m0 service two 1xA nodes: r1/1xA is
    violated and built in round 1, joining m0's services."""
    ts = (template("m0", Phase.DECODE, "r1", {"1xA": 1}, 4.0),
          template("m0", Phase.DECODE, "r1", {"1xB": 1}, 4.0),
          template("m0", Phase.PREFILL, "r1", {"1xA": 1}, 4.0),
          template("m0", Phase.PREFILL, "r1", {"1xB": 1}, 4.0),
          template("m1", Phase.DECODE, s3_region, {"1xA": 1}, 5.0))
    cells = {("r1", "1xA"), ("r1", "1xB"), (s3_region, "1xA")}
    prices = {rc: 3.0 if rc[1] == "1xB" else 1.0 for rc in cells}
    avail = {("r1", "1xA"): 3, ("r1", "1xB"): 10, ("r2", "1xA"): 5}
    return AllocationProblem(ts, {"m0/decode": 8.0, "m0/prefill": 8.0, "m1/decode": 10.0},
                             avail, prices, gap=0.0)


def test_shared_row_joins_only_the_services_it_touches(blocks_seen):
    problem = _three_services("r2")
    res = _solve(problem, True)
    assert blocks_seen == [3, 2]  # round 1: {m0/decode, m0/prefill} and {m1/decode}
    assert res.status is SolveStatus.OPTIMAL
    assert res.objective == pytest.approx(3 * 1.0 + 1 * 3.0 + 2 * 1.0)
    assert res.objective == pytest.approx(brute_force(problem)[1])
    assert _solve(problem, False).objective == pytest.approx(res.objective)


def test_row_shared_by_every_service_takes_the_joint_path(blocks_seen):
    problem = _three_services("r1")  # m1/decode needs r1/1xA too
    res = _solve(problem, True)
    assert blocks_seen == [3, 1]
    assert res.status is SolveStatus.OPTIMAL
    # m1/decode has only 1xA: two of the three nodes; m0 gets one 1xA node and three 1xB
    assert res.objective == pytest.approx(2 * 1.0 + 1 * 1.0 + 3 * 3.0)
    assert res.objective == pytest.approx(brute_force(problem)[1])
    assert _solve(problem, False).objective == pytest.approx(res.objective)


def test_fixed_models_are_merged_into_the_plan_and_the_bound(blocks_seen):
    for seed in range(40):  # the first seed whose fixed model runs something and is feasible
        base = _random(200 + seed, shared=False, services=(M0D, M0P, M1D), running=True,
                       avail_max=4)
        problem = base.with_changes(reoptimize=frozenset({"m0"}))
        fixed = {k: n for k, n in problem.running.counts if k.startswith("m1")}
        if fixed and (best := brute_force(problem)) is not None:
            break
    else:
        pytest.fail("no instance with a running fixed model")
    blocks_seen.clear()
    res = _solve(problem, True)
    assert blocks_seen and blocks_seen[-1] == 2  # m0's two services; m1 is fixed
    _check_exact(problem, res, best)
    for key, n in fixed.items():
        assert res.allocation[key] == n
    joint = _solve(problem, False)
    assert joint.objective == pytest.approx(res.objective, abs=1e-6)
    assert joint.allocation.as_dict().keys() >= fixed.keys()


def test_a_block_without_a_plan_makes_the_round_infeasible(blocks_seen):
    ts = (template("m0", Phase.DECODE, "r1", {"1xA": 1}, 2.0),  # at most 1 node: 2 < 5 tokens/s
          template("m0", Phase.PREFILL, "r2", {"1xA": 1}, 2.0))
    prices = {("r1", "1xA"): 1.0, ("r2", "1xA"): 1.0}
    problem = AllocationProblem(ts, {"m0/decode": 5.0, "m0/prefill": 3.0},
                                {("r1", "1xA"): 1, ("r2", "1xA"): 9}, prices)
    res = _solve(problem, True)
    assert blocks_seen == [2, 2]
    assert res.status is SolveStatus.INFEASIBLE and res.allocation is None
    assert "m0/decode" in res.message and "m0/prefill" not in res.message
    assert _solve(problem, False).status is SolveStatus.INFEASIBLE


def test_a_service_left_without_templates_goes_joint(blocks_seen):
    ts = (template("m0", Phase.DECODE, "r1", {"1xA": 2}, 4.0),  # needs 2 nodes, 1 available
          template("m0", Phase.PREFILL, "r2", {"1xA": 1}, 2.0))
    prices = {("r1", "1xA"): 1.0, ("r2", "1xA"): 1.0}
    problem = AllocationProblem(ts, {"m0/decode": 3.0, "m0/prefill": 3.0},
                                {("r1", "1xA"): 1, ("r2", "1xA"): 9}, prices)
    res = _solve(problem, True)
    assert blocks_seen == [2, 1]  # round 1 cuts m0/decode's only template: one (infeasible) ILP
    assert res.status is SolveStatus.INFEASIBLE and "m0/decode" in res.message


def _separate_instance() -> AllocationProblem:
    """Three services in regions of their own with room for any plan: one round, three blocks."""
    for seed in range(40):
        problem = _random(300 + seed, shared=False, services=(M0D, M0P, M1D), avail_max=4)
        problem = problem.with_changes(availability={rc: 50 * min(v, 1)
                                                     for rc, v in problem.availability.items()})
        res = solve_allocation(problem)
        if res.status is SolveStatus.OPTIMAL and res.allocation.total_instances >= 3:
            return problem
    raise AssertionError("no feasible instance")


def test_one_block_stopping_early_makes_the_round_feasible_only(blocks_seen, monkeypatch):
    problem = _separate_instance()
    blocks_seen.clear()
    calls = []
    original = solve_module.status_of

    def second_stops_early(run):
        calls.append(run)
        status = original(run)
        return SolveStatus.FEASIBLE_TIME_LIMIT if len(calls) == 2 else status

    monkeypatch.setattr(solve_module, "status_of", second_stops_early)
    res = _solve(problem, True)
    assert blocks_seen == [3] and len(calls) == 3
    assert res.status is SolveStatus.FEASIBLE_TIME_LIMIT
    assert res.allocation is not None and evaluate_plan(problem, res.allocation).feasible


def test_cbc_blocks_have_no_bound(blocks_seen):
    problem = _separate_instance()
    blocks_seen.clear()
    res = _solve(problem, True, solver="cbc")
    assert blocks_seen == [3]
    assert res.status is SolveStatus.OPTIMAL and math.isnan(res.gap)  # no bound from CBC
    assert res.objective == pytest.approx(_solve(problem, False).objective, abs=1e-6)


def test_warm_start_is_reported_for_blocks(blocks_seen):
    problem = _separate_instance()
    blocks_seen.clear()
    cold = _solve(problem, True)
    warm = _solve(problem, True, warm_start=cold.allocation)
    assert blocks_seen == [3, 3]
    assert cold.warm_start_accepted is None  # no start given
    assert warm.warm_start_accepted is True
    assert warm.objective == pytest.approx(cold.objective)


def test_combined_start_status():
    ok, warn, err = highspy.HighsStatus.kOk, highspy.HighsStatus.kWarning, highspy.HighsStatus.kError
    assert combined_start_status([]) is None
    assert combined_start_status([ok, ok]) is ok
    assert combined_start_status([ok, warn, err]) is warn
    assert combined_start_status([None, None]) is None  # CBC reports none
