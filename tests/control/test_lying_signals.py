"""Signals that are valid numbers but false, read through a served replay: demand hidden by
saturation, a lying queue or latency, and the correction that must not follow them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from live_harness import INPUT, MODELS, Harness, live_fleet

from atoll.control.controller import Controller, ControllerSettings, TickReport
from atoll.control.live_fleet import LiveFleet
from atoll.control.metrics import Histogram, MetricsSnapshot, ScrapeSource
from atoll.control.replay import ReplayExporter
from atoll.control.served import ServedFleet, latest_plan
from atoll.control.sinks import JsonDirSink
from atoll.control.state import load_state
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import parse_policy
from atoll.forecast.workloads import DemandSeries

SPEED, INTERVAL, DAY = 60.0, 300.0, 86400.0
SURGE = (6, 18)  # the steps of day 2 whose prompts are ten times longer
BASE_IN = 60.0


def _series(surge: bool) -> list[DemandSeries]:
    out = []
    for i, m in enumerate(MODELS):
        prompt = np.full(400, BASE_IN)
        if surge and i == 0:
            prompt[288 + SURGE[0]:288 + SURGE[1]] = 10 * BASE_IN
        out.append(DemandSeries(m, 300.0, np.full(400, 3.0 + i), prompt, np.full(400, 20.0)))
    return out


class Proxy:
    """A /metrics source between the controller and the replay that rewrites a read."""

    def __init__(self, inner: ScrapeSource) -> None:
        self.inner, self.url = inner, inner.url
        self.edit: Callable[[MetricsSnapshot], MetricsSnapshot] | None = None

    def read(self) -> MetricsSnapshot:
        snap = self.inner.read()
        return self.edit(snap) if self.edit is not None else snap


def _run(fleet: LiveFleet, tmp: Path, ticks: int, *, surge: bool = False,
         edits: dict[int, Callable[[MetricsSnapshot], MetricsSnapshot]] | None = None,
         policy: str = "threshold") -> tuple[list[TickReport], Controller]:
    wall = [0.0]
    served = ServedFleet(fleet.model, latest_plan(tmp / "plans"))
    reports = []
    with ReplayExporter(_series(surge), MODELS, speedup=SPEED, clock=lambda: wall[0], start_s=DAY,
                        served=served) as exporter:
        proxy = Proxy(ScrapeSource(exporter.url, clock=lambda: wall[0]))
        rule = make_policy(parse_policy(policy), 2)
        controller = Controller(fleet, proxy, rule, JsonDirSink(tmp / "plans"),
                                tmp / "state",
                                settings=ControllerSettings(interval_s=INTERVAL, time_scale=SPEED),
                                clock=lambda: DAY + SPEED * wall[0], sleep=lambda s: None)
        for k in range(ticks):
            proxy.edit = (edits or {}).get(k)
            reports.append(controller.tick())
            wall[0] += INTERVAL / SPEED
    return reports, controller


def _planned(report: TickReport, key: str) -> float | None:
    return (report.solve or {}).get("demand_tokens_per_s", {}).get(key)


def test_a_tenfold_prompt_growth_is_planned_for_within_three_ticks(fleet: LiveFleet, tmp_path: Path) -> None:
    reports, _ = _run(fleet, tmp_path, 26, surge=True)
    true = 3.0 * 10 * BASE_IN  # Phi-4's prompt tokens/s during the surge
    served = [r.metrics["rates"]["Phi-4-14B"]["prompt_tokens_per_s"] or 0.0 for r in reports]
    seen = next(k for k, v in enumerate(served) if v > 2 * 3.0 * BASE_IN)  # the first saturated read
    assert reports[seen].metrics["demand"]["Phi-4-14B"]["saturated"][0]
    plans = [_planned(r, "Phi-4-14B/prefill") for r in reports]
    caught = [k for k in range(seen, seen + 3) if (plans[k] or 0.0) >= true]
    assert caught, f"planned {plans[seen:seen + 3]} for a demand of {true} tokens/s"
    # no overshoot: never planned above the true demand x the forecast's headroom
    assert max(p for p in plans if p is not None) <= true * 1.1 * 1.01
    # and on the way back, the plan returns to the base demand
    assert plans[-1] is not None and plans[-1] <= 3.0 * BASE_IN * 1.1 * 1.01


def _waiting(value: float) -> Callable[[MetricsSnapshot], MetricsSnapshot]:
    def edit(snap: MetricsSnapshot) -> MetricsSnapshot:
        models = dict(snap.models)
        models["Phi-4-14B"] = replace(models["Phi-4-14B"], waiting=value)
        return replace(snap, models=models)
    return edit


def _ttft_plus(seconds: float) -> Callable[[MetricsSnapshot], MetricsSnapshot]:
    """Every replica's TTFT histogram _sum raised by ``seconds`` (a mean far past the interval)."""
    def edit(snap: MetricsSnapshot) -> MetricsSnapshot:
        mm = snap.models["Phi-4-14B"]
        series = tuple(replace(s, histograms={**s.histograms, "ttft": Histogram(
            s.histograms["ttft"].sum + seconds, s.histograms["ttft"].count, s.histograms["ttft"].buckets)})
                       for s in mm.series)
        return replace(snap, models={**snap.models, "Phi-4-14B": replace(mm, series=series)})
    return edit


@pytest.mark.parametrize("lie", ["queue", "negative", "latency"])
def test_a_lying_signal_is_held_and_never_moves_the_factors(fleet: LiveFleet, tmp_path: Path,
                                                            lie: str) -> None:
    edits: dict[int, Any] = {"queue": {10: _waiting(40000.0), 11: _waiting(40000.0)},
                             "negative": {10: _waiting(-5.0), 11: _waiting(-5.0)},
                             "latency": {10: _ttft_plus(1e6)}}[lie]
    honest, _ = _run(fleet, tmp_path / "honest", 16, policy="fixed:1")
    lied, controller = _run(fleet, tmp_path / "lied", 16, edits=edits, policy="fixed:1")
    assert "Phi-4-14B" in lied[10].metrics["implausible"], lied[10].metrics["implausible"]
    assert lied[10].metrics["implausible"]["Phi-4-14B"]["held"]
    assert "Phi-4-14B" not in honest[10].metrics["implausible"]
    for k in (10, 11, 12, 15):
        for kind in ("estimates", "planning_factors"):
            got, want = lied[k].correction[kind], honest[k].correction[kind]
            for f in {*got, *want}:
                assert got.get(f, 1.0) == pytest.approx(want.get(f, 1.0), rel=0.02), (k, kind, f)
    state = load_state(tmp_path / "lied" / "state")
    assert state is not None
    for f, k in honest[-1].correction["estimates"].items():
        assert state.correction["factors"][f] == pytest.approx(k, rel=0.02)


def test_a_second_signal_confirms_what_a_gate_held() -> None:
    from atoll.control.plausibility import GateLimits, PlausibilityGate
    from atoll.control.rates import ModelRate, RateStatus

    rate = ModelRate("m", RateStatus.OK, 500.0, 100.0, waiting=40000.0, running=10.0, interval_s=300.0,
                     ttft_mean_s=400.0)
    gate = PlausibilityGate()
    limits = GateLimits(300.0, (1.2, 0.06), 3000.0, planned_tps=(1000.0, 100.0), served_tps=(500.0, 100.0))
    used, verdict = gate.check(rate, limits)  # served half the planned demand: a real queue
    assert used.waiting == 40000.0 and used.ttft_mean_s == 400.0
    assert len(verdict.confirmed) == 2 and not verdict.held
    gate = PlausibilityGate()
    held, verdict = gate.check(rate, replace(limits, served_tps=(1000.0, 100.0)))  # served the plan: a lie
    assert held.waiting is None and held.ttft_mean_s is None and held.running is None
    assert any("longer than the interval" in why for why in verdict.held)
    assert any("more than the interval's arrivals could build" in why for why in verdict.held)
    _, verdict = PlausibilityGate().check(rate, replace(limits, planned_tps=None))  # no plan: held
    assert verdict.held and not verdict.confirmed


def test_a_bad_sample_after_a_long_outage_is_held_not_planned(tmp_path: Path) -> None:
    h = Harness(live_fleet(), tmp_path)
    for _ in range(4):
        h.tick()
    normal = h.source.rates["Phi-4-14B"] * INPUT
    h.source.advance(30 * DAY)  # down for 30 days; the counters kept rising
    h.controller = h.new()
    h.source.override["Phi-4-14B"] = 1e12  # and the first scrape after it lies
    reports = [h.tick() for _ in range(4)]
    assert reports[0].metrics["rates"]["Phi-4-14B"]["status"] == "outlier"
    planned = [r.metrics["demand"].get("Phi-4-14B", {}).get("planned_tokens_per_s", [0.0])[0]
               for r in reports]
    assert max(planned) < 2 * normal, planned
