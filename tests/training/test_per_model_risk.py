"""Per-model risk: a per-model assignment whose entries take their own risk, from its text to the
env's re-plans, and the per-model table crossed with the rules' risk twins."""

from __future__ import annotations

import dataclasses

import pytest
from test_contest import config

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import make_policy
from atoll.envs.rollout import run_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.errors import InputError
from atoll.solvers.problem import Risk
from atoll.training.cloning import bootstrap_teacher
from atoll.training.evaluate import env_at_level, resolve_policy
from atoll.training.per_model import (
    MODEL_KEYS,
    ModelCell,
    PerModelRule,
    coordinate_descent,
    effective_objective,
    evaluate,
    model_key,
    model_table,
)

H07 = Risk(headroom=0.7)


def test_entries_carry_their_own_risk_and_print_back() -> None:
    spec = parse_policy("per-model:1@0.9+h0.85,f0.3,6@0.95")
    assert spec.entries == ((1, 0.9, Risk(headroom=0.85, ondemand_floor=0.3)), (6, 0.95))
    assert spec.entry_risks == (Risk(headroom=0.85, ondemand_floor=0.3), Risk())
    assert str(spec) == "per-model:1@0.9+h0.85,f0.3,6@0.95" and parse_policy(str(spec)) == spec
    # a neutral entry risk is none; without any entry risk every model takes the env's
    plain = parse_policy("per-model:1@0.9+neutral,6@0.95")
    assert plain == parse_policy("per-model:1@0.9,6@0.95") and plain.entry_risks is None
    with pytest.raises(InputError, match="'s0.5' continues no entry's"):
        parse_policy("per-model:1@0.9,s0.5,6@0.95")
    with pytest.raises(InputError, match="per-model:1@0.9\\+h2"):
        parse_policy("per-model:1@0.9+h2,6@0.95")


def test_the_rule_runs_on_an_env_with_its_risks_as_the_action_menu() -> None:
    env = FleetEnv(dataclasses.replace(config(), days=(4, 4)))
    rule = PerModelRule.parse(parse_policy("per-model:1@0.9+h0.7,6@0.9"), 2)
    # a tie of one model each: the greater risk (neutral's headroom 1 > 0.7) is the configured one
    assert rule.risk == Risk() and rule.risk_presets == (Risk(), H07)
    at = env_at_level(env, rule, {})
    assert at.config.action == "risk" and at.config.risk_menu == (Risk(), H07)
    assert at.codec.risks == (Risk(), H07)
    codes = rule.act(None, {"step": 6})  # type: ignore[arg-type]
    assert [at.codec.decode(int(c)).label() for c in codes] == ["full@0.9+h0.7", "full@0.9"]
    assert [at.codec.decode(int(c)).label() for c in rule.act(None, {"step": 1})] == [  # type: ignore[arg-type]
        "full@0.9+h0.7", "hold"]
    with pytest.raises(InputError, match="field 'risks' must give one Risk per model"):
        PerModelRule((1, 1), (0.9, 0.9), (H07,))


def test_a_uniform_risky_assignment_is_the_rule_and_a_mixed_one_acts_per_model() -> None:
    env = FleetEnv(dataclasses.replace(config(), days=(4, 4), episode_steps=48))

    def run(spec: str):
        policy = resolve_policy(parse_policy(spec), 2)
        return run_policy(env_at_level(env, policy, {}), policy, days=[4], seed=0)

    def drop_timing(totals: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in totals.items() if k != "solver_seconds"}

    rule = make_policy(parse_policy("fixed:1@0.9+h0.7"), 2)
    a = run_policy(env_at_level(env, rule, {}), rule, days=[4], seed=0)
    uniform = run("per-model:1@0.9+h0.7,1@0.9+h0.7")
    assert drop_timing(a.totals()) == drop_timing(uniform.totals())

    def model_cost(episode, m: str) -> float:
        return sum(row[f"{m}/cost_usd"] for row in episode.steps)

    plain, mixed = run("per-model:1@0.9,1@0.9"), run("per-model:1@0.9+h0.7,1@0.9")
    first, second = env.models
    # headroom buys model 0 more capacity; model 1 plans as the neutral plan does
    assert model_cost(mixed, first) > 1.1 * model_cost(plain, first)
    assert model_cost(mixed, second) < model_cost(uniform, second) / 1.1


def test_the_table_crosses_options_with_risks_and_the_descent_mixes_them() -> None:
    # model 0 loses tokens without headroom, model 1 does not: the best assignment mixes
    rows = {"fixed:1@0.9": [(100.0, 1000.0, 900.0, 5e6), (100.0, 1000.0, 1000.0, 0.0)],
            "fixed:1@0.9+h0.7": [(140.0, 1000.0, 1000.0, 0.0), (140.0, 1000.0, 1000.0, 0.0)],
            "threshold@0.9+h0.7": [(1.0, 1000.0, 1000.0, 0.0), (1.0, 1000.0, 1000.0, 0.0)]}
    validation = {spec: [{model_key(i, k): cell[i][j] for i in range(2) for j, k in enumerate(MODEL_KEYS)}]
                  for spec, cell in rows.items()}
    table = model_table(validation, 2, [parse_policy(name) for name in validation])
    assert set(table) == {(1, 0.9), (1, 0.9, H07)}  # the threshold rule is no option
    assert table[(1, 0.9, H07)][0] == ModelCell(140.0, 1000.0, 1000.0, 0.0)
    best = coordinate_descent(table, [(1, 0.9)] * 2, effective_objective(10.0)).assignment
    assert best.options == ((1, 0.9, H07), (1, 0.9)) and best.cost_usd == 240.0
    assert best.spec == "per-model:1@0.9+h0.7,1@0.9"
    assert PerModelRule.parse(best.policy, 2).risks == (H07, Risk())
    assert evaluate(table, [(1, 0.9, H07)] * 2).spec == "fixed:1@0.9+h0.7"


def test_a_clone_of_a_risky_assignment_emits_each_model_its_preset() -> None:
    spec = "per-model:1@0.9+h0.7,1@0.9"
    env = FleetEnv(dataclasses.replace(config(), days=(4, 4), action="risk", episode_steps=4))
    obs, info = env.reset(seed=0, options={"day": 4})
    codes = bootstrap_teacher(parse_policy(spec), env)(obs, {**info, "step": 1})
    assert [env.codec.decode(int(c)).label() for c in codes] == ["full@0.9+h0.7", "full@0.9"]
    with pytest.raises(InputError, match="takes risk h0.7, not among the env's risk presets neutral"):
        bootstrap_teacher(parse_policy(spec),
                          FleetEnv(dataclasses.replace(config(), days=(4, 4), episode_steps=4)))
    with pytest.raises(InputError, match="takes risk f0.5, not among"):
        bootstrap_teacher(parse_policy("per-model:1@0.9+f0.5,1@0.9"), env)
