"""A tiny training run registers ``atoll-trigger-<fleet>``; the contest's crowning sets ``champion`` only
for a validation score that beats the frontier; the controller loads the policy by that alias
(``learned:champion``, the fleet's own, as ``atoll control --policy`` does) and acts with it; the
run's policy file (``learned:file:``) acts the same."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from control_helpers import FakeClock
from live_harness import INPUT, MODELS, OUTPUT, ScriptedServers, live_fleet, templates
from mlflow.tracking import MlflowClient

from atoll.control.controller import Controller, ControllerSettings
from atoll.control.sinks import JsonDirSink
from atoll.envs.config import FleetConfig
from atoll.envs.vocabulary import parse_policy
from atoll.forecast.workloads import DemandSeries
from atoll.solvers.errors import InputError
from atoll.training.evaluate import resolve_policy
from atoll.training.registry import CHAMPION, FleetSpaces, fleet_name, registered_name
from atoll.training.train import TrainSettings
from atoll.training.train_tracking import crown, train_run


def config() -> FleetConfig:
    rng = np.random.default_rng(5)
    t = np.arange(6 * 288)
    daily = 1 + 0.4 * np.sin(2 * np.pi * t / 288)
    demand = tuple(DemandSeries(f"s{i}", 300.0,
                                np.maximum((8 + 4 * i) * daily * (1 + 0.1 * rng.standard_normal(len(t))),
                                           0.1),
                                np.full(len(t), INPUT), np.full(len(t), OUTPUT)) for i in range(2))
    return FleetConfig(scenario="core", models=MODELS, templates=templates(), demand=demand,
                       request_shapes=((INPUT, OUTPUT),) * 2, forecaster="naive", availability="ample",
                       prices="on-demand", days=(4, 5), episode_steps=48)


def test_registered_policy_is_crowned_on_validation_and_drives_the_controller(tmp_path: Path) -> None:
    out = train_run(config(), TrainSettings(timesteps=128, n_steps=64, batch_size=32, n_epochs=1, n_envs=1,
                                            bootstrap_steps=48, bootstrap_epochs=2), run_dir=tmp_path / "run")
    name = registered_name(fleet_name("core", MODELS))
    assert out["registered"] == f"models:/{name}/1"
    client = MlflowClient()
    version = client.get_model_version(name, "1")
    assert version.tags["scenario"] == "core"
    spec = f"learned:{out['model_uri']}"
    with pytest.raises(InputError, match="cannot be loaded"):
        resolve_policy(parse_policy(f"learned:{name}@{CHAMPION}"), 2)  # no champion yet
    assert crown(parse_policy(spec), {"score": 1.02}) is None  # does not beat the frontier on validation days
    assert crown(parse_policy(spec), {"score": 0.93}) == f"{name}/1"
    assert str(client.get_model_version_by_alias(name, CHAMPION).version) == "1"

    fleet = live_fleet()
    policy = resolve_policy(parse_policy(f"learned:{CHAMPION}"), 2, fleet=FleetSpaces.of_live_fleet(fleet))
    clock = FakeClock(10 * 86400.0)
    source = ScriptedServers(clock, {m: 10.0 for m in MODELS})
    controller = Controller(fleet, source, policy, JsonDirSink(tmp_path / "plans"), tmp_path / "state",
                            settings=ControllerSettings(interval_s=300.0), clock=clock, sleep=lambda s: None)
    reports = []
    for _ in range(4):
        reports.append(controller.tick())
        source.advance(300.0)
    assert all(r.metrics["ok"] for r in reports)
    assert controller.state.running  # planned and delivered
    obs = controller.last_observation
    codes = policy.act(obs)
    assert codes.shape == (2,) and np.all((codes >= 0) & (codes < controller.codec.n))
    last = reports[-1].decision
    # what the policy answered is what the controller did with the models it could decide for
    for i, m in enumerate(MODELS):
        if m in last.reopt and "no capacity" not in last.chosen[m]:
            assert last.reopt[m] == controller.codec.decode(int(codes[i])).label()
    # the same policy as a file (no MLflow): the controller's fleet takes it and it answers the same
    from_file = resolve_policy(parse_policy(f"learned:file:{out['policy_file']}"), 2,
                               fleet=FleetSpaces.of_live_fleet(fleet))
    assert np.array_equal(from_file.act(obs), codes)
