"""One controller per state folder, and a state folder that cannot be read or written:
real subprocesses hold and die holding the lock."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from live_harness import Harness

from atoll.control.cli import main
from atoll.control.live_fleet import LiveFleet
from atoll.control.state import StateError, StateLock, StateLocked, load_state
from atoll.solvers import files

HOLDER = ("import sys, time\nfrom atoll.control.state import StateLock\n"
          "lock = StateLock(sys.argv[1])\nprint('locked', flush=True)\ntime.sleep(120)\n")


def hold(directory: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_controller_on_the_folder_exits_2_naming_the_holder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    proc = hold(state)
    try:
        with pytest.raises(StateLocked, match=rf"PID {proc.pid} on host {socket.gethostname()}"):
            StateLock(state)
        code = main(["control", "--scrape", "http://127.0.0.1:1", "--state", str(state), "--sink",
                     f"json:{tmp_path / 'plans'}", "--once"])
        err = capsys.readouterr().err.replace("\n", " ")
        assert code == 2 and f"PID {proc.pid}" in err and "in use by another controller" in err
        assert not (tmp_path / "plans").exists() and load_state(state) is None
    finally:
        proc.kill()
        proc.wait()


def test_a_dead_holders_lock_is_taken_over(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = hold(state)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with StateLock(state) as lock:
        assert lock.took_over is not None and f"PID {proc.pid}" in lock.took_over
        record = json.loads((state / "controller.lock").read_text())
        assert record["pid"] == os.getpid()
    with StateLock(state) as again:  # a clean release leaves no holder to take over from
        assert again.took_over is None


def test_binary_garbage_in_the_state_file_names_the_file(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "controller-state.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00garbage")
    with pytest.raises(StateError, match=r"controller-state\.json is not UTF-8"):
        load_state(state)
    code = main(["control", "--scrape", "http://127.0.0.1:1", "--state", str(state), "--sink",
                 f"json:{tmp_path / 'plans'}", "--once"])
    assert code == 2 and "controller-state.json is not UTF-8" in capsys.readouterr().err.replace("\n", "")


def test_a_read_only_state_folder_stops_the_tick_before_delivery_and_loses_nothing(
        fleet: LiveFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(fleet, tmp_path)
    h.tick()  # warm-up: the next tick plans from nothing
    saved = load_state(h.dir)
    real = files.tempfile.mkstemp

    def read_only(*args: object, **kwargs: object) -> tuple[int, str]:
        if Path(str(kwargs.get("dir"))) == h.dir:
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*args, **kwargs)  # type: ignore[call-overload,no-any-return]

    if os.geteuid() == 0:  # root writes through a read-only mode: make the filesystem refuse
        monkeypatch.setattr(files.tempfile, "mkstemp", read_only)
    else:
        h.dir.chmod(0o500)
    try:
        with pytest.raises(StateError, match=r"cannot write controller state .*controller-state\.json"):
            h.controller.tick()
    finally:
        monkeypatch.undo()
        h.dir.chmod(0o700)
    assert not (tmp_path / "plans").exists()  # nothing delivered that the state does not record
    assert load_state(h.dir) == saved
    h.controller = h.new()  # the next start resumes and delivers plan 1, once
    report = h.controller.tick()
    assert report.plan_changed and report.plan_sequence == 1 and report.sink_result["ok"]
    assert sorted(p.name for p in (tmp_path / "plans").iterdir()) == ["latest.json", "plan-000001.json"]
