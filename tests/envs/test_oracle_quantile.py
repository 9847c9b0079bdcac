"""``oracle-quantile``: plans for each step's quantile of the demand sampled anew from the true
rate, at the re-plan's level; only a sampled ServeGen workload has such a demand to draw."""

from __future__ import annotations

import numpy as np
import pytest
from test_fleet_env import MODEL, series, tiny_config

from atoll.envs.demand import DemandError, sampled_quantiles, workload_series
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.errors import InputError
from atoll.solvers.scenarios import SCENARIOS


def test_the_quantiles_are_read_over_fresh_draws_of_the_demand(shared_data: object) -> None:
    spec = SCENARIOS["core"]
    steps = 288
    got = sampled_quantiles("servegen", spec.models, spec.req_per_s, 300.0, levels=(0.5, 0.9), steps=steps,
                            draws=2, first_seed=10_000)
    draws = np.stack([np.stack([s.requests_per_s[:steps] for s in
                                workload_series("servegen", spec.models, spec.req_per_s, 300.0, seed=seed)])
                      for seed in (10_000, 10_001)])
    assert set(got) == {0.5, 0.9} and got[0.9].shape == (len(spec.models), steps)
    np.testing.assert_allclose(got[0.9], np.quantile(draws, 0.9, axis=0))
    assert np.all(got[0.9] >= got[0.5]) and np.any(got[0.9] > got[0.5])
    assert not np.array_equal(draws[0], draws[1])  # two realizations, not one read twice


def test_counts_have_no_sampling_model_to_draw_from() -> None:
    with pytest.raises(DemandError, match=r"workload 'azure:code' is given as counts — use oracle-rate"):
        sampled_quantiles("azure:code", (MODEL,), 1.0, 300.0, levels=(0.9,), steps=10)
    with pytest.raises(DemandError, match="draws must be an integer >= 2, got 1"):
        sampled_quantiles("servegen", (MODEL,), 1.0, 300.0, levels=(0.9,), steps=10, draws=1)
    env = FleetEnv(tiny_config())
    with pytest.raises(DemandError, match="oracle-quantile needs demand sampled from a ServeGen workload"):
        env.rate_quantiles  # noqa: B018 - the property is what raises


def test_a_replan_takes_the_quantile_of_its_own_level_over_the_look_ahead() -> None:
    rng = np.random.default_rng(0)
    rates = np.maximum(1.0 + 0.5 * rng.standard_normal(6 * 288), 0.05)
    env = FleetEnv(tiny_config(demand=(series(rates),)))
    q = env.config.planning_quantile
    low, high = rates[None, :] * 1.1, rates[None, :] * 1.5
    # what sampled_quantiles would give, without the sampling
    env.planning_demand.quantiles = {q: low, 0.99: high}
    g, h = 4 * 288 + 10, env.book.horizon
    np.testing.assert_allclose(env.planning_demand(g, "oracle-quantile"),
                               env.fleet.tokens(low[:, g: g + h].max(axis=1)))
    np.testing.assert_allclose(env.planning_demand(g, "oracle-quantile", [0.99]),
                               env.fleet.tokens(high[:, g: g + h].max(axis=1)))
    policy = make_policy(parse_policy("oracle-quantile"), 1)
    env.reset(seed=0, options={"day": 5, **policy.reset_options()})
    _, _, _, _, info = env.step(policy.act(np.zeros(1), {}))
    assert info["total"]["cost_usd"] > 0 and MODEL in info["models"]


def test_oracle_quantile_takes_a_level_and_a_risk_but_no_argument() -> None:
    policy = make_policy(parse_policy("oracle-quantile@0.95+h0.85"), 2)
    assert policy.planning_quantile == 0.95 and policy.reset_options() == {"planning": "oracle-quantile"}
    assert str(parse_policy("oracle-quantile@0.9+h0.85")) == "oracle-quantile@0.9+h0.85"
    with pytest.raises(InputError, match="wrong number of arguments"):
        make_policy(parse_policy("oracle-quantile:3"), 1)
