"""End to end: a real Prometheus scrapes the replay exporter; PrometheusSource reads rates per model."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from control_helpers import PrometheusServer, tiny_series

from atoll.control.metrics import PrometheusSource
from atoll.control.rates import RateReport, RateStatus, RateTracker
from atoll.control.replay import ReplayExporter
from atoll.envs.vocabulary import parse_policy

SPEEDUP = 60.0


def _until(read: Callable[[], RateReport], done: Callable[[RateReport], bool],
           timeout_s: float) -> RateReport:
    deadline = time.monotonic() + timeout_s
    report = read()
    while not done(report):
        assert time.monotonic() < deadline, f"gave up after {timeout_s:g} s; last report {report.as_dict()}"
        time.sleep(0.2)
        report = read()
    return report


def test_prometheus_scrapes_the_replay_and_rates_match_the_trace(
        start_prometheus: Callable[..., PrometheusServer]) -> None:
    series = [tiny_series("w1", [2.0] * 100, input_tokens=100, output_tokens=10),
              tiny_series("w2", [1.0] * 100, input_tokens=50, output_tokens=20)]
    with ReplayExporter(series, ["big", "small"], speedup=SPEEDUP) as exporter:
        prometheus = start_prometheus([exporter.target], scrape_interval="1s")
        source = PrometheusSource(prometheus.url, timeout=5)
        tracker = RateTracker(models=["big", "small"])

        def read() -> RateReport:
            return tracker.update(source.read())

        report = _until(read, lambda r: all(m.ok for m in r.models.values()), timeout_s=20)
        big, small = report.models["big"], report.models["small"]
        # counters grow by the trace's integral, so per wall second by speedup x the trace's rate
        assert big.prompt_tokens_per_s == pytest.approx(SPEEDUP * 2.0 * 100, rel=0.1)
        assert big.generation_tokens_per_s == pytest.approx(SPEEDUP * 2.0 * 10, rel=0.1)
        assert small.prompt_tokens_per_s == pytest.approx(SPEEDUP * 1.0 * 50, rel=0.1)
        assert big.running == pytest.approx(2.0 * (0.5 + 10 * 0.05)) and big.waiting == pytest.approx(0.2)
        # a model whose series vanish from the exporter goes stale in Prometheus: held, not zero
        exporter.set_fault("small", "missing")
        report = _until(read, lambda r: not r.models["small"].ok, timeout_s=10)
        assert report.models["small"].status is RateStatus.MISSING
        assert report.models["small"].prompt_tokens_per_s is None and report.models["big"].ok


def test_the_controller_reads_prometheus_and_writes_plans(start_prometheus: Callable[..., PrometheusServer],
                                                           tmp_path: Path) -> None:
    from atoll.control.controller import Controller, ControllerSettings
    from atoll.control.live_fleet import LiveFleet
    from atoll.control.sinks import make_sink
    from atoll.envs.fleet import FleetState
    from atoll.envs.policies import make_policy

    models = ["Phi-4-14B", "GPT-OSS-20B", "Qwen3-32B"]
    series = [tiny_series(f"w{i}", [2.0 + i] * 200, input_tokens=500, output_tokens=50) for i in range(3)]
    with ReplayExporter(series, models, speedup=SPEEDUP) as exporter:
        prometheus = start_prometheus([exporter.target], scrape_interval="1s")
        fleet = LiveFleet("core")
        settings = ControllerSettings(interval_s=60, time_scale=SPEEDUP)
        controller = Controller(fleet, PrometheusSource(prometheus.url, timeout=5),
                                make_policy(parse_policy("fixed:1"), len(models)),
                                make_sink(f"k8s:{tmp_path / 'k8s'}"),
                                tmp_path / "state", settings=settings, clock=lambda: time.time() * SPEEDUP,
                                sleep=time.sleep)
        deadline = time.monotonic() + 30

        def planned_from_demand(report: object) -> bool:
            # before Prometheus has the series, a tick may already raise every model to its floor
            # (min_instances): wait for a plan made from measured rates
            rates = report.metrics["rates"]  # type: ignore[attr-defined]
            return bool(report.plan_changed) and all(  # type: ignore[attr-defined]
                rates.get(m, {}).get("status") == "ok" for m in models)

        report = controller.tick()
        while not planned_from_demand(report):
            assert time.monotonic() < deadline, f"no plan within 30 s; last tick {report.as_dict()}"
            time.sleep(1.0)
            report = controller.tick()
        # rates measured on Prometheus' wall clock, divided by the speed-up: the trace's own
        for i, model in enumerate(models):
            rate = report.metrics["rates"][model]
            assert rate["prompt_tokens_per_s"] == pytest.approx((2.0 + i) * 500, rel=0.15)
            assert rate["generation_tokens_per_s"] == pytest.approx((2.0 + i) * 50, rel=0.15)
        assert report.sink_result is not None and report.sink_result["ok"]
        assert set(report.decision.chosen) == set(models)
        capacity = fleet.model.capacity(FleetState(running=fleet.known(controller.state.running)), 0.0)[1]
        assert (capacity[:, 0] >= [(2.0 + i) * 500 for i in range(3)]).all()
        manifests = list((tmp_path / "k8s").rglob("*.yaml"))
        assert manifests and len(report.diff) > 0
