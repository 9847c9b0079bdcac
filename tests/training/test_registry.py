"""Registry names per fleet: two fleets, two champions, each env and each controller loads its own;
a policy that does not fit a fleet is an InputError naming both."""

from __future__ import annotations

import dataclasses

import pytest
from mlflow.tracking import MlflowClient
from test_train import MODELS, tiny_config

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.errors import InputError
from atoll.training.evaluate import resolve_policy
from atoll.training.registry import (
    CHAMPION,
    FleetSpaces,
    champion_uri,
    fleet_name,
    fleet_policy_uri,
    registered_name,
)
from atoll.training.train import TrainSettings
from atoll.training.train_tracking import crown, train_run

TINY = TrainSettings(timesteps=64, n_steps=32, batch_size=32, n_epochs=1, n_envs=1, bootstrap_steps=16,
                     bootstrap_epochs=1)


def test_names_are_per_fleet() -> None:
    assert fleet_name("core") == fleet_name("core", ("Phi-4-14B", "GPT-OSS-20B", "Qwen3-32B")) == "core"
    assert fleet_name("core", MODELS) != fleet_name("core", MODELS[::-1])  # other models, other fleet
    assert registered_name("extended") == "atoll-trigger-extended"
    assert registered_name("my fleet/v2") == "atoll-trigger-my-fleet-v2"
    assert champion_uri("core") == "models:/atoll-trigger-core@champion"
    assert fleet_policy_uri("models:/champion", "core") == "models:/atoll-trigger-core@champion"
    assert fleet_policy_uri("models:/atoll-trigger@champion", "extended") == \
        "models:/atoll-trigger-extended@champion"
    assert fleet_policy_uri("models:/atoll-trigger/3", "core") == "models:/atoll-trigger-core/3"
    assert fleet_policy_uri("models:/m-123", "core") == "models:/m-123"
    with pytest.raises(InputError, match="field 'n_models'"):
        FleetSpaces("core", 0, (10,))


def test_two_fleets_two_champions_each_loads_its_own() -> None:
    a_config = tiny_config()
    b_config = tiny_config(models=MODELS[::-1])  # same sizes, another fleet
    a, b = train_run(a_config, TINY), train_run(b_config, TINY)
    a_fleet, b_fleet = fleet_name("core", MODELS), fleet_name("core", MODELS[::-1])
    assert a["fleet"] == a_fleet and b["fleet"] == b_fleet
    assert a["registered"] == f"models:/{registered_name(a_fleet)}/1"
    assert b["registered"] == f"models:/{registered_name(b_fleet)}/1"  # its own model, its own version 1
    assert crown(parse_policy(f"learned:{a['model_uri']}"), {"score": 0.9}) == f"{registered_name(a_fleet)}/1"
    assert crown(parse_policy(f"learned:{b['registered'].removeprefix('models:/')}"), {"score": 0.9}) == \
        f"{registered_name(b_fleet)}/1"
    client = MlflowClient()
    for fleet, run in ((a_fleet, a), (b_fleet, b)):
        assert client.get_model_version_by_alias(registered_name(fleet), CHAMPION).run_id == run["run_id"]
    # each fleet's env resolves "champion" (and the one-name spelling) to its own policy
    for config, fleet in ((a_config, a_fleet), (b_config, b_fleet)):
        spaces = FleetSpaces.of_env(FleetEnv(config))
        assert spaces.fleet == fleet
        for spec in ("learned:champion", "learned:atoll-trigger@champion"):
            policy = resolve_policy(parse_policy(spec), 2, fleet=spaces)
            assert policy.metadata["fleet"] == fleet  # type: ignore[attr-defined]
            assert policy.uri == champion_uri(fleet)  # type: ignore[attr-defined]


def test_a_policy_that_does_not_fit_the_fleet_is_an_input_error_naming_both() -> None:
    config = tiny_config()
    run = train_run(config, TINY)
    closed = FleetSpaces.of_env(FleetEnv(dataclasses.replace(config, observation="v2")))
    with pytest.raises(InputError) as err:
        resolve_policy(parse_policy(f"learned:{run['model_uri']}"), 2, fleet=closed)
    text = str(err.value)
    size = FleetSpaces.of_env(FleetEnv(config)).observation_sizes[0]
    assert f"observations of {size} features" in text  # the policy's
    assert f"observations of {closed.observation_sizes[0]} features" in text  # the fleet's
    assert "does not fit fleet" in text and "observation size" in text
    levels = FleetSpaces.of_env(FleetEnv(dataclasses.replace(config, action_levels=(0.7, 0.9))))
    with pytest.raises(InputError, match="action codes per model differ"):
        resolve_policy(parse_policy(f"learned:{run['model_uri']}"), 2, fleet=levels)


def test_training_on_fleet_v2_sees_the_signals_and_several_worlds() -> None:
    from atoll.envs import CLOSED_LOOP

    config = tiny_config(**{**CLOSED_LOOP, "capacity_error": 0.15})
    settings = dataclasses.replace(TINY, n_envs=2, demand_seeds=2, timesteps=128, n_steps=48, batch_size=48)
    run = train_run(config, settings)
    assert run["episodes"] >= 2 and run["capacity_error_draws"] == run["episodes"] + 2
    learned = parse_policy(f"learned:{run['model_uri']}")
    policy = resolve_policy(learned, 2, fleet=FleetSpaces.of_env(FleetEnv(config)))
    assert policy.metadata["env_id"] == "atoll/Fleet-v2"  # type: ignore[attr-defined]
    assert policy.metadata["world"]["observation"] == "v2"  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="observation size"):  # not on the v1 observation
        resolve_policy(learned, 2, fleet=FleetSpaces.of_env(FleetEnv(tiny_config())))
