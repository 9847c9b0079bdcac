"""The controller's tick schedule: late and missed ticks on a fake clock."""

from __future__ import annotations

import threading

from atoll.control.controller import TickReport
from atoll.control.decide import Decision
from atoll.control.loop import LoopSummary, run_loop


class _SlowController:
    """Ticks that take scripted times on a fake monotonic clock."""

    def __init__(self, durations: list[float], clock: list[float]) -> None:
        self.durations, self.clock, self.n = durations, clock, 0

    def tick(self) -> TickReport:
        self.clock[0] += self.durations[self.n]
        self.n += 1
        return TickReport(self.n - 1, 0.0, {"ok": True}, {}, Decision("x"), None, False, [], None, None, 0,
                          False, {"total": self.durations[self.n - 1]})


class _FakeEvent(threading.Event):
    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        self.clock[0] += timeout or 0.0
        return self.is_set()


def test_run_loop_counts_late_and_missed_ticks() -> None:
    clock = [0.0]
    ctl = _SlowController([0.1, 0.1, 2.5, 0.1, 0.1], clock)
    summary = run_loop(ctl, wall_interval_s=1.0, max_ticks=5, stop=_FakeEvent(clock),  # type: ignore[arg-type]
                       on_tick=lambda r: None, monotonic=lambda: clock[0])
    # tick 2 runs from 2.0 to 4.5: slot 3.0 passes wholly during it (missed), and the next tick
    # starts at 4.5, half an interval after its slot 4.0 (late)
    assert isinstance(summary, LoopSummary)
    assert summary.ticks == 5 and summary.missed == 1 and summary.late == 1
    on_time = run_loop(_SlowController([0.1] * 4, [0.0]), wall_interval_s=1.0, max_ticks=4,  # type: ignore[arg-type]
                       stop=_FakeEvent([0.0]), on_tick=lambda r: None)
    assert on_time.missed == 0
