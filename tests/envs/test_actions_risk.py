"""Fleet-v4's action: the risk preset a re-plan takes per model. The codec's layout (codes
0 .. 2 L mean what they mean in Fleet-v1), the chosen preset reaching that model's Risk in the
allocation problem the planner solves, Fleet-v4 registered and deterministic for a seed, and the
older ids keeping their one-risk action."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from test_fleet_env import rich_config

from atoll import envs
from atoll.envs import planner as planner_module
from atoll.envs.actions import RISK_MENUS, ActionCodec, risk_menu
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.vocabulary import Reoptimization
from atoll.solvers.allocation import evaluate_plan
from atoll.solvers.errors import InputError
from atoll.solvers.problem import NEUTRAL_RISK, Risk

H07, H085 = Risk(headroom=0.7), Risk(headroom=0.85)


def test_codec_with_risks_keeps_the_v1_codes_and_round_trips() -> None:
    plain = ActionCodec.for_config(0.9, (0.7, 0.9, 0.95))
    codec = ActionCodec.for_config(0.9, (0.7, 0.9, 0.95), NEUTRAL_RISK, risk_menu("spot"))
    assert codec.risks == (NEUTRAL_RISK, H085, H07) and codec.n == 1 + 2 * 3 * 3 == 19
    assert codec.names()[:plain.n] == plain.names()  # preset 0: the v1 codes, the configured risk
    for code in range(codec.n):
        r = codec.decode(code)
        assert codec.encode(r.kind, r.level, r.risk) == code
    assert codec.decode(13) == Reoptimization("full", 0.9, H07)  # 1 + 2 (r L + j), r = 2, j = 0
    assert codec.decode(10) == Reoptimization("grow", 0.7, H085)  # 2 + 2 (1 x 3 + 1)
    assert codec.names()[13] == "full@0.9+h0.7"
    np.testing.assert_array_equal(codec.relevel(np.array([0, 1, 2]), 0.95, H07), [0, 17, 18])
    with pytest.raises(InputError, match="not one of this env's risk presets"):
        codec.encode("full", 0.9, Risk(spread=0.5))
    with pytest.raises(ValueError, match="outside 0..18"):
        codec.decode(19)
    with pytest.raises(InputError, match="field 'risks' must be distinct"):
        ActionCodec((0.9,), (H07, H07))


def test_the_configured_risk_is_preset_zero_and_the_hedged_menu_has_a_spread() -> None:
    codec = ActionCodec.for_config(0.9, (0.9,), H07, risk_menu("spot"))
    assert codec.risks == (H07, NEUTRAL_RISK, H085)  # the configured one first, the menu without it
    assert codec.decode(1).risk is None  # the configured risk, as a rule's re-plan takes it
    assert Risk.parse("h0.85,s0.5") in risk_menu("hedged") and len(RISK_MENUS["hedged"]) == 4
    assert risk_menu("ample") == risk_menu("spot")


def _code(env: FleetEnv, text: str) -> int:
    r = Reoptimization.parse(text)
    return env.codec.encode(r.kind, r.level, r.risk)


def test_the_chosen_risk_reaches_that_models_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real solve, recorded: the problem of a step where model 0 re-plans at h0.7 and model 1
    with the configured (neutral) risk carries exactly those risks, and the applied plan meets
    model 0's headroom (checked by the evaluator, not the solver)."""
    env = FleetEnv(rich_config(action="risk", memoize=False, episode_steps=4))
    seen: list[Any] = []
    real = planner_module.solve_allocation

    def recording(problem: Any, **kwargs: Any) -> Any:
        result = real(problem, **kwargs)
        seen.append((problem, result))
        return result

    monkeypatch.setattr(planner_module, "solve_allocation", recording)
    env.reset(seed=3, options={"day": 5})
    seen.clear()
    a, b = env.models
    env.step(np.array([_code(env, "full@0.9+h0.7"), _code(env, "full@0.9")]))
    assert seen, "the step solved nothing"
    problem, result = seen[0]
    assert problem.risk_of(a) == H07 and problem.risk_of(b) == NEUTRAL_RISK
    assert problem.planning_demand(f"{a}/decode") == pytest.approx(problem.demand[f"{a}/decode"] / 0.7)
    if result.allocation is not None and problem.mode == "cost":
        assert evaluate_plan(problem, result.allocation).feasible
    # the same step with the configured risk for both: no risk in the problem
    env.reset(seed=3, options={"day": 5})
    seen.clear()
    env.step(np.array([_code(env, "full@0.9"), _code(env, "full@0.9")]))
    assert seen[0][0].risk is None


def test_a_headroom_preset_plans_more_capacity_than_the_configured_risk() -> None:
    def planned_instances(code_text: str) -> int:
        env = FleetEnv(rich_config(action="risk", episode_steps=4, availability="ample"))
        env.reset(seed=1, options={"day": 5})
        env.step(np.array([_code(env, code_text)] * len(env.models)))
        return sum(n for _, n in env.state.planned().counts)

    assert planned_instances("full@0.9+h0.7") > planned_instances("full@0.9")


def _rollout(env: gym.Env[Any, Any], seed: int, steps: int = 5) -> list[tuple[float, bytes]]:
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed, options={"day": 5})
    out = [(0.0, obs.tobytes())]
    for _ in range(steps):
        obs, reward, _, _, _ = env.step(rng.integers(0, env.action_space.nvec))
        out.append((reward, obs.tobytes()))
    return out


def test_fleet_v4_is_registered_passes_the_checker_and_is_deterministic_for_a_seed() -> None:
    from gymnasium.utils.env_checker import check_env as gym_check

    assert envs.ENV_ID_V4 in gym.registry
    env = gym.make(envs.ENV_ID_V4, config=rich_config(episode_steps=8)).unwrapped
    assert env.config.action == "risk" and env.config.spot_acquisition == "trace"  # v3's charged world
    assert env.config.observation == "v3"
    assert isinstance(env.action_space, gym.spaces.MultiDiscrete)
    assert list(env.action_space.nvec) == [19, 19]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check(env, skip_render_check=True)
    again = gym.make(envs.ENV_ID_V4, config=rich_config(episode_steps=8)).unwrapped
    assert _rollout(env, 11) == _rollout(again, 11)


@pytest.mark.parametrize("env_id", [envs.ENV_ID, envs.ENV_ID_V2, envs.ENV_ID_V3])
def test_older_ids_keep_their_one_risk_action(env_id: str) -> None:
    env = gym.make(env_id, config=rich_config(episode_steps=4)).unwrapped
    assert env.config.action == "reopt" and env.codec.risks == (NEUTRAL_RISK,)
    assert list(env.action_space.nvec) == [7, 7]
    assert all(env.codec.decode(c).risk is None for c in range(env.codec.n))


def test_v4_codes_of_the_configured_risk_replay_v3_exactly() -> None:
    """The same codes 0 .. 2 L on Fleet-v3 and Fleet-v4: the same rewards and observations."""
    v3 = gym.make(envs.ENV_ID_V3, config=rich_config(episode_steps=6)).unwrapped
    v4 = gym.make(envs.ENV_ID_V4, config=rich_config(episode_steps=6)).unwrapped
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 7, size=(6, 2))
    out = []
    for env in (v3, v4):
        obs, _ = env.reset(seed=2, options={"day": 5})
        trace = [obs.tobytes()]
        for a in codes:
            obs, reward, _, _, info = env.step(a)
            trace.append((reward, obs.tobytes(), info["total"]["cost_usd"]))
        out.append(trace)
    assert out[0] == out[1]
