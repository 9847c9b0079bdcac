"""atoll.training.policy_model: the PPO policy and its VecNormalize statistics as one pyfunc model."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import VecNormalize

from atoll.training.policy_model import (
    LoadedPolicy,
    PolicyPyfuncModel,
    load_policy,
    log_policy,
    pip_requirements,
)

OBS_SIZE, N_MODELS = 5, 2


def _expected(model: PPO, venv: VecNormalize | None, observations: np.ndarray) -> np.ndarray:
    """What the training stack itself would do: VecNormalize, then a deterministic policy step."""
    obs = venv.normalize_obs(observations) if venv is not None else observations
    actions, _ = model.predict(obs, deterministic=True)
    return np.asarray(actions)


def test_logged_policy_acts_like_the_trained_one(
    trained_ppo: tuple[PPO, VecNormalize], observations: np.ndarray, mlflow_run_id: str, tmp_path: Path
) -> None:
    model, venv = trained_ppo
    uri = log_policy(
        model,
        venv,
        run_id=mlflow_run_id,
        observation_size=OBS_SIZE,
        n_models=N_MODELS,
        metadata={"scenario": "tiny", "train_days": [1, 2], "reset_options": {"initial_plan": "peak"}},
    )
    assert uri.startswith("models:/")
    expected = _expected(model, venv, observations)
    assert {0, 1} <= set(np.unique(expected)), "degenerate policy: the comparison would prove little"

    pyfunc = mlflow.pyfunc.load_model(uri)
    actions = pyfunc.predict(observations)
    assert actions.dtype == np.int64 and actions.shape == (len(observations), N_MODELS)
    np.testing.assert_array_equal(actions, expected)
    # One 1-D observation -> a batch of one; DataFrames (float64 columns) and lists work too.
    np.testing.assert_array_equal(pyfunc.predict(observations[7]), expected[7:8])
    frame = pd.DataFrame(observations.astype(np.float64), columns=[f"f{i}" for i in range(OBS_SIZE)])
    np.testing.assert_array_equal(pyfunc.predict(frame), expected)
    np.testing.assert_array_equal(pyfunc.predict(observations[:4].tolist()), expected[:4])

    meta = pyfunc.metadata.metadata
    assert meta["observation_size"] == OBS_SIZE and meta["n_models"] == N_MODELS and meta["normalized"]
    assert meta["scenario"] == "tiny" and meta["train_days"] == [1, 2]
    assert pyfunc.metadata.get_input_schema() is None  # see the module docstring: checked by predict
    assert pyfunc.metadata.get_output_schema().inputs[0].shape == (-1, N_MODELS)

    # The model belongs to the run, in the run's experiment, with artifacts under the test's tmp_path.
    client = mlflow.MlflowClient()
    run = client.get_run(mlflow_run_id)
    logged = mlflow.get_logged_model(uri.removeprefix("models:/"))
    assert logged.source_run_id == mlflow_run_id and logged.experiment_id == run.info.experiment_id
    assert logged.artifact_location.startswith((tmp_path / "artifacts").as_uri())
    assert run.outputs is not None
    assert [out.model_id for out in run.outputs.model_outputs] == [logged.model_id]
    requirements = (Path(mlflow.artifacts.download_artifacts(uri)) / "requirements.txt").read_text()
    assert "torch==2.13.0\n" in requirements and "stable-baselines3==" in requirements

    policy = load_policy(uri, name="learned:tiny")
    assert isinstance(policy, LoadedPolicy) and policy.n_models == N_MODELS
    assert policy.name == "learned:tiny" and policy.reset_options() == {"initial_plan": "peak"}
    assert policy.metadata["scenario"] == "tiny"
    action = policy.act(observations[7], info={"ignored": True})
    assert action.dtype == np.int8 and action.shape == (N_MODELS,)
    np.testing.assert_array_equal(action, expected[7])
    np.testing.assert_array_equal(policy.act(observations), expected)

    with pytest.raises(ValueError, match=r"expects 5 features per observation, received 4"):
        pyfunc.predict(observations[:, :4])
    with pytest.raises(ValueError, match=r"expects 5 features per observation, received 6"):
        policy.act(np.zeros(6, dtype=np.float32))
    with pytest.raises(ValueError, match=r"1-D\) or a batch"):
        policy.act(np.zeros((2, 2, OBS_SIZE), dtype=np.float32))


def test_pyfunc_model_without_vec_normalize(
    trained_ppo: tuple[PPO, VecNormalize], observations: np.ndarray, tmp_path: Path
) -> None:
    # Exercised without MLflow logging: load_context only needs the artifact paths.
    model, _ = trained_ppo
    model.save(tmp_path / "ppo.zip")
    wrapper = PolicyPyfuncModel(OBS_SIZE, N_MODELS)
    wrapper.load_context(SimpleNamespace(artifacts={"sb3_model": str(tmp_path / "ppo.zip")}))
    np.testing.assert_array_equal(wrapper.predict(None, observations), _expected(model, None, observations))
    assert wrapper.predict(None, np.zeros((0, OBS_SIZE))).shape == (0, N_MODELS)
    with pytest.raises(ValueError, match="NaN"):
        wrapper.predict(None, np.full(OBS_SIZE, np.nan))
    with pytest.raises(ValueError, match="numeric"):
        # predict is hinted np.ndarray for MLflow's sake (see training/policy_model.py); frames work too.
        wrapper.predict(None, pd.DataFrame({f"f{i}": ["x"] for i in range(OBS_SIZE)}))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"observation_size": 4}, "observation_size=4"),
        ({"n_models": 3}, "n_models=3"),
        ({"metadata": {"n_models": 9}}, "set by log_policy"),
        ({"metadata": {"when": object()}}, "JSON-serializable"),
    ],
)
def test_log_policy_rejects_bad_arguments(
    trained_ppo: tuple[PPO, VecNormalize], mlflow_run_id: str, kwargs: dict[str, Any], message: str
) -> None:
    model, venv = trained_ppo
    arguments: dict[str, Any] = {"observation_size": OBS_SIZE, "n_models": N_MODELS, "metadata": {}}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        log_policy(model, venv, run_id=mlflow_run_id, **arguments)


def test_pip_requirements_pin_installed_versions() -> None:
    requirements = pip_requirements()
    assert [r.split("==")[0] for r in requirements] == [
        "mlflow",
        "stable-baselines3",
        "torch",
        "numpy",
        "cloudpickle",
    ]
    assert all("+" not in r for r in requirements)
