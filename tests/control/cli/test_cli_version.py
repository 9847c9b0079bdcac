"""``atoll --version``: the installed package's version, the one ``pyproject.toml`` declares, and
the changelog's newest section."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from atoll.control.cli import main

ROOT = Path(__file__).resolve().parents[3]
RELEASE = "0.2.0"  # the release this tree is: a bump changes pyproject.toml, the changelog and this


def _declared() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_the_version_is_declared_once_and_installed() -> None:
    assert _declared() == RELEASE
    assert version("atoll") == RELEASE  # the installed metadata: a stale install fails here


def test_version_prints_the_release(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"atoll {RELEASE}\n"


def test_the_command_prints_it_too() -> None:
    run = subprocess.run([sys.executable, "-m", "atoll.control.cli", "--version"],
                         capture_output=True, text=True, check=True)
    assert run.stdout == f"atoll {RELEASE}\n"


def test_the_changelogs_newest_version_is_the_packages() -> None:
    headings = re.findall(r"^## (\S+)\s*$", (ROOT / "docs" / "changelog.md").read_text(), flags=re.M)
    assert headings[0] == _declared()
    assert headings == sorted(headings, key=lambda v: tuple(int(p) for p in v.split(".")), reverse=True)
