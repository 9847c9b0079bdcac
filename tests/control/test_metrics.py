"""Metrics reading and rates: scripted snapshots with a fake clock, scripted HTTP answers, faults."""

from __future__ import annotations

import json
import math
import socket
import urllib.parse
from typing import Any

import pytest
from control_helpers import FakeClock, ScriptedHttp, closed_port

from atoll.control.metrics import (
    GENERATION,
    PROMPT,
    MetricsSnapshot,
    MetricsUnavailable,
    ModelMetrics,
    PrometheusSource,
    ScrapeSource,
    SeriesSample,
    read_with_retry,
)
from atoll.control.rates import RateStatus, RateTracker


def snap(t: float, **models: tuple[float, float] | list[tuple[str, float, float]] | None) -> MetricsSnapshot:
    """Models as (prompt, generation) of one replica, or [(replica, prompt, generation), ...];
    None = the model's generation counter missing."""
    out = {}
    for name, spec in models.items():
        if spec is None:
            out[name] = ModelMetrics((SeriesSample("r", t, 1.0, math.nan),), 1.0, 2.0,
                                     problems=(f"{GENERATION} missing for replica 'r'",))
            continue
        reps = [("r", *spec)] if isinstance(spec, tuple) else spec
        out[name] = ModelMetrics(tuple(SeriesSample(r, t, p, g) for r, p, g in reps), 1.0, 2.0, 0.5)
    return MetricsSnapshot(t, out, "test")


def test_rates_over_the_interval_and_first_read_warms_up() -> None:
    tracker = RateTracker()
    first = tracker.update(snap(100.0, a=(1000.0, 100.0)))
    assert first.models["a"].status is RateStatus.WARMING_UP
    assert first.models["a"].prompt_tokens_per_s is None
    r = tracker.update(snap(160.0, a=(7000.0, 700.0))).models["a"]
    assert r.ok and r.prompt_tokens_per_s == pytest.approx(100.0)
    assert r.generation_tokens_per_s == pytest.approx(10.0)
    assert r.interval_s == 60.0 and r.waiting == 1.0 and r.running == 2.0 and r.kv_usage == 0.5


def test_replicas_rate_then_sum_and_dropped_replica() -> None:
    tracker = RateTracker()
    tracker.update(snap(0.0, a=[("x", 0.0, 0.0), ("y", 500.0, 50.0)]))
    r = tracker.update(snap(10.0, a=[("x", 100.0, 10.0), ("y", 700.0, 70.0)])).models["a"]
    assert r.prompt_tokens_per_s == pytest.approx(10.0 + 20.0)
    # replica y scaled away: its disappearance is not a reset of the model's sum
    r = tracker.update(snap(20.0, a=[("x", 200.0, 20.0)])).models["a"]
    assert r.ok and r.prompt_tokens_per_s == pytest.approx(10.0) and r.resets == 0


def test_counter_reset_counts_the_new_value_as_the_increase() -> None:
    tracker = RateTracker()
    tracker.update(snap(0.0, a=(5000.0, 500.0)))
    r = tracker.update(snap(10.0, a=(300.0, 30.0))).models["a"]  # the server restarted
    assert r.ok and r.resets == 2
    assert r.prompt_tokens_per_s == pytest.approx(30.0) and r.generation_tokens_per_s == pytest.approx(3.0)
    r = tracker.update(snap(20.0, a=(400.0, 40.0))).models["a"]
    assert r.prompt_tokens_per_s == pytest.approx(10.0) and r.resets == 0


def test_missing_and_nan_model_is_held_never_zero_and_recovers_over_the_gap() -> None:
    tracker = RateTracker(models=["a", "b"])
    tracker.update(snap(0.0, a=(0.0, 0.0), b=(0.0, 0.0)))
    report = tracker.update(snap(10.0, a=(100.0, 10.0)))  # b absent
    assert report.models["b"].status is RateStatus.MISSING
    b = report.models["b"]
    assert b.prompt_tokens_per_s is None and b.generation_tokens_per_s is None
    assert report.fresh == ("a",) and "missing" in report.held["b"]
    report = tracker.update(snap(20.0, a=(200.0, 20.0), b=None))
    assert report.models["b"].status is RateStatus.INVALID and "missing" in report.models["b"].reason
    assert report.models["b"].prompt_tokens_per_s is None
    # back after 30 s: the rate spans the whole gap from the last good read
    r = tracker.update(snap(30.0, a=(300.0, 30.0), b=(600.0, 60.0))).models["b"]
    assert r.ok and r.interval_s == 30.0 and r.prompt_tokens_per_s == pytest.approx(20.0)


def test_nan_counter_from_the_exporter_marks_the_model_invalid() -> None:
    body = (f"# TYPE {PROMPT} counter\n{PROMPT}{{model_name=\"a\"}} NaN\n"
            f"{GENERATION}{{model_name=\"a\"}} 5\n"
            'vllm:num_requests_waiting{model_name="a"} 0\nvllm:num_requests_running{model_name="a"} 1\n'
            f"{PROMPT}{{model_name=\"b\"}} 10\n{GENERATION}{{model_name=\"b\"}} 5\n"
            'vllm:num_requests_waiting{model_name="b"} 0\nvllm:num_requests_running{model_name="b"} 1\n')
    with ScriptedHttp(lambda path, q: (200, body.encode())) as http:
        s = ScrapeSource([http.url], timeout=2, clock=FakeClock(5.0)).read()
    assert s.models["a"].problems == (f"{PROMPT} is NaN for replica {http.url + '/metrics'!r}",)
    assert not s.models["b"].problems and s.models["b"].prompt_tokens == 10.0
    report = RateTracker().update(s)
    assert report.models["a"].status is RateStatus.INVALID


def test_time_comes_only_from_snapshots_and_carries_when_no_new_scrape() -> None:
    tracker = RateTracker()
    tracker.update(snap(0.0, a=(0.0, 0.0)))
    tracker.update(snap(10.0, a=(100.0, 10.0)))
    # a read before the next scrape returns the same sample: the last rate stands
    r = tracker.update(MetricsSnapshot(15.0, snap(10.0, a=(100.0, 10.0)).models)).models["a"]
    assert r.ok and r.prompt_tokens_per_s == pytest.approx(10.0) and r.interval_s is None


def test_baseline_round_trip_gives_rates_on_the_first_read_after_restart() -> None:
    tracker = RateTracker()
    tracker.update(snap(0.0, a=[("x", 0.0, 0.0), ("y", 10.0, 1.0)]))
    saved = json.loads(json.dumps(tracker.baseline.as_dict()))
    restarted = RateTracker(baseline=MetricsSnapshot.from_dict(saved))
    r = restarted.update(snap(10.0, a=[("x", 50.0, 5.0), ("y", 60.0, 6.0)])).models["a"]
    assert r.ok and r.prompt_tokens_per_s == pytest.approx(10.0)
    assert restarted.models == ("a",)
    restarted.forget("a")
    assert "a" not in restarted.update(snap(20.0)).models


def test_scrape_source_reads_vllm_text_and_keeps_replicas_apart() -> None:
    body = (f"# HELP {PROMPT} x\n# TYPE {PROMPT} counter\n"
            f'{PROMPT}{{model_name="m",engine="0"}} 100\n{PROMPT}{{model_name="m",engine="1"}} 50\n'
            f'vllm:prompt_tokens_created{{model_name="m",engine="0"}} 1.7e9\n'
            f"# TYPE {GENERATION} counter\n"
            f'{GENERATION}{{model_name="m",engine="0"}} 10\n{GENERATION}{{model_name="m",engine="1"}} 5\n'
            '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m",engine="0"} 2\n'
            'vllm:num_requests_waiting{model_name="m",engine="1"} 1\n'
            'vllm:num_requests_running{model_name="m",engine="0"} 4\n'
            'vllm:num_requests_running{model_name="m",engine="1"} 3\n'
            'vllm:gpu_cache_usage_perc{model_name="m",engine="0"} 0.25\n'
            'vllm:gpu_cache_usage_perc{model_name="m",engine="1"} 0.75\nother_metric 1\n')
    with ScriptedHttp(lambda path, q: (200, body.encode()) if path == "/metrics" else (404, b"")) as http:
        s = ScrapeSource(http.url, timeout=2, clock=FakeClock(7.0)).read()
    m = s.models["m"]
    assert not m.problems and len(m.series) == 2 and s.time_s == 7.0
    assert m.prompt_tokens == 150.0 and m.generation_tokens == 15.0
    assert m.waiting == 3.0 and m.running == 7.0 and m.kv_usage == pytest.approx(0.5)


def test_prometheus_source_dates_replicas_by_scrape_time() -> None:
    def answer(path: str, q: dict[str, list[str]]) -> tuple[int, bytes]:
        query = q["query"][0]
        lab = {"model_name": "m", "instance": "h:1", "job": "v"}
        result: list[dict[str, Any]]
        if query.startswith("timestamp("):
            result = [{"metric": lab, "value": [50.0, "42.5"]}]
        else:
            result = [{"metric": dict(lab, __name__=n), "value": [50.0, v]}
                      for n, v in ((PROMPT, "1000"), (GENERATION, "100"), ("vllm:num_requests_waiting", "1"),
                                   ("vllm:num_requests_running", "2"), ("vllm:kv_cache_usage_perc", "NaN"))]
        doc = {"status": "success", "data": {"resultType": "vector", "result": result}}
        return 200, json.dumps(doc).encode()

    with ScriptedHttp(answer) as http:
        s = PrometheusSource(http.url + "/", timeout=2, clock=FakeClock(60.0)).read()
    m = s.models["m"]
    assert s.time_s == 60.0 and m.series == (SeriesSample("instance=h:1,job=v", 42.5, 1000.0, 100.0),)
    assert m.kv_usage is None and not m.problems
    first = urllib.parse.unquote_plus(http.requests[0])
    assert '{__name__=~"vllm:(prompt_tokens_total|generation_tokens_total|' in first


@pytest.mark.parametrize(("status", "body", "expect"), [
    (503, b"overloaded", "HTTP 503"),
    (200, b"<html>not json", "bad JSON"),
    (200, json.dumps({"status": "error", "error": "parse error"}).encode(), "parse error"),
])
def test_prometheus_fetch_errors_name_the_url_and_cause(status: int, body: bytes, expect: str) -> None:
    with ScriptedHttp(lambda path, q: (status, body)) as http:
        with pytest.raises(MetricsUnavailable) as info:
            PrometheusSource(http.url, timeout=2).read()
    assert http.url in str(info.value) and expect in str(info.value)


def test_unreachable_and_silent_servers() -> None:
    port = closed_port()
    with pytest.raises(MetricsUnavailable, match=rf"127\.0\.0\.1:{port}.*cannot connect"):
        PrometheusSource(f"http://127.0.0.1:{port}", timeout=1).read()
    with socket.socket() as listener:  # accepts, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(MetricsUnavailable, match="timed out|no complete answer"):
            ScrapeSource([url], timeout=0.3).read()
    with pytest.raises(ValueError, match="field 'url'"):
        PrometheusSource("localhost:9090")


class FlakySource:
    url = "http://flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def read(self) -> MetricsSnapshot:
        self.calls += 1
        if self.calls <= self.failures:
            raise MetricsUnavailable(self.url, "connection refused")
        return MetricsSnapshot(1.0, {}, self.url)


def test_read_with_retry_backs_off_exponentially() -> None:
    sleeps: list[float] = []
    snap_ = read_with_retry(FlakySource(2), attempts=3, backoff_s=0.5, sleep=sleeps.append)
    assert snap_.time_s == 1.0 and sleeps == [0.5, 1.0]
    sleeps.clear()
    with pytest.raises(MetricsUnavailable, match="http://flaky.*after 4 attempts"):
        read_with_retry(FlakySource(9), attempts=4, backoff_s=1.0, sleep=sleeps.append)
    assert sleeps == [1.0, 2.0, 4.0]
    with pytest.raises(ValueError, match="attempts"):
        read_with_retry(FlakySource(0), attempts=0)
