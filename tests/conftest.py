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
def _shipped_registries_unchanged() -> Iterator[None]:
    """A fleet file is a value: no test may change the shipped catalog, models or scenarios a
    later test would plan with (checked after every test, so such a change fails where it happens)."""
    from atoll.solvers.catalog import load_catalog
    from atoll.solvers.models import model_registry
    from atoll.solvers.scenarios import SCENARIOS

    def snapshot() -> tuple[object, ...]:
        catalog = load_catalog()
        return (catalog.offers, tuple(catalog.gpus.items()), tuple(model_registry().items()),
                tuple(SCENARIOS.items()))

    before = snapshot()
    yield
    assert snapshot() == before, "a test changed the shipped catalog, models or scenarios of this process"


@pytest.fixture(autouse=True)
def _no_run_folder_in_the_repository() -> Iterator[None]:
    """``atoll train`` without ``--run-dir`` writes ``runs/<fleet>-<key>`` under the working
    directory: a test must pass a temporary one, or the next run resumes the last one's state."""
    runs = Path(__file__).resolve().parents[1] / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    yield
    after = set(runs.iterdir()) if runs.is_dir() else set()
    new = sorted(map(str, after - before))
    assert after == before, f"a test wrote a run folder into the repository: {new}"
