"""The observation of risk live: the pool event log's reading and gates, the shares, the latency
miss from histogram buckets, queue growth, and the controller's refusal of a risk policy without
a log."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from atoll.control.risk_signals import (
    FUTURE_TOLERANCE_S,
    PoolEvent,
    PoolEventLog,
    QueueGrowth,
    pool_shares,
    requested_by_type,
    share_over,
)
from atoll.control.state import ControllerState

CONFIGS = frozenset({"4xL40S", "1xH100"})


def line(t: float, event: str = "preempted", config: str = "4xL40S", nodes: int = 1) -> str:
    return f'{{"time": {t}, "event": "{event}", "config": "{config}", "nodes": {nodes}}}\n'


def test_the_log_is_read_as_it_grows_and_names_every_line_it_ignores(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(line(100.0) + "{broken\n" + line(200.0, config="8xA100") + line(300.0, nodes=-1))
    log = PoolEventLog(path, CONFIGS)
    events, ignored = log.read(400.0)
    assert [e.time_s for e in events] == [100.0]
    assert len(ignored) == 3 and ignored[0].startswith("events.jsonl:2")
    assert "8xA100" in ignored[1] and "'nodes'" in ignored[2]
    # appended lines are read once, a half-written last line waits for its newline
    with path.open("a") as fh:
        fh.write(line(500.0, "refused", "1xH100", 2) + '{"time": 600')
    events, ignored = log.read(600.0)
    assert [(e.event, e.nodes) for e in events] == [("preempted", 1), ("refused", 2)] and ignored == []
    # the window forgets old events; a truncated (rotated) file is read again from its start
    assert [e.time_s for e in log.read(100.0 + 3600.0)[0]] == [500.0]
    path.write_text(line(4000.0))
    assert [e.time_s for e in log.read(4100.0)[0]] == [4000.0]


def test_a_missing_log_is_an_error_naming_it_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="create it empty"):
        PoolEventLog(tmp_path / "nope.jsonl", CONFIGS)


@pytest.mark.parametrize("doc", [{"time": 1.0, "event": "lost", "config": "4xL40S", "nodes": 1},
                                 {"time": float("nan"), "event": "refused", "config": "4xL40S", "nodes": 1},
                                 {"time": 1.0, "event": "refused", "config": "4xL40S", "nodes": 1.5},
                                 {"time": 1.0, "event": "refused", "nodes": 1}])
def test_a_malformed_event_names_its_field(doc: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="event|time|nodes|config"):
        PoolEvent.from_json(doc)


def test_shares_follow_the_simulators_formula_and_implausible_events_are_held() -> None:
    gpus = ("L40S", "H100")
    events = [PoolEvent(10.0, "preempted", "4xL40S", 2), PoolEvent(20.0, "refused", "1xH100", 1),
              PoolEvent(30.0, "refused", "4xL40S", 5), PoolEvent(100.0 + 2 * FUTURE_TOLERANCE_S, "preempted",
                                                                "1xH100", 1)]
    pre, fail, held = pool_shares(events, gpus, held=np.array([6.0, 0.0]), requested=np.array([2.0, 4.0]),
                                  now_s=100.0)
    assert pre.tolist() == [2 / 8, 0.0]  # preempted / (preempted + held)
    assert fail.tolist() == [1.0, 0.25]  # 5 refused of 2 requested: held at 2
    assert len(held) == 2 and "future" in held[0] and "requested" in held[1]
    pre, _, held = pool_shares([PoolEvent(10.0, "preempted", "1xH100", 3)], gpus, np.array([0.0, 1.0]),
                               np.zeros(2), 100.0)
    assert pre.tolist() == [0.0, 0.5] and "holds 1" in held[0]


def test_latency_miss_reads_buckets_as_prometheus_does() -> None:
    buckets = ((0.5, 50.0), (1.0, 80.0), (2.0, 90.0), (float("inf"), 100.0))
    assert share_over(buckets, 1.0) == pytest.approx(0.2)
    assert share_over(buckets, 1.5) == pytest.approx(0.15)  # linear within (1, 2]
    assert share_over(buckets, 0.25) == pytest.approx(0.75)
    assert share_over(buckets, 5.0) == pytest.approx(0.1)  # past the last finite edge: counted over
    assert share_over(None, 1.0) == 0.0 and share_over(((1.0, 0.0), (float("inf"), 0.0)), 1.0) == 0.0


def test_queue_growth_is_measured_from_the_last_plausible_gauge() -> None:
    q = QueueGrowth()
    assert q.update("m", 4.0, 6.0) == 0.0  # no base yet
    assert q.update("m", 9.0, 1.0) == pytest.approx(0.5)
    assert q.update("m", None, None) == 0.0  # held: the base stays
    assert q.update("m", 0.0, 1.0) == -1.0  # clipped


def test_requested_nodes_count_the_window_and_persist() -> None:
    log = ((0.0, "L40S", 4.0), (3000.0, "L40S", 1.0), (3500.0, "H100", 0.5))
    assert requested_by_type(log, ("L40S", "H100"), 3600.0).tolist() == [5.0, 0.5]
    assert requested_by_type(log, ("L40S", "H100"), 3601.0).tolist() == [1.0, 0.5]
    state = ControllerState(requested=log)
    assert ControllerState.from_dict(state.as_dict()).requested == log
    with pytest.raises(ValueError, match="requested"):
        ControllerState(requested=((0.0, "L40S", -1.0),))
