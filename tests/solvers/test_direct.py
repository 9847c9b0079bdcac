"""The cost stage built straight into HiGHS's arrays states the same model PuLP builds: on
random seeded rounds (running plans, start-up weight, grow floors, enforced availability rows,
warm starts) both give the same plan and objective, and the array path's plans equal brute force."""

from __future__ import annotations

import random

import pytest
from alloc_instances import matches_brute_force, random_problem, with_spot_tier

from atoll.solvers.allocation import direct, solve_allocation
from atoll.solvers.allocation.direct import DirectRun
from atoll.solvers.allocation.highs import SolverRun, status_of
from atoll.solvers.allocation.model import build_model, extract, start_values
from atoll.solvers.allocation.reduction import RoundInstance
from atoll.solvers.problem import Allocation, Risk, SolveStatus


def _rounds(seed: int) -> list[tuple[RoundInstance, Allocation | None]]:
    rng = random.Random(seed)
    problem = random_problem(seed, n_models=rng.choice([1, 2, 3]), max_templates=8, avail_max=3,
                             with_running=seed % 2 == 0)
    if seed % 3 == 0 and problem.free_models:
        problem = problem.with_changes(grow=frozenset(sorted(problem.free_models)[:1]))
    start = problem.running
    rows = frozenset(rng.sample(sorted(problem.prices), rng.randint(0, len(problem.prices))))
    return [(RoundInstance(problem, rows), start), (RoundInstance(problem, None), None),
            (RoundInstance(problem, frozenset()), start)]


@pytest.mark.parametrize("seed", range(20))
def test_array_model_equals_pulp_model(seed: int) -> None:
    for inst, start in _rounds(seed):
        if not inst.free:
            continue
        assert direct.supports(inst, "cost", "highs")
        arrays = DirectRun(inst, start, None, inst.problem.gap)
        model = build_model(inst, "cost")
        begin = start_values(inst, model, start) if start is not None else None
        pulp_run = SolverRun(model.prob, "highs", None, inst.problem.gap, begin)
        assert status_of(arrays) is status_of(pulp_run)
        if status_of(pulp_run) is not SolveStatus.OPTIMAL:
            continue
        assert arrays.column_objective == pytest.approx(pulp_run.column_objective, abs=1e-9)
        assert extract(inst, arrays.values()) == extract(inst, model.values())
        assert len(arrays.costs) == len(model.prob.variables())
        assert len(arrays._rows[0]) == len(list(model.prob.constraints.values()))


@pytest.mark.parametrize("seed", range(10))
def test_array_path_plans_equal_brute_force(seed: int) -> None:
    problem = random_problem(600 + seed, n_models=2, max_templates=6, avail_max=3, with_running=True)
    matches_brute_force(problem, solve_allocation(problem, warm_start=problem.running))


@pytest.mark.parametrize("seed", range(12))
def test_a_remembered_answer_is_the_answer_of_a_fresh_solve(seed: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for inst, start in _rounds(seed):
        if not inst.free:
            continue
        monkeypatch.setattr(direct, "_ANSWERS", type(direct._ANSWERS)())
        first = DirectRun(inst, start, None, inst.problem.gap)
        assert len(direct._ANSWERS) == 1
        again = DirectRun(inst, start, None, inst.problem.gap)  # the same arrays: recalled, not solved
        assert len(direct._ANSWERS) == 1
        assert status_of(again) is status_of(first) and again.values() == first.values()
        assert again.solve_seconds == first.solve_seconds and again.bound == first.bound
        if start is not None:  # another start is another key: solved, and it finds the same optimum
            cold = DirectRun(inst, None, None, inst.problem.gap)
            assert len(direct._ANSWERS) == 2
            if status_of(first) is SolveStatus.OPTIMAL:
                assert cold.column_objective == pytest.approx(first.column_objective, abs=1e-9)


def test_the_reused_solver_forgets_a_guard_run_s_options() -> None:
    inst, start = next((i, s) for i, s in _rounds(4) if i.free)
    run = DirectRun(inst, start, None, inst.problem.gap)
    run._run(None, None, {"presolve": "off"})
    h = direct._solver()
    assert h.getOptionValue("presolve")[1] == "choose"
    assert h.getNumCol() == 0  # cleared before the next model is added



@pytest.mark.parametrize("risk", [Risk(headroom=0.8), Risk(spread=0.5), Risk(ondemand_floor=0.3),
                                  Risk(headroom=0.9, spread=0.6, ondemand_floor=0.2)],
                         ids=lambda r: r.label())
@pytest.mark.parametrize("seed", range(6))
def test_risk_rows_in_arrays_equal_pulp_s(seed: int, risk: Risk) -> None:
    rng = random.Random(seed)
    base = with_spot_tier(random_problem(700 + seed, n_models=2, regions=("r1", "r2"), max_templates=6,
                                         avail_max=3, with_running=True), rng, discount=(0.3, 0.6))
    problem = base.with_changes(risk={m: risk for m in base.models})
    if seed % 2:  # a grow model's floor enters the risk rows as a constant
        problem = problem.with_changes(grow=frozenset(sorted(problem.free_models)[:1]))
    for inst in (RoundInstance(problem, frozenset()), RoundInstance(problem, None)):
        assert direct.supports(inst, "cost", "highs")
        if not inst.free:
            continue
        arrays = DirectRun(inst, problem.running, None, problem.gap)
        model = build_model(inst, "cost")
        begin = start_values(inst, model, problem.running) if problem.running is not None else None
        pulp_run = SolverRun(model.prob, "highs", None, problem.gap, begin)
        assert len(arrays._rows[0]) == len(list(model.prob.constraints.values()))
        assert status_of(arrays) is status_of(pulp_run)
        if status_of(pulp_run) is SolveStatus.OPTIMAL:
            assert arrays.column_objective == pytest.approx(pulp_run.column_objective, abs=1e-9)
            assert extract(inst, arrays.values()) == extract(inst, model.values())
