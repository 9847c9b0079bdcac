"""``oracle-rate``: plans on the trace's underlying rate, never on the sampled counts."""

from __future__ import annotations

import numpy as np
import pytest
from test_fleet_env import MODEL, series, tiny_config

from atoll.envs import demand as demand_mod
from atoll.envs.demand import smoothed_rates, underlying_rates, workload_series
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.errors import InputError
from atoll.solvers.scenarios import SCENARIOS

MODELS = SCENARIOS["core"].models


def test_servegen_underlying_rate_is_the_window_rate_and_never_sampled(monkeypatch: pytest.MonkeyPatch
                                                                       ) -> None:
    spec = SCENARIOS["core"]
    held = workload_series("servegen", MODELS, spec.req_per_s, 300.0, resample="hold")
    steps = 5 * 288

    def no_sampling(*args: object, **kwargs: object) -> None:
        raise AssertionError("oracle-rate drew sampled counts")

    monkeypatch.setattr(demand_mod, "sample_counts", no_sampling)
    demand_mod._named_series.cache_clear()  # a cached sampled series must not stand in either
    rate = underlying_rates("servegen", MODELS, spec.req_per_s, 300.0, resample="sampled", steps=steps)
    np.testing.assert_array_equal(rate, np.stack([s.requests_per_s[:steps] for s in held]))


def test_request_logs_get_a_centered_smoothed_rate() -> None:
    y = np.array([[0.0, 3.0, 0.0, 3.0, 0.0, 3.0, 0.0]])
    np.testing.assert_allclose(smoothed_rates(y, 3)[0], [1.5, 1.0, 2.0, 1.0, 2.0, 1.0, 1.5])


def test_oracle_rate_plans_the_smoothed_rate_not_the_counts() -> None:
    rng = np.random.default_rng(0)
    rates = np.maximum(1.0 + 0.5 * rng.standard_normal(6 * 288), 0.05)
    env = FleetEnv(tiny_config(demand=(series(rates),)))
    g = 4 * 288 + 10
    truth = smoothed_rates(rates[None, :])[:, g: g + env.book.horizon].max(axis=1)
    np.testing.assert_allclose(env.planning_demand(g, "oracle-rate"), env.fleet.tokens(truth))
    assert not np.allclose(env.planning_demand(g, "oracle-rate"), env.planning_demand(g, "oracle"))
    policy = make_policy(parse_policy("oracle-rate"), 1)
    assert policy.reset_options() == {"planning": "oracle-rate"}
    env.reset(seed=0, options={"day": 5, **policy.reset_options()})
    _, _, _, _, info = env.step(policy.act(np.zeros(1), {}))
    assert info["total"]["cost_usd"] > 0 and MODEL in info["models"]
    with pytest.raises(InputError, match="oracle-rate takes no planning level"):
        make_policy(parse_policy("oracle-rate@0.9"), 1)
