"""The lever oracle: the composition picks each block's least-cost preset per model (checked by
brute force), a uniform schedule is exactly its rule, a mixed one re-plans each model with its
block's preset, and paired ratios carry a t interval."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from test_contest import config

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.errors import InputError
from atoll.solvers.problem import Risk
from atoll.training.evaluate import env_at_level
from atoll.training.lever_oracle import (
    ScheduledRule,
    clock_schedule,
    compose,
    mean_interval,
    paired_ratio,
    preset_of,
    step_costs,
)

PRESETS = ("fixed:1@0.9", "fixed:1@0.9+h0.7")


def test_compose_takes_the_least_cost_preset_per_block_and_model() -> None:
    rng = np.random.default_rng(4)
    costs = rng.uniform(0, 10, size=(3, 10, 2))  # 3 presets, 10 steps, 2 models; blocks of 4, 4, 2
    schedule, estimate = compose(costs, 4)
    assert schedule.shape == (3, 2)
    best = 0.0
    for m in range(2):  # brute force: every choice of preset per block
        cells = [[costs[p, b * 4:(b + 1) * 4, m].sum() for p in range(3)] for b in range(3)]
        best_m = min(sum(cells[b][c[b]] for b in range(3)) for c in itertools.product(range(3), repeat=3))
        assert best_m == pytest.approx(sum(cells[b][schedule[b, m]] for b in range(3)))
        best += best_m
    assert estimate == pytest.approx(best)
    one_block, total = compose(costs, 100)
    assert one_block.shape == (1, 2) and total == pytest.approx(costs.sum(axis=1).min(axis=0).sum())
    with pytest.raises(InputError, match="block_steps must be an int >= 1"):
        compose(costs, 0)


def test_presets_are_fixed_rules_with_a_level() -> None:
    assert preset_of(parse_policy("fixed:1@0.9")) == (1, 0.9)
    assert preset_of(parse_policy("fixed:3@0.95+h0.7")) == (3, 0.95, Risk(headroom=0.7))
    with pytest.raises(InputError, match="must be fixed:K@q"):
        preset_of(parse_policy("threshold@0.9"))
    with pytest.raises(InputError, match="must be fixed:K@q"):
        preset_of(parse_policy("fixed:1"))


def _env() -> FleetEnv:
    return FleetEnv(dataclasses.replace(config(), days=(4, 5), episode_steps=24))


def test_a_uniform_schedule_is_its_rule_and_a_mixed_one_takes_each_blocks_preset() -> None:
    env = _env()
    presets = tuple(preset_of(parse_policy(s)) for s in PRESETS)
    for p, spec in enumerate(PRESETS):
        rule = make_policy(parse_policy(spec), 2)
        a, _ = step_costs(env_at_level(env, rule, {}), rule, days=[4, 5], seed=0, lost_usd_per_mtok=2.0)
        uniform = ScheduledRule(presets, np.full((8, 2), p), 6, (4, 5), 24)
        b, _ = step_costs(env_at_level(env, uniform, {}), uniform, days=[4, 5], seed=0,
                          lost_usd_per_mtok=2.0)
        assert np.array_equal(a, b)  # the same steps, to the cent
    mixed = ScheduledRule(presets, np.array([[0, 1], [1, 0]] * 4), 6, (4, 5), 24)
    at = env_at_level(env, mixed, {})
    assert at.config.action == "risk" and set(at.config.risk_menu) == {Risk(), Risk(headroom=0.7)}
    codec = at.codec
    obs, info = at.reset(seed=0, options={"day": 5})
    assert np.array_equal(mixed.act(obs, {"step": 0, "day": 5}), [0, 0])  # step 0 holds
    # day 5 starts at step 24: block 4, the schedule's [0, 1] row
    first, second = (codec.decode(int(c)) for c in mixed.act(obs, {"step": 1, "day": 5}))
    chosen = [presets[0], presets[1]]
    for reopt, option in zip((first, second), chosen, strict=True):
        want = option[2] if len(option) > 2 else Risk()
        assert reopt.kind == "full" and (reopt.risk or at.config.risk) == want
    with pytest.raises(InputError, match="day 7 is not among its days"):
        mixed.act(obs, {"step": 1, "day": 7})
    with pytest.raises(InputError, match="has 2 blocks; 2 days of 24 steps need 8"):
        ScheduledRule(presets, np.zeros((2, 2), dtype=int), 6, (4, 5), 24)


def test_the_run_oracle_is_measured_and_paired() -> None:
    env = _env()
    runs = []
    for spec in PRESETS:
        rule = make_policy(parse_policy(spec), 2)
        at = env_at_level(env, rule, {})
        runs.append(step_costs(at, rule, days=[4], seed=0, lost_usd_per_mtok=2.0)[0])
    schedule, estimate = compose(np.stack(runs), 6)
    oracle = ScheduledRule(tuple(preset_of(parse_policy(s)) for s in PRESETS), schedule, 6, (4,), 24)
    measured, episode = step_costs(env_at_level(env, oracle, {}), oracle, days=[4], seed=0,
                                   lost_usd_per_mtok=2.0)
    assert measured.shape == runs[0].shape and len(episode.steps) == 24
    assert estimate <= min(r.sum() for r in runs) + 1e-9  # the composition is never above a uniform preset


def test_paired_ratios_carry_a_t_interval() -> None:
    r = paired_ratio([9.0, 10.0, 11.0, 10.0], [10.0, 10.0, 10.0, 10.0])
    assert r["mean"] == pytest.approx(1.0) and r["tie"] is True and r["seeds"] == 4
    half = 3.182446305284263 * np.std([0.9, 1.0, 1.1, 1.0], ddof=1) / 2  # t(0.975, 3)
    assert r["high"] - r["mean"] == pytest.approx(half)
    clear = paired_ratio([9.0, 9.1, 8.9], [10.0, 10.0, 10.0])
    assert clear["high"] < 1.0 and clear["tie"] is False
    assert paired_ratio([1.0], [2.0])["low"] is None
    with pytest.raises(InputError, match="paired per seed"):
        paired_ratio([1.0, 2.0], [1.0])
    assert mean_interval([0.9, 1.0, 1.1, 1.0]) == r  # ratios already paired: the same interval
    with pytest.raises(InputError, match="finite numbers"):
        mean_interval([1.0, float("nan")])


def test_the_clock_schedule_sums_the_days_hour_by_hour() -> None:
    rng = np.random.default_rng(9)
    costs = rng.uniform(0, 10, size=(2, 3 * 8, 2))  # 2 presets, 3 days of 8 steps, 2 models
    schedule = clock_schedule(costs, 3, 4)  # 2 blocks a day
    assert schedule.shape == (2, 2)
    for b, m in itertools.product(range(2), range(2)):
        totals = [sum(costs[p, d * 8 + b * 4: d * 8 + b * 4 + 4, m].sum() for d in range(3))
                  for p in range(2)]
        assert schedule[b, m] == int(np.argmin(totals))
    with pytest.raises(InputError, match="24 steps are not 5 whole days"):
        clock_schedule(costs, 5, 4)
