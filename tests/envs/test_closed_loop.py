"""The closed loop in the simulator: a world off the model, the servers' signals, the
correction, atoll/Fleet-v2."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from test_fleet_env import MODEL, rich_config, tiny_config

import atoll.envs as envs
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.latency import ServiceLatency
from atoll.envs.observation import observation_size
from atoll.envs.servers import implied_capacities, server_report


def test_v2_is_registered_and_passes_the_checkers_with_warnings_as_errors() -> None:
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    env = gym.make(envs.ENV_ID_V2, config=rich_config())
    inner = env.unwrapped
    assert isinstance(inner, FleetEnv)
    assert inner.config.correction and inner.config.slo_model == "latency"
    assert inner.observation_space.shape == (observation_size(2, len(inner.gpu_types), closed_loop=True),)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check(inner, skip_render_check=True)
        sb3_check(inner, warn=True)


def _run(env: FleetEnv, seed: int, steps: int) -> list[tuple[float, float, float]]:
    env.reset(seed=seed, options={"day": 5})
    out = []
    for _ in range(steps):
        _, reward, _, _, info = env.step(np.ones(len(env.models), dtype=int))
        out.append((reward, info["total"]["slo_attainment"], info["total"]["served_requests"]))
    return out


def test_a_seeded_capacity_error_reproduces() -> None:
    cfg = rich_config(capacity_error="calibration", correction=True, slo_model="latency", episode_steps=12)
    a, b, c = FleetEnv(cfg), FleetEnv(cfg), FleetEnv(cfg)
    ra, rb = _run(a, 3, 12), _run(b, 3, 12)
    _run(c, 4, 12)
    assert a.truth == b.truth and ra == rb
    assert a.correction.factors() == b.correction.factors()
    assert a.truth != c.truth


def test_the_exact_world_draws_nothing_and_v1_is_unchanged() -> None:
    plain = FleetEnv(rich_config(episode_steps=12))
    exact = FleetEnv(rich_config(capacity_error=0, episode_steps=12))
    assert not plain.config.closed_loop and not exact.truth
    assert _run(plain, 1, 12) == _run(exact, 1, 12)


def test_the_correction_learns_the_true_factor_within_an_hour_and_serves_the_demand() -> None:
    def env(correction: bool) -> FleetEnv:
        return FleetEnv(tiny_config(capacity_error="scale:0.7", correction=correction, slo_model="latency",
                                    episode_steps=48, forecaster="naive"))

    learned, blind = env(True), env(False)
    got = _run(learned, 0, 48)
    factors = learned.correction.factors()
    assert factors and all(k == pytest.approx(0.7, rel=0.05) for k in factors.values())
    assert set(factors) == set(learned.truth)
    # flat demand planned at its own level runs at utilization ~1: the latency SLO is low either
    # way there; what the correction buys is the capacity, seen in the share served
    served_learned = np.mean([s for _, _, s in got[12:]])
    served_blind = np.mean([s for _, _, s in _run(blind, 0, 48)[12:]])
    assert served_learned > served_blind * 1.2
    assert not blind.correction.factors()  # correction off: the planner learns nothing


def test_latency_slo_is_at_most_the_fluid_count() -> None:
    env = FleetEnv(rich_config(slo_model="latency", episode_steps=24))
    env.reset(seed=0, options={"day": 5})
    for _ in range(24):
        _, _, _, _, info = env.step(np.ones(2, dtype=int))
        total = info["total"]
        assert total["slo_attainment"] * total["requests"] <= total["served_requests"] + 1e-6
        for m in env.models:
            assert info["models"][m]["slo_attainment"] <= info["models"][m]["served_share"] + 1e-9


@pytest.mark.parametrize("rho", [0.3, 0.6, 0.9, 0.98, 1.3, 2.0])
def test_the_servers_signals_invert_to_the_true_capacity(rho: float) -> None:
    pre = [ServiceLatency.from_model(MODEL, "prefill", 2048.0)] * 2
    dec = [ServiceLatency.from_model(MODEL, "decode", 28.0)] * 2
    capacity = np.array([[40_000.0, 900.0], [4_000.0, 90.0]])
    demand = capacity * rho
    instances = np.array([[4.0, 3.0], [1.0, 1.0]])
    report = server_report(pre, dec, demand, capacity, instances, 300.0)
    served = np.minimum(demand, capacity)
    for ph, services in enumerate((pre, dec)):
        cap, informative, weight = implied_capacities(services, served[:, ph], report.mean_latency()[:, ph],
                                                      report.phase_waiting()[:, ph], instances[:, ph], 300.0)
        assert informative.all() and (weight > 0).all()
        assert cap == pytest.approx(capacity[:, ph], rel=0.02 if rho < 1 else 1e-9)


@pytest.mark.parametrize("rho", [0.3, 0.9, 1.3])
def test_both_phases_in_one_inversion_equal_each_phase_alone_to_the_bit(rho: float) -> None:
    # servers.learn inverts prefill and decode services together; the model is elementwise
    pre = [ServiceLatency.from_model(MODEL, "prefill", n) for n in (2048.0, 512.0)]
    dec = [ServiceLatency.from_model(MODEL, "decode", n) for n in (28.0, 300.0)]
    capacity = np.array([[40_000.0, 900.0], [4_000.0, 90.0]])
    demand = capacity * rho
    instances = np.array([[4.0, 3.0], [1.0, 1.0]])
    report = server_report(pre, dec, demand, capacity, instances, 300.0)
    served, obs, waiting = np.minimum(demand, capacity), report.mean_latency(), report.phase_waiting()
    both = implied_capacities([*pre, *dec], served.T.ravel(), obs.T.ravel(), waiting.T.ravel(),
                              instances.T.ravel(), 300.0)
    for ph, services in enumerate((pre, dec)):
        alone = implied_capacities(services, served[:, ph], obs[:, ph], waiting[:, ph], instances[:, ph],
                                   300.0)
        for got, want in zip(both, alone, strict=True):
            np.testing.assert_array_equal(got[2 * ph:2 * ph + 2], want)


def test_idle_servers_teach_nothing() -> None:
    pre = [ServiceLatency.from_model(MODEL, "prefill", 2048.0)]
    cap, informative, weight = implied_capacities(pre, np.array([0.0]), np.array([0.5]), np.array([0.0]),
                                                  np.array([1.0]), 300.0)
    assert not informative[0] and weight[0] == 0 and np.isnan(cap[0])


def test_families_are_named_in_one_pass_and_an_evicted_correction_is_freed() -> None:
    import gc
    import weakref

    from atoll.envs.capacity_error import family_of
    from atoll.envs.fleet_model import _CORRECTED_MAX, FleetModel

    fleet = FleetModel.from_config(rich_config(capacity_error="calibration", correction=True))
    assert fleet.families() == tuple(sorted({family_of(t) for t in fleet.base.templates}))
    assert all(fleet.family(t.key) == family_of(t) for t in fleet.base.templates)
    family = fleet.families()[0]
    first = fleet.corrected_replanner({family: 0.8})
    gone = weakref.ref(first.base.index)
    for k in range(_CORRECTED_MAX):  # new factors evict the first correction
        fleet.corrected_replanner({family: 0.7 - 0.05 * k})
    # its index was frozen out of the collector (gc.freeze) and must still go when dropped
    del first
    assert gone() is None and gc.isenabled()


def test_the_simulator_plans_with_the_limit_and_so_does_a_correction() -> None:
    from atoll.envs.config import SOLVER_NODE_LIMIT
    from atoll.envs.fleet_model import FleetModel

    fleet = FleetModel.from_config(rich_config(capacity_error="calibration", correction=True))
    assert fleet.base.node_limit == SOLVER_NODE_LIMIT == fleet.config.solver_node_limit
    family = fleet.families()[0]
    assert fleet.corrected_replanner({family: 0.8}).base.node_limit == SOLVER_NODE_LIMIT
    off = FleetModel.from_config(rich_config(solver_node_limit=None))
    assert off.base.node_limit is None
