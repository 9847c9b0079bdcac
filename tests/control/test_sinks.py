"""Plan records and sinks: diff, JSON files, Kubernetes manifests, k8s-apply without a cluster, retries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from control_helpers import closed_port

from atoll.control.k8s.apply import (
    REGION_LABEL,
    K8sOptions,
    render_manifests,
    validate_object,
)
from atoll.control.plans import PlanRecord, SinkError, SinkResult
from atoll.control.sinks import JsonDirSink, K8sApplySink, K8sManifestSink, deliver, make_sink
from atoll.solvers.problem import Allocation
from atoll.solvers.types import Phase, Service, Stage, Template

MIXED = Template(Service("Llama-3-70B", Phase.DECODE), "aws:us-east-2", (("1xL4", 1), ("4xL40S", 3)),
                 (Stage(8, ("1xL4",)), Stage(72, ("4xL40S", "4xL40S", "4xL40S"))), 900.0)
SMALL = Template(Service("Phi-4-14B", Phase.PREFILL), "gcp:us-central1", (("1xH100", 1),),
                 (Stage(40, ("1xH100",)),), 5000.0)
OLD = Template(Service("Phi-4-14B", Phase.DECODE), "aws:ap-northeast-2", (("2xA10G", 1),),
               (Stage(40, ("2xA10G",)),), 300.0)
LIBRARY = {t.key: t for t in (MIXED, SMALL, OLD)}


def record(seq: int, plan: dict[str, int], previous: dict[str, int] | None = None) -> PlanRecord:
    return PlanRecord.from_allocation(seq, 1000.0 + seq, Allocation.of(plan), previous, LIBRARY,
                                      {"Llama-3-70B/decode": 1500.0}, "test")


def test_record_diff_and_round_trip() -> None:
    r = record(2, {MIXED.key: 2, SMALL.key: 1}, {MIXED.key: 1, OLD.key: 3})
    assert r.diff == {MIXED.key: 1, OLD.key: -3, SMALL.key: 1}
    assert r.added == {MIXED.key: 1, SMALL.key: 1} and r.removed == {OLD.key: 3} and r.changed
    assert set(r.templates) == {MIXED.key, SMALL.key, OLD.key}
    t = r.templates[MIXED.key]
    assert t["service"] == "Llama-3-70B/decode" and t["nodes"] == [["1xL4", 1], ["4xL40S", 3]]
    assert t["stages"][1] == [72, ["4xL40S", "4xL40S", "4xL40S"]]
    assert PlanRecord.from_dict(json.loads(json.dumps(r.as_dict()))) == r
    assert not record(3, {MIXED.key: 2}, Allocation.of({MIXED.key: 2}).as_dict()).changed


def test_record_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="lacks 1 planned template"):
        PlanRecord.from_allocation(1, 0.0, Allocation.of({"nope": 1}), None, LIBRARY, {}, "")
    with pytest.raises(ValueError, match="field 'plan' count of 'k'"):
        PlanRecord(1, 0.0, {"k": -1}, {})
    with pytest.raises(ValueError, match="field 'templates' lacks template 'k'"):
        PlanRecord(1, 0.0, {"k": 1}, {})
    with pytest.raises(ValueError, match="field 'demand'"):
        PlanRecord(1, 0.0, {}, {}, demand={"s": float("nan")})


def test_json_sink_files_and_latest(tmp_path: Path) -> None:
    sink = make_sink(f"json:{tmp_path / 'plans'}")
    assert isinstance(sink, JsonDirSink)
    first = sink.write(record(1, {MIXED.key: 1}))
    second = sink.write(record(2, {MIXED.key: 2}, {MIXED.key: 1}))
    assert first.ok and second.ok and len(second.written) == 2
    files = sorted(p.name for p in (tmp_path / "plans").iterdir())
    assert files == ["latest.json", "plan-000001.json", "plan-000002.json"]  # no temp files left
    latest = json.loads((tmp_path / "plans" / "latest.json").read_text())
    assert latest == json.loads((tmp_path / "plans" / "plan-000002.json").read_text())
    assert latest["diff"] == {MIXED.key: 1} and latest["plan"] == {MIXED.key: 2}


def test_k8s_manifests_and_long_names(tmp_path: Path) -> None:
    sink = make_sink(f"k8s:{tmp_path / 'k8s'}")
    assert isinstance(sink, K8sManifestSink)
    result = sink.write(record(1, {SMALL.key: 1, OLD.key: 2}))
    docs = [yaml.safe_load(Path(p).read_text()) for p in result.written if "kustomization" not in p]
    for doc in docs:
        validate_object(doc)
    (small,) = [d for d in docs if d["kind"] == "Deployment" and "prefill" in d["metadata"]["name"]]
    pod = small["spec"]["template"]["spec"]
    # a gcp: region selects GKE's labels; on-demand is "not a spot node" (an affinity)
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
                                   "cloud.google.com/machine-family": "a3",
                                   "node.kubernetes.io/instance-type": "a3-highgpu-1g",
                                   REGION_LABEL: "us-central1"}
    spot_not_in = {"key": "cloud.google.com/gke-spot", "operator": "NotIn", "values": ["true"]}
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"] == [{"matchExpressions": [spot_not_in]}]
    long = Template(Service("Some_Org/Very.Long-Model-Name-That-Goes-On-And-On-Forever-v2.5", Phase.DECODE),
                    "aws:us-east-2", (("8xH200", 1),), (Stage(10, ("8xH200",)),), 10.0)
    r = PlanRecord(1, 0.0, {long.key: 1}, {long.key: {
        "service": long.service.name, "model": long.service.model, "phase": "decode", "region": long.region,
        "nodes": [["8xH200", 1]], "stages": [[10, ["8xH200"]]], "throughput": 10.0}})
    opts = K8sOptions(namespace="serving", image="example/vllm:1",
                      model_sources={long.service.model: "org/m"})
    docs = render_manifests(r, opts)
    for doc in docs:
        validate_object(doc)
        assert len(doc["metadata"]["name"]) <= 63 and doc["metadata"]["namespace"] == "serving"
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    bad = json.loads(json.dumps(dep))
    bad["spec"]["replicas"] = -1
    with pytest.raises(SinkError, match="spec.replicas"):
        validate_object(bad, "x.yaml")
    bad = json.loads(json.dumps(dep))
    bad["spec"]["template"]["spec"]["nodeSelector"] = {}
    with pytest.raises(SinkError, match="nodeSelector is empty"):
        validate_object(bad)


def test_k8s_apply_without_a_cluster_is_a_clear_error(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    sink = make_sink("k8s-apply")
    with pytest.raises(SinkError, match="no Kubernetes cluster configured.*missing-kubeconfig.*KUBECONFIG"):
        sink.write(record(1, {SMALL.key: 1}))
    sleeps: list[float] = []
    result = deliver(sink, record(1, {SMALL.key: 1}), attempts=2, backoff_s=0.1, sleep=sleeps.append)
    assert not result.ok and result.attempts == 2 and "kept as pending" in result.message and sleeps == [0.1]


def test_k8s_apply_unreachable_api_server(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{closed_port()}",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    sink = K8sApplySink(kubeconfig=str(config), timeout=2)
    with pytest.raises(SinkError, match="k8s-apply:default: Deployment atoll-phi-4-14b-prefill-.* failed"):
        sink.write(record(1, {SMALL.key: 1}))


class FakeObjects:
    def __init__(self, existing: dict[str, list[str]]) -> None:
        self.calls: list[tuple[str, str, str, Any]] = []
        self.existing = existing

    def apply(self, doc: dict[str, Any], namespace: str, dry_run: str | None, timeout: float) -> None:
        self.calls.append(("apply", doc["kind"], doc["metadata"]["name"], dry_run))

    def list_names(self, kind: str, namespace: str, selector: str, timeout: float) -> list[str]:
        self.calls.append(("list", kind, namespace, selector))
        return self.existing.get(kind, [])

    def delete(self, kind: str, name: str, namespace: str, dry_run: str | None, timeout: float) -> None:
        self.calls.append(("delete", kind, name, dry_run))


@pytest.mark.parametrize("apply", [False, True])
def test_k8s_apply_objects_and_calls_without_a_cluster(apply: bool) -> None:
    api = FakeObjects(existing={"Deployment": ["atoll-old-decode-12345678"],
                                "Service": ["atoll-phi-4-14b-prefill"]})
    sink = K8sApplySink(K8sOptions(namespace="llm"), apply=apply, api_factory=lambda: api)
    objects = sink.objects(record(1, {SMALL.key: 2}))
    assert sorted(o["kind"] for o in objects) == ["Deployment", "Service"]
    result = sink.write(record(1, {SMALL.key: 2}))
    expected_dry = None if apply else "All"
    # an ownerless plan prunes only ownerless objects; the Service's older, unhashed name goes
    assert result.ok and result.removed == ("deployment/atoll-old-decode-12345678",
                                            "service/atoll-phi-4-14b-prefill")
    assert {c[3] for c in api.calls if c[0] == "list"} == {
        "app.kubernetes.io/managed-by=atoll,!atoll.io/controller"}
    applied = [c for c in api.calls if c[0] == "apply"]
    assert [c[1] for c in applied] == ["Deployment", "Service"]  # workloads before Services
    assert all(c[3] == expected_dry for c in applied)
    assert [c for c in api.calls if c[0] == "delete"] == [
        ("delete", "Deployment", "atoll-old-decode-12345678", expected_dry),
        ("delete", "Service", "atoll-phi-4-14b-prefill", expected_dry)]
    assert ("dry run" in result.message) is not apply


def test_make_sink_rejects_bad_specs() -> None:
    for spec in ("json:", "k8s", "s3:bucket", "k8s-apply:Bad_NS"):
        with pytest.raises(SinkError, match="json:DIR, k8s:DIR, k8s-apply|DNS-1123"):
            make_sink(spec)
    with pytest.raises(SinkError, match="--apply only applies to the k8s-apply sink"):
        make_sink("json:/tmp/x", apply=True)
    assert make_sink("k8s-apply:prod", apply=True).name == "k8s-apply:prod"


class FlakySink:
    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def write(self, record: PlanRecord) -> SinkResult:
        self.calls += 1
        if self.calls <= self.failures:
            raise SinkError("flaky: disk full")
        return SinkResult(self.name, True, ("x",))


def test_deliver_retries_with_backoff() -> None:
    sleeps: list[float] = []
    result = deliver(FlakySink(2), record(1, {SMALL.key: 1}), attempts=3, backoff_s=1.0, sleep=sleeps.append)
    assert result.ok and result.attempts == 3 and sleeps == [1.0, 2.0]
    result = deliver(FlakySink(5), record(7, {SMALL.key: 1}), attempts=3, backoff_s=0.0, sleep=sleeps.append)
    assert not result.ok and "plan 7 not delivered after 3 attempt(s): flaky: disk full" in result.message
