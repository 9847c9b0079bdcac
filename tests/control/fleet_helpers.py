"""A user's fleet for tests: a seeded CSV request log and a fleet file naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from request_logs import request_log  # noqa: F401 - re-exported for the control tests
from user_models import ACME_8B


def fleet_doc(name: str = "acme") -> dict[str, Any]:
    return {
        "name": name, "runtime": "vllm", "models": ["Phi-4-14B", ACME_8B],
        "regions": [{"name": "aws:us-east-2", "catalog": True, "gpu_types": ["L4", "L40S"]}],
        "availability": {"static": {"aws:us-east-2/1xL4": 40, "aws:us-east-2/4xL4": 10,
                                    "aws:us-east-2/1xL40S": 20}},
        "workloads": {"Phi-4-14B": {"source": "csv:requests.csv#phi-4", "mean_rate": 2.0},
                      "Acme-8B": {"source": "csv:requests.csv#acme-8b", "scale": 20}},
        "kubernetes": {"namespace": "llm", "model_sources": {"Acme-8B": "acme/acme-8b"}},
    }


def write_fleet(folder: Path, name: str = "acme") -> Path:
    request_log(folder / "requests.csv")
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet_doc(name), sort_keys=False))
    return path
