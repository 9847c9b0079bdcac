"""The risk a re-plan takes (headroom, spread over spot pools, on-demand floor) as rows of the
exact ILP: each against brute force on tiny seeded instances, cold and warm, with the evaluator
checking the same rows independently of the solver."""

from __future__ import annotations

import random

import pytest
from alloc_instances import matches_brute_force, random_problem, with_spot_tier

from atoll.solvers.allocation import evaluate_plan, solve_allocation
from atoll.solvers.problem import Allocation, AllocationProblem, Risk, SolveStatus
from atoll.solvers.types import Phase, Service, Stage, Template


def _market(seed: int, *, regions: tuple[str, ...] = ("r1", "r2")) -> AllocationProblem:
    """Templates in two regions, each also in its region's spot tier (cheaper), small pools."""
    base = random_problem(seed, n_models=1, regions=regions, max_templates=4, avail_max=2, demand_max=12)
    return with_spot_tier(base, random.Random(seed), discount=(0.3, 0.6))


RISKS = [Risk(spread=0.5), Risk(spread=0.7), Risk(ondemand_floor=0.3), Risk(headroom=0.8),
         Risk(headroom=0.9, spread=0.6, ondemand_floor=0.2)]


@pytest.mark.parametrize("risk", RISKS, ids=lambda r: r.label())
@pytest.mark.parametrize("seed", range(6))
def test_risk_rows_match_brute_force(seed: int, risk: Risk) -> None:
    plain = _market(4000 + seed)
    problem = plain.with_changes(risk={plain.models[0]: risk})
    res = solve_allocation(problem)
    best = matches_brute_force(problem, res)
    if best is None:
        return
    assert evaluate_plan(problem, res.allocation).feasible
    # warm from the plain optimum (often infeasible under the risk) and from the risk optimum
    unhedged = solve_allocation(plain)
    for start in (unhedged.allocation, res.allocation):
        if start is None:
            continue
        warm = solve_allocation(problem, warm_start=start)
        assert warm.status is SolveStatus.OPTIMAL and warm.objective == pytest.approx(best[1], abs=1e-6)
    if unhedged.allocation is not None:  # a risk only adds rows: never cheaper than without it
        assert res.objective >= unhedged.objective - 1e-9


def test_a_hand_computed_spread() -> None:
    """One service of demand 10; spot pools a~spot and b~spot sell a 10 tokens/s node at $1, the
    on-demand pool a 10 tokens/s node at $3. Spread 0.5: losing either spot pool must leave 5:
    one node in each spot pool ($2). Floor 0.5 instead: one on-demand node ($3)."""
    svc = Service("m", Phase.DECODE)
    regions = {"a~spot": 1.0, "b~spot": 1.0, "a": 3.0}
    templates = tuple(Template(svc, r, (("1xG", 1),), (Stage(1, ("1xG",)),), 10.0) for r in regions)
    prices = {(r, "1xG"): p for r, p in regions.items()}
    avail = {(r, "1xG"): 4 for r in regions}
    base = AllocationProblem(templates, {svc.name: 10.0}, avail, prices)
    assert solve_allocation(base).objective == pytest.approx(1.0)
    spread = solve_allocation(base.with_changes(risk={"m": Risk(spread=0.5)}))
    assert spread.objective == pytest.approx(2.0)
    assert dict(spread.allocation.counts) == {templates[0].key: 1, templates[1].key: 1}
    floor = solve_allocation(base.with_changes(risk={"m": Risk(ondemand_floor=0.5)}))
    assert floor.objective == pytest.approx(3.0)
    headroom = solve_allocation(base.with_changes(risk={"m": Risk(headroom=0.5)}))
    assert headroom.objective == pytest.approx(2.0)  # plans 20 tokens/s for the 10 demanded


def test_the_evaluator_names_a_broken_spread() -> None:
    svc = Service("m", Phase.DECODE)
    t = Template(svc, "a~spot", (("1xG", 1),), (Stage(1, ("1xG",)),), 10.0)
    problem = AllocationProblem((t,), {svc.name: 10.0}, {("a~spot", "1xG"): 4}, {("a~spot", "1xG"): 1.0},
                                risk={"m": Risk(spread=0.5)})
    ev = evaluate_plan(problem, Allocation.of({t.key: 2}))
    assert not ev.feasible and "spot pool a~spot" in ev.violations[0]
    assert solve_allocation(problem).status is SolveStatus.INFEASIBLE


@pytest.mark.parametrize(("field", "value"), [("headroom", 0.0), ("headroom", 1.2), ("spread", 0.0),
                                              ("ondemand_floor", -0.1), ("ondemand_floor", 2.0)])
def test_bad_risk_is_named(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        Risk(**{field: value})


def test_risk_for_an_unknown_model_is_named() -> None:
    problem = random_problem(1)
    with pytest.raises(ValueError, match="unknown models"):
        problem.with_changes(risk={"nope": Risk(spread=0.5)})
