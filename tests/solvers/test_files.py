"""Atomic file writes: a reader sees the old or the new file, and others can read it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from atoll.solvers.files import atomic_write_bytes, atomic_write_text


def test_atomic_writes_are_readable_by_others(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    atomic_write_text(path, "{}")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    os.chmod(path, 0o640)
    atomic_write_text(path, "{}")  # a file's own mode is kept
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "entry.bin"
    atomic_write_bytes(path, b"old")

    def crash(src: str, dst: str) -> None:
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr("atoll.solvers.files.os.replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        atomic_write_bytes(path, b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.bin"]
    atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new"
