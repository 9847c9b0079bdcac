"""Controller state: round trip, atomic replacement (crash before the rename, kill -9), bad files."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from atoll.control.metrics import MetricsSnapshot, ModelMetrics, SeriesSample
from atoll.control.plans import PlanRecord
from atoll.control.state import (
    STATE_FILE,
    ControllerState,
    HistoryPoint,
    StateError,
    load_state,
    save_state,
)

REPO = Path(__file__).resolve().parents[2]
DESC = {"service": "m/decode", "model": "m", "phase": "decode", "region": "r", "nodes": [["1xL4", 1]],
        "stages": [[10, ["1xL4"]]], "throughput": 5.0}


def full_state() -> ControllerState:
    pending = PlanRecord(4, 120.0, {"k": 2}, {"k": DESC}, {"k": 1}, {"m/decode": 7.5}, "forecast rose")
    metrics = MetricsSnapshot(118.0, {"m": ModelMetrics((SeriesSample("instance=a", 117.5, 1e6, 2e5),),
                                                        3.0, 5.0, 0.25)}, "http://prom")
    state = ControllerState(tick=12, last_tick_s=118.0, running={"k": 1, "gone": 0}, plan_sequence=4,
                            pending=pending, last_reoptimized={"m": 9}, last_metrics=metrics)
    return state.with_history("m", HistoryPoint(60.0, 100.0, 20.0)).with_history(
        "m", HistoryPoint(120.0, 110.0, 22.0, 1.1))


def test_round_trip(tmp_path: Path) -> None:
    assert load_state(tmp_path) is None
    state = full_state()
    path = save_state(tmp_path / "state", state)
    assert path.name == STATE_FILE
    loaded = load_state(tmp_path / "state")
    assert loaded == state
    assert loaded is not None and loaded.running == {"k": 1} and loaded.history["m"][-1].requests_per_s == 1.1


def test_nan_in_metrics_survives_as_strict_json(tmp_path: Path) -> None:
    metrics = MetricsSnapshot(1.0, {"m": ModelMetrics((SeriesSample("r", 1.0, math.nan, 3.0),), None, 1.0,
                                                      problems=("nan",))})
    save_state(tmp_path, ControllerState(last_metrics=metrics))
    assert "NaN" not in (tmp_path / STATE_FILE).read_text()
    loaded = load_state(tmp_path)
    assert loaded is not None and loaded.last_metrics is not None
    assert math.isnan(loaded.last_metrics.models["m"].series[0].prompt_tokens)


def test_history_is_bounded() -> None:
    state = ControllerState(history_limit=3)
    for i in range(5):
        state = state.with_history("m", HistoryPoint(float(i), 1.0, 1.0))
    assert [p.time_s for p in state.history["m"]] == [2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match="field 'tick'"):
        ControllerState(tick=-1)
    with pytest.raises(ValueError, match="requests_per_s"):
        HistoryPoint(0.0, 1.0, 1.0, -2.0)


def test_crash_between_temp_write_and_rename_keeps_the_old_state(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    old = ControllerState(tick=1, running={"k": 1})
    save_state(tmp_path, old)

    def crash(src: str, dst: str) -> None:
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr("atoll.solvers.files.os.replace", crash)
    with pytest.raises(StateError, match="simulated crash"):
        save_state(tmp_path, ControllerState(tick=2, running={"k": 5}))
    monkeypatch.undo()
    # a temp file a real crash (kill -9) would leave behind is ignored
    (tmp_path / f".{STATE_FILE}.abc123.tmp").write_text('{"version": 1, "tick": ')
    assert load_state(tmp_path) == old


def test_kill_9_while_saving_leaves_a_readable_state(tmp_path: Path) -> None:
    code = ("import sys\nfrom atoll.control.state import ControllerState, save_state\n"
            "for i in range(100000):\n"
            "    running = {f'k{j}': i + 1 for j in range(200)}\n"
            "    save_state(sys.argv[1], ControllerState(tick=i, running=running))\n"
            "    if i == 0: print('saved', flush=True)\n")
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.stdout is not None and proc.stdout.readline() == b"saved\n"
        time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        state = load_state(tmp_path)
        assert state is not None and set(state.running.values()) == {state.tick + 1}


def test_corrupt_and_foreign_files_name_the_file_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / STATE_FILE
    for text, match in (("{not json", rf"{path}.*not valid JSON.*delete it"),
                        ('{"version": 99, "tick": 1}', "schema version 99; this atoll reads version 1"),
                        ('{"version": 1}', r"malformed \(KeyError: 'tick'\).*restore it from a backup"),
                        ('{"version": 1, "tick": -3}', "field 'tick' must be >= 0, got -3"),
                        ("[1, 2]", "holds a list")):
        path.write_text(text)
        with pytest.raises(StateError, match=match):
            load_state(tmp_path)
