"""The replay exporter: exact counter integrals, stated gauges, parseable vLLM metrics, faults
(its command, ``atoll replay``, is tested in tests/control/cli/test_cli_replay.py)."""

from __future__ import annotations

import pytest
from control_helpers import FakeClock, exported_values, tiny_series

from atoll.control.metrics import GENERATION, PROMPT, MetricsUnavailable, ScrapeSource
from atoll.control.replay import ReplayExporter, ReplayTrace


def test_trace_integral_and_gauges_hand_computed() -> None:
    trace = ReplayTrace([tiny_series("w", [1.0, 2.0], input_tokens=100, output_tokens=10)], ["m"])
    v = trace.values(90.0)["m"]  # 60 s at 1 req/s, then 30 s at 2 req/s
    assert v.prompt_tokens == pytest.approx(1 * 100 * 60 + 2 * 100 * 30)
    assert v.generation_tokens == pytest.approx(1 * 10 * 60 + 2 * 10 * 30)
    assert v.running == pytest.approx(2 * (0.5 + 10 * 0.05))  # Little's law, stated latencies
    assert v.waiting == pytest.approx(2 * 0.1)
    assert v.kv_usage == pytest.approx(v.running * (100 + 5) / 1e6)
    end = trace.values(10_000.0)["m"]  # past the end: counters hold, gauges drop
    assert end.prompt_tokens == pytest.approx(18_000) and end.running == 0.0
    assert trace.values(-5.0)["m"].prompt_tokens == 0.0
    assert trace.duration_s == 120.0


def test_trace_validation_names_the_field() -> None:
    s = tiny_series("w", [1.0])
    with pytest.raises(ValueError, match="'models' has 2 names for 1 series"):
        ReplayTrace([s], ["a", "b"])
    with pytest.raises(ValueError, match="distinct"):
        ReplayTrace([s, s], ["a", "a"])
    with pytest.raises(ValueError, match="'speedup'"):
        ReplayExporter([s], speedup=0)
    with pytest.raises(ValueError, match="'port'"):
        ReplayExporter([s], port=70000)


def test_exporter_serves_vllm_metrics_growing_by_the_integral() -> None:
    clock = FakeClock(1000.0)
    series = [tiny_series("w1", [1.0, 3.0], 100, 10), tiny_series("w2", [0.5, 0.5], 200, 40)]
    with ReplayExporter(series, ["big", "small"], speedup=60.0, clock=clock) as exporter:
        assert exporter.url.startswith("http://127.0.0.1:") and exporter.port > 0
        clock.advance(0.5)  # trace time 30 s
        first = exported_values(exporter.url)
        assert set(first) >= {PROMPT, GENERATION, "vllm:num_requests_waiting", "vllm:num_requests_running",
                              "vllm:kv_cache_usage_perc"}
        assert first[PROMPT] == {"big": pytest.approx(3000.0), "small": pytest.approx(3000.0)}
        clock.advance(1.0)  # trace time 90 s: +30 s at 1 req/s and +30 s at 3 req/s for "big"
        second = exported_values(exporter.url)
        assert second[PROMPT]["big"] - first[PROMPT]["big"] == pytest.approx(100 * (30 * 1 + 30 * 3))
        assert second[GENERATION]["small"] - first[GENERATION]["small"] == pytest.approx(40 * 0.5 * 60)
        # the metrics reader parses the same page
        snap = ScrapeSource([exporter.url], timeout=2, clock=clock).read()
        assert not snap.models["big"].problems and snap.models["big"].running == pytest.approx(3 * 1.0)


def test_exporter_faults() -> None:
    clock = FakeClock()
    with ReplayExporter([tiny_series("w", [1.0] * 4)] * 2, ["a", "b"], speedup=60.0, clock=clock) as exporter:
        clock.advance(1.0)
        exporter.set_fault("a", "missing")
        exporter.set_fault("b", "nan")
        snap = ScrapeSource(exporter.url, timeout=2).read()
        assert "a" not in snap.models and "is NaN" in "; ".join(snap.models["b"].problems)
        exporter.set_fault("a", None)
        exporter.set_fault("b", None)
        before = exporter.current()["a"].prompt_tokens
        exporter.reset("a")
        assert exporter.current()["a"].prompt_tokens == 0.0 < before
        clock.advance(0.5)
        assert exporter.current()["a"].prompt_tokens == pytest.approx(100 * 30)
        exporter.set_status(503)
        with pytest.raises(MetricsUnavailable, match="HTTP 503"):
            ScrapeSource(exporter.url, timeout=2).read()
        exporter.set_status(None)
        with pytest.raises(ValueError, match="unknown model 'c'"):
            exporter.set_fault("c", "nan")
    with pytest.raises(RuntimeError, match="start"):
        _ = exporter.url


def test_counters_start_at_zero_at_the_start_time() -> None:
    clock = FakeClock()
    exporter = ReplayExporter([tiny_series("w", [1.0, 2.0, 4.0])], ["m"], speedup=60.0, start_s=90.0,
                              clock=clock)
    assert exporter.current()["m"].prompt_tokens == 0.0
    with exporter:
        clock.advance(1.0)  # trace 90 s -> 150 s: 30 s at 2 req/s, 30 s at 4 req/s
        assert exporter.trace_time() == 150.0
        assert exporter.current()["m"].prompt_tokens == pytest.approx(100 * (30 * 2 + 30 * 4))
