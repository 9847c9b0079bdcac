"""The live controller under real faults — scale from zero, guard rails, clocks,
ownership, names, sinks, bounded growth, one Prometheus instant, and the small ones. Each test
reproduces one fault and fails when the controller mishandles it."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from control_helpers import ScriptedHttp
from live_harness import DECODE_TPS, INPUT, MODELS, OUTPUT, PREFILL_TPS, USE2, Harness, live_fleet

from atoll.control.controller import ControllerSettings
from atoll.control.k8s.apply import K8sApplySink, K8sManifestSink, K8sOptions, render_manifests
from atoll.control.live_demand import LiveForecast, bin_history, compact_history
from atoll.control.live_fleet import LiveFleet
from atoll.control.loop import RECENT_TICKS, run_loop
from atoll.control.metrics import (
    GENERATION,
    PROMPT,
    RUNNING,
    WAITING,
    MetricsSnapshot,
    PrometheusSource,
    assemble,
)
from atoll.control.plans import PlanRecord, SinkError
from atoll.control.sinks import JsonDirSink, deliver
from atoll.control.state import STATE_FILE, HistoryPoint, StateError, StateLock, load_state, save_state
from atoll.solvers.fleet import FleetFileError, load_fleet
from atoll.solvers.problem import Allocation
from atoll.solvers.types import Phase, Service, Stage, Template


# ----- 1. scale from zero --------------------------------------------------------------------
def test_a_model_whose_traffic_stops_keeps_its_floor_and_comes_back(fleet: LiveFleet,
                                                                     tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path, flat_hold_s=600.0)
    h.source.instances = h.per_model()  # servers follow the delivered plan
    for _ in range(3):
        h.tick()
        h.source.instances = h.per_model()
    assert h.per_model()["Phi-4-14B"] > 0
    h.source.rates["Phi-4-14B"] = 0.0  # traffic stops: flat counters, then a real zero
    for _ in range(8):
        h.tick()
        h.source.instances = h.per_model()
        assert min(h.per_service("Phi-4-14B")) >= 1  # never planned to zero: its floor
    h.source.rates["Phi-4-14B"] = 30.0  # traffic back: its server's counters show it
    for _ in range(4):
        report = h.tick()
        h.source.instances = h.per_model()
    assert report.metrics["rates"]["Phi-4-14B"]["status"] == "ok"
    prefill, decode = h.per_service("Phi-4-14B")
    assert prefill * PREFILL_TPS >= 30.0 * INPUT and decode * DECODE_TPS >= 30.0 * OUTPUT


def test_a_model_at_zero_without_series_is_raised_to_its_floor(tmp_path: Path) -> None:
    floors = {"Phi-4-14B": (2, 1), "GPT-OSS-20B": (0, 0)}
    h = Harness(live_fleet(min_instances=floors), tmp_path, rates={"Phi-4-14B": 0.0, "GPT-OSS-20B": 0.0})
    h.source.instances = {}  # nothing runs: no model has a series at all
    reports = [h.tick() for _ in range(2)]
    assert reports[1].decision.chosen.get("Phi-4-14B", "").startswith("below its floor")
    assert h.per_service("Phi-4-14B") == (2, 1) and h.per_service("GPT-OSS-20B") == (0, 0)
    assert reports[1].solve is not None
    assert reports[1].solve["guard_rails"]["floor_added"]["Phi-4-14B/prefill"] == {"floor": 2, "added": 2}


def test_fleet_file_min_instances(tmp_path: Path) -> None:
    base = {"name": "acme", "models": ["Phi-4-14B", "Qwen3-32B"],
            "regions": [{"name": USE2, "catalog": True, "gpu_types": ["L4", "L40S"]}],
            "workloads": {"Phi-4-14B": {"source": "servegen:m-large"},
                          "Qwen3-32B": {"source": "servegen:m-mid"}}}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(base))
    assert load_fleet(path).min_instances == {"Phi-4-14B": (1, 1), "Qwen3-32B": (1, 1)}
    path.write_text(yaml.safe_dump({**base, "min_instances": {"default": 2, "phi-4-14b": {"decode": 0}}}))
    assert load_fleet(path).min_instances == {"Phi-4-14B": (1, 0), "Qwen3-32B": (2, 2)}
    for bad, match in (({"Nope": 1}, "names no model"), (-1, "whole number >= 0"),
                       ({"Phi-4-14B": {"verify": 1}}, "unknown phase")):
        path.write_text(yaml.safe_dump({**base, "min_instances": bad}))
        with pytest.raises(FleetFileError, match=match):
            load_fleet(path)


# ----- 2. guard rails -------------------------------------------------------------------------
def _steady(h: Harness, ticks: int = 6) -> None:
    for _ in range(ticks):
        h.tick()


def test_one_bad_sample_is_held_as_an_outlier_and_never_planned(fleet: LiveFleet, tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path)
    _steady(h)
    before = dict(h.controller.state.running)
    h.source.override["Phi-4-14B"] = 1e12  # one scrape reads the counter as 1e12
    spike = h.tick()
    rate = spike.metrics["rates"]["Phi-4-14B"]
    assert rate["status"] == "outlier" and "held until a second interval confirms it" in rate["reason"]
    assert "Phi-4-14B" in spike.decision.held and h.controller.state.running == before
    after = h.tick()  # back to normal: rated from the old baseline over both intervals
    assert after.metrics["rates"]["Phi-4-14B"]["status"] == "ok"
    assert after.metrics["rates"]["Phi-4-14B"]["prompt_tokens_per_s"] == pytest.approx(10.0 * INPUT)
    assert h.controller.state.running == before  # still the plan of 10 req/s


def test_a_real_surge_is_confirmed_by_a_second_interval_and_growth_is_capped(fleet: LiveFleet,
                                                                              tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path)
    _steady(h)
    n0 = h.per_service("Phi-4-14B")
    h.source.rates["Phi-4-14B"] = 500.0  # 50x: far above the recent range (read from the next tick)
    h.tick()
    first = h.tick()
    assert first.metrics["rates"]["Phi-4-14B"]["status"] == "outlier"
    assert h.per_service("Phi-4-14B") == n0
    second = h.tick()
    rate = second.metrics["rates"]["Phi-4-14B"]
    assert rate["status"] == "ok" and "two intervals running" in rate["reason"]
    assert second.solve is not None
    capped = second.solve["guard_rails"]["growth_capped"]
    assert "Phi-4-14B/prefill" in capped and capped["Phi-4-14B/prefill"]["capped_to"] == 2 * n0[0] + 4
    assert h.per_service("Phi-4-14B")[0] == 2 * n0[0] + 4
    for _ in range(4):  # the rest follows at the same pace
        h.tick()
    assert h.per_service("Phi-4-14B")[0] * PREFILL_TPS >= 500.0 * INPUT


def test_an_overflowing_sample_is_invalid_and_never_crashes_a_restart(fleet: LiveFleet,
                                                                        tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path, interval=0.5)
    _steady(h, 3)
    h.source.override["Phi-4-14B"] = 1.7e308  # over half a second: an infinite rate
    report = h.tick()
    assert report.metrics["rates"]["Phi-4-14B"]["status"] in ("invalid", "outlier")
    h.source.override["Phi-4-14B"] = 1.7e308
    h.controller = h.new()  # a restart reads it again: no crash either
    report = h.tick()
    assert report.metrics["rates"]["Phi-4-14B"]["status"] in ("invalid", "outlier")
    assert report.metrics["rates"]["GPT-OSS-20B"]["status"] == "ok"


def test_rate_tracker_turns_an_infinite_rate_into_invalid() -> None:
    from atoll.control.rates import RateTracker

    tracker = RateTracker(["m"])
    def read(t: float, prompt: float, generation: float) -> MetricsSnapshot:
        return assemble([("m", "r", PROMPT, prompt), ("m", "r", GENERATION, generation),
                         ("m", "r", WAITING, 0.0), ("m", "r", RUNNING, 1.0)], {}, t, "t")

    tracker.update(read(0.0, 1.0, 1.0))
    report = tracker.update(read(0.001, 1.7e308, 2.0))
    assert report.models["m"].status.value == "invalid" and "not finite" in report.models["m"].reason
    good = tracker.update(read(10.0, 11.0, 12.0))
    assert good.models["m"].ok and good.models["m"].prompt_tokens_per_s == pytest.approx(1.0)


# ----- 3. clocks ------------------------------------------------------------------------------
def test_a_state_from_another_time_scale_is_refused_naming_both(fleet: LiveFleet, tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path, time_scale=60.0)
    _steady(h, 2)
    h.settings = ControllerSettings(interval_s=300.0)
    with pytest.raises(StateError, match=r"--time-scale 60.*--time-scale 1\b"):
        h.new()
    saved = load_state(h.dir)
    assert saved is not None and saved.time_scale == 60.0


def test_a_state_whose_clock_is_ahead_is_refused(fleet: LiveFleet, tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path)
    _steady(h, 2)
    h.clock.now /= 60  # the same folder, a clock 60x slower (an older state without time_scale)
    with pytest.raises(StateError, match="another clock"):
        h.new()


def _points(start: float, end: float, step: float, rate: float) -> list[HistoryPoint]:
    return [HistoryPoint(t, rate * INPUT, rate * OUTPUT) for t in np.arange(start, end, step)]


def test_after_a_long_gap_the_forecast_follows_what_remains_at_a_bounded_cost() -> None:
    day = 86400.0
    f = LiveForecast(shapes={"m": (INPUT, OUTPUT)}, forecaster="ets", horizon=3)
    before = _points(0.0, 4 * day, 300.0, 50.0)
    after_gap = 34 * day
    history = {"m": (*before, *_points(after_gap, after_gap + 3600.0, 300.0, 100.0))}
    out = f.forecast(history, after_gap + 3600.0, ["m"])["m"]
    assert out.bins <= 13  # only what follows the gap is binned (was 34 days of bins)
    assert out.mean[0] == pytest.approx(100.0 * INPUT) and out.methods == ("recent", "recent")
    # a short gap is filled with the same time a day earlier, not the last rate
    pattern = [HistoryPoint(t, (50.0 if (t % day) < day / 2 else 150.0) * INPUT, 10.0) for t in
               np.arange(300.0, 2 * day, 300.0)]
    gap = [p for p in pattern if not (1.25 * day < p.time_s < 1.75 * day)]
    _, bins = bin_history(gap, 300.0, 2 * day, season=288)
    _, full = bin_history(pattern, 300.0, 2 * day, season=288)
    assert np.allclose(bins, full)


def test_history_is_bounded_in_time_and_compaction_keeps_the_bins() -> None:
    day = 86400.0
    points = _points(5.0, 8 * day, 5.0, 10.0)
    points = [HistoryPoint(p.time_s, p.prompt_tokens_per_s * (1 + 0.5 * math.sin(p.time_s / 3000)),
                           p.generation_tokens_per_s, 1.0, 100.0, 10.0) for p in points]
    now = 8 * day
    kept = compact_history(points, now, 300.0)
    assert len(kept) <= 2016 + 800  # a week of bins, the last hour (and the bin in progress) as measured
    week = [p for p in points if p.time_s > now - 7 * day]
    first, bins = bin_history(week, 300.0, now)
    first_c, bins_c = bin_history(kept, 300.0, now)
    assert first == first_c and np.allclose(bins, bins_c)
    assert compact_history(kept, now, 300.0) == kept  # idempotent


# ----- 4. ownership and 5. names --------------------------------------------------------------
PHI = Template(Service("Phi-4-14B", Phase.PREFILL), USE2, (("1xL40S", 1),), (Stage(40, ("1xL40S",)),), 800.0)


def _record(seq: int, templates: tuple[Template, ...], owner: str, counts: int = 1) -> PlanRecord:
    return PlanRecord.from_allocation(seq, 1.0, Allocation.of({t.key: counts for t in templates}), None,
                                      {t.key: t for t in templates}, {}, "test", owner=owner)


class Cluster:
    """Objects by (kind, name) with labels; list honours the equality and ``!key`` selectors."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, str]] = {}

    def apply(self, doc: dict[str, Any], namespace: str, dry_run: str | None, timeout: float) -> None:
        self.objects[(doc["kind"], doc["metadata"]["name"])] = dict(doc["metadata"]["labels"])

    def list_names(self, kind: str, namespace: str, selector: str, timeout: float) -> list[str]:
        def match(labels: dict[str, str]) -> bool:
            for term in selector.split(","):
                if term.startswith("!"):
                    if term[1:] in labels:
                        return False
                else:
                    k, _, v = term.partition("=")
                    if labels.get(k) != v:
                        return False
            return True
        return [n for (k, n), labels in self.objects.items() if k == kind and match(labels)]

    def delete(self, kind: str, name: str, namespace: str, dry_run: str | None, timeout: float) -> None:
        del self.objects[(kind, name)]


def test_k8s_apply_prunes_only_its_own_objects() -> None:
    cluster = Cluster()
    a = K8sApplySink(apply=True, api_factory=lambda: cluster)
    gpt = Template(Service("GPT-OSS-20B", Phase.DECODE), USE2, (("1xL4", 1),), (Stage(24, ("1xL4",)),), 200.0)
    a.write(_record(1, (PHI,), "fleet-a-000001"))
    mine = set(cluster.objects)
    b = K8sApplySink(apply=True, api_factory=lambda: cluster)
    result = b.write(_record(1, (gpt,), "fleet-b-000002"))  # another fleet, same namespace
    assert result.removed == () and mine <= set(cluster.objects)
    b.write(_record(2, (), "fleet-b-000002"))  # b scales to nothing: only its own objects go
    assert set(cluster.objects) == mine


def test_k8s_dir_belongs_to_one_controller(tmp_path: Path) -> None:
    d = tmp_path / "manifests"
    K8sManifestSink(d).write(_record(1, (PHI,), "fleet-a-000001"))
    files = sorted(p.name for p in d.iterdir())
    with pytest.raises(SinkError, match="another controller"):
        K8sManifestSink(d).write(_record(1, (), "fleet-b-000002"))
    assert sorted(p.name for p in d.iterdir()) == files


def test_model_names_that_slug_alike_get_their_own_services_and_files() -> None:
    a = Template(Service("org/Acme-8B", Phase.PREFILL), USE2, (("1xL4", 1),), (Stage(32, ("1xL4",)),), 800.0)
    b = Template(Service("org-Acme-8B", Phase.PREFILL), USE2, (("1xL4", 1),), (Stage(32, ("1xL4",)),), 800.0)
    options = K8sOptions(model_sources={"org/Acme-8B": "org/acme-8b", "org-Acme-8B": "other/acme-8b"})
    docs = render_manifests(_record(1, (a, b), ""), options)
    services = [d for d in docs if d["kind"] == "Service"]
    assert len({s["metadata"]["name"] for s in services}) == 2
    assert len({json.dumps(s["spec"]["selector"], sort_keys=True) for s in services}) == 2
    assert {s["metadata"]["annotations"]["atoll.io/model-name"] for s in services} == {"org/Acme-8B",
                                                                                       "org-Acme-8B"}
    long = "x" * 70
    one, two = (render_manifests(_record(1, (Template(Service(m, Phase.PREFILL), USE2, (("1xL4", 1),),
                                                               (Stage(32, ("1xL4",)),), 800.0),), ""),
                                 K8sOptions(model_sources={m: "o/m"})) for m in (long + "a", long + "b"))
    labels = [next(d for d in docs if d["kind"] == "Service")["metadata"]["labels"]["atoll.io/model"]
              for docs in (one, two)]
    assert labels[0] != labels[1] and all(len(v) <= 63 for v in labels)


# ----- 6. sinks -------------------------------------------------------------------------------
def test_a_half_written_kubeconfig_is_a_failed_delivery(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://")
    sink = K8sApplySink(kubeconfig=str(config))
    result = deliver(sink, _record(1, (PHI,), ""), attempts=2, backoff_s=0.0, sleep=lambda s: None)
    assert not result.ok and "kept as pending" in result.message and "kubeconfig" in result.message


def test_k8s_dir_validates_everything_before_writing_and_replaces_whole_files(tmp_path: Path) -> None:
    d = tmp_path / "manifests"
    sink = K8sManifestSink(d)
    sink.write(_record(1, (PHI,), "fleet-a-000001"))
    good = {p.name: p.read_text() for p in d.iterdir()}
    assert d.is_dir() and not d.is_symlink()
    small = Template(Service("Phi-4-14B", Phase.DECODE), USE2, (("1xL4", 1),), (Stage(40, ("1xL4",)),), 200.0)
    bad = K8sManifestSink(d, K8sOptions(gpu_products={"L40S": "NVIDIA-L40S", "L4": "not a label!"}))
    with pytest.raises(SinkError, match="not a valid label value"):
        bad.write(_record(2, (PHI, small), "fleet-a-000001"))
    assert {p.name: p.read_text() for p in d.iterdir()} == good  # none of the failing plan's files
    result = sink.write(_record(3, (small,), "fleet-a-000001"))
    names = sorted(p.name for p in d.iterdir())
    assert len(names) == 3 and all(Path(r).name not in names for r in result.removed)
    assert not list(tmp_path.glob(".manifests.*")) and not list(d.glob(".*"))  # nothing staged is left


# ----- 7. bounded growth ----------------------------------------------------------------------
def test_names_outside_the_fleet_are_neither_tracked_nor_kept(fleet: LiveFleet, tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path, interval=5.0)
    for i in range(40):
        h.source.extra = [f"churn-{i}"]
        report = h.tick()
    assert report.metrics["ignored_models"] == ["churn-39"]
    assert set(h.controller.tracker.models) == set(MODELS)
    saved = load_state(h.dir)
    assert saved is not None and saved.last_metrics is not None
    assert set(saved.last_metrics.models) <= set(MODELS)
    assert "churn-" not in (h.dir / STATE_FILE).read_text()


def test_json_dir_keeps_the_newest_plans(tmp_path: Path) -> None:
    sink = JsonDirSink(tmp_path / "plans", keep=5)
    for seq in range(1, 13):
        sink.write(_record(seq, (PHI,), "fleet-a-000001", counts=seq))
    names = sorted(p.name for p in (tmp_path / "plans").iterdir())
    assert names == ["latest.json", *(f"plan-{s:06d}.json" for s in range(8, 13))]


def test_loop_summary_is_bounded() -> None:
    class Fast:
        n = 0

        def tick(self) -> Any:
            self.n += 1

            class R:
                seconds = {"total": float(self.n)}
            return R()

    summary = run_loop(Fast(), wall_interval_s=0.0, max_ticks=RECENT_TICKS + 500, stop=threading.Event(),
                       on_tick=lambda r: None, monotonic=lambda: 0.0)
    assert len(summary.tick_seconds) == RECENT_TICKS
    assert summary.as_dict()["tick_seconds_max"] == RECENT_TICKS + 500


def test_temporary_files_left_by_kill_9_are_swept(fleet: LiveFleet, tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path)
    h.tick()
    stale = h.dir / f".{STATE_FILE}.abc123.tmp"
    stale.write_text("{")
    h.new()
    assert not stale.exists()


# ----- 8. one Prometheus instant --------------------------------------------------------------
def test_prometheus_queries_share_one_evaluation_time() -> None:
    def answer(path: str, q: dict[str, list[str]]) -> tuple[int, bytes]:
        return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()

    with ScriptedHttp(answer) as server:
        PrometheusSource(server.url, clock=lambda: 1234.5).read()
    times = [r.split("time=")[1] for r in server.requests if "time=" in r]
    assert len(times) == len(server.requests) == 3 and set(times) == {"1234.500"}


# ----- 9. smaller ------------------------------------------------------------------------------
def test_a_planted_lock_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "controller.lock").symlink_to(target)
    with pytest.raises(StateError, match="symbolic link"):
        StateLock(tmp_path / "state")
    assert target.read_text() == "keep me"


def test_a_state_number_beyond_a_float_is_a_state_error_naming_the_file(tmp_path: Path) -> None:
    from atoll.control.state import ControllerState

    save_state(tmp_path, ControllerState())
    path = tmp_path / STATE_FILE
    path.write_text(path.read_text().replace('"last_tick_s":null', '"last_tick_s":1e999'))
    with pytest.raises(StateError, match=str(path)):
        load_state(tmp_path)
    path.write_text(path.read_text().replace('"last_tick_s":1e999', '"starting":[["k",1,1e999]],"x":0'))
    with pytest.raises(StateError, match=str(path)):
        load_state(tmp_path)
