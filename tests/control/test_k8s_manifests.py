"""Manifests that start vLLM: every rendered object validates against the Kubernetes OpenAPI
schemas (kubernetes-validate) or the LeaderWorkerSet CRD schema, the vllm serve command carries
the pipeline, and templates vLLM cannot run are never rendered."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from atoll.control.k8s.apply import (
    CAPACITY_LABEL,
    REGION_LABEL,
    K8sOptions,
    render_manifests,
    service_name,
    validate_object,
)
from atoll.control.k8s.render import POOL_NODES_ANNOTATION, node_pools
from atoll.control.plans import PlanRecord, SinkError
from atoll.control.sinks import K8sManifestSink
from atoll.solvers.allocation import solve_allocation
from atoll.solvers.models import get_model
from atoll.solvers.problem import Allocation
from atoll.solvers.runtime import template_problem
from atoll.solvers.scenarios import build_problem
from atoll.solvers.types import Phase, Service, Stage, Template

K8S_VERSION = kubernetes_validate.latest_version()
EKS_GPU, EKS_COUNT = "karpenter.k8s.aws/instance-gpu-name", "karpenter.k8s.aws/instance-gpu-count"
LWS_SCHEMA = json.loads((Path(__file__).parent / "data" / "lws-v1.schema.json").read_text())

PIPE = Template(Service("Llama-3-70B", Phase.DECODE), "aws:us-east-2", (("4xL4", 1), ("4xL40S", 2)),
                (Stage(16, ("4xL4",)), Stage(32, ("4xL40S",)), Stage(32, ("4xL40S",))), 900.0)
SINGLE = Template(Service("Phi-4-14B", Phase.PREFILL), "gcp:us-central1", (("1xH100", 1),),
                  (Stage(40, ("1xH100",)),), 5000.0)
DP = Template(Service("Llama-3-70B", Phase.PREFILL), "aws:us-east-2", (("1xL4", 1), ("4xL40S", 3)),
              (Stage(8, ("1xL4",)), Stage(72, ("4xL40S", "4xL40S", "4xL40S"))), 900.0)


def plan(templates: dict[Template, int], seq: int = 1) -> PlanRecord:
    library = {t.key: t for t in templates}
    return PlanRecord.from_allocation(seq, 0.0, Allocation.of({t.key: n for t, n in templates.items()}), None,
                                      library, {}, "test")


def k8s_validate(doc: dict[str, Any]) -> None:
    """A core object with kubernetes-validate (strict: unknown fields fail); a LeaderWorkerSet
    against the CRD's schema, its two pod templates as core PodTemplateSpecs."""
    if doc["kind"] != "LeaderWorkerSet":
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        return
    jsonschema.Draft7Validator(LWS_SCHEMA).validate(doc)
    lwt = doc["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                      "metadata": {"name": f"{doc['metadata']['name']}-{role.lower()}"},
                                      "template": lwt[role]}, K8S_VERSION, strict=True)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_pipeline_renders_as_a_leaderworkerset_that_starts_vllm() -> None:
    docs = render_manifests(plan({PIPE: 2, SINGLE: 3}), K8sOptions(namespace="llm", capacity_type="spot"))
    for doc in docs:
        k8s_validate(doc)
        validate_object(doc)
    (lws,) = by_kind(docs, "LeaderWorkerSet")
    (dep,) = by_kind(docs, "Deployment")
    assert {d["metadata"]["name"] for d in by_kind(docs, "Service")} == {
        service_name("Llama-3-70B", "decode"), service_name("Phi-4-14B", "prefill")}
    assert service_name("Phi-4-14B", "prefill").startswith("atoll-phi-4-14b-prefill-")  # + the name's hash
    spec = lws["spec"]
    assert spec["replicas"] == 2 and spec["leaderWorkerTemplate"]["size"] == 3
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = spec["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    worker = spec["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    # aws: Karpenter's well-known labels (known before the node exists, so Karpenter provisions)
    assert leader["nodeSelector"] == {EKS_GPU: "l4", EKS_COUNT: "4", REGION_LABEL: "us-east-2",
                                      CAPACITY_LABEL: "spot"}
    assert worker["nodeSelector"][EKS_GPU] == "l40s"
    lc, wc = leader["containers"][0], worker["containers"][0]
    script = lc["command"][2]
    assert "multi-node-serving.sh leader --ray_cluster_size=$(LWS_GROUP_SIZE)" in script
    args = shlex.split(script.split("&& exec ", 1)[1])
    assert args[:3] == ["vllm", "serve", "meta-llama/Meta-Llama-3-70B-Instruct"]
    opt = dict(zip(args[3::2], args[4::2], strict=False))
    assert opt["--tensor-parallel-size"] == "4" and opt["--pipeline-parallel-size"] == "3"
    assert opt["--distributed-executor-backend"] == "ray" and opt["--served-model-name"] == "Llama-3-70B"
    assert json.loads(opt["--kv-transfer-config"]) == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert "--ray_address=$(LWS_LEADER_ADDRESS)" in wc["command"][2]
    for c in (lc, wc):
        env = {e["name"]: e for e in c["env"]}
        assert env["VLLM_PP_LAYER_PARTITION"]["value"] == "16,32,32"
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf-token"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
        assert {m["mountPath"] for m in c["volumeMounts"]} == {"/dev/shm", "/root/.cache/huggingface"}
    assert lc["readinessProbe"]["httpGet"]["path"] == "/health" and "readinessProbe" not in wc
    assert {v["name"] for v in leader["volumes"]} == {"dshm", "model-cache"}
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 3 and pod["nodeSelector"][REGION_LABEL] == "us-central1"
    single = shlex.split(pod["containers"][0]["command"][2].removeprefix("exec "))
    assert "--pipeline-parallel-size" not in single
    assert single[single.index("--tensor-parallel-size") + 1] == "1"
    assert pod["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/health"


def test_aggregated_options_and_errors() -> None:
    opts = K8sOptions(pd="aggregated", model_cache_claim="models", image="example/vllm:1",
                      model_sources={"Phi-4-14B": "/models/phi-4"})
    docs = render_manifests(plan({SINGLE: 1}), opts)
    for doc in docs:
        k8s_validate(doc)
    (dep,) = by_kind(docs, "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert "--kv-transfer-config" not in c["command"][2] and "/models/phi-4" in c["command"][2]
    assert c["image"] == "example/vllm:1"
    assert dep["spec"]["template"]["spec"]["volumes"][1]["persistentVolumeClaim"]["claimName"] == "models"
    (svc,) = by_kind(docs, "Service")
    assert "atoll.io/phase" not in svc["spec"]["selector"]  # aggregated: both phases serve
    with pytest.raises(SinkError, match="no model source for 'Llama-3-70B'"):
        render_manifests(plan({PIPE: 1}), opts)
    with pytest.raises(SinkError, match="field 'pd' must be one of disaggregated, aggregated"):
        K8sOptions(pd="both")
    with pytest.raises(SinkError, match="field 'capacity_type'"):
        K8sOptions(capacity_type="reserved")


def test_a_template_vllm_cannot_run_is_never_rendered(tmp_path: Path) -> None:
    assert template_problem("vllm", get_model("Llama-3-70B"), DP) is not None
    with pytest.raises(SinkError, match="several data-parallel nodes.*runtime 'vllm'"):
        render_manifests(plan({DP: 1}))
    sink = K8sManifestSink(tmp_path / "out")
    with pytest.raises(SinkError):
        sink.write(plan({DP: 1, SINGLE: 1}))
    assert not list((tmp_path / "out").glob("atoll-*")) if (tmp_path / "out").exists() else True


def test_sink_writes_files_that_validate_and_removes_stale_ones(tmp_path: Path) -> None:
    sink = K8sManifestSink(tmp_path / "k8s")
    result = sink.write(plan({PIPE: 1, SINGLE: 1}))
    files = sorted(p.name for p in (tmp_path / "k8s").glob("atoll-*.yaml"))
    assert len(files) == 4 and "1 LeaderWorkerSet(s)" in result.message
    for name in files:
        k8s_validate(yaml.safe_load((tmp_path / "k8s" / name).read_text()))
    kustomization = yaml.safe_load((tmp_path / "k8s" / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == files
    result = sink.write(plan({SINGLE: 2}, seq=2))
    assert len(result.removed) == 2  # the LeaderWorkerSet and its Service
    assert len(list((tmp_path / "k8s").glob("atoll-*.yaml"))) == 2


def test_a_core_plan_under_runtime_vllm_renders_objects_that_all_validate() -> None:
    problem = build_problem("core", "ample", "even", runtime="vllm")
    result = solve_allocation(problem)
    assert result.allocation is not None
    library = {k: problem.template(k) for k, _ in result.allocation.counts}
    for t in library.values():
        assert template_problem("vllm", get_model(t.service.model), t) is None
    record = PlanRecord.from_allocation(1, 0.0, result.allocation, None, library, {}, "core")
    docs = render_manifests(record)
    # 3 models x (2 phase Services + an entry and a metrics Service), a vllm-router Deployment
    # each with its ServiceAccount, Role and RoleBinding
    assert len(by_kind(docs, "Service")) == 12 and not by_kind(docs, "ConfigMap")
    assert all(len(by_kind(docs, k)) == 3 for k in ("ServiceAccount", "Role", "RoleBinding"))
    assert len(docs) == len(record.plan) + 12 + 3 + 9
    builtin = render_manifests(record, K8sOptions(router="builtin"))
    # the built-in router: 3 x (2 phase Services + 1 entry Service), a router Deployment each, its script
    assert len(by_kind(builtin, "Service")) == 9 and len(by_kind(builtin, "ConfigMap")) == 1
    assert len(builtin) == len(record.plan) + 9 + 3 + 1
    for doc in docs + builtin:
        k8s_validate(doc)
        validate_object(doc)


def test_the_lws_schema_catches_a_bad_object() -> None:
    (lws,) = by_kind(render_manifests(plan({PIPE: 1})), "LeaderWorkerSet")
    lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(LWS_SCHEMA).validate(lws)
    lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "None"
    lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["ports"][0][
        "containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(lws)


def test_slice_pods_request_their_gpus_on_the_nodes_they_share() -> None:
    """A one-stage slice is a Deployment whose pod asks for g GPUs (TP g) and selects
    the G-GPU node; TP x PP inside a node (four 2-GPU stages of an 8xH100) is a LeaderWorkerSet
    whose four pods ask for 2 GPUs each."""
    one = Template(Service("Phi-4-14B", Phase.DECODE), "aws:us-east-2", (("2/8xH100", 1),),
                   (Stage(40, ("2/8xH100",)),), 900.0)
    four = Template(Service("Phi-4-14B", Phase.PREFILL), "aws:us-east-2", (("2/8xH100", 4),),
                    tuple(Stage(10, ("2/8xH100",)) for _ in range(4)), 9000.0)
    docs = render_manifests(plan({one: 3, four: 1}))
    for doc in docs:
        k8s_validate(doc)
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert pod["nodeSelector"][EKS_COUNT] == "8" and deploy["spec"]["replicas"] == 3
    assert "--tensor-parallel-size 2" in pod["containers"][0]["command"][2]
    lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 4
    for side in ("leaderTemplate", "workerTemplate"):
        spec = lwt[side]["spec"]
        assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
        assert spec["nodeSelector"][EKS_COUNT] == "8"
    leader_cmd = lwt["leaderTemplate"]["spec"]["containers"][0]["command"][2]
    assert "--tensor-parallel-size 2" in leader_cmd and "--pipeline-parallel-size 4" in leader_cmd


def test_packed_plans_state_the_nodes_each_pool_pays_for() -> None:
    """3 TP-2 slices and one PP-4 engine of 2-GPU slices use 14 of the 8-GPU H100s'
    GPUs: 2 nodes (ceil(14 / 8), what the ILP buys); a 2-instance pipeline of whole 4xL40S
    nodes: 4 nodes; a spot pool is its own. Every workload names the pools it uses."""
    tp2 = Template(Service("Phi-4-14B", Phase.DECODE), "aws:us-east-2", (("2/8xH100", 1),),
                   (Stage(40, ("2/8xH100",)),), 900.0)
    pp4 = Template(Service("Phi-4-14B", Phase.PREFILL), "aws:us-east-2", (("2/8xH100", 4),),
                   tuple(Stage(10, ("2/8xH100",)) for _ in range(4)), 9000.0)
    whole = Template(Service("Llama-3-70B", Phase.PREFILL), "aws:us-east-2~spot", (("4xL40S", 2),),
                     (Stage(40, ("4xL40S",)), Stage(40, ("4xL40S",))), 900.0)
    record = plan({tp2: 3, pp4: 1, whole: 2})
    assert node_pools(record) == {"aws:us-east-2/8xH100": 2, "aws:us-east-2~spot/4xL40S": 4}
    docs = render_manifests(record)
    pools = {d["metadata"]["annotations"]["atoll.io/template-key"]:
             json.loads(d["metadata"]["annotations"][POOL_NODES_ANNOTATION])
             for d in docs if "atoll.io/template-key" in d["metadata"].get("annotations", {})}
    assert pools == {tp2.key: {"aws:us-east-2/8xH100": 2}, pp4.key: {"aws:us-east-2/8xH100": 2},
                     whole.key: {"aws:us-east-2~spot/4xL40S": 4}}
    # a record that carries its packing (a repacked plan may hold more nodes) is taken at its word
    packed = SimpleNamespace(plan=record.plan, templates=record.templates,
                             packing={"nodes_per_pool": {"aws:us-east-2/8xH100": 3}})
    assert node_pools(packed) == {"aws:us-east-2/8xH100": 3}  # type: ignore[arg-type]


def test_a_record_carrying_its_packing_states_those_nodes() -> None:
    from atoll.solvers.packing import repack

    tp2 = Template(Service("Phi-4-14B", Phase.DECODE), "aws:us-east-2", (("2/8xH100", 1),),
                   (Stage(40, ("2/8xH100",)),), 500.0)
    lib = {tp2.key: tp2}
    record = PlanRecord.from_allocation(1, 0.0, Allocation.of({tp2.key: 5}), None, lib, {}, "t",
                                        packing=repack(lib, {tp2.key: 5}))
    # 10 GPUs of 8-GPU nodes: 2 nodes, the record's own count
    assert record.nodes_per_pool == node_pools(record) == {"aws:us-east-2/8xH100": 2}
    (dep,) = by_kind(render_manifests(record), "Deployment")
    assert json.loads(dep["metadata"]["annotations"][POOL_NODES_ANNOTATION]) == {"aws:us-east-2/8xH100": 2}


COLOCATED = Template(Service("Phi-4-14B", Phase.COLOCATED), "gcp:us-central1", (("1xH100", 1),),
                     (Stage(40, ("1xH100",)),), 4000.0, 300.0)
DECODE = Template(Service("Phi-4-14B", Phase.DECODE), "gcp:us-central1", (("1xL4", 1),),
                  (Stage(40, ("1xL4",)),), 400.0)


def _command(dep: dict[str, Any]) -> str:
    return str(dep["spec"]["template"]["spec"]["containers"][0]["command"][2])


@pytest.mark.parametrize("router", ["vllm-router", "builtin"])
def test_a_colocated_model_is_plain_vllm_behind_its_entry_service(router: str) -> None:
    """A model served only co-located: plain vllm serve (no KV connector), no router, one entry
    Service over its pods; a model mixing co-located and prefill/decode replicas keeps its
    router, whose entry Service selects the router's pods and the co-located ones."""
    from atoll.control.k8s.render import ENTRY_LABEL, ENTRY_POD_LABEL, entry_service_name

    docs = render_manifests(plan({COLOCATED: 2}), K8sOptions(router=router))
    for doc in docs:
        k8s_validate(doc)
        validate_object(doc)
    (dep,) = by_kind(docs, "Deployment")
    assert "--kv-transfer-config" not in _command(dep) and "vllm serve" in _command(dep)
    assert dep["spec"]["template"]["metadata"]["labels"][ENTRY_POD_LABEL] == "true"
    assert "nixl" not in json.dumps(dep).lower()
    (svc,) = by_kind(docs, "Service")
    assert svc["metadata"]["name"] == entry_service_name("Phi-4-14B")
    assert svc["metadata"]["labels"][ENTRY_LABEL] == "true"
    assert svc["spec"]["selector"][ENTRY_POD_LABEL] == "true"

    mixed = render_manifests(plan({COLOCATED: 1, SINGLE: 1, DECODE: 2}), K8sOptions(router=router))
    for doc in mixed:
        k8s_validate(doc)
    entry = next(d for d in by_kind(mixed, "Service")
                 if d["metadata"]["name"] == entry_service_name("Phi-4-14B"))
    assert entry["spec"]["selector"][ENTRY_POD_LABEL] == "true"
    router_dep = next(d for d in by_kind(mixed, "Deployment") if "router" in d["metadata"]["name"])
    assert router_dep["spec"]["template"]["metadata"]["labels"][ENTRY_POD_LABEL] == "true"
    serving = [d for d in by_kind(mixed, "Deployment") if "router" not in d["metadata"]["name"]]
    labelled = {d["spec"]["template"]["metadata"]["labels"]["atoll.io/phase"]: _command(d) for d in serving}
    assert set(labelled) == {"colocated", "prefill", "decode"}
    assert "--kv-transfer-config" not in labelled["colocated"]
    assert "--kv-transfer-config" in labelled["prefill"] and "--kv-transfer-config" in labelled["decode"]
    # prefill and decode pods are not entry pods: the router reaches them
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in serving]
    assert all(ENTRY_POD_LABEL not in labels for labels in pod_labels
               if labels["atoll.io/phase"] != "colocated")
    # a plan record describes both rows of a co-located template
    record = plan({COLOCATED: 1})
    assert record.templates[COLOCATED.key]["decode_throughput"] == 300.0
