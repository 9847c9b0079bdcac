"""The split of a policy's missed requests by cause, on a tiny fleet."""

from __future__ import annotations

import dataclasses

import pytest
from test_fleet_env import rich_config

from atoll.envs import CLOSED_LOOP
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import make_policy
from atoll.envs.rollout import run_policy
from atoll.envs.slo_loss import BUCKETS, miss_breakdown


@pytest.mark.parametrize("availability", ["spot", "ample"])
def test_the_buckets_add_up_to_what_the_rollout_missed(availability: str) -> None:
    config = dataclasses.replace(rich_config(availability=availability, episode_steps=96), **CLOSED_LOOP)
    policy = make_policy("fixed:1", 2)
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
