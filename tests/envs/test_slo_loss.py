"""The split of a policy's missed requests by cause, on a tiny fleet."""

from __future__ import annotations

import dataclasses

import pytest
from test_fleet_env import rich_config

from atoll.envs import CLOSED_LOOP
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import make_policy
from atoll.envs.rollout import run_policy
from atoll.envs.slo_loss import BUCKETS, MissCounter, miss_breakdown
from atoll.envs.vocabulary import parse_policy


@pytest.mark.parametrize("availability", ["spot", "ample"])
def test_the_buckets_add_up_to_what_the_rollout_missed(availability: str) -> None:
    config = dataclasses.replace(rich_config(availability=availability, episode_steps=96), **CLOSED_LOOP)
    policy = make_policy(parse_policy("fixed:1"), 2)
    out = miss_breakdown(FleetEnv(config), policy, days=[4, 5], seed=7)
    totals = run_policy(FleetEnv(config), policy, days=[4, 5], seed=7).totals()
    fleet = out["fleet"]
    assert fleet["slo_attainment"] == pytest.approx(totals["slo_attainment"], rel=1e-9)
    assert fleet["cost_usd"] == pytest.approx(totals["cost_usd"], rel=1e-9)
    assert fleet["missed_requests"] > 0
    assert sum(fleet[f"{b}_share"] for b in BUCKETS) == pytest.approx(1.0)
    assert fleet["latency_share"] > 0  # the latency SLO misses requests that capacity served
    models = out["models"]
    for key in ("missed_requests", "cost_usd"):
        assert sum(v[key] for v in models.values()) == pytest.approx(fleet[key])
    if availability == "ample":  # nothing is ever preempted
        assert totals["preemptions"] == 0
        assert fleet["after_preemption_share"] == 0 and fleet["steps_after_preemption_share"] == 0
    else:  # the spot traces preempt on these days, and the steps after it miss requests
        assert totals["preemptions"] > 0
        assert fleet["steps_after_preemption_share"] > 0 and fleet["after_preemption_share"] > 0
    with pytest.raises(ValueError, match="window must be >= 1"):
        miss_breakdown(FleetEnv(config), policy, days=[4], seed=0, window=0)


def test_the_counter_fed_by_a_rollout_equals_the_breakdown_and_restarts_each_day() -> None:
    config = dataclasses.replace(rich_config(availability="spot", episode_steps=96), **CLOSED_LOOP)
    policy = make_policy(parse_policy("fixed:1"), 2)
    whole = miss_breakdown(FleetEnv(config), policy, days=[4, 4], seed=7)
    counter = MissCounter(FleetEnv(config).models)
    run_policy(FleetEnv(config), policy, days=[4, 4], seed=7, on_step=counter.add)
    assert counter.result() == whole
    assert counter.steps == 2 * 96


def _info(day: int, step: int, preempted: int, slo: float = 0.5) -> dict[str, object]:
    return {"day": day, "step": step, "models": {"m": {"requests": 10.0, "served_share": 1.0,
                                                       "slo_attainment": slo, "cost_usd": 1.0,
                                                       "preemptions": preempted}}}


def test_a_preemption_at_a_days_last_step_does_not_reach_the_next_day() -> None:
    counter = MissCounter(["m"])
    for info in (_info(4, 1, 0), _info(4, 2, 1), _info(4, 3, 0), _info(5, 1, 0), _info(5, 2, 0)):
        counter.add(info)
    fleet = counter.result()["fleet"]
    assert counter.steps_after.tolist() == [1.0]  # only day 4's step 3 followed a preemption
    assert fleet["missed_requests"] == pytest.approx(25.0)
    assert fleet["after_preemption_share"] == pytest.approx(5.0 / 25.0)
    assert fleet["latency_share"] == pytest.approx(20.0 / 25.0)
    again = MissCounter(["m"])
    for info in (_info(4, 1, 0), _info(4, 2, 1), _info(4, 1, 0)):  # the same day run again
        again.add(info)
    assert again.steps_after.tolist() == [0.0]
