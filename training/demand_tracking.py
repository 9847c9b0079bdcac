"""The demand model's runs in MLflow (``atoll forecast train``): ``peak:learned``'s network logged
and registered as a version of ``atoll-demand``. The store is :mod:`atoll.training.tracking`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient

from atoll.training.tracking import configure

DEMAND_MODEL = "atoll-demand"


def demand_model_run(weights: Path, report: Mapping[str, Any], command: str) -> dict[str, str]:
    """Log a trained ``peak:learned`` network (``atoll forecast train``): its settings as
    parameters, the validation loss per epoch as a metric, the weights and card as artifacts,
    registered as a new version of ``atoll-demand`` (the weights file stays the thing to ship)."""
    experiment = configure()
    with mlflow.start_run(experiment_id=experiment, run_name="forecast-train",
                          tags={"atoll.kind": "forecast-train", "atoll.command": command}) as run:
        settings = report.get("settings", {})
        mlflow.log_params({f"demand.{k}": str(v) for k, v in dict(settings).items()}
                          | {"demand.data_hash": str(report.get("data_hash"))})
        for epoch, value in enumerate(report.get("validation_history", []), 1):
            mlflow.log_metric("validation_pinball_0.9", float(value), step=epoch)
        mlflow.log_artifact(str(weights), artifact_path="demand_model")
        card = weights.with_suffix(".json")
        if card.is_file():
            mlflow.log_artifact(str(card), artifact_path="demand_model")
        # the weights are numpy arrays, not an MLflow model flavour: the version points at the
        # logged folder itself
        source = mlflow.get_artifact_uri("demand_model")
    client = MlflowClient()
    try:
        client.get_registered_model(DEMAND_MODEL)
    except mlflow.exceptions.MlflowException:
        client.create_registered_model(DEMAND_MODEL,
                                       description="peak:learned's network (atoll forecast train)")
    version = client.create_model_version(DEMAND_MODEL, source=source, run_id=run.info.run_id,
                                          tags={"data_hash": str(report.get("data_hash"))})
    return {"run_id": run.info.run_id, "registered": f"models:/{DEMAND_MODEL}/{version.version}"}
