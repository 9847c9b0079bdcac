"""A rule's ``+RISK`` suffix: parsed into the spec, printed back, refused with a clear error when
malformed; the rule grid crosses the rules with a risk menu; a rule with a risk runs on the env
configured with that risk, and a clone of it emits the Fleet-v4 code of its preset."""

from __future__ import annotations

import numpy as np
import pytest
from test_fleet_env import rich_config

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import make_policy, rule_grid
from atoll.envs.vocabulary import PolicySpec, Reoptimization, parse_policy, parse_risk
from atoll.solvers.errors import InputError, UnknownNameError
from atoll.solvers.problem import Risk
from atoll.training.cloning import bootstrap_teacher
from atoll.training.evaluate import env_at_level
from atoll.training.per_model import fixed_option

RISKY = ["fixed:1+h0.7", "fixed:3@0.95+h0.85", "threshold:0.5:1@0.9+h0.85,s0.5", "threshold+f0.3",
         "grow:6@0.9+h0.7", "never+h0.7", "hindsight+h0.7", "oracle-rate+h0.85,s0.5,f0.2"]


@pytest.mark.parametrize("text", RISKY)
def test_a_risk_suffix_prints_back_to_its_text(text: str) -> None:
    spec = parse_policy(text)
    assert spec.risk is not None and str(spec) == text and parse_policy(str(spec)) == spec


def test_the_suffix_is_typed_and_neutral_is_no_suffix() -> None:
    assert parse_policy("fixed:3@0.95+h0.85") == PolicySpec("fixed", every=3, level=0.95,
                                                            risk=Risk(headroom=0.85))
    assert parse_policy("fixed:1+neutral") == parse_policy("fixed:1")
    assert str(PolicySpec("fixed", every=1, risk=Risk())) == "fixed:1"
    # any order of the parts: one canonical text
    assert str(parse_policy("threshold+s0.5,h0.85")) == "threshold+h0.85,s0.5"
    assert Reoptimization.parse("full@0.9+h0.7") == Reoptimization("full", 0.9, Risk(headroom=0.7))
    assert Reoptimization.parse("grow@0.95+h0.85").label() == "grow@0.95+h0.85"


@pytest.mark.parametrize(("text", "error", "match"), [
    ("fixed:1+", InputError, "the risk after '\\+' is empty"),
    ("fixed:1+x0.5", InputError, "must be h<headroom>, s<spread> or f<on-demand floor>"),
    ("fixed:1+h1.5", InputError, "field 'headroom' must be in \\(0, 1\\]"),
    ("fixed:1+f-0.1", InputError, "field 'ondemand_floor' must be in \\[0, 1\\]"),
    ("fixed:1+h0.7,h0.8", InputError, "each at most once"),
    ("fixed:1+hx", InputError, "needs a number after 'h'"),
    ("per-model:1@0.9,h0.7", InputError, "'h0.7' continues no entry's \\+RISK"),
    ("sometimes+h0.7", UnknownNameError, "unknown policy"),
])
def test_bad_suffixes_are_errors_naming_the_text(text: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match) as info:
        parse_policy(text)
    if error is InputError and not text.startswith("per-model"):
        assert repr(text) in str(info.value) and "+RISK" in str(info.value)  # the text and the grammar


def test_a_learned_policy_takes_no_risk() -> None:
    with pytest.raises(InputError, match="learned takes no \\+RISK"):
        PolicySpec("learned", uri="runs:/x/policy", risk=Risk(headroom=0.7))
    assert parse_risk("neutral") == Risk()


def test_the_grid_crosses_every_rule_with_the_risk_menu() -> None:
    plain = rule_grid((0.9,), (1, 3), ((0.5, 1.0),))
    grid = rule_grid((0.9,), (1, 3), ((0.5, 1.0),), ("neutral", "h0.85", "h0.7"))
    assert len(grid) == 3 * len(plain) and set(plain) <= set(grid)
    assert "fixed:3@0.9+h0.7" in grid and "threshold:0.5:1@0.9+h0.85" in grid
    assert all(str(parse_policy(r)) == r for r in grid)
    with pytest.raises(InputError, match="distinct risk labels"):
        rule_grid((0.9,), (1,), (), ("h0.7", "h0.70"))
    with pytest.raises(InputError, match="must be h<headroom>"):
        rule_grid((0.9,), (1,), (), ("z0.5",))


def test_a_rule_with_a_risk_runs_on_the_env_configured_with_it() -> None:
    env = FleetEnv(rich_config(episode_steps=4))
    rule = make_policy(parse_policy("fixed:1@0.95+h0.7"), len(env.models))
    assert rule.risk == Risk(headroom=0.7) and rule.planning_quantile == 0.95  # type: ignore[attr-defined]
    cache: dict[object, FleetEnv] = {}
    at = env_at_level(env, rule, cache)
    assert at.config.risk == Risk(headroom=0.7) and at.config.planning_quantile == 0.95
    assert env_at_level(env, rule, cache) is at
    assert env_at_level(env, make_policy(parse_policy("fixed:1"), len(env.models)), cache) is env
    # a per-model option carries the rule's risk
    assert fixed_option(parse_policy("fixed:1@0.9")) == (1, 0.9)
    assert fixed_option(parse_policy("fixed:1@0.9+h0.7")) == (1, 0.9, Risk(headroom=0.7))


def test_a_clone_of_a_risky_rule_emits_its_fleet_v4_preset() -> None:
    env = FleetEnv(rich_config(action="risk", episode_steps=4))
    obs, info = env.reset(seed=0, options={"day": 5})
    teacher = bootstrap_teacher(parse_policy("fixed:1@0.95+h0.7"), env)
    codes = teacher(obs, {**info, "step": 1})
    assert [env.codec.decode(int(c)).label() for c in codes] == ["full@0.95+h0.7"] * len(env.models)
    with pytest.raises(InputError, match="not one of the env's risk presets"):
        bootstrap_teacher(parse_policy("fixed:1+h0.5"), env)
    with pytest.raises(InputError, match="not one of the env's risk presets"):
        bootstrap_teacher(parse_policy("fixed:1+h0.7"), FleetEnv(rich_config(episode_steps=4)))
    teacher = bootstrap_teacher(parse_policy("fixed:1"), env)
    np.testing.assert_array_equal(teacher(obs, {**info, "step": 1}), [1, 1])
