"""Where the package finds its shipped tables and the shared public data."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DATA = Path(__file__).resolve().parent / "data"
CATALOG_PATH = PACKAGE_DATA / "catalog.json"
PERF_FACTORS_PATH = PACKAGE_DATA / "perf_factors.json"
REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """``$ATOLL_SHARED_DATA`` or ``<repo>/../shared/data``; a clear error when absent."""
    env = os.environ.get("ATOLL_SHARED_DATA")
    path = Path(env) if env else REPO_ROOT.parent / "shared" / "data"
    if not path.is_dir():
        raise FileNotFoundError(
            f"shared data folder not found: {path} — set ATOLL_SHARED_DATA to the folder that "
            f"holds the public data sets (e.g. .../shared/data)"
        )
    return path
