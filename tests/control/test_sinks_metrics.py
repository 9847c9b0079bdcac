"""``metrics:PORT``: the delivered plan's desired replicas over HTTP, parsed with
prometheus_client's own parser; make-before-break through a real controller (the additions
are desired before anything is lowered); an example KEDA ScaledObject per workload."""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from atoll.control.controller import Controller, ControllerSettings
from atoll.control.k8s.render import K8sOptions, workload_name
from atoll.control.k8s.scale import read_desired, scaled_object
from atoll.control.k8s.validate import api_problems, kube_version
from atoll.control.live_fleet import LiveFleet
from atoll.control.plans import PlanRecord, SinkError
from atoll.control.sinks import MetricsSink, make_sink
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.problem import Allocation
from atoll.solvers.types import Phase, Service, Stage, Template

sys.path.insert(0, str(Path(__file__).parent))
from mbb_worker import BIG, DECODE, MODEL, SMALL, STEP, T0, Clock, StepSource  # noqa: E402

PIPE = Template(Service("Llama-3-70B", Phase.DECODE), "aws:us-east-2~spot", (("4xL40S", 2),),
                (Stage(40, ("4xL40S",)), Stage(40, ("4xL40S",))), 900.0)
LIB = {t.key: t for t in (SMALL, BIG, DECODE, PIPE)}


def record(seq: int, plan: dict[str, int], previous: dict[str, int] | None = None) -> PlanRecord:
    return PlanRecord.from_allocation(seq, 0.0, Allocation.of(plan), previous, LIB, {}, "t",
                                      owner="acme-000001")


def scrape(sink: MetricsSink, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{sink.port}{path}", timeout=10) as r:
        assert r.status == 200
        return r.read().decode()


@pytest.fixture()
def sink() -> Iterator[MetricsSink]:
    s = MetricsSink(0, "127.0.0.1")
    yield s
    s.close()


def test_the_exposition_parses_and_says_the_plan(sink: MetricsSink) -> None:
    values, sequence, _ = read_desired(scrape(sink))
    assert values == {} and sequence is None  # nothing delivered yet: no guess
    result = sink.write(record(4, {SMALL.key: 2, PIPE.key: 3}))
    assert result.ok
    values, sequence, labels = read_desired(scrape(sink))
    assert values == {SMALL.key: 2.0, PIPE.key: 3.0} and sequence == 4.0
    assert labels[PIPE.key] == {"model": "Llama-3-70B", "phase": "decode", "template": PIPE.key,
                                "region": "aws:us-east-2", "tier": "spot",
                                "workload": workload_name("Llama-3-70B", "decode", PIPE.key, "acme-000001")}
    assert labels[SMALL.key]["tier"] == "on-demand"
    nodes = {s.labels["pool"]: s.value for f in text_string_to_metric_families(scrape(sink))
             for s in f.samples if s.name == "atoll_desired_nodes"}
    assert nodes == {"aws:us-east-2/1xL4": 2.0, "aws:us-east-2~spot/4xL40S": 6.0}
    # a template the plan drops stays exported at 0 (a ScaledObject reading it scales to zero)
    sink.write(record(5, {PIPE.key: 3}, {SMALL.key: 2, PIPE.key: 3}))
    values, sequence, _ = read_desired(scrape(sink))
    assert values == {SMALL.key: 0.0, PIPE.key: 3.0} and sequence == 5.0


def test_keda_scaled_objects_read_the_desired_replicas(sink: MetricsSink) -> None:
    assert scrape(sink, "/scaledobjects.yaml") == ""
    r = record(1, {SMALL.key: 2, PIPE.key: 1})
    sink.write(r)
    objects = list(yaml.safe_load_all(scrape(sink, "/scaledobjects.yaml")))
    assert len(objects) == 2
    by_kind = {o["spec"]["scaleTargetRef"]["kind"]: o for o in objects}
    lws = by_kind["LeaderWorkerSet"]
    assert lws["spec"]["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1",
                                             "kind": "LeaderWorkerSet",
                                             "name": workload_name("Llama-3-70B", "decode", PIPE.key,
                                                                   "acme-000001")}
    (trigger,) = lws["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "1"  # replicas = ceil(desired / 1)
    assert trigger["metadata"]["ignoreNullValues"] == "false"  # a lost target holds, never scales to 0
    for o in objects:  # KEDA v2.20.2's CRD takes them (types, and no field it would prune)
        assert api_problems(o, kube_version("1.33")) == []
    bad = {**lws, "spec": {**lws["spec"], "minReplicas": 0}}
    assert api_problems(bad, kube_version("1.33")) == [
        "ScaledObject CRD schema: field spec.minReplicas is not in the schema "
        "(the API server would prune it)"]
    name = lws["spec"]["scaleTargetRef"]["name"]
    assert trigger["metadata"]["query"] == f'max(atoll_desired_replicas{{workload="{name}"}})'
    # the query's series exists in the exposition, with the desired count
    _, _, labels = read_desired(scrape(sink))
    assert labels[PIPE.key]["workload"] == name
    assert scaled_object(r, SMALL.key, K8sOptions(namespace="llm"), "http://p:9090")["metadata"][
        "namespace"] == "llm"


def test_make_before_break_through_a_real_controller(tmp_path: Path) -> None:
    """The controller replaces SMALL by BIG when demand jumps: the scrape after each tick never
    lowers SMALL before BIG is desired, and lowers it once BIG is ready."""
    fleet = LiveFleet("core", models=(MODEL,), templates=(SMALL, BIG, DECODE), request_shapes=[(100.0, 10.0)])
    clock = Clock()
    sink = make_sink("metrics:127.0.0.1:0")
    assert isinstance(sink, MetricsSink)
    try:
        controller = Controller(fleet, StepSource(clock), make_policy(parse_policy("fixed:1"), 1), sink,
                                tmp_path / "state", settings=ControllerSettings(interval_s=STEP), clock=clock,
                                sleep=lambda s: None)
        seen: list[tuple[float, float, float | None]] = []
        for _ in range(14):
            clock.now = T0 + controller.state.tick * STEP
            controller.tick()
            values, sequence, _ = read_desired(scrape(sink))
            seen.append((values.get(SMALL.key, 0.0), values.get(BIG.key, 0.0), sequence))
            if controller.state.final is None and values.get(BIG.key) and not values.get(SMALL.key):
                break
    finally:
        sink.close()
    assert seen[0] == (0.0, 0.0, None)  # the first tick reads counters: no plan, nothing exported
    seen = [row for row in seen if row[2] is not None]
    small = [s for s, _, _ in seen]
    big = [b for _, b, _ in seen]
    both = [i for i, (s, b, _) in enumerate(seen) if s > 0 and b > 0]
    assert small[0] > 0 and big[0] == 0, seen  # the start: the small template
    assert both, f"never both desired: {seen}"  # 1/2: additions, the replaced one still desired
    gone = next(i for i, s in enumerate(small) if s == 0)
    assert both[0] < gone and big[gone] > 0, seen  # 2/2: removed only after the addition
    assert all(s > 0 or b > 0 for s, b, _ in seen)  # never nothing
    sequences = [q for _, _, q in seen if q is not None]
    assert sequences == sorted(sequences)


def test_bad_specs_and_a_port_in_use(sink: MetricsSink) -> None:
    with pytest.raises(SinkError, match="needs a port 0..65535"):
        make_sink("metrics:http")
    with pytest.raises(SinkError, match="needs a port"):
        make_sink("metrics:99999")
    with pytest.raises(SinkError, match=f"cannot listen on 127.0.0.1:{sink.port}"):
        MetricsSink(sink.port, "127.0.0.1")
    with pytest.raises(SinkError, match="field 'port'"):
        MetricsSink(-1)
