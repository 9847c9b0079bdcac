"""Shared fixtures: the public data folder and an isolated MLflow store."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"public data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _isolated_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No test may write to the repository's mlruns/ store.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    # atoll.training.tracking.configure() calls mlflow.set_tracking_uri, a process global that
    # outranks the variable: clear it for each test, and restore the cleared value afterwards.
    monkeypatch.setattr("mlflow.tracking._tracking_service.utils._tracking_uri", None)
