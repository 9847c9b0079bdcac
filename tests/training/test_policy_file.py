"""A policy file acts as the model it was written from, is refused by name where it does not fit,
and every shipped policy loads and names the command that re-evaluates it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_train import tiny_config

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.errors import InputError
from atoll.training.evaluate import resolve_policy
from atoll.training.policy_file import CARD, FilePolicy, read_card
from atoll.training.registry import FleetSpaces
from atoll.training.train import TrainSettings

SHIPPED = Path(__file__).resolve().parents[2] / "training" / "policies"
SETTINGS = TrainSettings(timesteps=64, n_steps=64, batch_size=32, n_epochs=1, n_envs=1, bootstrap_steps=0,
                         seed=0, normalize_observations=True)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A policy file written as train_run writes one, without an MLflow run (the store is per test)."""
    from atoll.training.checkpoint import obs_stats
    from atoll.training.policy_file import write_policy_file
    from atoll.training.train import train_policy
    from atoll.training.train_tracking import data_hash, policy_card

    model, vec, _ = train_policy(tiny_config(), SETTINGS)
    card = policy_card(tiny_config(), SETTINGS, observation_size=int(vec.observation_space.shape[0]),
                       steps=int(model.num_timesteps), selected="best", validation_score=None,
                       command="atoll train --timesteps 64", created="2026-01-01T00:00:00+00:00",
                       digest=data_hash(tiny_config()))
    return write_policy_file(tmp_path_factory.mktemp("policy") / "policy-best", card, model=model,
                             obs_rms=obs_stats(vec))


def test_a_policy_file_acts_as_its_model_with_its_statistics(trained: Path) -> None:
    from stable_baselines3 import PPO

    folder = trained
    policy = resolve_policy(parse_policy(f"learned:file:{folder}"), 2,
                            fleet=FleetSpaces.of_env(FleetEnv(tiny_config())))
    assert isinstance(policy, FilePolicy) and policy.card.fleet.startswith("core-m")
    model = PPO.load(folder / "model.zip", device="cpu")
    with np.load(folder / "normalization.npz") as data:
        mean, var = data["mean"], data["var"]
    env = FleetEnv(tiny_config(days=(6, 6)))
    obs, info = env.reset(seed=0)
    for _ in range(20):
        expected, _ = model.predict(np.clip((obs - mean) / np.sqrt(var + 1e-8), -10, 10).astype(np.float32),
                                    deterministic=True)
        action = policy.act(obs, info)
        assert np.array_equal(action, np.asarray(expected, dtype=np.int8))
        obs, _, _, _, info = env.step(action)
    assert policy.act(np.stack([obs, obs])).shape == (2, 2)


def test_a_policy_file_that_does_not_fit_is_refused_naming_both(trained: Path) -> None:
    folder = trained
    other = FleetEnv(tiny_config(observation="v2", correction=True, slo_model="latency",
                                 capacity_error="calibration"))
    with pytest.raises(InputError, match=r"atoll/Fleet-v1.*does not fit fleet 'core-m.*atoll/Fleet-v2\): "
                                         r"observation size, env id differ"):
        resolve_policy(parse_policy(f"learned:file:{folder}"), 2, fleet=FleetSpaces.of_env(other))


def test_a_broken_policy_file_is_an_error_naming_the_path(trained: Path, tmp_path: Path) -> None:
    folder = trained
    with pytest.raises(InputError, match=r"policy file '.*nowhere': no such folder"):
        FilePolicy(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"'.*empty': no card.json"):
        FilePolicy(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    doc = json.loads((folder / CARD).read_text())
    (bad / CARD).write_text(json.dumps({**doc, "format": "atoll-policy/99"}))
    with pytest.raises(InputError, match=r"format 'atoll-policy/99'; this atoll reads 'atoll-policy/1'"):
        read_card(bad)
    del doc["env_id"]
    (bad / CARD).write_text(json.dumps(doc))
    with pytest.raises(InputError, match="the card lacks env_id"):
        read_card(bad)
    (bad / CARD).write_text(json.dumps({**json.loads((folder / CARD).read_text()), "observation_size": 0}))
    with pytest.raises(InputError, match="field 'observation_size' must be an int >= 1"):
        read_card(bad)


def test_the_training_run_logs_its_policy_file_as_artifacts(tmp_path: Path) -> None:
    import mlflow

    from atoll.training.train_tracking import train_run

    out = train_run(tiny_config(), SETTINGS, run_dir=tmp_path / "run", command="atoll train")
    local = mlflow.artifacts.download_artifacts(run_id=out["run_id"], artifact_path="policy_file",
                                                dst_path=str(tmp_path / "logged"))
    assert read_card(Path(local)) == read_card(Path(out["policy_file"]))
    assert (Path(local) / "model.zip").read_bytes() == (Path(out["policy_file"]) / "model.zip").read_bytes()


@pytest.mark.parametrize("folder", sorted(p for p in SHIPPED.glob("*") if p.is_dir()), ids=lambda p: p.name)
def test_every_shipped_policy_loads_and_names_how_to_reevaluate_it(folder: Path) -> None:
    policy = FilePolicy(folder)
    card = policy.card
    assert card.command and card.data_hash and card.steps >= 0
    action = policy.act(np.zeros(card.observation_size, dtype=np.float32))
    assert action.shape == (card.n_models,) and 0 <= action.min() and action.max() < len(card.action_codes)
    assert (folder / "model.zip").stat().st_size < 1_000_000  # small enough to ship
    readme = (folder / "README.md").read_text()
    assert f"learned:file:training/policies/{folder.name}" in readme  # the command that re-evaluates it


def test_a_policy_file_configures_the_env_it_is_evaluated_on(tmp_path: Path) -> None:
    from atoll.training.checkpoint import obs_stats
    from atoll.training.evaluate import evaluate_policies
    from atoll.training.policy_file import write_policy_file
    from atoll.training.train import train_policy
    from atoll.training.train_tracking import data_hash, policy_card

    narrow = tiny_config(action_levels=(0.9,))  # 3 codes per model; the default env has 7
    model, vec, _ = train_policy(narrow, SETTINGS)
    card = policy_card(narrow, SETTINGS, observation_size=int(vec.observation_space.shape[0]), steps=64,
                       selected="best", validation_score=None, command="atoll train", created="now",
                       digest=data_hash(narrow))
    assert card.action_levels == (0.9,) and card.planning_quantile == 0.9 and card.risk == "neutral"
    folder = write_policy_file(tmp_path / "narrow", card, model=model, obs_rms=obs_stats(vec))
    env = FleetEnv(tiny_config(days=(6, 6)))
    with pytest.raises(InputError, match="action codes per model differ"):
        resolve_policy(parse_policy(f"learned:file:{folder}"), 2, fleet=FleetSpaces.of_env(env))
    [result] = evaluate_policies(env, [parse_policy(f"learned:file:{folder}")], days=[6], seeds=1)
    assert len(result.episodes[0].steps) == 48  # run on the env configured with its levels
    # a card written before the action fields reads them off its world and codes
    doc = json.loads((folder / CARD).read_text())
    for key in ("planning_quantile", "action_levels", "risk", "risk_menu"):
        del doc[key]
    (folder / CARD).write_text(json.dumps(doc))
    assert read_card(folder) == card
