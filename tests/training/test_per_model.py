"""The per-model reference: coordinate descent on a hand-made 2-model table (checked against brute
force), the per-model rule policy in the env, and the contest's second reference."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from test_contest import SETTINGS, config

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import make_policy
from atoll.envs.rollout import run_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.errors import InputError
from atoll.training.contest import per_model_best, run_contest
from atoll.training.evaluate import env_at_level, resolve_policy
from atoll.training.per_model import (
    ModelCell,
    PerModelRule,
    coordinate_descent,
    effective_objective,
    evaluate,
    frontier_targets,
    per_model_reference,
    slo_objective,
)

# Model 0 has a flat day: re-planning every 6 steps loses nothing and costs less. Model 1 is spiky:
# every 6 steps loses a quarter of its requests; planning at 0.5 loses more and saves little.
# cells: (cost $, requests, requests that met the SLO, tokens lost)
TABLE = {
    (1, 0.9): [ModelCell(100.0, 1000.0, 990.0, 1e5), ModelCell(200.0, 1000.0, 980.0, 2e5)],
    (6, 0.9): [ModelCell(70.0, 1000.0, 985.0, 1.5e5), ModelCell(150.0, 1000.0, 750.0, 2.5e6)],
    (1, 0.5): [ModelCell(80.0, 1000.0, 900.0, 1e6), ModelCell(180.0, 1000.0, 850.0, 1.5e6)],
    (6, 0.5): [ModelCell(60.0, 1000.0, 890.0, 1.1e6), ModelCell(130.0, 1000.0, 700.0, 3e6)],
}


def brute_force(objective):  # type: ignore[no-untyped-def]
    return min((evaluate(TABLE, list(a)) for a in itertools.product(sorted(TABLE), repeat=2)), key=objective)


def test_evaluate_sums_the_models_cells_by_hand() -> None:
    a = evaluate(TABLE, [(6, 0.9), (1, 0.9)])
    assert a.cost_usd == 270.0 and a.slo_attainment == pytest.approx((985 + 980) / 2000)
    assert a.unserved_tokens == pytest.approx(3.5e5) and a.spec == "per-model:6@0.9,1@0.9"
    assert evaluate(TABLE, [(1, 0.9), (1, 0.9)]).spec == "fixed:1@0.9"


def test_descent_at_an_slo_target_finds_the_brute_force_optimum() -> None:
    target = 0.98  # fixed:1@0.9 attains 98.5%: it meets the target with room to spare
    d = coordinate_descent(TABLE, [(1, 0.9), (1, 0.9)], slo_objective(target), passes=3)
    assert d.assignment.options == ((6, 0.9), (1, 0.9))  # the flat model re-plans less often
    assert d.assignment.cost_usd == 270.0 < 300.0  # cheaper than the one rule at its own SLO
    assert d.assignment.slo_attainment >= target - 1e-12
    assert slo_objective(target)(d.assignment) == slo_objective(target)(brute_force(slo_objective(target)))
    assert d.moves == 1 and d.passes == 2  # the second pass changes nothing and stops the descent
    # every recorded objective is no worse than the one before: a descent
    assert list(d.history) == sorted(d.history, reverse=True)


def test_descent_on_effective_cost_and_its_price() -> None:
    cheap = coordinate_descent(TABLE, [(1, 0.9)] * 2, effective_objective(0.0)).assignment
    assert cheap.options == ((6, 0.5), (6, 0.5))  # lost tokens free: the cheapest option for both
    priced = coordinate_descent(TABLE, [(1, 0.9)] * 2, effective_objective(100.0)).assignment
    assert priced.options == brute_force(effective_objective(100.0)).options == ((6, 0.9), (1, 0.9))


def test_a_pass_limit_can_stop_short_and_bad_input_is_refused() -> None:
    target = 0.98
    one = coordinate_descent(TABLE, [(1, 0.9)] * 2, slo_objective(target), passes=1)
    assert one.passes == 1 and one.assignment.options == ((6, 0.9), (1, 0.9))
    with pytest.raises(InputError, match="'passes' must be >= 1"):
        coordinate_descent(TABLE, [(1, 0.9)] * 2, slo_objective(target), passes=0)
    with pytest.raises(InputError, match="option fixed:3@0.9 of model 1 is not in the table"):
        evaluate(TABLE, [(1, 0.9), (3, 0.9)])
    with pytest.raises(InputError, match="field 'met_requests'"):
        ModelCell(1.0, 10.0, 11.0, 0.0)
    with pytest.raises(InputError, match="field 'cost_usd'"):
        ModelCell(float("nan"), 10.0, 1.0, 0.0)


def test_reference_targets_come_from_the_frontier_and_beat_its_rules_on_the_table() -> None:
    frontier = [(parse_policy(n), slo) for n, slo in (("fixed:6@0.5", 0.795), ("fixed:1@0.5", 0.875),
                                                      ("threshold:0.5:1@0.9", 0.9), ("fixed:1@0.9", 0.98))]
    assert [(str(n), slo) for n, slo in frontier_targets(frontier, 2)] == [("fixed:6@0.5", 0.795),
                                                                           ("fixed:1@0.9", 0.98)]
    assert frontier_targets(frontier, 5) == [f for f in frontier if f[0].kind == "fixed"]
    ref = per_model_reference(TABLE, 2, frontier, parse_policy("fixed:1@0.9"), 100.0, targets=3)
    for a, (rule, slo) in zip(ref.frontier, ref.targets, strict=True):
        own = evaluate(TABLE, [(rule.every, rule.level)] * 2)
        assert a.slo_attainment >= slo - 1e-12 and a.cost_usd <= own.cost_usd
    assert ref.best.options == ((6, 0.9), (1, 0.9))


def test_per_model_rule_uniform_is_the_rule_and_mixed_acts_per_model() -> None:
    env = FleetEnv(dataclasses.replace(config(), days=(4, 4)))
    rule = make_policy(parse_policy("fixed:6@0.5"), 2)
    uniform = resolve_policy(parse_policy("per-model:6@0.5,6@0.5"), 2)
    a = run_policy(env_at_level(env, rule, {}), rule, days=[4], seed=0).totals()
    b = run_policy(env_at_level(env, uniform, {}), uniform, days=[4], seed=0).totals()
    assert {k: v for k, v in a.items() if k != "solver_seconds"} == \
        {k: v for k, v in b.items() if k != "solver_seconds"}
    mixed = PerModelRule.parse(parse_policy("per-model:1@0.9,6@0.5"), 2)
    assert mixed.planning_quantile == 0.9 and mixed.action_levels == (0.5, 0.9)
    episode = run_policy(env_at_level(env, mixed, {}), mixed, days=[4], seed=0)
    reopts = [sum(row[f"{m}/reoptimizations"] for row in episode.steps) for m in env.models]
    assert reopts[0] > 3 * reopts[1] > 0  # every step against every 6th
    with pytest.raises(InputError, match="gives 1 K@q entries for 2 models"):
        resolve_policy(parse_policy("per-model:1@0.9"), 2)
    with pytest.raises(InputError, match="not a planning level"):
        resolve_policy(parse_policy("per-model:1@0.9,3@0.42"), 2)


def test_the_contest_reports_the_per_model_reference_chosen_on_validation_days() -> None:
    settings = dataclasses.replace(SETTINGS, seeds=1, hindsight=False)
    result = run_contest(config(), [], settings)
    assert result.per_model is not None and result.per_model_best is not None
    names = {r.name for r in result.test}
    assert set(result.per_model_frontier) <= names and result.per_model_best in names
    assert "hindsight" not in names
    points = {p.name: p for p in result.validation_points()}
    for p in result.per_model_points.values():  # no one-rule frontier point dominates a per-model one
        assert not any(points[n].cost_usd < p.cost_usd and points[n].slo_attainment > p.slo_attainment
                       for n in result.frontier)
    changed = run_contest(config(test_factor=3.0), [], settings)
    assert changed.per_model_frontier == result.per_model_frontier
    assert changed.per_model_best == result.per_model_best
    # the teacher a benchmark clones (per-model:best) is the contest's own, from validation totals alone
    assert per_model_best(config(), result.validation, 2, settings) == result.per_model_best
    old = {rule: [{k: v for k, v in row.items() if not k.startswith("model")} for row in rows]
           for rule, rows in result.validation.items()}
    with pytest.raises(InputError, match="no per-model sums"):
        per_model_best(config(), old, 2, settings)


def test_rounding_below_the_target_buys_nothing() -> None:
    """A uniform start whose table SLO is its measured SLO minus a rounding error stays put (the
    extended grid's fixed:12@0.7 would move a model to fixed:3 at a cost without the tolerance)."""
    start = evaluate(TABLE, [(6, 0.5), (6, 0.5)])
    d = coordinate_descent(TABLE, [(6, 0.5), (6, 0.5)], slo_objective(start.slo_attainment + 1e-12))
    assert d.assignment.options == ((6, 0.5), (6, 0.5)) and d.moves == 0
