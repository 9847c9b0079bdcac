"""The MLflow store and what every logged run shares.

Where runs go (:func:`configure`), how a run is found again (:func:`settings_key`,
:func:`find_logged_policy`), and the pieces the runs have in common: the environment's parameters,
the checkout's commit, the first seed's per-step metrics and CSV tables. The runs themselves live
beside it, one kind per module: :mod:`atoll.training.train_tracking` (training runs, the policy's
registration and card), :mod:`atoll.training.evaluate_tracking` (``atoll evaluate``),
:mod:`atoll.training.contest_tracking` (the contest) and :mod:`atoll.training.demand_tracking`
(``peak:learned``'s network). These are the training modules that log runs; the training loop
(:mod:`atoll.training.train`) never imports MLflow (its logger's output format,
:mod:`atoll.training.mlflow_output`, does).

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from atoll.envs.config import FleetConfig

if TYPE_CHECKING:
    from atoll.training.evaluate import PolicyResult

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
    """The environment's settings as run parameters (``env.<field>``, ``reward.<field>``; the
    ``templates``, ``demand`` and ``fleet`` objects are not among them)."""
    skip = {"templates", "demand", "reward", "fleet"}
    params = {f"env.{k}": str(v) for k, v in dataclasses.asdict(config).items() if k not in skip}
    params.update({f"reward.{k}": str(v) for k, v in dataclasses.asdict(config.reward).items()})
    return params


def git_commit() -> str:
    """The commit of the atoll checkout this runs from, or ``unknown`` (an installed wheel)."""
    import subprocess

    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def step_metrics(result: PolicyResult) -> list[Metric]:
    """Per-step metrics of the first seed (step = index over the evaluated days)."""
    out = []
    for i, row in enumerate(result.episodes[0].steps):
        ts = int(row["seconds"] * 1000)
        for key in ("cost_usd", "slo_attainment", "reoptimizations", "solver_seconds", "preemptions"):
            out.append(Metric(f"step/{key}", float(row[key]), ts, i))
        share = row["goodput_tokens"] / row["demand_tokens"] if row["demand_tokens"] > 0 else 1.0
        out.append(Metric("step/goodput_share", float(share), ts, i))
    return out


def csv_text(rows: Sequence[Mapping[str, object]]) -> str:
    """``rows`` as CSV text, the first row's keys as the header."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()

