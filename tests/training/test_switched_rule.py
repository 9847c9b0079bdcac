"""The switched rule: a signal that never fires is exactly its calm rule, one that always fires
its alert rule, and each model switches on its own signal."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_contest import config

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.observation import MODEL_FEATURES
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.errors import InputError
from atoll.solvers.problem import Risk
from atoll.training.evaluate import env_at_level
from atoll.training.lever_oracle import preset_of, step_costs
from atoll.training.switched_rule import Signal, SwitchedRule, describe, uniform

CALM, ALERT = "fixed:1@0.9", "fixed:1@0.9+h0.7"


def _env() -> FleetEnv:
    return FleetEnv(dataclasses.replace(config(), days=(4, 5), episode_steps=24))


def _costs(env: FleetEnv, policy: object) -> np.ndarray:
    return step_costs(env_at_level(env, policy, {}), policy, days=[4], seed=0, lost_usd_per_mtok=2.0)[0]


def test_a_signal_that_never_fires_is_the_calm_rule_and_one_that_always_fires_acts_as_the_alert() -> None:
    env = _env()
    calm, alert = preset_of(parse_policy(CALM)), preset_of(parse_policy(ALERT))
    never = uniform(calm, alert, Signal("since_preempt", -1.0), 2)
    assert np.array_equal(_costs(env, never), _costs(env, make_policy(parse_policy(CALM), 2)))  # to the cent
    # always, starting from the alert rule's first plan: the alert rule, to the cent
    on = Signal("since_preempt", -1.0, above=True)
    always = uniform(calm, alert, on, 2, first=(0.9, Risk(headroom=0.7)))
    assert np.array_equal(_costs(env, always), _costs(env, make_policy(parse_policy(ALERT), 2)))
    at = env_at_level(env, always, {})
    obs, _ = at.reset(seed=0, options={"day": 4})
    assert always.alerts(obs).tolist() == [True, True]
    for code in always.act(obs, {"step": 5}):
        reopt = at.codec.decode(int(code))
        assert reopt.kind == "full" and (reopt.risk or at.config.risk) == Risk(headroom=0.7)


def test_each_model_switches_on_its_own_signal() -> None:
    env = _env()
    calm, alert = preset_of(parse_policy(CALM)), preset_of(parse_policy(ALERT))
    rule = uniform(calm, alert, Signal("since_preempt", 12 / 288), 2)
    at = env_at_level(env, rule, {})
    assert at.config.action == "risk" and set(at.config.risk_menu) == {Risk(), Risk(headroom=0.7)}
    obs, _ = at.reset(seed=0, options={"day": 4})
    obs = obs.copy()
    k = [f[0] for f in MODEL_FEATURES].index("since_preempt")
    obs[k], obs[len(MODEL_FEATURES) + k] = 1.0, 3 / 288  # model 1 lost an instance 3 steps ago
    assert rule.alerts(obs).tolist() == [False, True]
    assert np.array_equal(rule.act(obs, {"step": 0}), [0, 0])  # step 0 holds
    first, second = (at.codec.decode(int(c)) for c in rule.act(obs, {"step": 1}))
    assert first.kind == second.kind == "full"
    assert (first.risk or at.config.risk) == Risk() and (second.risk or at.config.risk) == Risk(headroom=0.7)
    want = f"switched({CALM} -> {ALERT} when since_preempt<=0.0416667)"
    assert describe([CALM], [ALERT], rule.signal) == want


def test_bad_signals_and_shapes_are_named() -> None:
    with pytest.raises(InputError, match="field 'feature' must be one of"):
        Signal("weather", 0.5)
    with pytest.raises(InputError, match="field 'threshold' must be a finite number"):
        Signal("since_preempt", float("nan"))
    with pytest.raises(InputError, match="one option per model"):
        SwitchedRule(((1, 0.9),), ((1, 0.9), (1, 0.9)), Signal("since_preempt", 0.1))
