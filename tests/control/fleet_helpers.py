"""A user's fleet for tests: a seeded CSV request log and a fleet file naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

ACME_8B = {"name": "Acme-8B", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
           "params_b": 8.0, "active_params_b": 8.0, "bytes_per_param": 2,
           "slo": {"ttft_ms": 800, "tpot_ms": 40}}


def request_log(path: Path, days: int = 5, seed: int = 0) -> Path:
    """One row per request (timestamp, model, input_tokens, output_tokens) for two models with
    a daily cycle: seeded Poisson arrivals per 5 minutes, gamma-distributed lengths."""
    rng = np.random.default_rng(seed)
    rows = []
    t0 = 1714521600.0
    for model, base, inp, out in (("phi-4", 0.1, 900, 180), ("acme-8b", 0.05, 400, 120)):
        for b in range(days * 24 * 12):
            t = b * 300.0
            rate = base * (1 + 0.6 * np.sin(2 * np.pi * (t / 86400 - 0.25)))
            for _ in range(rng.poisson(rate * 300)):
                rows.append((t0 + t + rng.uniform(0, 300), model, int(rng.gamma(4, inp / 4)) + 1,
                             int(rng.gamma(3, out / 3)) + 1))
    rows.sort()
    path.write_text("timestamp,model,input_tokens,output_tokens\n"
                    + "".join(f"{t:.3f},{m},{i},{o}\n" for t, m, i, o in rows))
    return path


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
