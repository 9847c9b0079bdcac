"""The controller's tick with scripted metrics and a fake clock: decisions, restarts, faults."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from control_helpers import FakeClock
from live_harness import (
    DECODE_TPS,
    INPUT,
    MODELS,
    OUTPUT,
    PREFILL_TPS,
    USE2,
    Harness,
    ScriptedServers,
    live_fleet,
)

from atoll.control.controller import Controller, ControllerSettings
from atoll.control.live_fleet import LiveFleet
from atoll.control.plans import PlanRecord, SinkError, SinkResult
from atoll.control.sinks import JsonDirSink
from atoll.control.state import load_state
from atoll.envs.fleet import FleetState
from atoll.envs.planner import PlanOutcome
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.problem import Allocation, SolveStatus


def instances(plan: dict[str, int], model: str, phase: str) -> int:
    return sum(n for k, n in plan.items() if f"{model}/{phase}" in k or (model in k and phase in k))


def capacity(fleet: LiveFleet, plan: dict[str, int]) -> np.ndarray:
    """[models, 2] planned tokens/s of ``plan`` (the env's fleet model computes it)."""
    return fleet.model.capacity(FleetState(running=fleet.known(plan)), 0.0)[1]


def test_first_read_warms_up_then_the_fleet_is_planned_for_the_forecast(fleet: LiveFleet,
                                                                         tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path)
    first = h.tick()
    assert first.decision.chosen == {} and set(first.decision.held) == set(MODELS)
    assert all("warming_up" in why for why in first.decision.held.values())
    assert not first.plan_changed and first.solve is None
    second = h.tick()
    assert set(second.decision.chosen) == set(MODELS)
    assert all("no capacity" in why for why in second.decision.chosen.values())
    assert second.plan_changed and second.sink_result is not None and second.sink_result["ok"]
    # demand 10 req/s: 1000 prompt and 100 generation tokens/s; planned for recent max x 1.1
    cap = capacity(fleet, h.controller.state.running)
    assert np.all(cap[:, 0] >= 1100 - 1e-6) and np.all(cap[:, 1] >= 110 - 1e-6)
    assert np.all(cap[:, 0] == 2 * PREFILL_TPS) and np.all(cap[:, 1] == DECODE_TPS)  # the cheapest cover
    adds = {(d["model"], d["phase"]): d["change"] for d in second.diff}
    assert adds == {(m, p): (2 if p == "prefill" else 1) for m in MODELS for p in ("prefill", "decode")}
    assert all(d["region"] == USE2 and d["action"] == "add" for d in second.diff)
    latest = json.loads((tmp_path / "plans" / "latest.json").read_text())
    assert latest["plan"] == h.controller.state.running
    saved = load_state(h.dir)
    assert saved is not None and saved.running == h.controller.state.running and saved.tick == 2
    assert saved.pending is None and saved.plan_sequence == 1


def test_the_policy_decides_which_models_are_reoptimized(fleet: LiveFleet, tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path, policy="fixed:3")
    reports = [h.tick() for _ in range(7)]
    chosen = [sorted(r.decision.chosen) for r in reports]
    # tick 1 plans (no capacity yet); then fixed:3 re-optimizes every model at ticks 3 and 6
    assert chosen == [[], sorted(MODELS), [], sorted(MODELS), [], [], sorted(MODELS)]
    assert all("fixed:3" in why for why in reports[3].decision.chosen.values())
    assert reports[3].solve is not None and reports[3].solve["result"] == "unchanged"


def test_threshold_replans_only_the_model_whose_demand_outgrew_its_plan(fleet: LiveFleet,
                                                                          tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path, policy="threshold")
    for _ in range(6):  # planned at tick 1; demand lost while it started leaves the window by tick 5
        h.tick()
    assert h.controller.state.unserved == {m: (0.0, 0.0, 0.0) for m in MODELS}
    before = dict(h.controller.state.running)
    h.source.rates["Phi-4-14B"] = 30.0  # 3x: 3000 prompt tokens/s against 1600 planned
    h.tick()  # this interval's rate is still the old one (the counters grew at 10 req/s)
    report = h.tick()
    assert list(report.decision.chosen) == ["Phi-4-14B"]
    assert "threshold (full@0.9): forecast upper / planned capacity" in report.decision.chosen["Phi-4-14B"]
    assert report.decision.reopt == {"Phi-4-14B": "full@0.9"}
    assert report.plan_changed and {d["model"] for d in report.diff} == {"Phi-4-14B"}
    after = h.controller.state.running
    gpt = [k for k in before if "GPT-OSS-20B" in k]
    assert all(after.get(k) == before[k] for k in gpt)
    assert capacity(fleet, after)[0, 0] >= 3000 * 1.1 - 1e-6


@pytest.mark.parametrize("fault", ["missing", "nan"])
def test_a_model_without_usable_metrics_is_held_never_scaled_down(fleet: LiveFleet, tmp_path: Path,
                                                                    fault: str) -> None:
    h = Harness(fleet, tmp_path)
    h.tick()
    h.tick()
    gpt_before = {k: n for k, n in h.controller.state.running.items() if "GPT-OSS-20B" in k}
    assert gpt_before
    h.source.faults["GPT-OSS-20B"] = fault
    h.source.rates["Phi-4-14B"] = 20.0
    for _ in range(3):
        report = h.tick()
        assert "GPT-OSS-20B" in report.decision.held and "GPT-OSS-20B" not in report.decision.chosen
        assert ("missing" if fault == "missing" else "NaN") in report.decision.held["GPT-OSS-20B"]
        gpt_now = {k: n for k, n in h.controller.state.running.items() if "GPT-OSS-20B" in k}
        assert gpt_now == gpt_before
    assert capacity(fleet, h.controller.state.running)[0, 0] >= 2000  # Phi followed its demand
    h.source.faults.clear()
    report = h.tick()
    assert "GPT-OSS-20B" in report.decision.chosen  # back: the gap is rated as a whole


def test_a_counter_reset_keeps_rates_positive(fleet: LiveFleet, tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path)
    for _ in range(4):  # the last read saw 900 s of tokens; after the restart 300 s: below half of it
        h.tick()
    running = dict(h.controller.state.running)
    h.source.counters["Phi-4-14B"] = [0.0, 0.0]  # the server restarted
    h.source.advance(300.0)
    report = h.tick()
    rate = report.metrics["rates"]["Phi-4-14B"]
    assert rate["status"] == "ok" and rate["resets"] == 2
    # 300 s of tokens counted since the reset, over the 600 s since the last read
    assert rate["prompt_tokens_per_s"] == pytest.approx(1000.0 / 2)
    assert capacity(fleet, h.controller.state.running)[0, 0] > 0
    assert h.controller.state.running.keys() == running.keys()


def test_metrics_down_holds_the_plan_reports_stale_data_and_backs_off(fleet: LiveFleet,
                                                                        tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path)
    h.tick()
    h.tick()
    plan = dict(h.controller.state.running)
    h.source.down = True
    h.tick()
    report = h.tick()
    assert report.metrics["ok"] is False and "connection refused" in report.metrics["error"]
    assert "after 3 attempts" in report.metrics["error"]
    assert report.metrics["stale_s"] == pytest.approx(600.0)  # the last good read was 2 ticks ago
    assert report.decision.chosen == {} and set(report.decision.held) == set(MODELS)
    assert h.controller.state.running == plan and not report.plan_changed
    assert h.sleeps[-2:] == [0.5, 1.0]  # backoff between the three attempts
    assert load_state(h.dir).tick == 4  # type: ignore[union-attr]
    h.source.down = False
    back = h.tick()
    assert back.metrics["ok"] and set(back.decision.chosen) == set(MODELS)


class FlakySink:
    name = "flaky"

    def __init__(self, inner: JsonDirSink) -> None:
        self.inner, self.broken, self.calls = inner, True, 0

    def write(self, record: PlanRecord) -> SinkResult:
        self.calls += 1
        if self.broken:
            raise SinkError("flaky: cluster API unreachable")
        return self.inner.write(record)


def test_a_failed_delivery_stays_pending_on_disk_and_is_delivered_first_next_tick(fleet: LiveFleet,
                                                                                   tmp_path: Path) -> None:
    sink = FlakySink(JsonDirSink(tmp_path / "plans"))
    h = Harness(fleet, tmp_path, sink=sink)
    h.tick()
    report = h.tick()
    assert report.plan_changed and report.sink_result is not None and not report.sink_result["ok"]
    assert report.pending and sink.calls == 3  # retried
    saved = load_state(h.dir)
    assert saved is not None and saved.pending is not None and saved.running == {}
    made = saved.pending.plan
    sink.broken = False
    again = h.tick()
    assert again.earlier_delivery is not None and again.earlier_delivery["ok"]
    assert h.controller.state.running == made and h.controller.state.pending is None
    assert json.loads((tmp_path / "plans" / "latest.json").read_text())["plan"] == made


class Killed(BaseException):
    """Stands for kill -9: nothing after it runs."""


class DyingSink:
    name = "dying"

    def write(self, record: PlanRecord) -> SinkResult:
        raise Killed


def test_killed_mid_tick_the_next_start_resumes_from_the_persisted_state(fleet: LiveFleet,
                                                                         tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path, sink=DyingSink())
    h.tick()
    with pytest.raises(Killed):
        h.controller.tick()  # dies between persisting the plan as pending and delivering it
    h.source.advance(300.0)
    saved = load_state(h.dir)
    assert saved is not None and saved.pending is not None and saved.tick == 1
    h.sink = JsonDirSink(tmp_path / "plans")
    h.controller = h.new()
    assert h.controller.resumed and h.controller.state.tick == 1
    report = h.tick()
    assert report.tick == 1 and report.earlier_delivery is not None and report.earlier_delivery["ok"]
    assert h.controller.state.running == saved.pending.plan
    # the persisted rate baseline: the restarted controller has rates at once (no warm-up read)
    assert report.metrics["rates"]["Phi-4-14B"]["status"] == "ok"


def test_restart_resumes_plan_history_and_schedule(fleet: LiveFleet, tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path, policy="fixed:3")
    for _ in range(3):
        h.tick()
    state = h.controller.state
    h.controller = h.new()
    assert h.controller.resumed
    assert h.controller.state.running == state.running and h.controller.state.history == state.history
    report = h.tick()
    assert report.tick == 3 and set(report.decision.chosen) == set(MODELS)  # fixed:3 is due at tick 3


class TimedOutReplanner:
    """Answers like the real Replanner does after a solver time-out."""

    def __init__(self, allocation: Allocation | None) -> None:
        self.allocation = allocation

    def plan(self, models, demand, availability, running, grow=frozenset(), risk=None,  # noqa: ANN001
             diagnose=True) -> PlanOutcome:  # noqa: ANN001
        status = SolveStatus.FEASIBLE_TIME_LIMIT if self.allocation else SolveStatus.ERROR
        return PlanOutcome(self.allocation, status, "cost" if self.allocation else "hold", 10.0, False,
                           "time limit reached" + ("" if self.allocation else " without a feasible plan"))


def test_solver_timeout_keeps_the_incumbent_or_holds(tmp_path: Path) -> None:
    fleet = live_fleet()
    h = Harness(fleet, tmp_path)
    h.tick()
    h.tick()
    plan = dict(h.controller.state.running)
    fleet.replanner = TimedOutReplanner(None)  # type: ignore[assignment]
    report = h.tick()
    assert report.solve is not None and report.solve["result"] == "held: no plan"
    assert report.solve["status"] == "error" and not report.plan_changed
    assert h.controller.state.running == plan
    bigger = {k: n + 1 for k, n in plan.items()}
    fleet.replanner = TimedOutReplanner(Allocation.of(bigger))  # type: ignore[assignment]
    report = h.tick()
    assert report.solve["status"] == "feasible_time_limit" and report.plan_changed  # type: ignore[index]
    assert h.controller.state.running == bigger


def test_a_policy_for_another_fleet_is_refused(fleet: LiveFleet, tmp_path: Path) -> None:
    class Wrong:
        name = "learned:x"
        observation_size = 7

        def act(self, observation, info):  # noqa: ANN001, ANN201
            return np.zeros(2, dtype=np.int8)

        def reset_options(self) -> dict[str, object]:
            return {}

    with pytest.raises(ValueError, match="takes observations of 7 values.*scenario 'core'"):
        Controller(fleet, ScriptedServers(FakeClock(), {}), Wrong(), JsonDirSink(tmp_path), tmp_path)


def test_a_rules_risk_reaches_every_live_replan(fleet: LiveFleet, tmp_path: Path) -> None:
    # 13 req/s: 1,300 prompt and 130 generation tokens/s, planned at x 1.1. Neutral: 2 prefill
    # instances (1,600 tokens/s), 1 decode (200). At headroom 0.7 the ILP covers the demand / 0.7:
    # 3 prefill (2,400 >= 2,043) and 2 decode (400 >= 204), the simulator's rows
    plans = {}
    for spec in ("fixed:1@0.9", "fixed:1@0.9+h0.7"):
        h = Harness(fleet, tmp_path / spec.replace(":", "_").replace("+", "_"), policy=spec,
                    rates={m: 13.0 for m in MODELS})
        h.tick()
        report = h.tick()
        assert report.solve is not None
        assert report.solve["risk"] == dict.fromkeys(sorted(MODELS), "h0.7" if "+" in spec else "neutral")
        plans[spec] = capacity(fleet, h.controller.state.running)
    assert np.all(plans["fixed:1@0.9"] == [[2 * PREFILL_TPS, DECODE_TPS]] * 2)
    assert np.all(plans["fixed:1@0.9+h0.7"] == [[3 * PREFILL_TPS, 2 * DECODE_TPS]] * 2)
    demand = np.array([13.0 * INPUT, 13.0 * OUTPUT]) * 1.1
    assert np.all(plans["fixed:1@0.9+h0.7"] >= demand / 0.7)


def test_what_the_controller_cannot_honour_is_refused_not_dropped(fleet: LiveFleet, tmp_path: Path) -> None:
    from atoll.training.evaluate import resolve_policy

    source = ScriptedServers(FakeClock(), {})
    with pytest.raises(ValueError, match=r"plans at level 0.5.*planning level is 0.9.*planning_quantile=0.5"):
        Controller(fleet, source, make_policy(parse_policy("fixed:1@0.5"), 2), JsonDirSink(tmp_path),
                   tmp_path / "a")
    per_model = resolve_policy(parse_policy("per-model:1@0.9+h0.7,1@0.9"), 2)
    with pytest.raises(ValueError, match=r"risk presets \(neutral, h0.7\).*decodes presets \(none\)"):
        Controller(fleet, source, per_model, JsonDirSink(tmp_path), tmp_path / "b")
    levels = resolve_policy(parse_policy("per-model:1@0.9,1@0.95"), 2)
    with pytest.raises(ValueError, match=r"levels 0.9, 0.95.*action_levels=\(0.9, 0.95\)"):
        Controller(fleet, source, levels, JsonDirSink(tmp_path), tmp_path / "c",
                   settings=ControllerSettings(planning_quantile=0.95, action_levels=(0.9,)))
    # with the policy's levels the controller decodes its codes as the simulator does
    c = Controller(fleet, source, levels, JsonDirSink(tmp_path), tmp_path / "d",
                   settings=ControllerSettings(planning_quantile=0.95, action_levels=(0.9, 0.95)))
    assert set(c.codec.levels) == {0.9, 0.95} and c.risk is None
    # its codes mean what they mean in the simulator: model i's code is full at its own level
    codes = levels.act(np.zeros(1), {"step": 1})
    assert [c.codec.decode(int(k)).label() for k in codes] == ["full@0.9", "full@0.95"]


def test_a_per_model_rules_risk_presets_reach_each_models_replan(fleet: LiveFleet, tmp_path: Path) -> None:
    # Phi-4-14B at headroom 0.7, GPT-OSS-20B neutral: 13 req/s each, as in the uniform test above
    from atoll.training.evaluate import resolve_policy

    policy = resolve_policy(parse_policy("per-model:1@0.9+h0.7,1@0.9"), 2)
    h = Harness(fleet, tmp_path, rates={m: 13.0 for m in MODELS})
    h.controller = Controller(fleet, h.source, policy, h.sink, h.dir,
                              settings=ControllerSettings(interval_s=300.0, action_levels=(0.9,),
                                                          risk_presets=policy.risk_presets),
                              clock=h.clock, sleep=h.sleeps.append)
    h.tick()
    h.tick()  # plans from nothing: each model at the configured risk (the most common: a tie, the greatest)
    report = h.tick()  # the rule's own codes: each model at its own preset
    assert report.solve is not None
    assert report.solve["risk"] == {"GPT-OSS-20B": "neutral", "Phi-4-14B": "h0.7"}
    cap = capacity(fleet, h.controller.state.running)
    assert np.all(cap[0] == [3 * PREFILL_TPS, 2 * DECODE_TPS])  # Phi-4-14B: demand / 0.7
    assert np.all(cap[1] == [2 * PREFILL_TPS, DECODE_TPS])  # GPT-OSS-20B: neutral
