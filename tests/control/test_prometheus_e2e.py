"""End to end: a real Prometheus scrapes the replay exporter; PrometheusSource reads rates per model."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from control_helpers import PrometheusServer, tiny_series

from control.metrics import PrometheusSource
from control.rates import RateReport, RateStatus, RateTracker
from control.replay import ReplayExporter

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
