"""Fleet-v1's action: the codec, both registered versions through the checkers, grow never
removing an instance, and the rule policies behaving in v1 exactly as in v0."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from test_fleet_env import rich_config

from atoll import envs
from atoll.envs.actions import ActionCodec
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import make_policy
from atoll.envs.rollout import run_policy
from atoll.envs.vocabulary import Reoptimization, parse_policy
from atoll.solvers.errors import InputError


def test_codec_round_trip_and_level_zero_is_the_configured_one() -> None:
    codec = ActionCodec.for_config(0.9, (0.7, 0.9, 0.95))
    assert codec.levels == (0.9, 0.7, 0.95) and codec.n == 7
    assert codec.names() == ["hold", "full@0.9", "grow@0.9", "full@0.7", "grow@0.7", "full@0.95", "grow@0.95"]
    for code in range(codec.n):
        r = codec.decode(code)
        assert codec.encode(r.kind, r.level) == code
    assert codec.decode(1) == Reoptimization("full", 0.9)  # v0's bit 1
    np.testing.assert_array_equal(codec.relevel(np.array([0, 1, 2]), 0.7), [0, 3, 4])
    with pytest.raises(InputError, match="not one of this env's action levels"):
        codec.encode("grow", 0.5)
    with pytest.raises(ValueError, match="outside 0..6"):
        codec.decode(7)


@pytest.mark.parametrize("env_id, space", [(envs.ENV_ID, gym.spaces.MultiDiscrete),
                                           (envs.ENV_ID_V0, gym.spaces.MultiBinary)])
def test_both_versions_pass_the_checkers_with_warnings_as_errors(env_id: str, space: type) -> None:
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    env = gym.make(env_id, config=rich_config())
    assert isinstance(env.action_space, space)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check(env.unwrapped, skip_render_check=True)
        sb3_check(env.unwrapped, warn=True)


@pytest.mark.parametrize("seed", range(4))
def test_grow_never_removes_an_instance(seed: int) -> None:
    """Property over random states (random actions, ample availability so nothing is preempted):
    after a step in which a model was grown, every template of that model holds at least the
    instances it had planned before the step."""
    env = FleetEnv(rich_config(availability="ample", prices="on-demand", episode_steps=60))
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    grown = 0
    for _ in range(60):
        action = rng.integers(0, env.codec.n, size=len(env.models))
        before = env.state.planned().as_dict()
        _, _, _, trunc, info = env.step(action)
        after = env.state.planned().as_dict()
        for i, name in enumerate(env.models):
            if env.codec.decode(int(action[i])).kind != "grow":
                continue
            grown += 1
            for key, n in before.items():
                if env.fleet.info(key)[0] == i:
                    assert after.get(key, 0) >= n, (name, key, n, after.get(key, 0))
        assert info["total"]["grows"] == sum(env.codec.decode(int(a)).kind == "grow" for a in action)
        if trunc:
            break
    assert grown > 0


@pytest.mark.parametrize("rule", ["fixed:1", "fixed:3", "threshold", "threshold:0.7:1", "never", "hindsight"])
def test_every_rule_behaves_in_v1_as_in_v0(rule: str) -> None:
    """The rules emit 0/1, which mean the same in both versions: same totals on a seeded run."""
    totals = {}
    for action in ("binary", "reopt"):
        env = FleetEnv(rich_config(action=action, episode_steps=96))
        ep = run_policy(env, make_policy(parse_policy(rule), len(env.models)), days=[5], seed=7)
        totals[action] = {k: v for k, v in ep.totals().items() if k != "solver_seconds"}
    assert totals["binary"] == totals["reopt"]


def test_grow_rule_grows_every_step_and_replans_fully_every_k() -> None:
    env = FleetEnv(rich_config(episode_steps=13))
    ep = run_policy(env, make_policy(parse_policy("grow:6"), len(env.models)), days=[5], seed=0)
    actions = [row[f"{env.models[0]}/reoptimizations"] for row in ep.steps]
    assert actions[0] == 0 and all(actions[1:])  # step 0 holds: the initial plan was just made
    assert ep.totals()["reoptimizations"] == 12 * len(env.models)
