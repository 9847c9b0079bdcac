"""One clock: intervals from a monotonic clock, wall-clock steps reported and bounded, a state
written under a clock ahead of this one read with its offset."""

from __future__ import annotations

from pathlib import Path

import pytest
from control_helpers import FakeClock, tiny_series
from live_harness import MODELS

from atoll.control.clock import MAX_SLEW, SteadyClock, iso
from atoll.control.controller import Controller, ControllerSettings
from atoll.control.live_fleet import LiveFleet
from atoll.control.metrics import ScrapeSource
from atoll.control.replay import ReplayExporter
from atoll.control.sinks import JsonDirSink
from atoll.control.state import ControllerState, save_state
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import parse_policy

T0 = 1.7e9


def test_a_wall_step_is_reported_and_moves_an_interval_by_at_most_the_slew() -> None:
    wall, mono = FakeClock(T0), FakeClock(5.0)
    clock = SteadyClock(wall, mono)
    start = clock()
    for seconds, step in ((300.0, 0.0), (300.0, -300.0), (300.0, 0.0), (300.0, 36000.0)):
        before = clock()
        wall.advance(seconds + step)
        mono.advance(seconds)
        interval = clock() - before
        assert interval == pytest.approx(seconds, rel=MAX_SLEW + 1e-9)
        assert clock.report().jump_s == pytest.approx(step, abs=1.0)
    assert clock() > start
    # the steady clock converges on a corrected wall clock within a bounded number of readings
    for _ in range(1300):  # a 10 h step at 30 s per 300 s reading
        wall.advance(300.0)
        mono.advance(300.0)
        clock()
    assert clock() == pytest.approx(wall(), abs=1.0)
    assert iso(0.0) == "1970-01-01T00:00:00+00:00"


@pytest.mark.parametrize("dated_by", ["steady", "wall"])
def test_a_wall_clock_stepped_back_does_not_change_a_rate(fleet: LiveFleet, tmp_path: Path,
                                                          dated_by: str) -> None:
    wall, mono = FakeClock(T0), FakeClock(0.0)
    steady = SteadyClock(wall, mono)
    series = [tiny_series(m, [3.0] * 100, step_s=300.0) for m in MODELS]
    with ReplayExporter(series, MODELS, clock=mono) as exporter:
        source = ScrapeSource(exporter.url, clock=steady.metrics_clock() if dated_by == "steady" else wall)
        never = make_policy(parse_policy("never"), 2)
        controller = Controller(fleet, source, never, JsonDirSink(tmp_path / "plans"),
                                tmp_path / "state", settings=ControllerSettings(interval_s=300.0),
                                clock=steady if dated_by == "steady" else wall, sleep=lambda s: None)
        rates = []
        for k in range(4):
            rates.append(controller.tick().metrics["rates"]["Phi-4-14B"]["prompt_tokens_per_s"])
            mono.advance(300.0)
            wall.advance(300.0 - (150.0 if k == 1 else 0.0))  # stepped back 150 s once
    if dated_by == "wall":
        assert rates[2] == pytest.approx(600.0)  # what a wall-dated rate does: doubled
        return
    assert rates[1] == pytest.approx(300.0, rel=1e-6)
    assert rates[2] == pytest.approx(300.0, rel=1e-6)  # dated by the unslewed monotonic anchor
    assert rates[3] == pytest.approx(300.0, rel=1e-6)


def test_a_state_written_under_a_clock_ahead_is_read_with_its_offset(fleet: LiveFleet,
                                                                    tmp_path: Path) -> None:
    key = next(k for k in fleet.templates if k.startswith("Phi-4-14B") and "prefill" in k)
    ahead = 3600.0
    save_state(tmp_path / "state", ControllerState(tick=5, last_tick_s=T0 + ahead, running={key: 2},
                                                   starting=((key, 1, T0 + ahead + 60.0),)))
    controller = Controller(fleet, ScrapeSource("http://127.0.0.1:9"), make_policy(parse_policy("never"), 2),
                            JsonDirSink(tmp_path / "plans"), tmp_path / "state",
                            settings=ControllerSettings(interval_s=300.0), clock=lambda: T0,
                            sleep=lambda s: None)
    assert controller.clock_offset == pytest.approx(ahead)
    assert controller.now() == pytest.approx(T0 + ahead)
    # the instance starting when the state was saved is ready 60 s later, not an hour and a minute
    assert controller.fleet_state(controller.now() + 61.0).starting == {}
    report = controller.tick()  # metrics unavailable: held, and the clock still reported
    assert report.clock["offset_s"] == pytest.approx(ahead) and report.clock["wall_time"]
