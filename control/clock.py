"""One clock for the live controller: intervals from a monotonic clock, wall time only as an anchor.

The controller dates its ticks, history, start-ups and drains in seconds. A wall clock
(``time.time``) can be stepped — by NTP, a VM resumed, an operator — and an interval measured
across the step is wrong by the step: 5 minutes back doubles one interval's rate, an hour back
delays every make-before-break removal by an hour, ten hours forward divides a rate by 120.
:class:`SteadyClock` reads wall time once, at start, and advances by a monotonic clock from
there, so a step of the wall clock never lands in an interval. Wall time still matters (the
time of day a forecast's season follows, the ISO time of a tick), so the steady clock *slews*
toward the wall clock by at most ``max_slew`` of the time elapsed since the last reading: a step
is reported (``jump_s``) the moment it is seen and bounded in effect (a controller interval —
its billing, start-up and drain times — is at most ``max_slew`` off), and a wall clock that was
really corrected is followed in time. Metrics samples are dated by the unslewed reading
(:meth:`SteadyClock.metrics_clock`: the wall time at start plus the monotonic time since), so a
rate is never off by a step or its slew.

A state written under one clock and read under another (restarted on a host whose clock is
behind, or after the clock was stepped back) is read with its offset: the controller continues
from the state's last tick (:func:`resume_offset`) rather than waiting out the difference.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_SLEW = 0.1  # a wall step moves the steady clock by at most this share of the elapsed time
JUMP_TOLERANCE_S = 1.0  # differences below this are drift, not a step worth reporting


@dataclass
class ClockReport:
    """What the clock saw since the last report: ``jump_s`` the wall clock's step (seconds, + ahead),
    ``lag_s`` how far the steady clock still is from the wall clock after slewing."""

    jump_s: float = 0.0
    lag_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"wall_jump_s": self.jump_s, "wall_lag_s": self.lag_s}


class SteadyClock:
    """Seconds since the epoch, advanced by ``monotonic`` and slewed toward ``wall`` (see the
    module docstring); ``scale`` multiplies the result (a replay's trace seconds per second)."""

    def __init__(self, wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 *, scale: float = 1.0, max_slew: float = MAX_SLEW) -> None:
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"SteadyClock: field 'scale' must be finite and > 0, got {scale!r}")
        if not 0 <= max_slew < 1:
            raise ValueError(f"SteadyClock: field 'max_slew' must be in [0, 1), got {max_slew!r}")
        self.wall, self.monotonic, self.scale, self.max_slew = wall, monotonic, float(scale), float(max_slew)
        self._base = float(wall())  # steady seconds at the anchor
        self._mono = float(monotonic())
        self._anchor = (self._base, self._mono)  # never slewed: the metrics' clock
        self._last = self._base
        self._seen_lag = 0.0  # the wall - steady difference already reported
        self._jump = 0.0

    def seconds(self) -> float:
        """Unscaled steady seconds (the metrics' clock)."""
        mono = float(self.monotonic())
        elapsed = max(mono - self._mono, 0.0)
        steady = self._base + elapsed
        lag = float(self.wall()) - steady
        if abs(lag - self._seen_lag) > JUMP_TOLERANCE_S:
            self._jump += lag - self._seen_lag
        # slew: follow the wall clock by at most max_slew of the time since the last reading
        step = max(steady - self._last, 0.0) * self.max_slew
        shift = max(-step, min(step, lag))
        self._base += shift
        self._mono = mono
        self._base += elapsed
        self._last = self._base
        self._seen_lag = lag - shift
        return self._base

    def __call__(self) -> float:
        return self.seconds() * self.scale

    def report(self) -> ClockReport:
        """The wall steps seen since the last report, and the lag left (then forgets the steps)."""
        out = ClockReport(self._jump, self._seen_lag)
        self._jump = 0.0
        return out

    def metrics_clock(self) -> Callable[[], float]:
        """The unslewed, unscaled clock to date metrics samples with: the wall time at start plus
        the monotonic seconds since (a rate's interval is exactly the time that passed)."""
        wall0, mono0 = self._anchor

        def read() -> float:
            return wall0 + max(float(self.monotonic()) - mono0, 0.0)

        return read


def resume_offset(now_s: float, last_tick_s: float | None) -> float:
    """Seconds to add to this clock so that it continues from a state whose last tick is
    ``last_tick_s``: positive when the state was written under a clock ahead of this one, 0
    otherwise (a clock behind it cannot be told from the time the controller was down)."""
    if last_tick_s is None or now_s >= last_tick_s:
        return 0.0
    return last_tick_s - now_s


def state_clock_offset(where: object, recorded_time_scale: float | None, last_tick_s: float | None,
                       now_s: float, *, time_scale: float, interval_s: float) -> float:
    """The offset a controller on clock ``now_s`` (at ``time_scale``) resumes a state with (see
    :func:`resume_offset`), after refusing a state written on another clock: its start-up, drain
    and history times would be read years off (instances "starting" for millennia, removals never
    sent, a forecast binning 3e8 empty bins). A :class:`~atoll.control.state.StateError` names the
    state folder ``where`` and the fix."""
    from atoll.control.state import StateError

    recorded = recorded_time_scale
    if recorded is not None and not math.isclose(recorded, time_scale, rel_tol=1e-9):
        raise StateError(f"controller state in {where} was written at --time-scale {recorded:g}, "
                         f"this controller runs at --time-scale {time_scale:g}: their clocks differ by "
                         f"that factor; run with --time-scale {recorded:g}, or give this one "
                         f"its own --state folder")
    last = last_tick_s
    if last is not None and now_s < last - max(10 * interval_s, 86400.0):  # not an NTP step
        raise StateError(f"controller state in {where} has its last tick at {last:.0f} s, "
                         f"{last - now_s:.0f} s after this controller's clock ({now_s:.0f} s): it was "
                         f"written on another clock (another --time-scale?); run it with the clock "
                         f"that wrote it, or give this one its own --state folder")
    # a state written under a clock ahead of this one (stepped back since, or another host's):
    # continue from its last tick, so its start-up and drain times keep their meaning
    return resume_offset(now_s, last)


def iso(epoch_s: float) -> str:
    """An epoch time as ISO 8601 UTC (second precision)."""
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC).isoformat(timespec="seconds")
