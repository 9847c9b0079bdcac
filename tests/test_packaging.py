"""The wheel installs one top-level package, ``atoll``, with every source folder in it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("control", "envs", "forecast", "solvers", "training")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # --no-build-isolation: no network in tests; setuptools and wheel are in the venv.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
         "-w", str(out), "-q"],
        capture_output=True, text=True, cwd=build,
    )
    assert proc.returncode == 0, proc.stderr
    wheels = list(out.glob("atoll-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_only_top_level_package_is_atoll(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"atoll"}
    top_level = [n for n in names if n.endswith("top_level.txt")]
    if top_level:
        assert zipfile.ZipFile(wheel).read(top_level[0]).decode().split() == ["atoll"]


def test_every_source_package_is_in_the_wheel(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.relative_to(ROOT).as_posix()
            assert f"atoll/{rel}" in names, (f"{rel} missing from the wheel: list its package in "
                                             f"pyproject.toml")
    assert "atoll/solvers/data/catalog.json" in names


def test_cache_never_inside_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from atoll.solvers import paths

    monkeypatch.delenv("ATOLL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert paths.cache_root() == tmp_path / "atoll"
    monkeypatch.setenv("ATOLL_CACHE_DIR", str(tmp_path / "c"))
    assert paths.cache_root() == tmp_path / "c"
