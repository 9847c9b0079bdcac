"""A fleet file is a value that travels: its config runs the same in a spawned worker process, a
forkserver SubprocVecEnv and a Ray task as here, with no process-wide registry behind it."""

from __future__ import annotations

import multiprocessing
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from test_fleet_file import FLEET, request_log

from atoll.envs.config import FleetConfig
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.fleet_file import fleet_config, read_fleet
from atoll.envs.vocabulary import PolicySpec, parse_policy
from atoll.training.contest import run_rule, run_rules

RULES = ("never", "fixed:12")
DAYS = (4,)


@pytest.fixture()
def config(tmp_path: Path) -> FleetConfig:
    """A fleet with a model and a region of its own (neither is in the shipped catalog)."""
    request_log(tmp_path / "requests.csv")
    doc = {**FLEET, "regions": [*FLEET["regions"],
                                {"name": "lab:rack-1", "offers": [{"config": "4xL40S", "on_demand": 7.0}]}]}
    doc["availability"] = {"static": {**FLEET["availability"]["static"], "lab:rack-1/4xL40S": 2}}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(doc))
    return fleet_config(read_fleet(tmp_path / "fleet.yaml"), (4, 4), forecaster="naive")


def _figures(runs: dict[str, list[Any]]) -> dict[str, list[dict[str, float]]]:
    """Each rule's totals without the wall-clock ones (solver seconds differ run to run)."""
    return {s: [{k: v for k, v in t.items() if "seconds" not in k} for t in ts] for s, ts in runs.items()}


def _here(config: FleetConfig) -> dict[str, list[dict[str, float]]]:
    return _figures({s: [run_rule(config, parse_policy(s), DAYS, 0, False)] for s in RULES})


def _specs() -> list[PolicySpec]:
    return [parse_policy(s) for s in RULES]


def test_the_config_carries_the_fleet_through_pickle(config: FleetConfig) -> None:
    back = pickle.loads(pickle.dumps(config))
    assert back.fleet == config.fleet and back.fleet is not None
    assert "lab:rack-1" in back.scenario_spec.catalog.regions
    assert back.scenario_spec.model("Acme-8B").layers == 32


def test_a_spawned_worker_pool_runs_the_fleet_as_this_process_does(config: FleetConfig) -> None:
    here = _here(config)
    assert here["fixed:12"][0]["cost_usd"] > 0
    # the contest's process pool: spawn, so the workers import atoll afresh and see only the config
    there = run_rules(config, _specs(), DAYS, seeds=1, workers=2, keep_steps=False, tick=None)
    assert _figures(there) == here


def test_a_forkserver_subproc_vec_env_steps_the_fleet_as_this_process_does(config: FleetConfig) -> None:
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no forkserver start method on this platform")
    make = [lambda: FleetEnv(config)]
    local, remote = DummyVecEnv(make), SubprocVecEnv(make, start_method="forkserver")
    try:
        local.seed(3)
        remote.seed(3)
        obs = [local.reset(), remote.reset()]
        action = np.ones((1, len(config.models)), dtype=np.int64)
        steps = [local.step(action), remote.step(action)]
    finally:
        local.close()
        remote.close()
    assert np.array_equal(obs[0], obs[1])
    assert np.array_equal(steps[0][0], steps[1][0])
    # DummyVecEnv keeps rewards as float32, SubprocVecEnv as the env returns them
    assert np.array_equal(steps[0][1], np.asarray(steps[1][1], dtype=np.float32))


def test_a_ray_task_runs_the_fleet_as_this_process_does(config: FleetConfig) -> None:
    ray = pytest.importorskip("ray")
    here = _here(config)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        there = run_rules(config, _specs(), DAYS, seeds=1, workers=1, keep_steps=False, tick=None,
                           ray_address="auto")
    finally:
        ray.shutdown()
    assert _figures(there) == here
