"""FleetEnv: checkers, determinism, a hand-computed episode, start-up, preemption, policies, errors."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import pytest
from tiny_fleet import two_model_templates

from atoll import envs
from atoll.envs.config import FleetConfig, RewardWeights
from atoll.envs.demand import DemandError
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import make_policy
from atoll.envs.rollout import run_policy
from atoll.envs.vocabulary import parse_policy
from atoll.forecast.workloads import DemandSeries
from atoll.solvers.types import Phase, Service, Stage, Template

MODEL = "Phi-4-14B"  # 40 layers of 0.735 GB; scenario shape: 2047.85 input / 27.88 output tokens
USE2 = "aws:us-east-2"
PRICE_L40S, PRICE_L4 = 1.861, 0.8048  # on-demand $/node-hour in aws:us-east-2 (catalog)
STARTUP = 180.0 + 40 * 0.735  # boot + all 40 layers at 1 GB/s = 209.4 s
PREFILL = Template(Service(MODEL, Phase.PREFILL), USE2, (("1xL40S", 1),), (Stage(40, ("1xL40S",)),), 800.0)
DECODE = Template(Service(MODEL, Phase.DECODE), USE2, (("1xL4", 1),), (Stage(40, ("1xL4",)),), 20.0)


def series(rates: np.ndarray, name: str = "synthetic") -> DemandSeries:
    ones = np.ones(len(rates))
    return DemandSeries(name, 300.0, rates, 2048 * ones, 28 * ones)


def flat(days: int = 6, rate: float = 1.0) -> DemandSeries:
    return series(np.full(days * 288, rate))


def tiny_config(**changes: object) -> FleetConfig:
    base: dict[str, object] = dict(scenario="core", models=(MODEL,), templates=(PREFILL, DECODE),
                                   demand=(flat(),), forecaster="naive", availability="ample",
                                   prices="on-demand", days=(4, 6))
    base.update(changes)
    return FleetConfig(**base)  # type: ignore[arg-type]


def rich_config(**changes: object) -> FleetConfig:
    """Two models, both regions, several configs, bursty demand, spot availability."""
    rng = np.random.default_rng(7)
    t = np.arange(6 * 288)
    shape = 1.0 + 0.6 * np.sin(2 * np.pi * t / 288)
    demand = tuple(series(np.maximum(shape * (2 + i) * (1 + 0.2 * rng.standard_normal(len(t))), 0.05),
                          f"s{i}") for i in range(2))
    base: dict[str, object] = dict(scenario="core", models=("Phi-4-14B", "GPT-OSS-20B"),
                                   templates=two_model_templates(), demand=demand, forecaster="naive",
                                   availability="spot", days=(4, 6))
    base.update(changes)
    return FleetConfig(**base)  # type: ignore[arg-type]


def test_registered_and_checkers_pass_with_warnings_as_errors() -> None:
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    assert envs.ENV_ID in gym.registry
    env = gym.make(envs.ENV_ID, config=rich_config())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check(env.unwrapped, skip_render_check=True)
        sb3_check(FleetEnv(rich_config()), warn=True)


def rollout(seed: int, steps: int = 200) -> list[tuple[object, ...]]:
    env = FleetEnv(rich_config(episode_steps=steps))
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    out: list[tuple[object, ...]] = [obs.tobytes()]
    for _ in range(steps):
        action = env.action_space.sample()
        obs, reward, term, trunc, info = env.step(action)
        assert env.observation_space.contains(obs)
        out.append((obs.tobytes(), reward, term, trunc, info["total"]["cost_usd"],
                    info["total"]["preemptions"], env.state.planned().counts))
    assert trunc
    return out


def test_same_seed_same_rollout_for_200_steps() -> None:
    a = rollout(3)
    assert a == rollout(3)
    assert a != rollout(4)


def test_hand_computed_three_step_episode() -> None:
    env = FleetEnv(tiny_config(episode_steps=3))
    obs, info = env.reset(seed=0, options={"day": 5})
    # prefill 2047.85 tok/s (x1.02 grid) / 800 -> 3 L40S instances; decode 27.88 / 20 -> 2 L4
    assert env.state.running == {PREFILL.key: 3, DECODE.key: 2}
    step_cost = (3 * PRICE_L40S + 2 * PRICE_L4) * 300 / 3600
    rewards = []
    for action in ([0], [1], [0]):
        obs, reward, terminated, truncated, info = env.step(np.array(action))
        rewards.append(reward)
        assert info["total"]["cost_usd"] == pytest.approx(step_cost)
        assert info["total"]["slo_attainment"] == 1.0 and info["total"]["unserved_tokens"] == 0.0
    assert rewards == pytest.approx([-step_cost, -(step_cost + 0.02), -step_cost])
    assert (terminated, truncated) == (False, True)
    assert env.state.running == {PREFILL.key: 3, DECODE.key: 2}


def test_unserved_demand_is_priced_in_the_reward() -> None:
    env = FleetEnv(tiny_config(episode_steps=2, reward=RewardWeights(unserved_usd_per_mtok=5.0)))
    env.reset(seed=0, options={"day": 5})
    env.state.running = {PREFILL.key: 2, DECODE.key: 2}  # 1600 of 2047.85 prefill tok/s
    _, reward, _, _, info = env.step(np.array([0]))
    share = 1600 / (1.0 * env.fleet.shape[0, 0])
    tokens = (env.fleet.shape[0].sum()) * 300
    assert info["total"]["slo_attainment"] == pytest.approx(share)
    assert info["total"]["unserved_tokens"] == pytest.approx((1 - share) * tokens)
    cost = (2 * PRICE_L40S + 2 * PRICE_L4) * 300 / 3600
    assert reward == pytest.approx(-(cost + 5.0 * (1 - share) * tokens / 1e6))


def test_added_instances_serve_only_after_startup() -> None:
    rates = np.full(6 * 288, 1.0)
    rates[4 * 288 + 3:] = 2.0  # day 5: demand doubles at step 3
    env = FleetEnv(tiny_config(demand=(series(rates),)))
    env.reset(seed=0, options={"day": 5, "planning": "oracle"})
    env.step(np.array([0]))
    # at step 1 the oracle look-ahead (3 steps) sees the jump: 6 prefill and 3 decode instances
    _, _, _, _, info = env.step(np.array([1]))
    assert env.state.planned().as_dict() == {PREFILL.key: 6, DECODE.key: 3}
    ready = info["models"][MODEL]["ready_prefill"]
    assert ready == pytest.approx(3 * 800 + 3 * 800 * (300 - STARTUP) / 300)
    assert info["total"]["cost_usd"] == pytest.approx((6 * PRICE_L40S + 3 * PRICE_L4) * 300 / 3600)
    _, _, _, _, info = env.step(np.array([0]))
    assert info["models"][MODEL]["ready_prefill"] == pytest.approx(6 * 800)


class _DropAt:
    """Availability that removes all but one 1xL40S node in us-east-2 from ``at`` seconds on."""

    def __init__(self, at: float) -> None:
        self.at = at

    def reset(self, rng: np.random.Generator) -> None:
        return None

    def capacity(self, seconds: float) -> Mapping[tuple[str, str], int]:
        return {(USE2, "1xL40S"): 1 if seconds >= self.at else 1000, (USE2, "1xL4"): 1000}


def test_preemption_removes_capacity_at_once() -> None:
    env = FleetEnv(tiny_config())
    start = (5 - 1) * 86400.0
    env._availability = _DropAt(start + 300)  # type: ignore[assignment]
    env.reset(seed=0, options={"day": 5})
    obs, _, _, _, info = env.step(np.array([0]))
    assert info["total"]["preemptions"] == 2
    assert env.state.running[PREFILL.key] == 1
    assert obs[7] == 1.0  # "preempted" flag of the model
    _, _, _, _, info = env.step(np.array([0]))
    assert info["models"][MODEL]["ready_prefill"] == pytest.approx(800)
    assert info["total"]["slo_attainment"] == pytest.approx(800 / env.fleet.shape[0, 0])
    # the threshold rule re-plans after a preemption; within 1 node there is no plan that meets
    # demand, so the goodput fallback keeps what fits
    _, _, _, _, info = env.step(make_policy(parse_policy("threshold"), 1).act(obs, info))
    assert info["solve"]["mode"] == "goodput"


def test_never_on_flat_demand_keeps_one_plan_all_day() -> None:
    env = FleetEnv(tiny_config())
    policy = make_policy(parse_policy("never"), 1)
    obs, info = env.reset(seed=0, options={"day": 5, **policy.reset_options()})
    first = env.state.planned()
    for _ in range(288):
        obs, _, _, trunc, info = env.step(policy.act(obs, info))
        assert env.state.planned() == first
    assert trunc


def test_rule_policies_run_and_total() -> None:
    env = FleetEnv(rich_config(episode_steps=24))
    totals = {}
    for name in ("fixed:1", "fixed:6", "threshold", "never", "hindsight"):
        ep = run_policy(env, make_policy(parse_policy(name), 2), days=[5], seed=1)
        totals[name] = ep.totals()
        assert len(ep.steps) == 24
    assert totals["fixed:1"]["reoptimizations"] == 23 * 2
    assert totals["fixed:6"]["reoptimizations"] == 3 * 2
    assert totals["never"]["reoptimizations"] == 0
    for t in totals.values():
        assert 0.0 <= t["goodput_share"] <= 1.0 and t["cost_usd"] > 0


def test_invalid_actions_and_configs_give_clear_errors() -> None:
    env = FleetEnv(tiny_config())
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(np.array([0]))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"MultiDiscrete\(\[7\] \* 1\).*Phi-4-14B.*2=grow@0.9"):
        env.step(np.array([0, 1]))
    with pytest.raises(ValueError, match="MultiDiscrete"):
        env.step(np.array([7]))
    with pytest.raises(ValueError, match="MultiDiscrete"):
        env.step(np.array([0.5]))
    v0 = FleetEnv(tiny_config(action="binary"))
    v0.reset(seed=0)
    with pytest.raises(ValueError, match=r"MultiBinary\(1\).*Phi-4-14B"):
        v0.step(np.array([2]))
    with pytest.raises(ValueError, match="'action_levels'"):
        tiny_config(action_levels=(0.42,))
    with pytest.raises(ValueError, match="'availability' must be one of ample, scarce, spot"):
        tiny_config(availability="sometimes")
    with pytest.raises(ValueError, match="'planning_quantile'"):
        tiny_config(planning_quantile=0.42)
    with pytest.raises(DemandError, match="days 2-3 are outside 4-6"):
        FleetEnv(tiny_config(days=(2, 3)))
    with pytest.raises(ValueError, match="initial_plan"):
        env.reset(options={"initial_plan": "yesterday"})
    with pytest.raises(KeyError, match="unknown policy 'sometimes'"):
        make_policy(parse_policy("sometimes"), 1)
    with pytest.raises(ValueError, match="fixed:K"):
        make_policy(parse_policy("fixed:0"), 1)


def test_an_env_never_reuses_the_planner_of_freed_templates_whose_id_is_reused() -> None:
    """Process-wide planner caches key on content: a freed templates tuple's id() is handed to the
    next tuple of its size (the loop below finds it), and must not bring back the old planner."""
    import gc

    def decode_instances(env: FleetEnv) -> int:
        env.reset(seed=0, options={"day": 5})
        return sum(n for k, n in env.state.running.items() if "decode" in k)

    slow = DECODE  # 20 tokens/s per instance
    fast = Template(DECODE.service, USE2, DECODE.nodes, DECODE.stages, 200.0)
    env = FleetEnv(tiny_config(templates=tuple([PREFILL, slow])))
    slow_n = decode_instances(env)
    old = id(env.config.templates)
    del env
    gc.collect()
    reused, alive = None, []  # kept alive, so each candidate takes the next free slot
    for _ in range(100_000):
        candidate = tuple([PREFILL, fast])
        if id(candidate) == old:
            reused = candidate
            break
        alive.append(candidate)
    del alive
    fast_n = decode_instances(FleetEnv(tiny_config(templates=reused or tuple([PREFILL, fast]))))
    assert fast_n < slow_n  # planned with the 200 tokens/s template, not the freed 20 tokens/s one


def test_the_docstring_table_lists_every_observation_feature_in_order() -> None:
    import re

    from atoll.envs.observation import (
        CLOSED_LOOP_FEATURES,
        FLEET_FEATURES,
        MODEL_FEATURES,
        POOL_FEATURES,
        RISK_FEATURES,
    )

    rows = re.findall(r"^\s*12 [mM][^`]*``([^`]+)``.*?\s(-?\d+)\s+(-?\d+)\s*$", FleetEnv.__doc__ or "",
                      flags=re.MULTILINE)
    listed = [(name.split("/")[-1], float(lo), float(hi)) for name, lo, hi in rows]
    expected = ([(f[0], f[2], f[3]) for f in MODEL_FEATURES] + [("<gpu type>", 0.0, 1.0)]
                + [(f[0], f[2], f[3]) for f in FLEET_FEATURES]
                + [(f[0], f[2], f[3]) for f in CLOSED_LOOP_FEATURES]
                + [(f[0], f[2], f[3]) for f in RISK_FEATURES]
                + [("<gpu type>", f[2], f[3]) for f in POOL_FEATURES])
    assert listed == expected


def test_make_before_break_counts_the_replaced_instance_until_the_new_one_serves() -> None:
    from atoll.envs.fleet import FleetState
    from atoll.solvers.problem import Allocation

    other = Template(PREFILL.service, USE2, (("1xL4", 1),), (Stage(40, ("1xL4",)),), 300.0)
    for transition, old_share in (("make-before-break", STARTUP / 300), ("break-before-make", 0.0)):
        env = FleetEnv(tiny_config(templates=(PREFILL, other, DECODE), transition=transition))
        state = FleetState(running={PREFILL.key: 1, DECODE.key: 2})
        env.fleet.apply(state, Allocation.of({other.key: 1, DECODE.key: 2}))
        ready, planned = env.fleet.capacity(state, 300.0)
        # the old 800 tokens/s instance serves until the new one (209.4 s start-up) is ready
        assert ready[0, 0] == pytest.approx(800 * old_share + 300 * (300 - STARTUP) / 300)
        assert planned[0, 0] == pytest.approx(300)
        cost = env.fleet.cost(state, 300.0)[0]
        billed_old = min(STARTUP + 60, 300) if transition == "make-before-break" else 60
        assert cost == pytest.approx((PRICE_L40S * billed_old + PRICE_L4 * 300 + 2 * PRICE_L4 * 300) / 3600)


def test_a_hedged_env_plans_both_tiers_and_reports_the_on_demand_share() -> None:
    from atoll.solvers.tiers import split_tier

    env = FleetEnv(tiny_config(availability="hedged", ondemand_quota="ample"))
    env.reset(seed=0, options={"day": 5})
    tiers = {split_tier(env.fleet.templates[k].region)[1] for k in env.fleet.templates}
    assert tiers == {"on-demand", "spot"}
    _, _, _, _, info = env.step(np.array([1]))
    total = info["total"]
    assert total["node_hours"] > 0 and 0 <= total["ondemand_node_hours"] <= total["node_hours"]
