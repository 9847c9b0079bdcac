"""A plan as Kubernetes objects that start vLLM.

Per planned template (all its instances):

- **one node** -> a ``Deployment`` (``apps/v1``), ``replicas`` = instances; the pod runs
  ``vllm serve <model source> --tensor-parallel-size <GPUs per node>``. A *slice* ("2/8xH100",
  :mod:`atoll.solvers.packing`) is a pod asking for its g GPUs (``nvidia.com/gpu: 2``,
  ``--tensor-parallel-size 2``) with the node selector of the G-GPU node (GPU count 8); several
  such pods share a node, placed by the scheduler (the plan's packing shows one way they fit).
- **several nodes** (a pipeline, one node per stage; :mod:`atoll.solvers.runtime` ``vllm``) ->
  a ``LeaderWorkerSet`` (``leaderworkerset.x-k8s.io/v1``), ``replicas`` = instances, ``size`` =
  stages: each replica is one gang-scheduled group (``RecreateGroupOnPodRestart``). The leader
  pod is stage 0; it starts the Ray head with vLLM's ``multi-node-serving.sh leader
  --ray_cluster_size=$(LWS_GROUP_SIZE)`` and then ``vllm serve ... --tensor-parallel-size T
  --pipeline-parallel-size S --distributed-executor-backend ray``; workers join with
  ``multi-node-serving.sh worker --ray_address=$(LWS_LEADER_ADDRESS)``. vLLM's Ray executor
  ranks the driver's node first, so the leader holds pipeline rank 0, and the layer split rides
  in ``VLLM_PP_LAYER_PARTITION`` (set on every pod). The leader may be a different node config
  from the workers (one leader template, one worker template), which is exactly the shape the
  ``vllm`` runtime allows.
- **one Service per (model, phase)** selecting the serving pods of that service (label
  ``atoll.io/serving: "true"``: single-node pods and LeaderWorkerSet leaders; workers only run
  Ray), and **one entry Service per model** (label ``atoll.io/entry: "true"``), the model's one
  endpoint for clients.

Every serving pod: container port ``http`` (8000) with readiness and liveness probes on vLLM's
``/health`` (a start-up probe allows ``startup_timeout_s`` for weights to load), ``/dev/shm`` as
a memory-backed ``emptyDir``, a model cache volume (a PersistentVolumeClaim when
``model_cache_claim`` is set, else an ``emptyDir``) mounted at ``/root/.cache/huggingface``, the
Hugging Face token from Secret ``token_secret`` (key ``token_key``, optional so public models
start without it), CPU and memory requests per GPU and ``nvidia.com/gpu`` limits, and node
selection in the labels of the region's cloud (:mod:`atoll.control.k8s.nodes`: Karpenter's on
aws, GKE's on gcp, GPU Feature Discovery's elsewhere, or the fleet's own; the tier is a
template description's ``tier``, else ``capacity_type``). ``--served-model-name`` is atoll's
model name, so vLLM's metrics carry the ``model_name`` the controller reads. Every flag and
variable is checked against the pinned vLLM's table (:mod:`atoll.control.k8s.vllm`; image
``vllm/vllm-openai:v0.33.0`` unless ``image`` says otherwise). Every workload carries
``atoll.io/pool-nodes``: the nodes the plan pays for in each pool it uses.

**Prefill/decode.** ``pd="disaggregated"`` (default, what the planner plans): both sides run
vLLM's ``NixlConnector``, prefill as ``kv_producer`` and decode as ``kv_consumer`` (a decode
engine with pipeline parallelism keeps ``kv_both``: vLLM 0.33.0 refuses a PP consumer), the NIXL
side channel on the pod IP, port 5600. For each model with both phases planned, a **router**
takes each request to a prefill pod (one token, ``kv_transfer_params`` asking to keep the KV for a
remote decode) and then to a decode pod with the prefill side's ``kv_transfer_params`` (the
decode pod pulls the KV from that prefill pod over NIXL); its Service is the model's entry
Service. ``router="vllm-router"`` (default): the vLLM project's router (pinned in
:mod:`atoll.control.k8s.vllm`, image ``router_image``) in P/D mode, finding the model's prefill
and decode pods through the Kubernetes API by atoll's labels (a ServiceAccount, a Role allowed
get/list/watch on pods and a RoleBinding per model), readiness ``/readiness`` once a prefill and
a decode pod are healthy, Prometheus metrics behind a metrics Service with scrape annotations.
``router="builtin"``: atoll's standard-library router (:mod:`atoll.control.k8s.router`, a
script in a ConfigMap, run by ``router_image``) sending to the prefill and decode Services;
readiness ``/health`` is 200 only when both sides answer theirs. A model with only one phase
planned gets no router (no request could be served whole).

**Co-located templates** (phase ``colocated``, a plan of ``pd: auto`` or ``aggregated``): one
engine serves prefill and decode together (vLLM's default chunked prefill), so its pods run
plain ``vllm serve`` without a KV connector and carry ``atoll.io/entry-pod``. A model served
only co-located gets one entry Service over those pods and no router; a model whose plan mixes
co-located and prefill/decode replicas keeps its router, and its entry Service selects the
router's pods and the co-located ones (connections split by endpoint count).

``pd="aggregated"`` (the ``kubernetes`` section's): no KV
transfer; every pod serves whole requests and the model's one Service selects all of them
(the planner still sizes prefill and decode separately, so aggregated serving holds at least
the capacity planned for each phase).

Names are DNS-1123 labels: ``atoll-<model>-<phase>-<hash>``, the hash of the exact model name
(Services) or template key (workloads) and the controller's identity, so ``org/Acme-8B`` and
``org-Acme-8B`` (one slug) never share a Service, nor two controllers an object. The model label
is the name cut to a label value plus the same kind of hash (labels hold 63 characters); the
exact name is the ``atoll.io/model-name`` annotation. Every object carries its controller's
identity (``atoll.io/controller``, the plan's ``owner``); the sinks prune only their own.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from atoll.control.k8s.nodes import GFD, NodeLabels, node_labels_for, parse_node_labels
from atoll.control.k8s.validate import kube_version
from atoll.control.k8s.vllm import (
    HEALTH_PATH,
    MULTI_NODE_SCRIPT,
    NIXL_SIDE_CHANNEL_PORT,
    VLLM_API_KEY_ENV,
    VLLM_IMAGE,
    VLLM_ROUTER_API_KEY_ENV,
    VLLM_ROUTER_IMAGE,
    VLLM_ROUTER_LIVENESS,
    VLLM_ROUTER_METRICS_PORT,
    VLLM_ROUTER_READINESS,
    kv_transfer_config,
    unknown_router_args,
    unknown_serve_args,
)
from atoll.control.plans import PlanRecord, SinkError
from atoll.solvers.packing import first_fit_decreasing
from atoll.solvers.tiers import tiered_region
from atoll.solvers.types import ModelSpec, node_config_of, parse_config_name
from atoll.solvers.validation import check_choice, check_integer, check_number, check_port

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
REGION_LABEL = "topology.kubernetes.io/region"
CAPACITY_LABEL = "karpenter.sh/capacity-type"
GPU_RESOURCE = "nvidia.com/gpu"
MANAGED_BY = ("app.kubernetes.io/managed-by", "atoll")
TEMPLATE_LABEL = "atoll.io/template"
MODEL_LABEL = "atoll.io/model"
PHASE_LABEL = "atoll.io/phase"
CONTROLLER_LABEL = "atoll.io/controller"  # the controller that owns the object (PlanRecord.owner)
MODEL_NAME_ANNOTATION = "atoll.io/model-name"  # the exact model name (labels are cut and hashed)
POOL_NODES_ANNOTATION = "atoll.io/pool-nodes"  # {"<region>[~spot]/<config>": nodes the plan pays for}
SERVING_LABEL = "atoll.io/serving"  # "true" on pods that serve HTTP (not LeaderWorkerSet workers)
COMPONENT_LABEL = "atoll.io/component"  # "router" on the prefill/decode router's objects
ENTRY_LABEL = "atoll.io/entry"  # "true" on the one Service per model that clients use
# "true" on the pods a model's entry Service selects when they are not just its router's: the
# co-located vLLM pods (they serve whole requests), and the router's pods beside them
ENTRY_POD_LABEL = "atoll.io/entry-pod"
REQUEST_PATH_ANNOTATION = "atoll.io/request-path"
ROUTER_SCRIPT = "pd_router.py"
# the router's source, shipped in a ConfigMap so that any image with Python runs it
ROUTER_SOURCE = (Path(__file__).with_name("router.py")).read_text(encoding="utf-8")
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
NIXL_PORT = NIXL_SIDE_CHANNEL_PORT
PD_MODES = ("disaggregated", "aggregated")
ROUTERS = ("vllm-router", "builtin")  # the prefill/decode router of a disaggregated model
BUILTIN_ROUTER_IMAGE = "python:3.12-slim"  # any image with Python 3.10+ runs the built-in router
RBAC_API = "rbac.authorization.k8s.io/v1"
CAPACITY_TYPES = ("on-demand", "spot")
# GPU Feature Discovery's product names (the ``gfd`` node-label preset, atoll.control.k8s.nodes).
DEFAULT_GPU_PRODUCTS: dict[str, str] = dict(GFD.gpu_values)
# Hugging Face repositories of the catalog's serving models; a fleet file names its own.
DEFAULT_MODEL_SOURCES: dict[str, str] = {
    "Phi-4-14B": "microsoft/phi-4", "GPT-OSS-20B": "openai/gpt-oss-20b", "Qwen3-32B": "Qwen/Qwen3-32B",
    "Llama-3-70B": "meta-llama/Meta-Llama-3-70B-Instruct", "GPT-OSS-120B": "openai/gpt-oss-120b",
    "Qwen3-235B-A22B": "Qwen/Qwen3-235B-A22B",
}
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_CONFIG = re.compile(r"([1-9][0-9]*)(?:/([1-9][0-9]*))?x(.+)")  # "4xL40S" or a slice "2/8xH100"


def _dns_label(owner: str, name: str, value: str) -> None:
    if not isinstance(value, str) or len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise SinkError(f"{owner}: field '{name}' must be a DNS-1123 label (lowercase letters, digits, '-', "
                        f"at most 63), got {value!r}")


@dataclass(frozen=True)
class K8sOptions:
    """Cluster-specific parts of the rendering (a fleet file's ``kubernetes`` section)."""

    namespace: str = "default"
    image: str = VLLM_IMAGE
    # GPU type -> the value of the GPU label on every cloud (a cluster whose nodes name a GPU
    # otherwise); per-cloud labels are ``node_labels``
    gpu_products: Mapping[str, str] = field(default_factory=dict)
    model_sources: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_MODEL_SOURCES))
    token_secret: str = "hf-token"
    token_key: str = "token"
    model_cache_claim: str | None = None
    pd: str = "disaggregated"
    capacity_type: str = "on-demand"
    # the tier's label key on every cloud instead of the preset's (None: the preset's)
    capacity_label: str | None = None
    # cloud prefix (aws, gcp, lab, '*') -> NodeLabels or a preset name or a mapping of its fields
    node_labels: Mapping[str, Any] = field(default_factory=dict)
    port: int = 8000
    shm_gi: int = 16
    cpu_per_gpu: float = 3.0
    memory_gi_per_gpu: int = 12
    startup_timeout_s: int = 1800
    # the prefill/decode router (disaggregated): vLLM's vllm-router (default) or atoll's own
    # standard-library script (``builtin``, any image with Python 3.10+)
    router: str = "vllm-router"
    # None: the pinned vllm-router image (atoll.control.k8s.vllm.VLLM_ROUTER_IMAGE, built by
    # control/data/vllm-router.Dockerfile), or python:3.12-slim for the built-in router
    router_image: str | None = None
    router_replicas: int = 2
    # the longest answer (tokens) the router's request time-out allows at the model's SLO pace
    router_max_tokens: int = 8192
    # the largest request body a router takes (MiB; larger: 413), well inside its 1Gi memory
    router_max_body_mb: int = 16
    # a Secret holding the vLLM servers' API key (key ``api_key_key``): set as VLLM_API_KEY on
    # every vLLM pod and given to vllm-router, which sends it on both hops (clients then reach
    # the servers only through the router: guard the entry Service); None: the servers take no key
    api_key_secret: str | None = None
    api_key_key: str = "api-key"
    # the API server version objects are checked against before any is written or applied
    # (atoll.control.k8s.validate); None: atoll's structural checks only
    kube_version: str | None = None
    # a fleet file's own model definitions: their SLOs set the router's time-out (not a key of the
    # file's kubernetes section; k8s_options takes them beside it)
    user_models: tuple[ModelSpec, ...] = ()

    def __post_init__(self) -> None:
        owner = "K8sOptions"
        _dns_label(owner, "namespace", self.namespace)
        _dns_label(owner, "token_secret", self.token_secret)
        if self.model_cache_claim is not None:
            _dns_label(owner, "model_cache_claim", self.model_cache_claim)
        if not isinstance(self.image, str) or not self.image.strip():
            raise SinkError(f"{owner}: field 'image' must name a container image")
        check_choice(owner, "pd", self.pd, PD_MODES, error=SinkError)
        check_choice(owner, "capacity_type", self.capacity_type, CAPACITY_TYPES, error=SinkError)
        check_choice(owner, "router", self.router, ROUTERS, error=SinkError)
        if self.router_image is None:
            object.__setattr__(self, "router_image",
                               VLLM_ROUTER_IMAGE if self.router == "vllm-router" else BUILTIN_ROUTER_IMAGE)
        if not isinstance(self.router_image, str) or not self.router_image.strip():
            need = "vllm-router" if self.router == "vllm-router" else "Python 3.10+"
            raise SinkError(f"{owner}: field 'router_image' must name a container image with {need}")
        if self.api_key_secret is not None:
            _dns_label(owner, "api_key_secret", self.api_key_secret)
        if not isinstance(self.api_key_key, str) or not re.fullmatch(r"[-._a-zA-Z0-9]+", self.api_key_key):
            raise SinkError(f"{owner}: field 'api_key_key' must be a Secret key, got {self.api_key_key!r}")
        check_port(owner, "port", self.port, error=SinkError)
        for name in ("shm_gi", "memory_gi_per_gpu", "startup_timeout_s", "router_replicas",
                     "router_max_tokens", "router_max_body_mb"):
            check_integer(owner, name, getattr(self, name), error=SinkError)
        object.__setattr__(self, "node_labels", parse_node_labels(self.node_labels, "node_labels"))
        if self.kube_version is not None:
            object.__setattr__(self, "kube_version",
                               kube_version(self.kube_version, f"{owner}: field 'kube_version'"))
        if self.capacity_label is not None:
            if not isinstance(self.capacity_label, str) or not self.capacity_label:
                raise SinkError(f"{owner}: field 'capacity_label' must be a label key, "
                                f"got {self.capacity_label!r}")
        check_number(owner, "cpu_per_gpu", self.cpu_per_gpu, error=SinkError)


def _slug(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")


def _label_value(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _name(*parts: str, tail: str = "") -> str:
    """``atoll-<parts>[-tail]``, cut to 63 characters from the left parts, tail kept whole."""
    suffix = f"-{tail}" if tail else ""
    head = "-".join(["atoll", *(_slug(p) for p in parts)])
    return head[: 63 - len(suffix)].rstrip("-") + suffix


def _owned(owner: str, text: str) -> str:
    return f"{owner}\0{text}" if owner else text


def workload_name(model: str, phase: str, key: str, owner: str = "") -> str:
    """The Deployment or LeaderWorkerSet of a template: its key's hash with the owner's."""
    return _name(model, phase, tail=_digest(_owned(owner, key)))


def entry_service_name(model: str, owner: str = "") -> str:
    """The model's one endpoint: the router's Service (disaggregated) or the Service of all its
    pods (aggregated)."""
    return _name(model, tail=_digest(_owned(owner, model)))


def service_name(model: str, phase: str, owner: str = "") -> str:
    """The Service of (model, phase): a hash of the exact model name (and owner), so names whose
    slugs agree never share one."""
    return _name(model, phase, tail=_digest(_owned(owner, model)))


def model_label(model: str) -> str:
    """The model's label value: the name cut to fit, and a hash of the exact name."""
    return f"{_label_value(model)[:54].strip('-_.')}-{_digest(model)}".lstrip("-")


def _parse_config(key: str, config: str) -> tuple[int, str]:
    """(GPUs a stage's pod requests, GPU type): a slice "2/8xH100" asks for 2 of a node's 8."""
    m = _CONFIG.fullmatch(config)
    if not m:
        raise SinkError(f"template {key!r}: node config {config!r} is not '<count>x<GPU>' such as '4xL40S' "
                        f"or a slice '<count>/<node GPUs>x<GPU>' such as '2/8xH100'")
    return int(m.group(1)), m.group(3)


def _node_gpus(config: str) -> int:
    """GPUs of the node a (parsed) config is bought as: the node selector's GPU count."""
    m = _CONFIG.fullmatch(config)
    if m is None:
        raise SinkError(f"node config {config!r} is not '<count>x<GPU>' or '<count>/<node GPUs>x<GPU>'")
    return int(m.group(2) or m.group(1))


def vllm_stages(key: str, t: Mapping[str, Any]) -> list[tuple[int, str]]:
    """(layers, node config) per pipeline stage, checked against what vLLM on a LeaderWorkerSet
    can run (:mod:`atoll.solvers.runtime`); SinkError names the template and the reason."""
    stages = [(int(j), list(nodes)) for j, nodes in t["stages"]]
    if any(len(nodes) != 1 for _, nodes in stages):
        raise SinkError(f"template {key!r} has a stage with several data-parallel nodes; vLLM runs one node "
                        f"per pipeline stage: plan with runtime 'vllm'")
    out = [(j, nodes[0]) for j, nodes in stages]
    gpus = {_parse_config(key, c)[0] for _, c in out}
    if len(gpus) != 1:
        raise SinkError(f"template {key!r} mixes GPU counts {sorted(gpus)} across stages; vLLM uses one "
                        f"tensor-parallel size: plan with runtime 'vllm'")
    if len({c for _, c in out[1:]}) > 1:
        raise SinkError(f"template {key!r}: stages after the first use several node configs; a "
                        f"LeaderWorkerSet has one worker template: plan with runtime 'vllm'")
    return out


def _node_selector(options: K8sOptions, config: str, key: str, region: str, tier: str
                   ) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """(nodeSelector, required node-affinity expressions) of a pod of ``config`` in ``region``
    at ``tier``, in the labels of the region's cloud (:mod:`atoll.control.k8s.nodes`)."""
    _, gpu = _parse_config(key, config)
    labels: NodeLabels = node_labels_for(region, options.node_labels)
    if options.capacity_label is not None and labels.capacity_key is not None:
        labels = replace(labels, capacity_key=options.capacity_label)
    # a slice's pod lands on a node of the config it was planned on; several such pods share it
    return labels.select(gpu, _node_gpus(config), region.rsplit(":", 1)[-1], tier, options.gpu_products)


def _volumes(options: K8sOptions) -> list[dict[str, Any]]:
    cache: dict[str, Any] = ({"persistentVolumeClaim": {"claimName": options.model_cache_claim}}
                             if options.model_cache_claim else {"emptyDir": {}})
    return [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{options.shm_gi}Gi"}},
            {"name": "model-cache", **cache}]


def _container(options: K8sOptions, name: str, gpus: int, command: str, env: dict[str, str],
               serving: bool, nixl: bool) -> dict[str, Any]:
    envs: list[dict[str, Any]] = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": options.token_secret,
                                                            "key": options.token_key, "optional": True}}},
        *({"name": k, "value": v} for k, v in env.items())]
    if options.api_key_secret:
        envs.append(_api_key_env(options))
    ports: list[dict[str, Any]] = []
    if nixl:
        envs.append({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                     "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        envs.append({"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_PORT)})
        ports.append({"name": "nixl", "containerPort": NIXL_PORT, "protocol": "TCP"})
    c: dict[str, Any] = {
        "name": name, "image": options.image, "command": ["sh", "-c", command], "env": envs,
        "resources": {"requests": {"cpu": f"{options.cpu_per_gpu * gpus:g}",
                                   "memory": f"{options.memory_gi_per_gpu * gpus}Gi", GPU_RESOURCE: gpus},
                      "limits": {GPU_RESOURCE: gpus}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "model-cache", "mountPath": "/root/.cache/huggingface"}],
    }
    if serving:
        ports.insert(0, {"name": "http", "containerPort": options.port, "protocol": "TCP"})
        health = {"httpGet": {"path": HEALTH_PATH, "port": "http"}}
        c["startupProbe"] = {**health, "periodSeconds": 10,
                             "failureThreshold": max(1, options.startup_timeout_s // 10)}
        c["readinessProbe"] = {**health, "periodSeconds": 10, "failureThreshold": 3}
        c["livenessProbe"] = {**health, "periodSeconds": 15, "failureThreshold": 4}
    if ports:
        c["ports"] = ports
    return c


def _pod(options: K8sOptions, selection: tuple[dict[str, str], list[dict[str, Any]]],
         container: dict[str, Any]) -> dict[str, Any]:
    selector, expressions = selection
    pod: dict[str, Any] = {
        "nodeSelector": selector,
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 60, "containers": [container], "volumes": _volumes(options)}
    if expressions:  # a tier that is the absence of a label (GKE on-demand: not gke-spot)
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": expressions}]}}}
    return pod


def kv_role(phase: str, stages: int) -> str:
    """The NIXL role of an engine serving ``phase`` (vLLM 0.33.0, :mod:`atoll.control.k8s.vllm`):
    prefill produces KV, decode consumes it. A decode engine with a pipeline (PP > 1) keeps the
    deprecated ``kv_both``: 0.33.0 refuses ``kv_consumer`` with PP > 1 and only that role."""
    if phase == "prefill":
        return "kv_producer"
    return "kv_consumer" if stages == 1 else "kv_both"


def serve_command(options: K8sOptions, model: str, tp: int, layers: list[int], phase: str = "decode") -> str:
    """The ``vllm serve`` command line of one instance (shell-quoted), checked against the
    pinned vLLM version's options (:func:`atoll.control.k8s.vllm.unknown_serve_args`)."""
    source = options.model_sources.get(model)
    if not source:
        raise SinkError(f"no model source for {model!r}: name its Hugging Face repository or path in the "
                        f"fleet file's kubernetes.model_sources (known: "
                        f"{', '.join(sorted(options.model_sources))})")
    args = ["vllm", "serve", source, "--served-model-name", model, "--host", "0.0.0.0",
            "--port", str(options.port), "--tensor-parallel-size", str(tp)]
    if len(layers) > 1:
        args += ["--pipeline-parallel-size", str(len(layers)), "--distributed-executor-backend", "ray"]
    if options.pd == "disaggregated" and phase != "colocated":  # a co-located engine keeps its KV
        args += ["--kv-transfer-config", kv_transfer_config(kv_role(phase, len(layers)))]
    command = shlex.join(args)
    problems = unknown_serve_args(command)
    if problems:  # a renderer bug, not a user's: say which flag the pinned version lacks
        raise SinkError(f"the vllm serve command of {model!r} does not fit the pinned vLLM: "
                        f"{'; '.join(problems)}")
    return command


def _pool(d: Mapping[str, Any], config: str) -> str:
    """A pool's name as plans write it: "<region>[~spot]/<node config>" (slices: the node's)."""
    tier = d.get("tier")
    region = tiered_region(str(d["region"]), str(tier)) if tier else str(d["region"])
    return f"{region}/{node_config_of(config)}"


def node_pools(record: PlanRecord) -> dict[str, int]:
    """Nodes per pool the plan pays for: the record's packing when it carries one (a
    repacked plan may hold more than the fewest), else first-fit decreasing of each pool's stage
    slices (for power-of-two slices exactly ceil(GPUs used / G), the count the ILP bought;
    :mod:`atoll.solvers.packing`). Whole-node stages are one node each."""
    packing = getattr(record, "packing", None)
    if isinstance(packing, Mapping) and isinstance(packing.get("nodes_per_pool"), Mapping):
        return {str(k): int(v) for k, v in packing["nodes_per_pool"].items()}
    sizes: dict[str, tuple[int, list[int]]] = {}
    for key, n in record.plan.items():
        d = record.templates[key]
        for _, configs in d["stages"]:
            for c in configs:
                g, node_gpus, _ = parse_config_name(c)
                sizes.setdefault(_pool(d, c), (node_gpus, []))[1].extend([g] * n)
    return {pool: len(first_fit_decreasing(items, g)) for pool, (g, items) in sorted(sizes.items())}


def _workload_metadata(options: K8sOptions, record: PlanRecord, key: str, instances: int,
                       pools: Mapping[str, int], stages: int) -> dict[str, Any]:
    """The metadata of one template's workload: its name, the labels its Services and the
    controller select it by, and annotations saying what the plan asked (its template, stages,
    instances, the nodes its pools are paid for, and a caveat where vLLM forces a role)."""
    t = record.templates[key]
    model, phase, owner = str(t["model"]), str(t["phase"]), record.owner
    labels = {MANAGED_BY[0]: MANAGED_BY[1], "app.kubernetes.io/name": "vllm",
              MODEL_LABEL: model_label(model), PHASE_LABEL: _label_value(phase),
              TEMPLATE_LABEL: _digest(_owned(owner, key)), **({CONTROLLER_LABEL: owner} if owner else {}),
              # a co-located pod serves whole requests: the model's entry Service selects it
              **({ENTRY_POD_LABEL: "true"} if phase == "colocated" else {})}
    annotations = {"atoll.io/template-key": key, MODEL_NAME_ANNOTATION: model,
                   "atoll.io/stages": json.dumps(t["stages"], separators=(",", ":")),
                   "atoll.io/instances": str(instances), "atoll.io/plan-sequence": str(record.sequence),
                   # the nodes the plan pays for in each pool this workload uses (several
                   # workloads and their slices share a pool): what a cluster autoscaler's
                   # limit for the pool should allow
                   POOL_NODES_ANNOTATION: json.dumps(
                       {p: pools[p] for p in sorted({_pool(t, c) for _, cs in t["stages"] for c in cs})
                        if p in pools}, separators=(",", ":"))}
    if options.pd == "disaggregated" and phase != "colocated" and kv_role(phase, stages) == "kv_both":
        annotations["atoll.io/vllm-caveat"] = (
            "decode with pipeline parallelism: vLLM 0.33.0's NixlConnector refuses kv_consumer with "
            "PP > 1, so this engine runs the deprecated kv_both role")
    return {"name": workload_name(model, phase, key, owner), "namespace": options.namespace, "labels": labels,
            "annotations": annotations}


def _workload(options: K8sOptions, record: PlanRecord, key: str, instances: int,
              pools: Mapping[str, int]) -> dict[str, Any]:
    """One template's workload: a Deployment of one-node engines, or a LeaderWorkerSet whose
    leader starts the Ray cluster and serves and whose workers join it (pipeline stages)."""
    t = record.templates[key]
    model, phase, region = str(t["model"]), str(t["phase"]), str(t["region"])
    tier = str(t.get("tier") or options.capacity_type)
    if tier not in CAPACITY_TYPES:
        raise SinkError(f"template {key!r}: field 'tier' must be one of {', '.join(CAPACITY_TYPES)}, "
                        f"got {tier!r}")
    stages = vllm_stages(key, t)
    tp = _parse_config(key, stages[0][1])[0]
    layers = [j for j, _ in stages]
    meta = _workload_metadata(options, record, key, instances, pools, len(stages))
    labels = meta["labels"]
    serve = serve_command(options, model, tp, layers, phase)
    nixl = options.pd == "disaggregated" and phase != "colocated"
    if len(stages) == 1:
        pod = _pod(options, _node_selector(options, stages[0][1], key, region, tier),
                   _container(options, "vllm", tp, f"exec {serve}", {}, True, nixl))
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                "spec": {"replicas": instances, "selector": {"matchLabels": {
                    MANAGED_BY[0]: MANAGED_BY[1], TEMPLATE_LABEL: labels[TEMPLATE_LABEL]}},
                         "template": {"metadata": {"labels": {**labels, SERVING_LABEL: "true"}},
                                      "spec": pod}}}
    env = {"VLLM_PP_LAYER_PARTITION": ",".join(str(j) for j in layers)}
    leader_cmd = (f"bash {MULTI_NODE_SCRIPT} leader --ray_cluster_size=$(LWS_GROUP_SIZE) && exec {serve}")
    worker_cmd = f"bash {MULTI_NODE_SCRIPT} worker --ray_address=$(LWS_LEADER_ADDRESS)"
    leader = _pod(options, _node_selector(options, stages[0][1], key, region, tier),
                  _container(options, "vllm-leader", tp, leader_cmd, env, True, nixl))
    worker = _pod(options, _node_selector(options, stages[1][1], key, region, tier),
                  _container(options, "vllm-worker", tp, worker_cmd, env, False, nixl))
    return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": meta, "spec": {
        "replicas": instances, "startupPolicy": "LeaderCreated",
        "leaderWorkerTemplate": {
            "size": len(stages), "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": {"metadata": {"labels": {**labels, SERVING_LABEL: "true"}},
                               "spec": leader},
            "workerTemplate": {"metadata": {"labels": {**labels, SERVING_LABEL: "false"}},
                               "spec": worker},
        }}}


def _aggregated_services(options: K8sOptions, record: PlanRecord, models: list[str]) -> list[dict[str, Any]]:
    """Every pod serves whole requests: one Service per model selects all its serving pods."""
    owned = {CONTROLLER_LABEL: record.owner} if record.owner else {}
    out = []
    for model in models:
        selector = {MANAGED_BY[0]: MANAGED_BY[1], MODEL_LABEL: model_label(model), SERVING_LABEL: "true",
                    **owned}
        path = {REQUEST_PATH_ANNOTATION: "client -> this Service -> any vLLM pod of the model"}
        out.append(_service(options, entry_service_name(model, record.owner), model, None, selector,
                            owned, {ENTRY_LABEL: "true"}, path))
    return out


def _disaggregated_services(options: K8sOptions, record: PlanRecord,
                            services: Mapping[tuple[str, str], None]) -> list[dict[str, Any]]:
    """A Service per (model, phase) of the separate phases; an entry Service per model served
    only co-located; the routers of the models with both phases planned (a model with only one
    phase planned gets no router: it could not serve a request whole)."""
    owned = {CONTROLLER_LABEL: record.owner} if record.owner else {}
    models = dict.fromkeys(m for m, _ in services)
    out = []
    for model, phase in services:
        if phase == "colocated":  # reached through the model's entry Service, below
            continue
        selector = {MANAGED_BY[0]: MANAGED_BY[1], MODEL_LABEL: model_label(model), SERVING_LABEL: "true",
                    PHASE_LABEL: _label_value(phase), **owned}
        out.append(_service(options, service_name(model, phase, record.owner), model, phase, selector, owned))
    routed = [m for m in models if (m, "prefill") in services and (m, "decode") in services]
    served_colocated = [m for m in models if (m, "colocated") in services]
    for model in served_colocated:
        if model in routed:  # mixed: the router's entry Service selects these pods too (see _entry_selector)
            continue
        selector = {MANAGED_BY[0]: MANAGED_BY[1], MODEL_LABEL: model_label(model), SERVING_LABEL: "true",
                    ENTRY_POD_LABEL: "true", **owned}
        path = {REQUEST_PATH_ANNOTATION: "client -> this Service -> a co-located vLLM pod of the model "
                                         "(prefill and decode on one engine, chunked prefill)"}
        out.append(_service(options, entry_service_name(model, record.owner), model, None, selector, owned,
                            {ENTRY_LABEL: "true"}, path))
    if routed and options.router == "builtin":
        out.append(_router_script(options, record.owner))
    out.extend(_routers(options, record, routed, served_colocated))
    return out


def _routers(options: K8sOptions, record: PlanRecord, routed: list[str],
             served_colocated: list[str]) -> list[dict[str, Any]]:
    """Each routed model's router (atoll's builtin one, or vllm-router told each phase's planned
    pods); a model also served co-located is mixed (its entry Service selects both kinds)."""
    pods: dict[tuple[str, str], int] = {}  # instances planned per (model, phase)
    for key, n in record.plan.items():
        mp = (str(record.templates[key]["model"]), str(record.templates[key]["phase"]))
        pods[mp] = pods.get(mp, 0) + n
    out: list[dict[str, Any]] = []
    for model in routed:
        mixed = model in served_colocated
        if options.router == "builtin":
            out.extend(_router(options, model, record.owner, record.sequence, mixed))
        else:
            out.extend(_vllm_router(options, model, record.owner, record.sequence,
                                    pods[(model, "prefill")], pods[(model, "decode")], mixed))
    return out


def render_manifests(record: PlanRecord, options: K8sOptions | None = None) -> list[dict[str, Any]]:
    """Deployments, LeaderWorkerSets and Services of a plan, sorted by (kind, name)."""
    options = options or K8sOptions()
    pools = node_pools(record)
    out: list[dict[str, Any]] = []
    services: dict[tuple[str, str], None] = {}
    for key, instances in sorted(record.plan.items()):
        out.append(_workload(options, record, key, instances, pools))
        t = record.templates[key]
        services[(str(t["model"]), str(t["phase"]))] = None
    if options.pd == "aggregated":
        out += _aggregated_services(options, record, list(dict.fromkeys(m for m, _ in services)))
    else:
        out += _disaggregated_services(options, record, services)
    return sorted(out, key=lambda d: (d["kind"], d["metadata"]["name"]))


def _service(options: K8sOptions, name: str, model: str, phase: str | None, selector: dict[str, str],
             owned: dict[str, str], labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": name, "namespace": options.namespace,
        "labels": {MANAGED_BY[0]: MANAGED_BY[1], MODEL_LABEL: model_label(model),
                   **({PHASE_LABEL: _label_value(phase)} if phase else {}), **owned, **(labels or {})},
        "annotations": {MODEL_NAME_ANNOTATION: model, **(annotations or {})}},
        "spec": {"type": "ClusterIP", "selector": selector,
                 "ports": [{"name": "http", "port": options.port, "targetPort": "http", "protocol": "TCP"}]}}


def router_script_name(owner: str = "") -> str:
    """The ConfigMap holding the router's source (one per controller)."""
    return _name("pd-router", tail=_digest(_owned(owner, "pd-router")))


def router_name(model: str, owner: str = "") -> str:
    """The Deployment of a model's prefill/decode router."""
    return _name(model, "router", tail=_digest(_owned(owner, model)))


def _router_script(options: K8sOptions, owner: str) -> dict[str, Any]:
    owned = {CONTROLLER_LABEL: owner} if owner else {}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": router_script_name(owner), "namespace": options.namespace,
        "labels": {MANAGED_BY[0]: MANAGED_BY[1], COMPONENT_LABEL: "router", **owned}},
        "data": {ROUTER_SCRIPT: ROUTER_SOURCE}}


def _entry_selector(model: str, owned: dict[str, str], mixed: bool) -> dict[str, str]:
    """The entry Service's selector of a routed model: its router pods; with ``mixed`` (the plan
    also holds co-located pods of the model) every pod labelled an entry pod, the router's and
    the co-located ones. Kubernetes spreads connections over the endpoints, so a mixed model's
    requests split over router and co-located pods by their count, not by planned capacity."""
    if mixed:
        return {MANAGED_BY[0]: MANAGED_BY[1], MODEL_LABEL: model_label(model), ENTRY_POD_LABEL: "true",
                **owned}
    return {MANAGED_BY[0]: MANAGED_BY[1], MODEL_LABEL: model_label(model), COMPONENT_LABEL: "router", **owned}


def _router(options: K8sOptions, model: str, owner: str, sequence: int,
            mixed: bool = False) -> list[dict[str, Any]]:
    """A model's router Deployment (CPU only) and its entry Service, the model's one endpoint."""
    owned = {CONTROLLER_LABEL: owner} if owner else {}
    labels = {MANAGED_BY[0]: MANAGED_BY[1], "app.kubernetes.io/name": "atoll-pd-router",
              MODEL_LABEL: model_label(model), COMPONENT_LABEL: "router", **owned,
              **({ENTRY_POD_LABEL: "true"} if mixed else {})}
    prefill, decode = (service_name(model, p, owner) for p in ("prefill", "decode"))
    url = f"http://{{}}.{options.namespace}.svc:{options.port}"
    entry = entry_service_name(model, owner)
    path = (f"client -> Service {entry} -> router -> Service {prefill} (max_tokens 1, kv_transfer_params "
            f"do_remote_decode) -> Service {decode} (kv_transfer_params from the prefill pod; the decode pod "
            f"pulls the KV over NIXL from that pod's side channel, port {NIXL_PORT})")
    probe = {"periodSeconds": 10, "timeoutSeconds": 8}
    container = {
        "name": "router", "image": options.router_image, "command": ["python3", f"/atoll/{ROUTER_SCRIPT}"],
        "env": [{"name": "PREFILL_URL", "value": url.format(prefill)},
                {"name": "DECODE_URL", "value": url.format(decode)},
                {"name": "PORT", "value": str(options.port)},
                {"name": "UPSTREAM_TIMEOUT_S", "value": str(options.startup_timeout_s)},
                {"name": "MAX_BODY_BYTES", "value": str(options.router_max_body_mb * 2**20)}],
        "ports": [{"name": "http", "containerPort": options.port, "protocol": "TCP"}],
        # ready only when both sides answer /health: the pair works, not just the proxy
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, **probe, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/live", "port": "http"}, **probe, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": [{"name": "router", "mountPath": "/atoll", "readOnly": True}]}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
        "name": router_name(model, owner), "namespace": options.namespace, "labels": labels,
        "annotations": {MODEL_NAME_ANNOTATION: model, REQUEST_PATH_ANNOTATION: path,
                        "atoll.io/plan-sequence": str(sequence)}},
        "spec": {"replicas": options.router_replicas,
                 "selector": {"matchLabels": {MANAGED_BY[0]: MANAGED_BY[1], MODEL_LABEL: model_label(model),
                                              COMPONENT_LABEL: "router", **owned}},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "containers": [container], "terminationGracePeriodSeconds": 30,
                     "volumes": [{"name": "router", "configMap": {"name": router_script_name(owner)}}]}}}}
    service = _service(options, entry, model, None, _entry_selector(model, owned, mixed), owned,
                       {ENTRY_LABEL: "true"}, {REQUEST_PATH_ANNOTATION: path})
    return [deployment, service]


def _api_key_env(options: K8sOptions, name: str = VLLM_API_KEY_ENV) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": options.api_key_secret,
                                                         "key": options.api_key_key}}}


def router_metrics_name(model: str, owner: str = "") -> str:
    """The Service Prometheus scrapes a model's vllm-router through."""
    return _name(model, "router-metrics", tail=_digest(_owned(owner, model)))


def request_timeout_s(model: str, options: K8sOptions) -> int:
    """vllm-router's per-request time-out for ``model``: twice the time its SLO allows an answer
    of ``router_max_tokens`` tokens (TTFT budget + tokens x TPOT budget), at least 60 s; a model
    outside the catalog and the fleet's own models (no SLO known here) gets ``startup_timeout_s``."""
    from atoll.solvers.models import get_model  # the catalog: only needed for this

    try:
        slo = get_model(model, options.user_models).slo
    except (KeyError, ValueError):
        return options.startup_timeout_s
    return max(60, math.ceil(2 * (slo.ttft_ms + options.router_max_tokens * slo.tpot_ms) / 1000))


def _policy(instances: int, busy: str) -> str:
    # one pod: nothing to choose between, and round robin keeps no state
    return "round_robin" if instances <= 1 else busy


def vllm_router_args(options: K8sOptions, model: str, owner: str, prefill_instances: int,
                     decode_instances: int) -> list[str]:
    """The ``vllm-router`` arguments of ``model``'s router: P/D mode over NIXL, prefill and decode
    pods found through the Kubernetes API by atoll's own labels (the same selection as the
    phase Services), a cache-aware policy for prefill and power-of-two for decode (round robin
    where the plan has one pod), health checks, the request time-out from the SLO, Prometheus
    on :data:`VLLM_ROUTER_METRICS_PORT`; checked against the pinned version's flags."""
    owned = {CONTROLLER_LABEL: owner} if owner else {}

    def selector(phase: str) -> list[str]:
        labels = {MANAGED_BY[0]: MANAGED_BY[1], MODEL_LABEL: model_label(model), SERVING_LABEL: "true",
                  PHASE_LABEL: phase, **owned}
        return [f"{k}={v}" for k, v in labels.items()]

    args = ["--host", "0.0.0.0", "--port", str(options.port), "--vllm-pd-disaggregation",
            "--kv-connector", "nixl", "--service-discovery",
            "--service-discovery-namespace", options.namespace,
            "--service-discovery-port", str(options.port),
            "--prefill-selector", *selector("prefill"), "--decode-selector", *selector("decode"),
            "--prefill-policy", _policy(prefill_instances, "cache_aware"),
            "--decode-policy", _policy(decode_instances, "power_of_two"),
            "--health-check-interval-secs", "10", "--health-failure-threshold", "3",
            "--request-timeout-secs", str(request_timeout_s(model, options)),
            "--max-payload-size", str(options.router_max_body_mb * 2**20),
            "--prometheus-host", "0.0.0.0", "--prometheus-port", str(VLLM_ROUTER_METRICS_PORT)]
    if options.api_key_secret:
        args += ["--api-key", f"$({VLLM_ROUTER_API_KEY_ENV})"]  # expanded by the kubelet from the Secret
    problems = unknown_router_args(args)
    if problems:  # a renderer bug: say which flag the pinned version lacks
        raise SinkError(f"the vllm-router arguments of {model!r} do not fit the pinned vllm-router: "
                        f"{'; '.join(problems)}")
    return args


def _vllm_router(options: K8sOptions, model: str, owner: str, sequence: int, prefill_instances: int,
                 decode_instances: int, mixed: bool = False) -> list[dict[str, Any]]:
    """A model's vllm-router: its Deployment, the ServiceAccount / Role / RoleBinding that let it
    watch pods in the namespace, the entry Service (the model's one endpoint) and a metrics
    Service with Prometheus' scrape annotations."""
    owned = {CONTROLLER_LABEL: owner} if owner else {}
    labels = {MANAGED_BY[0]: MANAGED_BY[1], "app.kubernetes.io/name": "vllm-router",
              MODEL_LABEL: model_label(model), COMPONENT_LABEL: "router", **owned,
              **({ENTRY_POD_LABEL: "true"} if mixed else {})}
    name = router_name(model, owner)
    entry = entry_service_name(model, owner)
    prefill, decode = (service_name(model, p, owner) for p in ("prefill", "decode"))
    path = (f"client -> Service {entry} -> vllm-router -> a prefill pod (the pods Service {prefill} selects; "
            f"max_tokens 1, kv_transfer_params do_remote_decode) -> a decode pod (those of Service {decode}; "
            f"kv_transfer_params from the prefill pod; the decode pod pulls the KV over NIXL from that pod's "
            f"side channel, port {NIXL_PORT})")
    meta = {"namespace": options.namespace, "labels": labels}
    annotations = {MODEL_NAME_ANNOTATION: model}
    container: dict[str, Any] = {
        "name": "router", "image": options.router_image, "command": ["vllm-router"],
        "args": vllm_router_args(options, model, owner, prefill_instances, decode_instances),
        "ports": [{"name": "http", "containerPort": options.port, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": VLLM_ROUTER_METRICS_PORT, "protocol": "TCP"}],
        # ready once a prefill and a decode worker are healthy: the pair works, not just the proxy
        "readinessProbe": {"httpGet": {"path": VLLM_ROUTER_READINESS, "port": "http"}, "periodSeconds": 10,
                           "timeoutSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": VLLM_ROUTER_LIVENESS, "port": "http"}, "periodSeconds": 10,
                          "timeoutSeconds": 5, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}}
    if options.api_key_secret:
        # what the router sends the servers on both hops (VLLM_ROUTER_API_KEY_ENV)
        container["env"] = [_api_key_env(options, VLLM_ROUTER_API_KEY_ENV)]
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
        "name": name, **meta, "annotations": {**annotations, REQUEST_PATH_ANNOTATION: path,
                                              "atoll.io/plan-sequence": str(sequence)}},
        "spec": {"replicas": options.router_replicas,
                 "selector": {"matchLabels": {MANAGED_BY[0]: MANAGED_BY[1], MODEL_LABEL: model_label(model),
                                              COMPONENT_LABEL: "router", **owned}},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "serviceAccountName": name, "containers": [container],
                     "terminationGracePeriodSeconds": 30}}}}
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": name, **meta, "annotations": annotations}}
    # service discovery watches pods in this namespace, nothing else
    role = {"apiVersion": RBAC_API, "kind": "Role",
            "metadata": {"name": name, **meta, "annotations": annotations},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}
    binding = {"apiVersion": RBAC_API, "kind": "RoleBinding",
               "metadata": {"name": name, **meta, "annotations": annotations},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": options.namespace}]}
    selector = {MANAGED_BY[0]: MANAGED_BY[1], MODEL_LABEL: model_label(model), COMPONENT_LABEL: "router",
                **owned}
    service = _service(options, entry, model, None, _entry_selector(model, owned, mixed), owned,
                       {ENTRY_LABEL: "true"}, {REQUEST_PATH_ANNOTATION: path})
    metrics = _service(options, router_metrics_name(model, owner), model, None, selector, owned,
                       {COMPONENT_LABEL: "router"},
                       {"prometheus.io/scrape": "true", "prometheus.io/port": str(VLLM_ROUTER_METRICS_PORT),
                        "prometheus.io/path": "/metrics"})
    metrics["spec"]["ports"] = [{"name": "metrics", "port": VLLM_ROUTER_METRICS_PORT, "targetPort": "metrics",
                                 "protocol": "TCP"}]
    return [account, role, binding, deployment, service, metrics]


def k8s_options(section: Mapping[str, Any], where: str = "kubernetes",
                user_models: Sequence[ModelSpec] = ()) -> K8sOptions:
    """:class:`K8sOptions` from a fleet file's ``kubernetes`` section and its own models
    (``user_models``); unknown or bad fields fail with ``where`` (the file and section) and the
    field."""
    allowed = {f.name for f in fields(K8sOptions)} - {"user_models"}
    extra = sorted(set(section) - allowed)
    if extra:
        raise SinkError(f"{where}: unknown field(s) {extra}; valid: {', '.join(sorted(allowed))}")
    values = dict(section)
    for name in ("gpu_products", "model_sources"):
        if name in values:
            if not isinstance(values[name], Mapping):
                raise SinkError(f"{where}: field '{name}' must map names to strings, got {values[name]!r}")
            # a fleet's entries add to (and override) the built-in table
            own = {str(k): str(v) for k, v in values[name].items()}
            values[name] = {**getattr(K8sOptions(), name), **own}
    try:
        return K8sOptions(**values, user_models=tuple(user_models))
    except SinkError as exc:
        raise SinkError(f"{where}: {exc}") from None
    except TypeError as exc:
        raise SinkError(f"{where}: {exc}") from None
