"""Warm-started re-solves against their labels: one simulated day per scenario, every solve of
the env's planner recorded, as one JSON document on stdout (progress on stderr).

Three runs per scenario, same seed and day (``fixed:1``, spot availability):

- ``checked``: the solver as shipped — each HiGHS answer checked against its own columns and
  dual bound, re-solved with presolve off, then cold, when a check fails (cost rounds built as
  arrays, :mod:`atoll.solvers.allocation.direct`);
- ``unchecked``: one HiGHS run per stage through PuLP, its status taken as it comes (the solver
  without its checks): how many of its ``optimal`` labels had a gap above 1e-3, and what the day
  cost with those plans;
- ``presolve_off``: every solve with presolve off from the start (the alternative to the
  checks): its solver seconds, for the price of that alternative on large libraries.

Usage: ``python benchmarks/warm_start.py [--scenarios core,extended] [--day 11] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from emit import emit  # this folder's own module, imported while the folder is on sys.path

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import atoll.envs.planner as planner  # noqa: E402
import atoll.solvers.allocation.direct as direct  # noqa: E402
import atoll.solvers.allocation.highs as highs  # noqa: E402
import atoll.solvers.allocation.solve as solve  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.fleet_model import clear_replanners  # noqa: E402
from atoll.envs.policies import make_policy  # noqa: E402
from atoll.envs.rollout import run_policy  # noqa: E402
from atoll.envs.vocabulary import parse_policy  # noqa: E402
from atoll.solvers.problem import AllocationResult, SolveStatus  # noqa: E402

LOOSE_GAP = 1e-3


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class _Unchecked(highs.SolverRun):
    """One HiGHS run, its status as HiGHS gives it: the solver without its checks."""

    def __init__(self, prob: Any, solver: str, time_limit: float | None, gap: float,
                 start: Any) -> None:
        self.bound = None
        self.start_status = None
        self.reported_objective = None
        self.guard_resolves = 0
        self.guard_reasons = []
        self.gap = gap
        self.minimize = True
        self.solve_seconds = self.model_seconds = 0.0
        self._run_highs(prob, start, time_limit, gap, {})
        self.column_objective = None

    @property
    def proven(self) -> bool:
        return True


class _Recorder:
    """Wraps the planner's solve_allocation: keeps each result's status, gap and guard count."""

    def __init__(self) -> None:
        self.results: list[AllocationResult] = []
        self._inner = planner.solve_allocation

    def __call__(self, problem: Any, **kwargs: Any) -> AllocationResult:
        res = self._inner(problem, **kwargs)
        self.results.append(res)
        return res


def _day(scenario: str, day: int, variant: str) -> dict[str, Any]:
    saved = (solve.SolverRun, solve.status_of, planner.solve_allocation, dict(highs.HIGHS_OPTIONS),
             AllocationResult.from_allocation, direct.supports)
    recorder = _Recorder()
    planner.solve_allocation = recorder
    if variant == "unchecked":
        direct.supports = lambda *args: False  # every round through the unchecked PuLP run
        solve.SolverRun = _Unchecked

        def trusting(run: highs.SolverRun) -> SolveStatus:
            return saved[1](run)

        solve.status_of = trusting
        original = saved[4].__func__

        def unlabelled(cls: type, problem: Any, status: SolveStatus, allocation: Any, **kw: Any) -> Any:
            # keep HiGHS's own label: the result type would downgrade an unproven "optimal"
            res = original(cls, problem, status, allocation, **kw)
            if res.status is SolveStatus.FEASIBLE and status is SolveStatus.OPTIMAL:
                object.__setattr__(res, "status", SolveStatus.OPTIMAL)
            return res

        AllocationResult.from_allocation = classmethod(unlabelled)  # type: ignore[method-assign]
    elif variant == "presolve_off":
        highs.HIGHS_OPTIONS["presolve"] = "off"
    try:
        clear_replanners()
        env = FleetEnv(FleetConfig(scenario=scenario, days=(day, day), availability="spot"))
        t0 = time.perf_counter()
        ep = run_policy(env, make_policy(parse_policy("fixed:1"), len(env.models)), days=[day], seed=0)
        wall = time.perf_counter() - t0
    finally:
        solve.SolverRun, solve.status_of, planner.solve_allocation = saved[:3]
        highs.HIGHS_OPTIONS.clear()
        highs.HIGHS_OPTIONS.update(saved[3])
        AllocationResult.from_allocation = saved[4]  # type: ignore[method-assign]
        direct.supports = saved[5]
    res = recorder.results
    optimal = [r for r in res if r.status is SolveStatus.OPTIMAL]
    gaps = [r.gap for r in optimal if not math.isnan(r.gap)]
    totals = ep.totals()
    return {
        "wall_s": round(wall, 2),
        "solver_seconds": round(sum(r.build_seconds + r.solve_seconds for r in res), 3),
        "solves": len(res),
        "statuses": dict(Counter(r.status.value for r in res)),
        "optimal_with_gap_above_1e-3": sum(g > LOOSE_GAP for g in gaps),
        "solver_gap": env.config.solver_gap,
        "optimal_with_gap_above_solver_gap": sum(g > env.config.solver_gap + 1e-9 for g in gaps),
        "worst_gap_labelled_optimal": max(gaps, default=0.0),
        "guard_resolves": sum(r.guard_resolves for r in res),
        "solves_with_guard_resolves": sum(r.guard_resolves > 0 for r in res),
        "cost_usd": round(totals["cost_usd"], 2),
        "slo_attainment": round(totals["slo_attainment"], 5),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default="core,extended")
    ap.add_argument("--day", type=int, default=11)
    ap.add_argument("--variants", default="checked,unchecked,presolve_off")
    ap.add_argument("--out", type=Path, default=None, help="also write the document here")
    args = ap.parse_args()
    doc: dict[str, Any] = {"day": args.day, "policy": "fixed:1", "availability": "spot", "seed": 0,
                           "load_before": [round(x, 2) for x in os.getloadavg()], "scenarios": {}}
    for scenario in args.scenarios.split(","):
        cell: dict[str, Any] = {}
        for variant in args.variants.split(","):
            log(f"{scenario} day {args.day}: {variant} ...")
            cell[variant] = _day(scenario, args.day, variant)
            cell[variant]["load"] = round(os.getloadavg()[0], 2)
            log(f"  {json.dumps(cell[variant])}")
        if "checked" in cell and "unchecked" in cell:
            cell["cost_change"] = round(cell["checked"]["cost_usd"] / cell["unchecked"]["cost_usd"] - 1, 5)
        doc["scenarios"][scenario] = cell
    emit(doc, args.out)


if __name__ == "__main__":
    main()
