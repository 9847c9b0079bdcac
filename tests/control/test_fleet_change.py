"""A fleet change is a plan change: instances on templates the new fleet lacks keep serving until
their replacements are ready, reported as retiring; churn is counted as a figure."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from live_harness import INPUT, LAYERS, MODELS, OUTPUT, USE2, Harness, live_fleet

from atoll.control.churn import diff_counts, figure, record
from atoll.control.live_fleet import LiveFleet
from atoll.solvers.types import Phase, Service, Stage, Template


def _moved_fleet() -> LiveFleet:
    """The same models with prefill on 1xL4 instead of 1xL40S: every running prefill template
    of the first fleet is gone from this one."""
    out = []
    for m in MODELS:
        out.append(Template(Service(m, Phase.PREFILL), USE2, (("1xL4", 1),), (Stage(LAYERS[m], ("1xL4",)),),
                            400.0))
        out.append(Template(Service(m, Phase.DECODE), USE2, (("1xL4", 1),), (Stage(LAYERS[m], ("1xL4",)),),
                            200.0))
    return LiveFleet("core", models=MODELS, templates=tuple(out), request_shapes=[(INPUT, OUTPUT)] * 2)


def _latest(tmp: Path) -> dict[str, int]:
    return json.loads((tmp / "plans" / "latest.json").read_text())["plan"]


def test_a_changed_fleet_retires_its_instances_make_before_break(tmp_path: Path) -> None:
    h = Harness(live_fleet(), tmp_path)
    for _ in range(3):
        h.tick()
    old = {k: n for k, n in h.controller.state.running.items() if "/prefill@" in k}
    assert old and sum(old.values()) >= 2
    h.fleet = _moved_fleet()  # restarted on the same state with another fleet file
    h.controller = h.new()
    assert h.controller.retiring == old
    report = h.tick()
    delivered = _latest(tmp_path)
    # nothing dropped at once: every retiring instance is still in the delivered plan, beside
    # its replacements
    assert all(delivered.get(k) == n for k, n in old.items()), delivered
    assert any(k not in old and "/prefill@" in k for k in delivered)
    assert report.churn["retiring"] == old
    assert all(m in report.decision.chosen for m in MODELS)
    assert "retire" in json.loads((tmp_path / "plans" / "latest.json").read_text())["reason"]
    # once the additions are ready (start-up passed), the removal phase is delivered
    for _ in range(6):
        report = h.tick()
    delivered = _latest(tmp_path)
    assert not any(k in delivered for k in old), delivered
    assert h.controller.retiring == {} and "retiring" not in report.churn
    assert report.churn["removed"] >= sum(old.values())


def test_a_changed_fleet_with_nothing_to_add_still_retires_without_dropping(tmp_path: Path) -> None:
    h = Harness(live_fleet(), tmp_path)
    for _ in range(3):
        h.tick()
    running = dict(h.controller.state.running)
    extra = next(k for k in running if "/prefill@" in k)
    state = h.controller.state
    h.controller.state = replace(state, running={**running, "Gone-1B/prefill@x": 1},
                                 templates={**state.templates, "Gone-1B/prefill@x": state.templates[extra]})
    assert h.controller.retiring == {"Gone-1B/prefill@x": 1}
    h.tick()
    assert _latest(tmp_path).get("Gone-1B/prefill@x") == 1  # kept while it retires
    h.tick()
    assert "Gone-1B/prefill@x" not in _latest(tmp_path)


def test_churn_is_added_plus_removed_per_hour_over_the_fleet() -> None:
    assert diff_counts({"a": 3, "b": 1}, {"a": 1, "c": 2}) == (2, 3)
    log = record((), 0.0, 0, 0)
    assert log == ()
    log = record(record(log, 100.0, 5, 0), 1900.0, 0, 5)
    fig = figure(log, 3600.0, 100)
    assert (fig["added"], fig["removed"]) == (5, 5)
    assert fig["per_hour_over_fleet"] == pytest.approx(0.10)
    assert figure(log, 3700.0 + 1, 100)["added"] == 0  # out of the hour's window
    assert figure(log, 3600.0, 0)["per_hour_over_fleet"] is None
    assert record(log, 200000.0, 1, 0) == ((200000.0, 1, 0),)  # a day later the log is short


def test_a_newer_plan_during_the_change_keeps_the_retiring_instances(tmp_path: Path) -> None:
    h = Harness(live_fleet(), tmp_path, interval=10.0)  # ticks far shorter than a start-up
    for _ in range(3):
        h.tick()
    old = {k: n for k, n in h.controller.state.running.items() if "/prefill@" in k}
    h.fleet = _moved_fleet()
    h.controller = h.new()
    h.tick()
    h.source.rates = {m: 2 * r for m, r in h.source.rates.items()}  # demand doubles mid-change
    for _ in range(4):
        report = h.tick()
        if report.plan_changed:
            break
    assert report.plan_changed and h.controller.state.final is not None
    delivered = _latest(tmp_path)
    assert all(delivered.get(k) == n for k, n in old.items()), delivered
