"""A user's own model for the fleet-file and catalog tests: Acme-8B, an 8B dense model the catalog
does not know, as a fleet file gives it (fields of ModelSpec, with its SLO)."""

from __future__ import annotations

import textwrap
from typing import Any

import yaml

ACME_8B: dict[str, Any] = {
    "name": "Acme-8B", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
    "params_b": 8.0, "active_params_b": 8.0, "bytes_per_param": 2, "slo": {"ttft_ms": 800, "tpot_ms": 40},
}


def models_yaml(*models: dict[str, Any] | str) -> str:
    """The entries of a ``models:`` list in a YAML file, one field a line (``    layers: 32``)
    under ``  - name: ...`` and the SLO inline; a name stands for a catalog model."""
    return textwrap.indent(yaml.safe_dump(list(models), sort_keys=False, default_flow_style=None), "  ")
