"""The re-planner the simulator and the live controller share: a warm-started re-optimization is
labelled optimal only when proven, and costs what a cold solve of the same problem costs."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "solvers"))
from alloc_instances import random_problem  # noqa: E402

from atoll.envs.planner import Replanner  # noqa: E402
from atoll.solvers.allocation import evaluate_plan, solve_allocation  # noqa: E402
from atoll.solvers.problem import Allocation, SolveStatus, within_tolerance  # noqa: E402


@pytest.mark.parametrize("seed", range(10))
def test_replanner_outcomes_are_proven_and_equal_cold_solves(seed: int) -> None:
    rng = random.Random(900 + seed)
    base = random_problem(900 + seed, n_models=2, max_templates=8, avail_max=4, with_running=False)
    base = base.with_changes(gap=1e-3, startup_weight=rng.choice([0.0, 0.5]))
    planner = Replanner(base, demand_round=0.0, memoize=False)
    running = Allocation()
    for _ in range(4):  # a short episode: each plan is the next step's running plan
        demand = {s: d * rng.uniform(0.5, 1.5) for s, d in base.demand.items()}
        avail = {rc: int(v) for rc, v in (base.availability or {}).items()}
        out = planner.plan(frozenset(base.models), demand, avail, running)
        quiet = planner.plan(frozenset(base.models), demand, avail, running, diagnose=False)
        assert (quiet.allocation, quiet.status, quiet.mode) == (out.allocation, out.status, out.mode)
        if out.allocation is None:
            continue
        problem = base.with_changes(demand=demand, availability=avail, running=running,
                                    reoptimize=frozenset(base.models), mode=out.mode)
        cold = solve_allocation(problem)
        if out.status is SolveStatus.OPTIMAL:
            assert not math.isnan(out.gap)
            assert out.gap <= problem.gap + 1e-9
            assert cold.status is SolveStatus.OPTIMAL
            mine = evaluate_plan(problem, out.allocation)
            assert mine.feasible
            assert within_tolerance(abs(mine.objective - cold.objective), cold.objective, 2 * problem.gap)
        running = out.allocation

