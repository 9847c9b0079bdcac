"""The cost stage built straight into HiGHS's arrays states the same model PuLP builds: on
random seeded rounds (running plans, start-up weight, grow floors, enforced availability rows,
warm starts) both give the same plan and objective, and the array path's plans equal brute force."""

from __future__ import annotations

import random

import numpy as np
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


Terms = list[tuple[int, float]]


def _per_template_arrays(inst: RoundInstance) -> tuple[list[float], list[float], list[Terms]]:
    """(costs, upper, each row's terms) as one pass over the block's template objects states them:
    the reference the array build (gathered from the library's index) must equal to the bit."""
    p = inst.problem
    k = p.startup_weight
    free = inst.free
    added = [i for i, key in enumerate(free) if inst.running[key] != 0] if k > 0 else []
    x_cost = [p.template_cost(key) * (1.0 + k) if inst.running[key] == 0 else p.template_cost(key)
              for key in free]
    costs = [p.template_cost(free[i]) * k for i in added] + x_cost
    upper = [float(inst.bound[free[i]]) for i in added] + [float(inst.bound[key]) for key in free]
    rows: list[list[tuple[int, float]]] = [[(j, 1.0), (len(added) + i, -1.0)] for j, i in enumerate(added)]
    by_rc: dict[tuple[str, str], list[tuple[int, float]]] = {}
    by_service: dict[str, list[tuple[int, float]]] = {}
    for i, key in enumerate(free):
        t = p.template(key)
        for c, use in t.node_use:
            if (t.region, c) in inst.rows:
                by_rc.setdefault((t.region, c), []).append((len(added) + i, float(use)))
        for s, thr in t.covers:
            by_service.setdefault(s, []).append((len(added) + i, thr))
    rows += [by_rc[rc] for rc in sorted(by_rc)]
    rows += [by_service.get(s, []) for s in inst.services]
    return costs, upper, rows


@pytest.mark.parametrize("colocated", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_the_array_build_is_the_per_template_loop_to_the_bit(seed: int, colocated: bool) -> None:
    rng = random.Random(seed)
    problem = random_problem(800 + seed, n_models=rng.choice([1, 2, 3]), regions=("r1", "r2"),
                             max_templates=8, avail_max=3, with_running=True, colocated=colocated)
    if seed % 3 == 0:  # a corrected library: the index's throughputs are the scaled templates'
        scale = [rng.choice([1.0, 0.87, 1.13]) for _ in problem.templates]
        scaled = problem.index.rescaled(np.asarray(scale)).templates
        problem = problem.with_changes(templates=scaled)
    rows = frozenset(rng.sample(sorted(problem.prices), rng.randint(0, len(problem.prices))))
    for inst in (RoundInstance(problem, r) for r in (rows, None, frozenset())):
        if not inst.free:
            continue
        run = DirectRun(inst, None, None, problem.gap)
        costs, upper, terms = _per_template_arrays(inst)
        assert run.costs.tolist() == costs and run.upper.tolist() == upper
        starts, index, value, _, _ = run._rows
        ends = [*starts.tolist()[1:], len(index)]
        got = [list(zip(index[a:b].tolist(), value[a:b].tolist(), strict=True))
               for a, b in zip(starts.tolist(), ends, strict=True)]
        assert got == terms
