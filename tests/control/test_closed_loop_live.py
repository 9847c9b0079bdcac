"""The closed loop live: a replay that serves the delivered plan in a world 25% below
the model, and the controller learning that world from the replay's vLLM metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from control_helpers import tiny_series
from live_harness import MODELS

from atoll.control.controller import Controller, ControllerSettings
from atoll.control.live_check import family_error_after, run_live_loop
from atoll.control.live_fleet import LiveFleet
from atoll.control.metrics import ScrapeSource
from atoll.control.plans import PlanRecord
from atoll.control.replay import ReplayExporter
from atoll.control.served import ServedFleet, latest_plan
from atoll.control.sinks import JsonDirSink
from atoll.control.state import load_state
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.problem import Allocation

# the traffic's own shape (tokens per request), different from the profiled 100 / 10 on purpose
REAL_INPUT, REAL_OUTPUT = 60.0, 20.0


def _series() -> list:
    # steady traffic a few instances serve (the library's throughputs: see live_harness)
    return [tiny_series(m, [3.0 + i] * 400, REAL_INPUT, REAL_OUTPUT, step_s=300.0)
            for i, m in enumerate(MODELS)]


def test_the_controller_learns_a_world_25_percent_below_the_model(fleet: LiveFleet, tmp_path: Path) -> None:
    result = run_live_loop(fleet, _series(), MODELS, tmp_path, capacity_error="scale:0.75", ticks=16,
                           start_day=1)
    assert set(result.truth.values()) == {0.75}
    after = family_error_after(result, 12)
    assert after, "no family served for an hour"
    assert max(after.values()) <= 0.05, after
    # each phase is still planned from its measured rate x the forecast's headroom
    for row in result.ticks[1:]:
        for ratio in row["phases"].values():
            assert ratio == pytest.approx(1.0, rel=0.10)


def test_a_plan_carries_the_factors_it_was_solved_with(fleet: LiveFleet) -> None:
    key = next(iter(fleet.templates))
    record = PlanRecord.from_allocation(1, 0.0, Allocation.of({key: 2}), None, fleet.templates, {}, "test",
                                        correction={"Phi-4-14B/prefill/L40S/pp1-tp1": 0.8})
    doc = json.loads(json.dumps(record.as_dict()))
    assert doc["correction"] == {"Phi-4-14B/prefill/L40S/pp1-tp1": 0.8}
    assert PlanRecord.from_dict(doc).correction == record.correction
    with pytest.raises(ValueError, match="field 'correction'"):
        PlanRecord.from_allocation(1, 0.0, Allocation.of({key: 2}), None, fleet.templates, {}, "test",
                                   correction={"f": float("nan")})


def test_the_exact_world_learns_factors_of_one(fleet: LiveFleet, tmp_path: Path) -> None:
    result = run_live_loop(fleet, _series(), MODELS, tmp_path, capacity_error=0, ticks=16, start_day=1)
    factors = result.ticks[-1]["factors"]
    assert factors and all(k == pytest.approx(1.0, abs=0.05) for k in factors.values())


def test_correction_survives_a_restart(fleet: LiveFleet, tmp_path: Path) -> None:
    result = run_live_loop(fleet, _series(), MODELS, tmp_path, capacity_error="scale:0.75", ticks=8,
                           start_day=1)
    learned = result.ticks[-1]["factors"]
    assert learned
    state = load_state(tmp_path / "state")
    assert state is not None and state.correction["factors"] == pytest.approx(learned)
    # a new controller on the same state folder (as after kill -9) plans with the same factors
    served = ServedFleet(fleet.model, latest_plan(tmp_path / "plans"), capacity_error="scale:0.75")
    clock = [0.0]
    with ReplayExporter(_series(), MODELS, speedup=60.0, clock=lambda: clock[0], served=served) as exporter:
        again = Controller(fleet, ScrapeSource(exporter.url, clock=lambda: clock[0]),
                           make_policy(parse_policy("fixed:1"), 2),
                           JsonDirSink(tmp_path / "plans"), tmp_path / "state",
                           settings=ControllerSettings(interval_s=300.0, time_scale=60.0),
                           clock=lambda: result.ticks[-1]["time_s"] + 300.0, sleep=lambda s: None)
        assert again.correction.factors() == pytest.approx(learned)
        assert again.correction.planning_factors() == pytest.approx(state.correction["planning_factors"])


def test_correction_off_plans_on_the_model(fleet: LiveFleet, tmp_path: Path) -> None:
    served = ServedFleet(fleet.model, latest_plan(tmp_path / "plans"), capacity_error="scale:0.75")
    clock = [0.0]
    with ReplayExporter(_series(), MODELS, speedup=60.0, clock=lambda: clock[0], served=served) as exporter:
        controller = Controller(fleet, ScrapeSource(exporter.url, clock=lambda: clock[0]),
                                make_policy(parse_policy("fixed:1"), 2), JsonDirSink(tmp_path / "plans"),
                                tmp_path / "state",
                                settings=ControllerSettings(interval_s=300.0, time_scale=60.0,
                                                            correction=False),
                                clock=lambda: 60.0 * clock[0], sleep=lambda s: None)
        for _ in range(6):
            report = controller.tick()
            clock[0] += 5.0
    assert report.correction["enabled"] is False and not report.correction["planning_factors"]
