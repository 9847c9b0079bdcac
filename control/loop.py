"""The controller's tick scheduler: ticks on a fixed wall-clock schedule, counting late and
missed ticks, until stopped.

Ticks are scheduled at ``start + k x interval`` rather than ``interval`` after the previous one,
so a slow tick does not shift every later one; a tick is never interrupted — ``stop`` is only
looked at between ticks, so a signal lets the tick in progress finish and persist.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from atoll.control.controller import TickReport

LATE_FRACTION = 0.1  # a tick starting more than 10% of an interval after its slot is late
RECENT_TICKS = 1000  # the median tick time is over the last this many ticks (memory stays bounded)


class Ticking(Protocol):
    def tick(self) -> TickReport: ...


@dataclass
class LoopSummary:
    """ticks run; late: ticks that started over ``LATE_FRACTION`` of an interval after their
    scheduled time; missed: scheduled ticks skipped because an earlier one ran past them;
    stopped_by: why the loop ended (``signal`` or ``ticks``); tick_seconds: the last
    ``RECENT_TICKS`` ticks' durations (a month of 5 s ticks must not grow a list without end),
    max_tick_seconds: the longest of all."""

    ticks: int = 0
    late: int = 0
    missed: int = 0
    stopped_by: str = ""
    tick_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_TICKS))
    max_tick_seconds: float | None = None

    def record(self, seconds: float) -> None:
        self.tick_seconds.append(seconds)
        top = self.max_tick_seconds
        self.max_tick_seconds = seconds if top is None else max(top, seconds)

    def as_dict(self) -> dict[str, Any]:
        s = sorted(self.tick_seconds)
        return {"ticks": self.ticks, "late_ticks": self.late, "missed_ticks": self.missed,
                "stopped_by": self.stopped_by,
                "tick_seconds_median": s[len(s) // 2] if s else None,
                "tick_seconds_max": self.max_tick_seconds}


def run_loop(controller: Ticking, *, wall_interval_s: float, max_ticks: int | None, stop: threading.Event,
             on_tick: Callable[[TickReport], None], monotonic: Callable[[], float] = time.monotonic
             ) -> LoopSummary:
    """Tick on a fixed schedule (``start + k x wall_interval_s``) until ``stop`` is set or
    ``max_ticks`` ran."""
    summary = LoopSummary()
    start = monotonic()
    k = 0
    while not stop.is_set() and (max_ticks is None or summary.ticks < max_ticks):
        if monotonic() - (start + k * wall_interval_s) > LATE_FRACTION * wall_interval_s:
            summary.late += 1
        report = controller.tick()
        summary.ticks += 1
        summary.record(report.seconds.get("total", 0.0))
        on_tick(report)
        k += 1
        behind = monotonic() - (start + k * wall_interval_s)
        if behind > wall_interval_s:  # whole slots passed during the tick: they are skipped
            skipped = int(behind // wall_interval_s)
            summary.missed += skipped
            k += skipped
        if max_ticks is not None and summary.ticks >= max_ticks:
            break
        stop.wait(max(0.0, start + k * wall_interval_s - monotonic()))
    summary.stopped_by = "signal" if stop.is_set() else "ticks"
    return summary
