"""vLLM's histograms (tokens per request, TTFT, inter-token latency): parsed from a hand-written
/metrics page and through the Prometheus API, rated per interval with the counters' reset and
new-replica rules, missing or broken ones never an error, and persisted in the state."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from control_helpers import FakeClock, ScriptedHttp

from atoll.control.metrics import (
    GENERATION,
    ITL,
    ITL_OLD,
    PROMPT,
    RUNNING,
    TTFT,
    WAITING,
    Histogram,
    MetricsSnapshot,
    ModelMetrics,
    PrometheusSource,
    ScrapeSource,
    SeriesSample,
    assemble,
)
from atoll.control.rates import RateStatus, RateTracker
from atoll.control.state import ControllerState, HistoryPoint, StateError, load_state, save_state

TTFT_EDGES = (0.1, 0.5, math.inf)


def page(requests: float, *, prompt_per_request: float = 100.0, generation_per_request: float = 20.0,
         ttft: tuple[float, float, float] | None = None, itl_name: str | None = ITL,
         labels: str = 'engine="0",model_name="m"') -> str:
    """One vLLM replica's /metrics text after ``requests`` finished requests: counters and
    request-length histograms consistent with them; ``ttft`` the cumulative bucket counts at
    TTFT_EDGES (None: no TTFT histogram); the ITL histogram under ``itl_name`` (None: absent)."""
    p, g = requests * prompt_per_request, requests * generation_per_request
    lines = [
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"{PROMPT}{{{labels}}} {p}", f"{GENERATION}{{{labels}}} {g}",
        f"{WAITING}{{{labels}}} 1.0", f"{RUNNING}{{{labels}}} 3.0",
        "# TYPE vllm:request_prompt_tokens histogram",
        f'vllm:request_prompt_tokens_bucket{{{labels},le="+Inf"}} {requests}',
        f"vllm:request_prompt_tokens_count{{{labels}}} {requests}",
        f"vllm:request_prompt_tokens_sum{{{labels}}} {p}",
        f"vllm:request_generation_tokens_count{{{labels}}} {requests}",
        f"vllm:request_generation_tokens_sum{{{labels}}} {g}",
        f"vllm:request_generation_tokens_created{{{labels}}} 1.7e9",
    ]
    if ttft is not None:
        lines += [f'{TTFT}_bucket{{{labels},le="{"+Inf" if le == math.inf else le}"}} {c}'
                  for le, c in zip(TTFT_EDGES, ttft, strict=True)]
        lines += [f"{TTFT}_count{{{labels}}} {ttft[-1]}", f"{TTFT}_sum{{{labels}}} {0.2 * ttft[-1]}"]
    if itl_name is not None:
        lines += [f"{itl_name}_count{{{labels}}} {requests * generation_per_request}",
                  f"{itl_name}_sum{{{labels}}} {0.04 * requests * generation_per_request}"]
    return "\n".join(lines) + "\n"


def scrape(body: str, clock: FakeClock) -> MetricsSnapshot:
    return scrapes([(clock(), body)])[0]


def scrapes(pages: list[tuple[float, str]]) -> list[MetricsSnapshot]:
    """Successive reads of one endpoint, each (time, page text)."""
    clock, current = FakeClock(), [""]
    out = []
    with ScriptedHttp(lambda path, q: (200, current[0].encode())) as http:
        source = ScrapeSource(http.url, clock=clock)
        for t, body in pages:
            clock.now, current[0] = t, body
            out.append(source.read())
    return out


def test_a_vllm_page_gives_each_replica_its_histograms() -> None:
    snap = scrape(page(10, ttft=(4, 9, 10)), FakeClock(5.0))
    (s,) = snap.models["m"].series
    assert s.histograms["prompt_tokens"] == Histogram(1000.0, 10.0)  # no buckets kept: sum/count is all
    assert s.histograms["generation_tokens"] == Histogram(200.0, 10.0)
    assert s.histograms["ttft"] == Histogram(2.0, 10.0, ((0.1, 4.0), (0.5, 9.0), (math.inf, 10.0)))
    assert s.histograms["itl"].count == 200.0 and not snap.notes and not snap.models["m"].problems


def test_the_older_itl_name_is_read_and_the_current_one_preferred() -> None:
    old = scrape(page(10, itl_name=ITL_OLD), FakeClock(5.0)).models["m"].series[0]
    assert old.histograms["itl"] == Histogram(8.0, 200.0)
    labels = 'engine="0",model_name="m"'
    both = page(10) + f"{ITL_OLD}_count{{{labels}}} 7\n{ITL_OLD}_sum{{{labels}}} 70\n"
    assert scrape(both, FakeClock(5.0)).models["m"].series[0].histograms["itl"] == Histogram(8.0, 200.0)


def test_missing_and_broken_histograms_are_none_never_a_held_model() -> None:
    bare = scrape(page(10, ttft=None, itl_name=None), FakeClock(5.0))
    assert set(bare.models["m"].series[0].histograms) == {"prompt_tokens", "generation_tokens"}
    broken = page(10).replace("vllm:request_generation_tokens_sum{", "vllm:request_generation_tokens_nope{")
    broken += f'{TTFT}_count{{engine="0",model_name="m"}} NaN\n{TTFT}_sum{{engine="0",model_name="m"}} 1\n'
    snap = scrape(broken, FakeClock(5.0))
    assert set(snap.models["m"].series[0].histograms) == {"prompt_tokens", "itl"}
    assert not snap.models["m"].problems  # the counters are fine: the model is not held
    assert any("request_generation_tokens" in n and "no _sum" in n for n in snap.notes)
    assert any(TTFT in n and "left out" in n for n in snap.notes)
    counters_only = "\n".join(line for line in page(10).splitlines()
                              if "request_" not in line and "latency" not in line)
    tracker = RateTracker()
    first, second = scrapes([(0.0, counters_only), (10.0, counters_only.replace("1000.0", "2000.0"))])
    tracker.update(first)
    r = tracker.update(second).models["m"]
    assert r.ok and r.prompt_tokens_per_s == pytest.approx(100.0)
    assert r.requests_per_s is None and r.prompt_tokens_per_request is None and r.ttft_mean_s is None
    assert r.as_dict()["ttft_buckets"] is None


def test_prometheus_api_histograms_with_le_labels() -> None:
    labels = {"model_name": "m", "instance": "a:8000", "job": "vllm"}

    def item(name: str, value: float, **extra: str) -> dict[str, Any]:
        return {"metric": {"__name__": name, **labels, **extra}, "value": [1.0, str(value)]}

    def answer(path: str, q: dict[str, list[str]]) -> tuple[int, bytes]:
        query = q["query"][0]
        if query.startswith("timestamp("):
            result = [{"metric": labels, "value": [1.0, "90.0"]}]
        elif query.startswith("process_start"):
            result = []
        else:
            assert "request_prompt_tokens_sum" in query and "inter_token_latency_seconds_bucket" in query
            result = [item(PROMPT, 1000.0), item(GENERATION, 200.0), item(WAITING, 0.0), item(RUNNING, 1.0),
                      item("vllm:request_prompt_tokens_sum", 1000.0),
                      item("vllm:request_prompt_tokens_count", 10),
                      item(f"{TTFT}_sum", 2.0), item(f"{TTFT}_count", 10),
                      item(f"{TTFT}_bucket", 10, le="+Inf"), item(f"{TTFT}_bucket", 4, le="0.1"),
                      item(f"{ITL}_sum", "NaN"), item(f"{ITL}_count", 5)]
        doc = {"status": "success", "data": {"resultType": "vector", "result": result}}
        return 200, json.dumps(doc).encode()

    with ScriptedHttp(answer) as http:
        snap = PrometheusSource(http.url, clock=FakeClock(100.0)).read()
    (s,) = snap.models["m"].series
    assert s.time_s == 90.0 and s.series == "instance=a:8000,job=vllm"  # le is not part of the replica
    assert s.histograms["prompt_tokens"] == Histogram(1000.0, 10.0)
    assert s.histograms["ttft"].buckets == ((0.1, 4.0), (math.inf, 10.0))
    assert "itl" not in s.histograms and any(ITL in n for n in snap.notes)
    assert not snap.models["m"].problems


def hsnap(t: float, replicas: dict[str, tuple[float, dict[str, Histogram]]], start: float | None = None
          ) -> MetricsSnapshot:
    """Replicas as id -> (requests so far, histograms); 100 prompt / 20 generation tokens each."""
    series = tuple(SeriesSample(r, t, n * 100.0, n * 20.0, start, h) for r, (n, h) in replicas.items())
    return MetricsSnapshot(t, {"m": ModelMetrics(series, 0.0, 1.0)}, "test")


def lengths(n: float, prompt: float = 100.0, gen: float = 20.0) -> dict[str, Histogram]:
    return {"prompt_tokens": Histogram(n * prompt, n), "generation_tokens": Histogram(n * gen, n)}


def ttft(total: float, counts: tuple[float, float, float]) -> Histogram:
    return Histogram(total, counts[-1], tuple(zip(TTFT_EDGES, counts, strict=True)))


def test_interval_deltas_means_and_bucket_increases_summed_over_replicas() -> None:
    tracker = RateTracker()
    tracker.update(hsnap(0.0, {"a": (10, {**lengths(10), "ttft": ttft(2.0, (4, 9, 10))}),
                               "b": (0, {**lengths(0), "ttft": ttft(0.0, (0, 0, 0))})}))
    # replica a: 20 more requests of 40 prompt / 50 generation tokens; b: 10 of the same
    a = {"prompt_tokens": Histogram(10 * 100 + 20 * 40, 30),
         "generation_tokens": Histogram(200 + 20 * 50, 30),
         "ttft": ttft(6.0, (10, 25, 30))}
    b = {**lengths(10, 40, 50), "ttft": ttft(3.0, (5, 10, 10))}
    r = tracker.update(hsnap(10.0, {"a": (30, a), "b": (10, b)})).models["m"]
    assert r.ok and r.requests_per_s == pytest.approx(3.0)  # 20 + 10 finished requests in 10 s
    assert r.prompt_tokens_per_request == pytest.approx(40.0)
    assert r.generation_tokens_per_request == pytest.approx(50.0)
    assert r.ttft_count == 30 and r.ttft_mean_s == pytest.approx((4.0 + 3.0) / 30)
    assert r.ttft_buckets == ((0.1, 11.0), (0.5, 26.0), (math.inf, 30.0))
    assert r.itl_mean_s is None and r.itl_count is None  # not exported
    assert r.as_dict()["ttft_buckets"][-1] == ["+Inf", 30.0]


def test_histogram_reset_new_replica_and_a_replica_without_a_new_sample() -> None:
    tracker = RateTracker()
    tracker.update(hsnap(0.0, {"a": (100, lengths(100))}, start=1.0))
    # the replica restarted (new process start time): everything since the restart is the increase
    r = tracker.update(hsnap(10.0, {"a": (5, lengths(5, 60, 30))}, start=2.0)).models["m"]
    assert r.ok and r.resets >= 1 and r.requests_per_s == pytest.approx(0.5)
    assert r.prompt_tokens_per_request == pytest.approx(60.0)
    # a histogram alone going back by less (no restart) is left out for the interval, not an error
    odd = {"prompt_tokens": Histogram(5 * 60 + 100, 4.0), "generation_tokens": Histogram(5 * 30 + 60, 7)}
    r = tracker.update(hsnap(20.0, {"a": (7, odd)}, start=2.0)).models["m"]
    assert r.ok and r.prompt_tokens_per_request is None
    assert r.generation_tokens_per_request == pytest.approx(30.0)
    # a new replica warms the model up for one read; then both replicas' increases add up
    r = tracker.update(hsnap(30.0, {"a": (9, lengths(9) | {"prompt_tokens": Histogram(400 + 200, 6)}),
                                    "b": (1, lengths(1))}, start=2.0)).models["m"]
    assert r.status is RateStatus.WARMING_UP and r.requests_per_s is None
    r = tracker.update(hsnap(40.0, {"a": (11, lengths(9) | {"prompt_tokens": Histogram(600 + 200, 8)}),
                                    "b": (3, lengths(3))}, start=2.0)).models["m"]
    assert r.ok and r.requests_per_s == pytest.approx((2 + 2) / 10.0)
    assert r.prompt_tokens_per_request == pytest.approx(100.0)
    # no new scrape of either replica since the last read: the last interval's figures stand
    same = tracker.update(hsnap(40.0, {"a": (11, lengths(9) | {"prompt_tokens": Histogram(800, 8)}),
                                       "b": (3, lengths(3))}, start=2.0)).models["m"]
    assert same.requests_per_s == pytest.approx(r.requests_per_s)


def test_baseline_with_histograms_survives_the_state_file(tmp_path: Path) -> None:
    tracker = RateTracker()
    tracker.update(hsnap(0.0, {"a": (10, {**lengths(10), "ttft": ttft(2.0, (4, 9, 10))})}))
    save_state(tmp_path, ControllerState(last_metrics=tracker.baseline,
                                         history={"m": (HistoryPoint(0.0, 1.0, 2.0, 0.1, 10.0, 20.0),)}))
    loaded = load_state(tmp_path)
    assert loaded is not None and loaded.last_metrics == tracker.baseline
    assert loaded.history["m"][0].shape == (10.0, 20.0)
    again = RateTracker(baseline=loaded.last_metrics)
    r = again.update(hsnap(10.0, {"a": (20, {**lengths(20), "ttft": ttft(4.0, (8, 18, 20))})})).models["m"]
    assert r.ok and r.requests_per_s == pytest.approx(1.0) and r.ttft_mean_s == pytest.approx(0.2)


def test_state_files_written_before_histograms_still_load(tmp_path: Path) -> None:
    history = {"m": [[300.0, 1000.0, 100.0, 10.0], [600.0, 1000.0, 100.0, None]]}
    old = {"version": 1, "tick": 3, "history": history,
           "last_metrics": {"time_s": 600.0, "source": "x", "models": {"m": {
               "series": [["r", 600.0, 5.0, 6.0], ["s", 600.0, 5.0, 6.0, 123.0]],
               "waiting": 0.0, "running": 1.0, "kv_usage": None, "problems": []}}}}
    (tmp_path / "controller-state.json").write_text(json.dumps(old))
    loaded = load_state(tmp_path)
    assert loaded is not None and loaded.history["m"][0].shape is None
    assert loaded.last_metrics is not None
    assert [s.start_time_s for s in loaded.last_metrics.models["m"].series] == [None, 123.0]
    old["history"] = {"m": [[300.0]]}
    (tmp_path / "controller-state.json").write_text(json.dumps(old))
    with pytest.raises(StateError, match="controller-state.json.*history point must be a list"):
        load_state(tmp_path)


def test_assemble_keeps_gauge_only_replicas_out_and_histograms_with_their_counters() -> None:
    raw = [("m", "r0", PROMPT, 10.0), ("m", "r0", GENERATION, 2.0), ("m", "r0", WAITING, 0.0),
           ("m", "r0", RUNNING, 0.0), ("m", "r0", f"{TTFT}_sum", 1.0), ("m", "r0", f"{TTFT}_count", 2.0)]
    snap = assemble(raw, {}, 1.0, "t")
    assert snap.models["m"].series[0].histograms == {"ttft": Histogram(1.0, 2.0)}
