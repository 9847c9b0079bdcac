"""One bad sample never stops the controller: bad pages and API answers, counters that go back or
stay flat, and requests bounded in time and size."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest
from control_helpers import FakeClock, LoopbackHttp, QuietHandler, ScriptedHttp

from atoll.control.metrics import (
    GENERATION,
    PROMPT,
    RUNNING,
    WAITING,
    MetricsSnapshot,
    MetricsUnavailable,
    ModelMetrics,
    PrometheusSource,
    ScrapeSource,
    SeriesSample,
    prometheus_snapshot,
)
from atoll.control.rates import RateStatus, RateTracker


def page(models: dict[str, tuple[str, str]], extra: str = "") -> bytes:
    lines = [f"# TYPE {PROMPT} counter", f"# TYPE {GENERATION} counter"]
    for m, (p, g) in models.items():
        lines += [f'{PROMPT}{{model_name="{m}"}} {p}', f'{GENERATION}{{model_name="{m}"}} {g}',
                  f'{WAITING}{{model_name="{m}"}} 0', f'{RUNNING}{{model_name="{m}"}} 1']
    return ("\n".join(lines) + "\n" + extra).encode()


def read_page(body: bytes) -> MetricsSnapshot:
    with ScriptedHttp(lambda path, q: (200, body)) as http:
        return ScrapeSource(http.url, timeout=2, clock=FakeClock(5.0)).read()


@pytest.mark.parametrize(("value", "expect"), [("+Inf", "+Inf"), ("-Inf", "-Inf"), ("-5", "negative")])
def test_a_bad_counter_sample_holds_its_model_only(value: str, expect: str) -> None:
    snap = read_page(page({"a": (value, "10"), "b": ("100", "10")}))
    assert any(expect in p for p in snap.models["a"].problems) and not snap.models["b"].problems
    rates = RateTracker().update(snap)
    assert rates.models["a"].status is RateStatus.INVALID
    assert rates.models["b"].status is RateStatus.WARMING_UP


def test_unparsable_lines_are_held_and_named() -> None:
    extra = (f'{PROMPT}{{model_name="c"}} twelve\n{PROMPT}{{model_name="d" 12\n{GENERATION}{{ 12\n'
             'vllm:num_requests_waiting{engine="0"} 1\nunrelated_metric{{{ garbage\n')
    snap = read_page(page({"a": ("100", "10")}, extra))
    assert not snap.models["a"].problems  # the rest of the page is read
    assert any("unparsable line" in p for p in snap.models["c"].problems)
    assert any("unparsable line" in p for p in snap.models["d"].problems)
    assert any("unparsable line" in n for n in snap.notes)  # no model can be told: a note
    assert any("without a model_name" in n for n in snap.notes)


def test_a_binary_page_fails_the_read_with_its_url() -> None:
    with pytest.raises(MetricsUnavailable, match="binary content"):
        read_page(b"\x00\x01\x02vllm:\xff\xfe")


def api_item(name: str | None, value: Any, model: str | None = "m", **extra: Any) -> dict[str, Any]:
    labels = {"instance": "h:1", "job": "v", **extra}
    if model is not None:
        labels["model_name"] = model
    if name is not None:
        labels["__name__"] = name
    return {"metric": labels, "value": [50.0, value]}


def good(model: str) -> list[dict[str, Any]]:
    return [api_item(PROMPT, "10", model), api_item(GENERATION, "1", model), api_item(WAITING, "0", model),
            api_item(RUNNING, "1", model)]


@pytest.mark.parametrize(("item", "held"), [
    ({"value": [50.0, "1"]}, None),  # no 'metric'
    ({"metric": None, "value": [50.0, "1"]}, None),
    ("not an object", None),
    (api_item(None, "1", "x"), "x"),  # no __name__
    (api_item(PROMPT, "lots", "x"), "x"),  # non-numeric value
    (api_item(PROMPT, None, "x"), "x"),
    (api_item(PROMPT, ["1"], "x"), "x"),
    ({"metric": {"__name__": PROMPT, "model_name": "x"}, "value": "1"}, "x"),
    (api_item(PROMPT, "+Inf", "x"), "x"),
])
def test_prometheus_items_that_cannot_be_used_are_held_and_reported(item: Any, held: str | None) -> None:
    snap = prometheus_snapshot([*good("m"), item], [item, "junk"], [item, {"metric": 3}], 60.0, "prom")
    assert not snap.models["m"].problems
    if held is None:
        assert snap.notes and "skipped a result item" in snap.notes[0]
    else:
        assert snap.models[held].problems
        assert RateTracker().update(snap).models[held].status is RateStatus.INVALID


def test_prometheus_process_start_time_is_attached_to_its_replicas() -> None:
    starts = [api_item("process_start_time_seconds", "1700000000", None)]
    snap = prometheus_snapshot(good("m"), [], starts, 60.0, "prom")
    assert snap.models["m"].series[0].start_time_s == 1.7e9


# ----- counters that go back or stay flat ----------------------------------------------------------

def snap(t: float, p: float, g: float, start: float | None = None) -> MetricsSnapshot:
    mm = ModelMetrics((SeriesSample("r", t, p, g, start),), 0.0, 1.0)
    return MetricsSnapshot(t, {"m": mm}, "test")


def test_a_small_drop_is_held_not_a_reset_and_the_gap_is_rated_when_it_recovers() -> None:
    tr = RateTracker(flat_hold_s=900)
    tr.update(snap(0, 600_000, 60_000))
    assert tr.update(snap(60, 610_000, 61_000)).models["m"].ok
    # a minute's worth lower (a lagging replica answered): the old code read 600k new tokens
    r = tr.update(snap(120, 600_000, 60_000)).models["m"]
    assert r.status is RateStatus.COUNTER_BACKWARDS and r.prompt_tokens_per_s is None
    assert "went back from 610000 to 600000" in r.reason and "not a reset" in r.reason
    r = tr.update(snap(180, 622_000, 62_200)).models["m"]
    assert r.ok and r.prompt_tokens_per_s == pytest.approx(12_000 / 120) and r.resets == 0


def test_a_drop_below_the_fraction_or_a_new_start_time_is_a_reset() -> None:
    tr = RateTracker(reset_fraction=0.5)
    tr.update(snap(0, 600_000, 60_000))
    r = tr.update(snap(60, 6_000, 600)).models["m"]
    assert r.ok and r.resets == 2 and r.prompt_tokens_per_s == pytest.approx(100.0)
    tr = RateTracker()
    tr.update(snap(0, 600_000, 60_000, start=1.0))
    r = tr.update(snap(60, 590_000, 59_000, start=2.0)).models["m"]  # restarted: start time changed
    assert r.ok and r.resets == 2
    tr = RateTracker()
    tr.update(snap(0, 600_000, 60_000, start=1.0))
    r = tr.update(snap(60, 6_000, 600, start=1.0)).models["m"]  # same process: not a restart
    assert r.status is RateStatus.COUNTER_BACKWARDS


def test_flat_counters_are_held_until_they_move_or_the_hold_passes() -> None:
    tr = RateTracker(flat_hold_s=300)
    tr.update(snap(0, 1000, 100))
    assert tr.update(snap(60, 7000, 700)).models["m"].ok
    for t in (120, 180, 240, 300):
        r = tr.update(snap(t, 7000, 700)).models["m"]
        assert r.status is RateStatus.STALE_FLAT and r.prompt_tokens_per_s is None, t
    r = tr.update(snap(330, 10_000, 1000)).models["m"]  # moves again: the whole flat stretch is rated
    assert r.ok and r.prompt_tokens_per_s == pytest.approx(3000 / 270)
    for t in (390, 450, 510, 570):
        assert tr.update(snap(t, 10_000, 1000)).models["m"].status is RateStatus.STALE_FLAT
    r = tr.update(snap(630, 10_000, 1000)).models["m"]  # 300 s flat: a real zero
    assert r.ok and r.prompt_tokens_per_s == 0.0
    # the baseline persisted while flat keeps the hold across a restart
    tr2 = RateTracker(flat_hold_s=300)
    tr2.update(snap(0, 5, 5))
    tr2.update(snap(60, 50, 50))
    again = RateTracker(flat_hold_s=300, baseline=tr2.baseline)
    assert again.update(snap(120, 50, 50)).models["m"].status is RateStatus.STALE_FLAT


# ----- bounded requests ---------------------------------------------------------------------------

class Trickle(LoopbackHttp):
    """A loopback server that answers 200 with a Content-Length and then one byte every ``gap_s``."""

    def __init__(self, size: int, gap_s: float) -> None:
        outer = self
        self.stop = threading.Event()

        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                for _ in range(size):
                    if outer.stop.is_set():
                        return
                    try:
                        self.wfile.write(b"#")
                        self.wfile.flush()
                    except OSError:
                        return
                    outer.stop.wait(gap_s)

        super().__init__(Handler)
        self.start()

    def close(self) -> None:
        self.stop.set()
        super().close()


def test_a_trickling_server_is_cut_at_the_total_deadline() -> None:
    # every byte comes well within the socket time-out, the whole answer would take 100 s
    server = Trickle(size=200, gap_s=1.0)
    try:
        with pytest.raises(MetricsUnavailable, match=r"no complete answer within 2.5 s"):
            ScrapeSource(server.url, timeout=2.5).read()
    finally:
        server.close()


def test_a_page_over_the_size_cap_is_refused() -> None:
    big = page({"a": ("1", "1")}) + b"# filler\n" * 300_000
    with ScriptedHttp(lambda path, q: (200, big)) as http:
        with pytest.raises(MetricsUnavailable, match=r"larger than the 1 MiB cap"):
            ScrapeSource(http.url, timeout=5, max_bytes=2**20).read()
        assert ScrapeSource(http.url, timeout=5, max_bytes=4 * 2**20).read().models["a"]

    def no_length() -> None:  # a body without Content-Length is counted as it arrives
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            url = f"http://127.0.0.1:{listener.getsockname()[1]}"

            def serve() -> None:
                conn, _ = listener.accept()
                with conn:
                    conn.recv(4096)
                    conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
                    try:
                        for _ in range(40):
                            conn.sendall(b"x" * 65536)
                    except OSError:
                        pass

            threading.Thread(target=serve, daemon=True).start()
            with pytest.raises(MetricsUnavailable, match="cap"):
                PrometheusSource(url, timeout=5, max_bytes=2**20).read()

    no_length()
    with pytest.raises(ValueError, match="max_bytes"):
        ScrapeSource("http://127.0.0.1:1", max_bytes=0)
    assert json  # keep the import for parametrized bodies
    assert time
