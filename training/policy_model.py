"""The trained PPO trigger policy and its observation normalization, logged as one MLflow model.

``log_policy`` stores the SB3 zip (``model.save``) and the VecNormalize pickle (``vec_normalize.save``)
as artifacts of one ``mlflow.pyfunc`` model, so ``mlflow.pyfunc.load_model(uri).predict(observation)``
returns the deterministic action for raw (un-normalized) observations::

    uri = log_policy(model, vec_normalize, run_id=run_id, observation_size=obs_dim, n_models=n,
                     metadata={"scenario": "core"})
    actions = mlflow.pyfunc.load_model(uri).predict(observations)   # (batch, n_models) of 0/1
    policy = load_policy(uri)
    action = policy.act(observation, info)                          # same interface as rule policies

Input schema: the model's signature declares only the output (int64, ``(-1, n_models)``). A tensor
input spec would make MLflow reject 1-D observations, float64 arrays and float64 DataFrames before
``predict`` runs (``mlflow.models.utils._enforce_tensor_spec`` checks rank and exact dtype), so the
input contract (float32, ``observation_size`` features) is checked by ``predict`` itself, with an error
naming both sizes, and recorded in the model metadata (``observation_size``, ``observation_dtype``).
"""

from __future__ import annotations

import importlib.metadata
import json
import pickle
import sys
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cloudpickle
import mlflow
import mlflow.pyfunc
import numpy as np
import pandas as pd
from gymnasium import spaces
from mlflow.exceptions import MlflowException
from mlflow.models import Model, ModelSignature
from mlflow.models.model import ModelInfo
from mlflow.pyfunc import PyFuncModel, PythonModel
from mlflow.types import Schema, TensorSpec
from stable_baselines3 import PPO
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import VecNormalize

from atoll.solvers.errors import InputError

__all__ = ["LoadedPolicy", "PolicyPyfuncModel", "load_policy", "log_policy", "pip_requirements"]

_MODEL_ARTIFACT = "sb3_model"
_VEC_NORMALIZE_ARTIFACT = "vec_normalize"
# Keys log_policy writes into the model metadata; callers' metadata may not redefine them.
_RESERVED_METADATA = ("observation_size", "observation_dtype", "n_models", "normalized", "policy_format")
_POLICY_FORMAT = "atoll-sb3-ppo-reopt/2"  # Fleet-v1: one re-optimization code per model
_FORMATS = (_POLICY_FORMAT, "atoll-sb3-ppo-multibinary/1")  # /1: Fleet-v0 policies, still loadable
_PINNED_PACKAGES = ("mlflow", "stable-baselines3", "torch", "numpy", "cloudpickle")


def _observation_batch(model_input: Any, observation_size: int) -> np.ndarray:
    """Coerce a 1-D observation, a 2-D batch, a DataFrame or nested lists into float32 (batch, size).

    float32 because that is what the environment emits and what VecNormalize saw during training:
    normalizing the same float32 values reproduces training-time inputs bit for bit.
    """
    if isinstance(model_input, pd.DataFrame):
        try:
            array = model_input.to_numpy(dtype=np.float32)
        except (TypeError, ValueError) as error:
            raise ValueError(f"observation DataFrame must be all numeric: {error}") from error
    else:
        array = np.asarray(model_input, dtype=np.float32)
    if array.ndim == 1:
        array = array.reshape(1, -1)
    if array.ndim != 2:
        raise ValueError(
            "expected one observation (1-D) or a batch of observations (2-D, one row each), "
            f"got an input of shape {array.shape}"
        )
    if array.shape[1] != observation_size:
        raise ValueError(
            f"observation size mismatch: the policy expects {observation_size} features per observation, "
            f"received {array.shape[1]} (input shape {array.shape})"
        )
    if np.isnan(array).any():
        raise ValueError("observation contains NaN")
    return array


class PolicyPyfuncModel(PythonModel):
    """``mlflow.pyfunc`` wrapper: raw observations in, deterministic actions out (one
    ``Fleet-v1`` code per model, :mod:`atoll.envs.actions`).

    Built by :func:`log_policy`; MLflow constructs it from the pickle and calls :meth:`load_context`.
    """

    def __init__(self, observation_size: int, n_models: int) -> None:
        self.observation_size = observation_size
        self.n_models = n_models
        self._model: PPO | None = None
        self._obs_rms: RunningMeanStd | None = None
        self._clip_obs = np.inf
        self._epsilon = 1e-8

    def load_context(self, context: Any) -> None:
        """Load the SB3 policy on CPU and the VecNormalize observation statistics."""
        self._model = PPO.load(context.artifacts[_MODEL_ARTIFACT], device="cpu")
        stats_path = context.artifacts.get(_VEC_NORMALIZE_ARTIFACT)
        if stats_path is not None:
            # The pickle vec_normalize.save wrote; unpickled without an env (SB3 drops venv on save)
            # because only the observation statistics are needed, not a working VecEnv.
            with open(stats_path, "rb") as handle:
                vec_normalize = pickle.load(handle)
            if vec_normalize.norm_obs:
                self._obs_rms = vec_normalize.obs_rms
                self._clip_obs = float(vec_normalize.clip_obs)
                self._epsilon = float(vec_normalize.epsilon)

    def normalize(self, observations: np.ndarray) -> np.ndarray:
        """What ``VecNormalize.normalize_obs`` does with the saved statistics (identity without them)."""
        if self._obs_rms is None:
            return observations
        scaled = (observations - self._obs_rms.mean) / np.sqrt(self._obs_rms.var + self._epsilon)
        # float32 cast as in VecNormalize.normalize_obs, so the policy sees training-time inputs exactly.
        return np.clip(scaled, -self._clip_obs, self._clip_obs).astype(np.float32)

    # The np.ndarray hint is one MLflow recognises as "no type-hint validation" (anything else makes it
    # warn or re-validate inputs); DataFrames and lists are accepted too, see _observation_batch.
    def predict(
        self, context: Any, model_input: np.ndarray, params: dict[str, Any] | None = None
    ) -> np.ndarray:
        """Deterministic actions for raw observations.

        Args:
            context: MLflow's model context (unused; artifacts were read in ``load_context``).
            model_input: one observation ``(observation_size,)``, a batch ``(batch, observation_size)``,
                or a DataFrame with ``observation_size`` numeric columns (one row per observation).
            params: unused; accepted for the pyfunc interface.

        Returns:
            int64 array of action codes with shape ``(batch, n_models)`` (batch 1 for a single
            observation).

        Raises:
            ValueError: wrong rank, wrong number of features (names expected and received), or NaN.
        """
        if self._model is None:
            raise RuntimeError("policy not loaded: load it with mlflow.pyfunc.load_model")
        observations = _observation_batch(model_input, self.observation_size)
        if observations.shape[0] == 0:
            return np.zeros((0, self.n_models), dtype=np.int64)
        actions, _ = self._model.predict(self.normalize(observations), deterministic=True)
        return np.asarray(actions, dtype=np.int64).reshape(observations.shape[0], self.n_models)


def pip_requirements() -> list[str]:
    """Installed versions of what the logged model needs to load, pinned.

    Explicit requirements skip MLflow's dependency inference (which loads the model in a subprocess).
    A local version suffix (torch ``2.13.0+cpu``) is dropped: it is not resolvable from PyPI.
    """
    return [f"{name}=={importlib.metadata.version(name).split('+')[0]}" for name in _PINNED_PACKAGES]


def _check_spaces(
    model: PPO, vec_normalize: VecNormalize | None, observation_size: int, n_models: int
) -> None:
    """Fail at logging time, not at serving time, when the declared sizes do not match the policy."""
    obs_space, action_space = model.observation_space, model.action_space
    if not isinstance(obs_space, spaces.Box) or obs_space.shape != (observation_size,):
        raise ValueError(
            f"observation_size={observation_size} but the policy's observation space is {obs_space}"
        )
    per_model = isinstance(action_space, spaces.MultiDiscrete | spaces.MultiBinary)
    if not per_model or action_space.shape != (n_models,):
        raise ValueError(f"n_models={n_models} but the policy's action space is {action_space}")
    if vec_normalize is not None and vec_normalize.norm_obs:
        obs_rms = vec_normalize.obs_rms
        if not isinstance(obs_rms, RunningMeanStd) or obs_rms.mean.shape != (observation_size,):
            raise ValueError(
                "VecNormalize observation statistics do not match the policy: "
                f"expected one RunningMeanStd over {observation_size} features"
            )


def log_policy(
    model: PPO,
    vec_normalize: VecNormalize | None,
    *,
    run_id: str,
    name: str = "policy",
    observation_size: int,
    n_models: int,
    metadata: Mapping[str, Any],
) -> str:
    """Log the policy and its observation normalization to ``run_id`` as one pyfunc model.

    The run is addressed explicitly: nothing is started, resumed or ended, and an active run (if any)
    is left alone. The tracking URI is MLflow's current one (``MLFLOW_TRACKING_URI`` or
    ``mlflow.set_tracking_uri``). The model's artifacts go to the run's experiment artifact location.

    Args:
        model: the trained PPO (Box observation of ``observation_size``, one action entry per model:
            ``MultiDiscrete`` re-optimization codes).
        vec_normalize: the training VecNormalize, or ``None`` if observations were not normalized.
        run_id: MLflow run the model belongs to (its source run).
        name: model name within the run.
        observation_size: features per observation.
        n_models: action bits (served models).
        metadata: JSON-serializable facts stored with the model (scenario, workload, training days,
            seed...); readable as ``mlflow.pyfunc.load_model(uri).metadata.metadata``.

    Returns:
        The model URI for ``mlflow.pyfunc.load_model`` / :func:`load_policy` (MLflow 3: ``models:/<id>``).

    Raises:
        ValueError: sizes that do not match the policy's spaces, reserved or non-JSON metadata.
    """
    _check_spaces(model, vec_normalize, observation_size, n_models)
    full_metadata = _policy_metadata(metadata, vec_normalize, observation_size, n_models)
    signature = ModelSignature(inputs=None, outputs=Schema([TensorSpec(np.dtype(np.int64), (-1, n_models))]))
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    with tempfile.TemporaryDirectory(prefix="atoll-policy-") as tmp:
        artifacts = _save_artifacts(model, vec_normalize, Path(tmp))
        # Created up front with the run's experiment: Model.log(run_id=...) alone files the model under
        # the *active/default* experiment (mlflow 3.17 _create_logged_model), not the run's.
        logged = mlflow.initialize_logged_model(
            name=name,
            source_run_id=run_id,
            experiment_id=run.info.experiment_id,
            params={key: str(value) for key, value in run.data.params.items()},
        )
        info = _log_pyfunc(name, run_id, logged.model_id, PolicyPyfuncModel(observation_size, n_models),
                           artifacts, signature, full_metadata)
    return str(info.model_uri)


def _policy_metadata(metadata: Mapping[str, Any], vec_normalize: VecNormalize | None, observation_size: int,
                     n_models: int) -> dict[str, Any]:
    """``metadata`` with the facts :func:`log_policy` sets itself; ValueError for a reserved key or
    a value that is not JSON."""
    clashes = sorted(set(metadata) & set(_RESERVED_METADATA))
    if clashes:
        raise ValueError(f"metadata keys {clashes} are set by log_policy itself")
    full_metadata = {
        **metadata,
        "observation_size": int(observation_size),
        "observation_dtype": "float32",
        "n_models": int(n_models),
        "normalized": bool(vec_normalize is not None and vec_normalize.norm_obs),
        "policy_format": _POLICY_FORMAT,
    }
    try:
        json.dumps(full_metadata)
    except TypeError as error:
        raise ValueError(f"metadata must be JSON-serializable: {error}") from error
    return full_metadata


def _save_artifacts(model: PPO, vec_normalize: VecNormalize | None, folder: Path) -> dict[str, str]:
    """The policy (and its observation normalization) saved in ``folder``: artifact name -> path."""
    artifacts = {_MODEL_ARTIFACT: str(folder / "ppo.zip")}
    model.save(artifacts[_MODEL_ARTIFACT])
    if vec_normalize is not None:
        artifacts[_VEC_NORMALIZE_ARTIFACT] = str(folder / "vec_normalize.pkl")
        vec_normalize.save(artifacts[_VEC_NORMALIZE_ARTIFACT])
    return artifacts


def _log_pyfunc(name: str, run_id: str, model_id: str, python_model: PolicyPyfuncModel,
                artifacts: dict[str, str], signature: ModelSignature, metadata: dict[str, Any]) -> ModelInfo:
    """Log the pyfunc model (the wrapper pickled by value, so it loads where atoll is not installed)."""
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    try:
        with warnings.catch_warnings():
            # An input example would make MLflow infer (and then enforce) a tensor input schema,
            # which the output-only signature avoids; its advice to add one is noise here.
            warnings.filterwarnings(
                "ignore", message=r".*An input example was not provided", category=UserWarning
            )
            return Model.log(
                artifact_path=None,
                name=name,
                flavor=mlflow.pyfunc,
                run_id=run_id,
                model_id=model_id,
                python_model=python_model,
                artifacts=artifacts,
                signature=signature,
                pip_requirements=pip_requirements(),
                metadata=metadata,
            )
    finally:
        cloudpickle.unregister_pickle_by_value(module)


class LoadedPolicy:
    """A logged policy with the rule policies' interface (``atoll.envs.policies.Policy``): ``name``,
    ``act(observation, info) -> action`` and ``reset_options() -> dict``."""

    def __init__(self, pyfunc_model: PyFuncModel, uri: str, name: str = "learned") -> None:
        self.uri = uri
        self.name = name
        self.planning_quantile: float | None = None  # plans at the env's configured level
        self.pyfunc_model = pyfunc_model
        self.metadata: dict[str, Any] = dict(pyfunc_model.metadata.metadata or {})
        if self.metadata.get("policy_format") not in _FORMATS:
            found = self.metadata.get("policy_format")
            raise ValueError(
                f"{uri} is not a policy logged by atoll.training.policy_model.log_policy "
                f"(metadata policy_format={found!r}, expected {_POLICY_FORMAT!r})"
            )
        self.observation_size = int(self.metadata["observation_size"])
        self.n_models = int(self.metadata["n_models"])

    def act(self, observation: Any, info: Mapping[str, Any] | None = None) -> np.ndarray:
        """The deterministic action for ``observation``; ``info`` is ignored (the policy sees only
        the observation) and accepted for interface parity.

        Returns:
            int8 array of action codes: ``(n_models,)`` for one 1-D observation, ``(batch, n_models)``
            for a batch.
        """
        actions = np.asarray(self.pyfunc_model.predict(observation), dtype=np.int8)
        single = not isinstance(observation, pd.DataFrame) and np.ndim(observation) == 1
        return actions[0] if single else actions

    def reset_options(self) -> dict[str, Any]:
        """Environment reset options the policy was trained with: the ``reset_options`` entry of the
        metadata given to :func:`log_policy` if the training command recorded one, else none."""
        return dict(self.metadata.get("reset_options") or {})

    def __repr__(self) -> str:
        return f"LoadedPolicy({self.uri!r}, name={self.name!r}, n_models={self.n_models})"


def load_policy(uri: str, name: str = "learned") -> LoadedPolicy:
    """Load a model logged by :func:`log_policy` (any MLflow model URI: ``models:/...``, ``runs:/...``).

    ``name`` is the policy's label in evaluations (rule policies use their spec, e.g. ``fixed:3``).
    A URI that does not resolve (unknown run or model, wrong store) is an :class:`InputError`.
    """
    try:
        model = mlflow.pyfunc.load_model(uri)
    except (MlflowException, OSError) as exc:
        raise InputError(f"learned policy {uri!r} cannot be loaded ({exc}); use the model_uri that "
                         f"'atoll train' printed, with MLFLOW_TRACKING_URI set as it was "
                         f"(now {mlflow.get_tracking_uri()})") from exc
    return LoadedPolicy(model, uri, name=name)
