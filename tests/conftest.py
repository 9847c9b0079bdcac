"""Shared fixtures: the public data folder and an isolated MLflow store."""

from __future__ import annotations

from collections.abc import Iterator
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


@pytest.fixture(autouse=True)
def _shipped_registries() -> Iterator[None]:
    """Activating a fleet overlays its catalog, models and scenario on this process: each test
    gets back what it found, so no test's fleet leaks into a later test's solves."""
    from metamorphic_targets import restored_registries

    with restored_registries():
        yield
