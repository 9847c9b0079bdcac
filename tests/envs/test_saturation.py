"""Demand, not service: the arrivals a saturated server hides, recovered from what the simulator's
own servers report (served, queue growth, requests given up), and churn as a rollout figure."""

from __future__ import annotations

import numpy as np
import pytest
from test_fleet_env import rich_config

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import make_policy
from atoll.envs.rollout import run_policy
from atoll.envs.saturation import abandoned_requests, estimate_arrivals, planning_demand, saturated
from atoll.envs.servers import server_report, service_latencies
from atoll.envs.vocabulary import parse_policy

MODELS = ("Phi-4-14B", "GPT-OSS-20B")


@pytest.mark.parametrize("surge", [1.0, 3.0, 10.0])
def test_the_estimate_recovers_the_demand_an_overloaded_step_hides(surge: float) -> None:
    shape = np.array([[600.0, 20.0], [60.0, 20.0]])  # Phi-4's prompts ten times longer
    pre, dec = service_latencies(MODELS, shape)
    capacity = np.array([[800.0, 200.0], [800.0, 200.0]])
    demand = np.array([[180.0 * surge, 60.0], [180.0, 60.0]])
    step = 300.0
    base = np.array([[180.0, 60.0], [180.0, 60.0]])
    calm = server_report(pre, dec, base, capacity, np.ones((2, 2)), step / 5)
    waiting_before = last = calm.waiting  # the queue before the interval, at the base demand
    served = np.zeros((2, 2))
    aborted = np.zeros(2)
    for _ in range(5):  # one controller interval in five simulator steps
        report = server_report(pre, dec, demand, capacity, np.ones((2, 2)), step / 5)
        aborted += abandoned_requests(report.lost_requests, last, report.waiting)
        last = report.waiting
        served += np.stack([report.prefill.served_tps, report.decode.served_tps], axis=1) / 5
    estimate = estimate_arrivals(served, shape, waiting_before, last, aborted, step)
    over = demand[0, 0] > capacity[0, 0]
    # overloaded: served + queue growth + given up is what arrived; below capacity the standing
    # queue's own growth is all the estimate adds (it is not used there: see planning_demand)
    np.testing.assert_allclose(estimate[0, 0], demand[0, 0], rtol=1e-6 if over else 1e-2)
    assert served[0, 0] == pytest.approx(min(demand[0, 0], capacity[0, 0]))
    np.testing.assert_allclose(estimate[1], demand[1], rtol=1e-6)
    busy = saturated(report.mean_latency() / np.array([0.75 * pre[0].budget_s, dec[0].budget_s]),
                     aborted)
    if surge in (1.0, 10.0):  # at the base demand the servers are far from capacity; at 10x past it
        assert busy[0, 0] == (surge == 10.0)
    assert not busy[1].any()


def test_planning_demand_is_bounded_by_the_growth_cap() -> None:
    served = np.array([[800.0, 60.0]])
    arrivals = np.array([[8000.0, 60.0]])
    plan = planning_demand(served, arrivals, np.array([[True, False]]), np.array([[1.0, 1.0]]), 2.0, 4)
    assert plan[0, 0] == pytest.approx(800.0 * (2.0 + 4.0))  # 2 x 1 + 4 instances' worth at most
    assert plan[0, 1] == 60.0
    calm = planning_demand(served, arrivals, np.array([[False, False]]), np.ones((1, 2)), 2.0, 4)
    assert calm[0, 0] == 800.0
    # never below what was served, even when the queue drained
    low = estimate_arrivals(served, np.array([[600.0, 20.0]]), [50.0], [0.0], [0.0], 300.0)
    assert low[0, 0] == 800.0
    # a model without latency histograms but with requests left unserved: its prefill queues
    blind = saturated(np.full((1, 2), np.nan), [5.0])
    assert blind.tolist() == [[True, False]]


def test_a_rollout_reports_its_churn() -> None:
    env = FleetEnv(rich_config(episode_steps=13))
    ep = run_policy(env, make_policy(parse_policy("fixed:1"), len(env.models)), days=[5], seed=0)
    t = ep.totals()
    assert t["instances_added"] + t["instances_removed"] > 0
    hours = 13 * env.config.step_s / 3600.0
    assert t["churn_per_hour"] == pytest.approx(
        (t["instances_added"] + t["instances_removed"]) / hours
        / (ep.sums["instance_seconds"] / ep.sums["plan_seconds"]))
    never_rule = make_policy(parse_policy("never"), len(env.models))
    never = run_policy(FleetEnv(rich_config(episode_steps=13)), never_rule,
                       days=[5], seed=0)
    assert never.totals()["churn_per_hour"] <= t["churn_per_hour"]
