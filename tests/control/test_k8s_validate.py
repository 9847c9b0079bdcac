"""Objects checked as an API server of a named version would: Kubernetes' OpenAPI schemas of
``kube_version`` (strict), the LWS CRD's structural schema (types, enums, pruned fields); the
sinks refuse a plan whose objects fail, before writing or applying anything."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from atoll.control.k8s.apply import K8sApplySink, K8sManifestSink
from atoll.control.k8s.render import K8sOptions, k8s_options, render_manifests
from atoll.control.k8s.validate import api_problems, kube_version, kube_versions, lws_schema, pruned_fields
from atoll.control.plans import PlanRecord, SinkError
from atoll.solvers.problem import Allocation
from atoll.solvers.types import Phase, Service, Stage, Template

R = "gcp:us-central1"
PIPE_P = Template(Service("Llama-3-70B", Phase.PREFILL), R, (("4xL4", 2),),
                  (Stage(40, ("4xL4",)), Stage(40, ("4xL4",))), 9000.0)
ONE_D = Template(Service("Llama-3-70B", Phase.DECODE), R, (("8xH100", 1),), (Stage(80, ("8xH100",)),), 900.0)
RECORD = PlanRecord.from_allocation(1, 0.0, Allocation.of({PIPE_P.key: 1, ONE_D.key: 2}), None,
                                    {t.key: t for t in (PIPE_P, ONE_D)}, {}, "t", owner="acme-000001")


def docs(**kw: Any) -> list[dict[str, Any]]:
    return render_manifests(RECORD, K8sOptions(**kw))


@pytest.mark.parametrize("version", ["1.28", "1.33", "1.37"])
def test_every_rendered_kind_passes_the_named_version(version: str) -> None:
    v = kube_version(version)
    rendered, builtin = docs(), docs(router="builtin")
    assert {d["kind"] for d in rendered} == {"Deployment", "LeaderWorkerSet", "Role", "RoleBinding",
                                             "Service", "ServiceAccount"}
    assert {d["kind"] for d in builtin} == {"ConfigMap", "Deployment", "LeaderWorkerSet", "Service"}
    for d in rendered + builtin:
        assert api_problems(d, v) == [], d["metadata"]["name"]


def test_versions_are_named_and_checked() -> None:
    assert kube_version("v1.33") == kube_version("1.33.2") == "1.33.0"
    assert kube_versions()[0] == "1.25.0" and kube_versions()[-1] == "1.37.0"
    assert len(set(kube_versions())) == len(kube_versions())
    with pytest.raises(SinkError, match=r"kube_version: Kubernetes '1.12' has no schema here; give one of 1"):
        kube_version("1.12")
    with pytest.raises(SinkError, match="fleet.yaml: kubernetes: K8sOptions: field 'kube_version'"):
        k8s_options({"kube_version": "latest"}, "fleet.yaml: kubernetes")


def test_what_an_api_server_would_refuse_or_prune_is_found() -> None:
    v = kube_version("1.33")
    (lws,) = [d for d in docs() if d["kind"] == "LeaderWorkerSet"]
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Sometimes"  # not in the CRD's enum
    assert any("restartPolicy" in p or "Sometimes" in p for p in api_problems(bad, v))
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["sizee"] = 2  # a typo the API server would drop silently
    assert api_problems(bad, v) == ["LeaderWorkerSet CRD schema: field spec.leaderWorkerTemplate.sizee is "
                                    "not in the schema (the API server would prune it)"]
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    assert any("workerTemplate as a PodTemplateSpec" in p for p in api_problems(bad, v))
    (dep,) = [d for d in docs() if d["kind"] == "Deployment" and "router" not in d["metadata"]["name"]]
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    (problem,) = api_problems(bad, v)
    assert "Deployment (Kubernetes 1.33.0)" in problem and "containerPort" in problem
    # the schema itself: a field under a preserve-unknown node is never "pruned"
    keep = {"properties": {"a": {"x-kubernetes-preserve-unknown-fields": True}}}
    assert pruned_fields({"a": {"b": 1}}, keep) == [] and pruned_fields({"c": 1}, keep) == ["c"]
    assert lws_schema()["properties"]["spec"]["properties"]["leaderWorkerTemplate"]


class Objects:
    def __init__(self) -> None:
        self.applied: list[str] = []

    def apply(self, doc: dict[str, Any], namespace: str, dry_run: str | None, timeout: float) -> None:
        self.applied.append(doc["metadata"]["name"])

    def list_names(self, kind: str, namespace: str, selector: str, timeout: float) -> list[str]:
        return []

    def delete(self, kind: str, name: str, namespace: str, dry_run: str | None, timeout: float) -> None:
        raise AssertionError("nothing to delete")


def test_the_sinks_check_before_writing_or_applying(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = K8sManifestSink(tmp_path / "k8s", K8sOptions(kube_version="1.30"))
    assert good.write(RECORD).ok
    api = Objects()
    assert K8sApplySink(K8sOptions(kube_version="1.30"), api_factory=lambda: api).write(RECORD).ok
    assert len(api.applied) == len(docs())
    # a renderer that slipped a field the LWS CRD lacks: nothing of the plan is written or applied
    import atoll.control.k8s.apply as k8s

    def typo(record: PlanRecord, options: K8sOptions) -> list[dict[str, Any]]:
        out = render_manifests(record, options)
        for d in out:
            if d["kind"] == "LeaderWorkerSet":
                d["spec"]["startupPolicyy"] = "LeaderCreated"
        return out

    monkeypatch.setattr(k8s, "render_manifests", typo)
    opts = K8sOptions(kube_version="1.30")
    with pytest.raises(SinkError, match=r"k8s:.*leaderworkerset.yaml: .*spec.startupPolicyy .*would prune"):
        K8sManifestSink(tmp_path / "bad", opts).write(RECORD)
    assert not (tmp_path / "bad").exists()
    api = Objects()
    with pytest.raises(SinkError, match="k8s-apply:default: LeaderWorkerSet .*startupPolicyy"):
        K8sApplySink(opts, api_factory=lambda: api).write(RECORD)
    assert api.applied == []
    assert K8sManifestSink(tmp_path / "unchecked", K8sOptions()).write(RECORD).ok  # no version: not checked


def test_ports_are_checked_by_the_options() -> None:
    # the OpenAPI schema types containerPort as int32 without a range: atoll checks it itself
    with pytest.raises(SinkError, match="field 'port' must be an integer in 1..65535"):
        K8sOptions(port=70000)
