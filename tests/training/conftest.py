"""Fixtures for training/: a tiny env PPO learns in seconds, and an MLflow run in the test's temp store."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import gymnasium as gym
import mlflow
import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

OBS_SIZE = 5
N_MODELS = 2
# Observation features have different centres and scales so VecNormalize's statistics matter.
OBS_LOC = np.array([0.0, 2.0, -1.0, 0.5, 10.0], dtype=np.float32)
OBS_SCALE = np.array([1.0, 3.0, 0.5, 2.0, 4.0], dtype=np.float32)
EPISODE_LENGTH = 16


class BitMatchEnv(gym.Env[np.ndarray, np.ndarray]):
    """Reward = share of action bits i with ``action[i] == (obs[i] > centre_i)``: learnable in a few
    hundred steps, and the right action depends on the (normalized) observation."""

    observation_space = spaces.Box(-np.inf, np.inf, shape=(OBS_SIZE,), dtype=np.float32)
    action_space = spaces.MultiBinary(N_MODELS)

    def __init__(self) -> None:
        self._obs = np.zeros(OBS_SIZE, dtype=np.float32)
        self._t = 0

    def _draw(self) -> np.ndarray:
        noise = self.np_random.normal(size=OBS_SIZE).astype(np.float32)
        self._obs = OBS_LOC + OBS_SCALE * noise
        return self._obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._draw(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        target = self._obs[:N_MODELS] > OBS_LOC[:N_MODELS]
        reward = float(np.mean(np.asarray(action, dtype=bool) == target))
        self._t += 1
        return self._draw(), reward, False, self._t >= EPISODE_LENGTH, {}


@pytest.fixture(autouse=True)
def _quiet_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests must not send MLflow usage telemetry (read on every call, so setting it here is enough).
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(scope="session")
def _migrated_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow sqlite store with its schema created (about 1.5 s, so done once per session)."""
    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture(autouse=True)
def _prebuilt_mlflow_db(_isolated_mlflow: None, _migrated_mlflow_db: Path) -> None:
    """Seed the per-test store of tests/conftest.py::_isolated_mlflow with the migrated template, so
    each test does not pay for MLflow's schema migrations."""
    uri = os.environ["MLFLOW_TRACKING_URI"]
    assert uri.startswith("sqlite:///"), uri
    target = Path(uri.removeprefix("sqlite:///"))
    if not target.exists():
        shutil.copyfile(_migrated_mlflow_db, target)


@pytest.fixture
def mlflow_run_id(tmp_path: Path) -> str:
    """A run in the temp sqlite store of tests/conftest.py, with artifacts under tmp_path too.

    The experiment gets an explicit artifact location: with a sqlite tracking URI MLflow's default
    artifact root is ./mlruns relative to the working directory, i.e. the repository's store.
    """
    client = mlflow.MlflowClient()
    experiment_id = client.create_experiment("test", artifact_location=(tmp_path / "artifacts").as_uri())
    return client.create_run(experiment_id).info.run_id


def _new_ppo(seed: int) -> tuple[PPO, VecNormalize]:
    venv = VecNormalize(DummyVecEnv([lambda: Monitor(BitMatchEnv())]), norm_reward=False, clip_obs=5.0)
    venv.seed(seed)
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=32, n_epochs=4, seed=seed, device="cpu", verbose=0)
    return model, venv


@pytest.fixture
def new_ppo() -> Any:
    """Factory: an untrained PPO on the tiny env (VecNormalize, clip_obs=5) and its VecNormalize."""
    torch.set_num_threads(1)
    return _new_ppo


@pytest.fixture(scope="session")
def trained_ppo() -> tuple[PPO, VecNormalize]:
    """PPO trained for 512 steps on the tiny env, once per session (no MLflow involved)."""
    torch.set_num_threads(1)
    model, venv = _new_ppo(seed=3)
    model.learn(total_timesteps=512)
    return model, venv


@pytest.fixture(scope="session")
def observations() -> np.ndarray:
    """Raw float32 observations as the env emits them, with far outliers first to exercise clipping."""
    rng = np.random.default_rng(0)
    obs = (OBS_LOC + OBS_SCALE * rng.normal(size=(200, OBS_SIZE))).astype(np.float32)
    obs[:3] = OBS_LOC + OBS_SCALE * np.array([50.0, -50.0, 30.0], dtype=np.float32)[:, None]
    return obs
