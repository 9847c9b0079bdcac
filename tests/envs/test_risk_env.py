"""A rule's risk in the simulator: every plan the env applies satisfies the Risk rows (checked by
the evaluator, independently of the solver), and an on-demand floor under ``hedged`` moves node
hours onto on-demand."""

from __future__ import annotations

from test_fleet_env import rich_config

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import make_policy
from atoll.envs.rollout import run_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.allocation import evaluate_plan
from atoll.solvers.problem import Risk


def _hedged_share(risk: Risk) -> float:
    env = FleetEnv(rich_config(availability="hedged", ondemand_quota="ample", episode_steps=12, risk=risk))
    ep = run_policy(env, make_policy(parse_policy("fixed:1"), len(env.models)), days=[5], seed=0)
    return ep.totals()["ondemand_node_hour_share"]


def test_an_ondemand_floor_moves_node_hours_to_ondemand() -> None:
    plain, floored = _hedged_share(Risk()), _hedged_share(Risk(ondemand_floor=0.6))
    assert floored > plain + 0.1, (plain, floored)


def test_applied_plans_keep_the_spread() -> None:
    env = FleetEnv(rich_config(availability="hedged", ondemand_quota="ample", episode_steps=8,
                               risk=Risk(spread=0.6)))
    replanner = env.fleet.replanner
    inner = replanner._solve
    checked: list[bool] = []

    def solve_and_check(models, demand, availability, running, grow=frozenset(), risk=None,  # type: ignore[no-untyped-def]
                        diagnose=True):
        out = inner(models, demand, availability, running, grow, risk, diagnose)
        if out.allocation is not None and out.mode == "cost":
            problem = replanner.base.with_changes(demand=demand, availability=availability,
                                                  running=running, reoptimize=models, grow=grow)
            ev = evaluate_plan(problem, out.allocation)
            assert ev.feasible, ev.violations
            checked.append(True)
        return out

    replanner._solve = solve_and_check  # type: ignore[method-assign]
    try:
        run_policy(env, make_policy(parse_policy("fixed:1"), len(env.models)), days=[5], seed=0)
    finally:
        replanner._solve = inner  # type: ignore[method-assign]
    assert len(checked) >= 4
