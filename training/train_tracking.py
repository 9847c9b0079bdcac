"""Training runs in MLflow: train and log a policy, register it under its fleet's name, and
reuse it when the same training is asked again.

A training run logs its parameters (:func:`train_params`), SB3's learning curves, the policy as a
pyfunc model registered as a version of ``atoll-trigger-<fleet>`` (:mod:`atoll.training.registry`)
and as a policy file with its card (:func:`policy_card`; :mod:`atoll.training.policy_file`).
:func:`crown` gives a registered version its fleet's ``champion`` alias. The store is
:mod:`atoll.training.tracking`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
import tempfile
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from atoll.envs import world_of
from atoll.envs.config import FleetConfig
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.vocabulary import PolicySpec
from atoll.solvers.paths import cache_root
from atoll.training import checkpoint as ckpt
from atoll.training.mlflow_output import make_logger
from atoll.training.policy_file import PolicyCard, write_policy_file
from atoll.training.policy_model import log_policy
from atoll.training.registry import CHAMPION, PREFIX, env_id, fleet_name, registered_name
from atoll.training.run_folder import RunFolder, identity, run_status
from atoll.training.tracking import (
    REUSE_TAG,
    config_params,
    configure,
    find_logged_policy,
    git_commit,
    settings_key,
)
from atoll.training.train import TrainSettings, train_policy


def checkpoint_folder(key: str) -> Path:
    """The run folder of a training run asked for checkpoints without a run folder of its own:
    ``training/<key>`` under the cache root (``$ATOLL_CACHE_DIR`` or the user's cache folder)."""
    return cache_root() / "training" / key


def train_params(config: FleetConfig, settings: TrainSettings) -> dict[str, str]:
    """A training run's parameters: the environment's and PPO's (explicit ``templates`` and
    ``demand`` objects, as tests pass, are not among them); a field's text is ``str`` of its value
    (the bootstrap rule's spec text, not its fields)."""
    return {**config_params(config),
            **{f"ppo.{f.name}": str(getattr(settings, f.name)) for f in dataclasses.fields(settings)}}


def register_policy(model_uri: str, tags: Mapping[str, str], fleet: str) -> str:
    """Register a logged policy as a new version of its fleet's model, ``atoll-trigger-<fleet>``
    (:mod:`atoll.training.registry`); returns ``models:/atoll-trigger-<fleet>/<version>``."""
    name = registered_name(fleet)
    version = mlflow.register_model(model_uri, name, tags={**dict(tags), "fleet": fleet})
    return f"models:/{name}/{version.version}"


def registered_version(model_uri: str) -> tuple[str, str] | None:
    """(registered name, version) of a policy URI: ``models:/atoll-trigger-core/3``,
    ``models:/atoll-trigger-core@champion``, or the logged model's own ``models:/m-...`` (found
    among the versions of every ``atoll-trigger-*`` model); None when it is not registered."""
    client = MlflowClient()
    body = model_uri.removeprefix("models:/")
    name, sep, alias = body.partition("@")
    try:
        if sep and name.startswith(PREFIX):
            return name, str(client.get_model_version_by_alias(name, alias).version)
        head, _, number = body.partition("/")
        if head.startswith(PREFIX) and number.isdigit():
            return head, number
        for mv in client.search_model_versions(f"name LIKE '{PREFIX}-%'"):
            if mv.source == model_uri or getattr(mv, "model_id", None) == body:
                return str(mv.name), str(mv.version)
    except MlflowException:
        return None
    return None


def crown(spec: PolicySpec, validation: Mapping[str, float]) -> str | None:
    """Set the ``champion`` alias of the policy's own fleet model (``atoll-trigger-<fleet>``) on
    the registered version of learned policy ``spec`` when its validation-day score beats the rule
    frontier (score < 1: cheaper than the frontier at its SLO attainment and no less reliable than
    fixed:1@0.9); returns the version crowned as ``atoll-trigger-<fleet>/<version>``."""
    if not spec.is_learned or validation.get("score", float("inf")) >= 1.0:
        return None
    uri = spec.uri
    found = registered_version(uri if ":/" in uri else f"models:/{uri}")
    if found is None:
        return None
    name, version = found
    MlflowClient().set_registered_model_alias(name, CHAMPION, version)
    return f"{name}/{version}"


def data_hash(config: FleetConfig) -> str:
    """sha256 (16 hex digits) of the demand the env samples on the config's days: the training
    data a policy card names."""
    book = FleetEnv(config).book
    first, last = config.days
    per_day = book.steps_per_day
    digest = hashlib.sha256(np.ascontiguousarray(book.rates[:, (first - 1) * per_day: last * per_day],
                                                 dtype=np.float64).tobytes())
    digest.update(json.dumps(list(book.models)).encode())
    return digest.hexdigest()[:16]


def policy_card(config: FleetConfig, settings: TrainSettings, *, observation_size: int, steps: int,
                selected: str, validation_score: float | None, command: str, created: str,
                digest: str) -> PolicyCard:
    """The card of a policy trained with ``config`` and ``settings``."""
    models = tuple(config.models or config.scenario_spec.models)
    codec = config.action_codec
    return PolicyCard(
        env_id=env_id(config), observation=config.observation, observation_size=observation_size,
        action=config.action if config.action in ("reopt", "risk") else "multibinary",
        action_codes=tuple(codec.names() if config.action in ("reopt", "risk") else ("hold", "full")),
        fleet=fleet_name(config.scenario, config.models, config.scenario_spec.models), models=models,
        scenario=config.scenario, availability=config.availability,
        world=config_params(config),
        train_days=(int(config.days[0]), int(config.days[1])), demand_seeds=settings.demand_seeds,
        data_hash=digest, steps=steps, bootstrap_steps=settings.bootstrap_steps, selected=selected,
        validation_score=validation_score, command=command, git_commit=git_commit(), created=created,
        planning_quantile=float(config.planning_quantile), action_levels=tuple(config.action_levels),
        risk=config.risk.label(),
        risk_menu=tuple(r.label() for r in codec.risks) if config.action == "risk" else ())


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def train_run(config: FleetConfig, settings: TrainSettings, *, tags: dict[str, str] | None = None,
              tick: Callable[[int], None] | None = None,
              validate: Callable[[Any], float] | None = None,
              note: Callable[[str], None] | None = None, checkpoint_every: int = 0,
              run_dir: Path | None = None, command: str = "",
              now: Callable[[], str] = _utc_now) -> dict[str, Any]:
    """Train and log: params, SB3 learning curves, the policy as one pyfunc model, registered as
    a version of ``atoll-trigger-<fleet>`` (its signature and metadata say what it takes and
    returns), and the same policy as a policy file (:mod:`atoll.training.policy_file`) among the
    run's artifacts (``policy_file/``).

    ``run_dir`` (or, without it, ``checkpoint_every`` > 0: a folder under the cache root) is the
    run's folder (:mod:`atoll.training.run_folder`): checkpoints every ``checkpoint_every`` PPO
    steps (0: only at the end), resumed when the same run is asked again (a larger budget goes
    on from the last one; the new MLflow run is tagged ``atoll.resumed_at``), and the finished
    command's ``policy-best`` and ``policy-last`` files. ``command`` is recorded on the cards;
    ``now`` gives their time."""
    params = train_params(config, settings)
    key = settings_key(params)
    run_key = settings_key(identity(params))
    folder = None
    if run_dir is not None or checkpoint_every:
        where = Path(run_dir) if run_dir is not None else checkpoint_folder(run_key)
        folder = RunFolder.open(where, params, run_key, command=command)
    checkpoint = folder.checkpoint_spec(checkpoint_every or sys.maxsize) if folder is not None else None
    experiment = configure()
    earlier = run_status(folder.path).get("mlflow_runs", []) if folder is not None else []
    with mlflow.start_run(experiment_id=experiment, run_name=f"train-{config.scenario}",
                          tags={"atoll.kind": "train", "atoll.world": world_of(config),
                                **(tags or {})}) as run:
        run_id = run.info.run_id
        mlflow.log_params(params)
        mlflow.set_tag(REUSE_TAG, key)  # what train_or_reuse looks runs up by
        if folder is not None:
            mlflow.set_tag("atoll.run_dir", str(folder.path))
            folder.write_status({"state": "running", "timesteps": settings.timesteps,
                                 "mlflow_runs": [*earlier, run_id], "updated": now()})
        model, vec, stats = train_policy(config, settings, logger=make_logger(run_id, extra_formats=()),
                                         tick=tick, validate=validate, note=note, checkpoint=checkpoint)
        if "resumed_at" in stats:
            mlflow.set_tag("atoll.resumed_at", str(int(stats["resumed_at"])))
        if stats:
            mlflow.log_metrics(stats)
        size = int(np.prod(vec.observation_space.shape or (0,)))
        steps = int(model.num_timesteps)
        card = functools.partial(policy_card, config, settings, observation_size=size, command=command,
                                 created=now(), digest=data_hash(config))
        best_score = stats.get("validation_best")
        best_card = card(steps=int(stats.get("validation_best_at", steps)), selected="best",
                         validation_score=best_score)
        uri, registered = _log_and_register(model, vec, run_id, size, best_card, config, settings)
        with tempfile.TemporaryDirectory(prefix="atoll-policy-file-") as tmp:
            best = folder.best if folder is not None else Path(tmp) / "policy"
            write_policy_file(best, best_card, model=model, obs_rms=ckpt.obs_stats(vec))
            mlflow.log_artifacts(str(best), artifact_path="policy_file")
        result = {"run_id": run_id, "model_uri": uri, "registered": registered, "fleet": best_card.fleet,
                  **stats}
        if folder is not None and checkpoint is not None:
            result.update(_finish_folder(folder, checkpoint, card, stats, settings, steps, [*earlier, run_id],
                                         now))
    return result


def _log_and_register(model: Any, vec: Any, run_id: str, size: int, card: PolicyCard, config: FleetConfig,
                      settings: TrainSettings) -> tuple[str, str]:
    """Log the trained policy as the run's pyfunc model and register it under its fleet's name;
    (model URI, registered version)."""
    fleet = card.fleet
    # the registry's metadata names what the card names (one source for both)
    uri = log_policy(model, vec, run_id=run_id, observation_size=size,
                     n_models=card.n_models,
                     metadata={"scenario": config.scenario, "fleet": fleet,
                               "models": list(card.models), "train_days": list(config.days),
                               "availability": config.availability,
                               "env_id": card.env_id,
                               "world": {"capacity_error": str(config.capacity_error),
                                         "correction": config.correction, "slo_model": config.slo_model,
                                         "observation": config.observation},
                               "demand_seeds": settings.demand_seeds,
                               "action_codes": list(card.action_codes)})
    mlflow.set_tag("atoll.model_uri", uri)
    registered = register_policy(uri, {"scenario": config.scenario, "availability": config.availability,
                                       "run_id": run_id}, fleet)
    mlflow.set_tag("atoll.registered", registered.removeprefix("models:/"))
    return uri, registered


def _finish_folder(folder: RunFolder, checkpoint: ckpt.CheckpointSpec, card: Callable[..., PolicyCard],
                   stats: Mapping[str, float], settings: TrainSettings, steps: int, runs: list[str],
                   now: Callable[[], str]) -> dict[str, str]:
    """The run folder at the end of a command: the last checkpoint's policy file and the status."""
    best_score = stats.get("validation_best")
    last = ckpt.load(checkpoint)
    if last is not None:
        write_policy_file(folder.last, card(steps=last.steps, selected="last", validation_score=best_score),
                          model_zip=last.model_path, obs_rms=last.obs_rms)
    scores = [[t, v] for t, v in (last.stop or {}).get("scores", [])] if last is not None else []
    folder.write_status({"state": "stopped-early" if stats.get("stopped_early") else "finished",
                         "timesteps": settings.timesteps, "steps": steps,
                         "validation_scores": scores, "validation_best": best_score,
                         "mlflow_runs": runs, "updated": now()})
    return {"run_dir": str(folder.path), "policy_file": str(folder.best)}


def train_or_reuse(config: FleetConfig, settings: TrainSettings, *, retrain: bool = False,
                   tick: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The policy a finished run trained with exactly this environment and these settings (its
    params are the key), or a new training run when there is none or ``retrain``. Returns
    ``model_uri``, ``run_id`` (of the run that trained it) and ``reused``."""
    found = None if retrain else find_logged_policy(REUSE_TAG, settings_key(train_params(config, settings)))
    if found is not None:
        fleet = fleet_name(config.scenario, config.models, config.scenario_spec.models)
        known = registered_version(found[0])
        if known is None or known[0] != registered_name(fleet):  # logged before per-fleet names
            register_policy(found[0], {"scenario": config.scenario, "availability": config.availability,
                                       "run_id": found[1]}, fleet)
        return {"model_uri": found[0], "run_id": found[1], "reused": True, "fleet": fleet}
    return {**train_run(config, settings, tick=tick), "reused": False}


