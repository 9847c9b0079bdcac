"""MLflow bookkeeping of training and evaluation runs (the only training module that logs runs).

Store: ``sqlite:///mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts`` (MLflow >= 3.13
refuses the old ``./mlruns`` file store); ``MLFLOW_TRACKING_URI`` overrides the store (tests
point it at a temporary directory). Open the UI with
``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db``.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from atoll.envs.config import FleetConfig
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.plot import plot_episodes
from atoll.training.evaluate import PolicyResult, comparison_rows, evaluate_policies, markdown_table
from atoll.training.mlflow_output import make_logger
from atoll.training.policy_model import log_policy
from atoll.training.train import TrainSettings, train_policy

EXPERIMENT = "atoll"
DEFAULT_URI = "sqlite:///mlruns/mlflow.db"


def configure(tracking_uri: str | None = None, experiment: str = EXPERIMENT) -> str:
    """Point MLflow at the store and return the experiment id (created with its artifact root
    beside the database, so artifacts never land in the working directory by accident)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        db.parent.mkdir(parents=True, exist_ok=True)
        artifacts = (db.parent / "artifacts").resolve().as_uri()
    else:
        artifacts = None
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        return str(found.experiment_id)
    return str(client.create_experiment(experiment, artifact_location=artifacts))


def settings_key(settings: Mapping[str, Any]) -> str:
    """A short stable digest of settings, tagged on a training run so a later identical
    request can find and reuse its policy."""
    return hashlib.sha256(json.dumps(dict(settings), sort_keys=True).encode()).hexdigest()[:16]


REUSE_TAG = "atoll.settings_key"


def find_logged_policy(tag: str, value: str) -> tuple[str, str] | None:
    """(model URI, run id) of the newest FINISHED run tagged ``tag = value`` that logged a
    policy, or None."""
    experiment = configure()
    runs = MlflowClient().search_runs([experiment], filter_string=f"tags.`{tag}` = '{value}' and "
                                      "attributes.status = 'FINISHED'", max_results=1,
                                      order_by=["attributes.start_time DESC"])
    if not runs or "atoll.model_uri" not in runs[0].data.tags:
        return None
    return runs[0].data.tags["atoll.model_uri"], runs[0].info.run_id


def config_params(config: FleetConfig) -> dict[str, str]:
    skip = {"templates", "demand", "reward"}
    params = {f"env.{k}": str(v) for k, v in dataclasses.asdict(config).items() if k not in skip}
    params.update({f"reward.{k}": str(v) for k, v in dataclasses.asdict(config.reward).items()})
    return params


def _train_params(config: FleetConfig, settings: TrainSettings) -> dict[str, str]:
    """A training run's parameters: the environment's and PPO's (explicit ``templates`` and
    ``demand`` objects, as tests pass, are not among them)."""
    return {**config_params(config), **{f"ppo.{k}": str(v) for k, v in dataclasses.asdict(settings).items()}}


def train_run(config: FleetConfig, settings: TrainSettings, *, tags: dict[str, str] | None = None,
              tick: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Train and log: params, SB3 learning curves, the policy as one pyfunc model."""
    experiment = configure()
    with mlflow.start_run(experiment_id=experiment, run_name=f"train-{config.scenario}",
                          tags={"atoll.kind": "train", **(tags or {})}) as run:
        run_id = run.info.run_id
        params = _train_params(config, settings)
        mlflow.log_params(params)
        mlflow.set_tag(REUSE_TAG, settings_key(params))  # what train_or_reuse looks runs up by
        model, vec, stats = train_policy(config, settings, logger=make_logger(run_id, extra_formats=()),
                                         tick=tick)
        if stats:
            mlflow.log_metrics(stats)
        env: FleetEnv = vec.venv.envs[0].unwrapped  # type: ignore[attr-defined]
        size = int(np.prod(env.observation_space.shape or (0,)))
        uri = log_policy(model, vec, run_id=run_id, observation_size=size,
                         n_models=len(env.models),
                         metadata={"scenario": config.scenario, "models": list(env.models),
                                   "train_days": list(config.days), "availability": config.availability})
        mlflow.set_tag("atoll.model_uri", uri)
    return {"run_id": run_id, "model_uri": uri, **stats}


def train_or_reuse(config: FleetConfig, settings: TrainSettings, *, retrain: bool = False,
                   tick: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The policy a finished run trained with exactly this environment and these settings (its
    params are the key), or a new training run when there is none or ``retrain``. Returns
    ``model_uri``, ``run_id`` (of the run that trained it) and ``reused``."""
    found = None if retrain else find_logged_policy(REUSE_TAG, settings_key(_train_params(config, settings)))
    if found is not None:
        return {"model_uri": found[0], "run_id": found[1], "reused": True}
    return {**train_run(config, settings, tick=tick), "reused": False}


def _step_metrics(result: PolicyResult) -> list[Metric]:
    """Per-step metrics of the first seed (step = index over the evaluated days)."""
    out = []
    for i, row in enumerate(result.episodes[0].steps):
        ts = int(row["seconds"] * 1000)
        for key in ("cost_usd", "slo_attainment", "reoptimizations", "solver_seconds", "preemptions"):
            out.append(Metric(f"step/{key}", float(row[key]), ts, i))
        share = row["goodput_tokens"] / row["demand_tokens"] if row["demand_tokens"] > 0 else 1.0
        out.append(Metric("step/goodput_share", float(share), ts, i))
    return out


def evaluate_run(env: FleetEnv, specs: Sequence[str], *, days: Sequence[int], seeds: int,
                 tick: Callable[[int], None] | None = None, run_name: str = "evaluate",
                 tags: dict[str, str] | None = None) -> dict[str, Any]:
    """One parent run, one nested run per policy; table (markdown, CSV) and plot as artifacts."""
    experiment = configure()
    client = MlflowClient()
    results = evaluate_policies(env, specs, days=days, seeds=seeds, tick=tick)
    with mlflow.start_run(experiment_id=experiment, run_name=run_name,
                          tags={"atoll.kind": "evaluate", **(tags or {})}) as parent:
        mlflow.log_params({**config_params(env.config), "eval.days": ",".join(map(str, days)),
                           "eval.seeds": str(seeds), "eval.policies": ",".join(specs)})
        for r in results:
            with mlflow.start_run(experiment_id=experiment, run_name=r.name, nested=True) as child:
                mlflow.log_param("policy", r.name)
                summary = r.summary()
                mlflow.log_metrics({f"{k}_mean": v["mean"] for k, v in summary.items()}
                                   | {f"{k}_std": v["std"] for k, v in summary.items()})
                metrics = _step_metrics(r)
                for i in range(0, len(metrics), 1000):
                    client.log_batch(child.info.run_id, metrics=metrics[i:i + 1000])
        table = markdown_table(results)
        rows = comparison_rows(results)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "comparison.md").write_text(table)
            (folder / "comparison.csv").write_text(buf.getvalue())
            plot_episodes([r.episodes[0] for r in results], env.models, folder / "policies.png",
                          title=f"{env.config.scenario}, {env.config.availability}, days "
                                f"{days[0]}-{days[-1]}, seed 0")
            (folder / "summary.json").write_text(json.dumps({r.name: r.summary() for r in results}, indent=1))
            mlflow.log_artifacts(str(folder), artifact_path="comparison")
        parent_id = parent.info.run_id
    return {"parent_run_id": parent_id, "table": table,
            "policies": {r.name: r.summary() for r in results}}
