"""The ``metrics:`` sink cannot starve the controller: idle clients time out, connections past the
cap are closed at once, running out of descriptors is named as such and the state save outlives
it; the sink binds 127.0.0.1 by default and exports the tick's figures."""

from __future__ import annotations

import errno
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from live_harness import MODELS, Harness, live_fleet
from prometheus_client.parser import text_string_to_metric_families

from atoll.control import state as state_module
from atoll.control.sinks import MetricsSink, make_sink
from atoll.control.state import ControllerState, StateError, load_state, save_state


def _scrape(port: int, attempts: int = 200) -> str:
    """The page, retried while the sink is busy (its slots freed by the idle clients' time-outs)."""
    last: Exception | None = None
    for _ in range(attempts):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return r.read().decode()
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            last = exc
            time.sleep(0.05)
    raise AssertionError(f"never served: {last}")


def test_the_sink_binds_loopback_unless_told_otherwise() -> None:
    sink = make_sink("metrics:0")
    try:
        assert isinstance(sink, MetricsSink) and sink.host == "127.0.0.1"
    finally:
        sink.close()


def test_idle_clients_are_capped_and_time_out() -> None:
    sink = MetricsSink(0, max_connections=4, timeout_s=0.3)
    idle = []
    try:
        threads_before = threading.active_count()
        for _ in range(30):  # connect and never send a byte
            idle.append(socket.create_connection(("127.0.0.1", sink.port), timeout=5))
        time.sleep(0.1)
        # at most the cap's threads hold a client; the rest were closed unserved and counted
        assert threading.active_count() - threads_before <= 4
        page = _scrape(sink.port)
        assert "atoll_desired_replicas" in page
        assert sink.refused >= 26
    finally:
        for s in idle:
            s.close()
        sink.close()


def test_the_tick_figures_are_exported(tmp_path: Path) -> None:
    h = Harness(live_fleet(), tmp_path)
    h.sink = MetricsSink(0)  # type: ignore[assignment]
    h.controller = h.new()
    try:
        for _ in range(3):
            h.tick()
        page = _scrape(h.sink.port)  # type: ignore[attr-defined]
    finally:
        h.sink.close()  # type: ignore[attr-defined]
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(page) for s in f.samples}
    names = {name for name, _ in samples}
    for name in ("atoll_plan_cost_usd_per_hour", "atoll_demand_tokens_per_second",
                 "atoll_forecast_tokens_per_second", "atoll_slo_attainment_ratio",
                 "atoll_last_tick_timestamp_seconds"):
        assert name in names, name
    assert samples[("atoll_plan_cost_usd_per_hour", ())] > 0
    # a one-tier fleet (on-demand): its whole $/h in that tier
    assert samples[("atoll_plan_tier_cost_usd_per_hour", (("tier", "on-demand"),))] == pytest.approx(
        samples[("atoll_plan_cost_usd_per_hour", ())])
    for m in MODELS:
        assert 0.0 <= samples[("atoll_slo_attainment_ratio", (("model", m),))] <= 1.0
        assert samples[("atoll_demand_tokens_per_second", (("model", m), ("phase", "prefill")))] > 0


def test_out_of_descriptors_is_named_and_a_passing_shortage_does_not_fail_the_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = state_module.atomic_write_text
    calls = {"n": 0}

    def flaky(path: Path, text: str) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        real(path, text)

    monkeypatch.setattr(state_module, "SAVE_RETRY_S", 0.0)
    monkeypatch.setattr(state_module, "atomic_write_text", flaky)
    save_state(tmp_path, ControllerState(tick=3))
    assert load_state(tmp_path).tick == 3  # type: ignore[union-attr]

    def exhausted(path: Path, text: str) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(state_module, "atomic_write_text", exhausted)
    with pytest.raises(StateError, match="too many open files.*file-descriptor limit") as info:
        save_state(tmp_path, ControllerState(tick=4))
    assert "permission" not in str(info.value).split("(not a")[0]
