"""A plan as Kubernetes Deployments: rendered to a directory, or applied through the API.

How a template maps: one template instance is a group of nodes (a pipeline of stages, each
stage one or more data-parallel nodes), possibly of several node configs. A Deployment's pods
are all alike, so there is one Deployment per (template, node config), and each pod is one
whole node of that config: ``replicas`` = instances x nodes of that config in the template,
``nvidia.com/gpu`` limit = GPUs per node, node selectors on the GPU product
(``nvidia.com/gpu.product``, GPU Feature Discovery's label), GPU count and region
(``topology.kubernetes.io/region``; atoll's "aws:us-east-2" becomes "us-east-2"). The template
key, its stages and its node multiset ride along as annotations and environment variables,
so the serving stack (e.g. a Ray or LeaderWorkerSet launcher) can wire an instance's pods into
its pipeline. A Deployment does not gang-schedule one instance's nodes; a LeaderWorkerSet per
template is the upgrade path when that matters.

Names are DNS-1123 labels (lowercase, <= 63 characters): ``atoll-<model>-<phase>-<config>-<hash>``
with the hash of (template key, config), so they are stable across plans and distinct.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from atoll.control.plans import PlanRecord, SinkError, SinkResult, atomic_write_text

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
REGION_LABEL = "topology.kubernetes.io/region"
GPU_RESOURCE = "nvidia.com/gpu"
MANAGED_BY = ("app.kubernetes.io/managed-by", "atoll")
TEMPLATE_LABEL = "atoll.io/template"
CONFIG_LABEL = "atoll.io/node-config"
# GPU Feature Discovery's product names on the clouds atoll's catalog covers; override per cluster.
DEFAULT_GPU_PRODUCTS: dict[str, str] = {
    "T4": "Tesla-T4", "L4": "NVIDIA-L4", "A10G": "NVIDIA-A10G", "L40S": "NVIDIA-L40S",
    "V100": "Tesla-V100-SXM2-16GB", "A100-40GB": "NVIDIA-A100-SXM4-40GB",
    "A100-80GB": "NVIDIA-A100-SXM4-80GB", "H100": "NVIDIA-H100-80GB-HBM3", "H200": "NVIDIA-H200",
}
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_CONFIG = re.compile(r"([1-9][0-9]*)x(.+)")


@dataclass(frozen=True)
class K8sOptions:
    """Cluster-specific parts of the rendering: namespace, serving image, GPU product names."""

    namespace: str = "default"
    image: str = "vllm/vllm-openai:latest"
    gpu_products: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_GPU_PRODUCTS))

    def __post_init__(self) -> None:
        if not _DNS_LABEL.fullmatch(self.namespace) or len(self.namespace) > 63:
            raise SinkError(f"K8sOptions: field 'namespace' must be a DNS-1123 label (lowercase letters, "
                            f"digits, '-'), got {self.namespace!r}")
        if not self.image:
            raise SinkError("K8sOptions: field 'image' must name a container image")


def _slug(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")


def _label_value(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")


def _digest(key: str, config: str) -> str:
    return hashlib.sha256(f"{key}#{config}".encode()).hexdigest()[:8]


def deployment_name(model: str, phase: str, config: str, key: str) -> str:
    """``atoll-<model>-<phase>-<config>-<hash>``, the model part cut to fit 63 characters."""
    tail = f"-{_slug(phase)}-{_slug(config)}-{_digest(key, config)}"
    head = ("atoll-" + _slug(model))[: 63 - len(tail)].rstrip("-")
    return head + tail


def _parse_config(key: str, config: str) -> tuple[int, str]:
    m = _CONFIG.fullmatch(config)
    if not m:
        raise SinkError(f"template {key!r}: node config {config!r} is not '<count>x<GPU>' such as '4xL40S'")
    return int(m.group(1)), m.group(2)


def render_deployments(record: PlanRecord, options: K8sOptions | None = None) -> list[dict[str, Any]]:
    """One Deployment per (planned template, node config), sorted by name."""
    options = options or K8sOptions()
    out = []
    for key, instances in record.plan.items():
        t = record.templates[key]
        model, phase = str(t["model"]), str(t["phase"])
        for config, per_instance in t["nodes"]:
            gpus, gpu = _parse_config(key, config)
            name = deployment_name(model, phase, config, key)
            selector = {MANAGED_BY[0]: MANAGED_BY[1], TEMPLATE_LABEL: _digest(key, config),
                        CONFIG_LABEL: _label_value(config)}
            labels = {**selector, "app.kubernetes.io/name": "vllm", "atoll.io/model": _label_value(model),
                      "atoll.io/phase": _label_value(phase)}
            stages = json.dumps(t["stages"], separators=(",", ":"))
            annotations = {"atoll.io/template-key": key, "atoll.io/stages": stages,
                           "atoll.io/template-nodes": json.dumps(t["nodes"], separators=(",", ":")),
                           "atoll.io/instances": str(instances),
                           "atoll.io/plan-sequence": str(record.sequence)}
            env = {"ATOLL_MODEL": model, "ATOLL_PHASE": phase, "ATOLL_TEMPLATE_KEY": key,
                   "ATOLL_NODE_CONFIG": config, "ATOLL_STAGES": stages}
            pod = {
                "nodeSelector": {GPU_PRODUCT_LABEL: options.gpu_products.get(gpu, f"NVIDIA-{gpu}"),
                                 GPU_COUNT_LABEL: str(gpus),
                                 REGION_LABEL: str(t["region"]).rsplit(":", 1)[-1]},
                "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "server", "image": options.image,
                                "env": [{"name": k, "value": v} for k, v in env.items()],
                                "resources": {"limits": {GPU_RESOURCE: gpus}}}],
            }
            out.append({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": options.namespace, "labels": labels,
                             "annotations": annotations},
                "spec": {"replicas": instances * int(per_instance), "selector": {"matchLabels": selector},
                         "template": {"metadata": {"labels": labels, "annotations": annotations},
                                      "spec": pod}},
            })
    return sorted(out, key=lambda d: d["metadata"]["name"])


def _get(doc: Any, path: str) -> Any:
    cur = doc
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            raise SinkError(f"field '{path}' is missing")
        cur = cur[part]
    return cur


def validate_deployment(doc: Any, where: str = "Deployment") -> None:
    """Check the fields a Deployment needs (and the ones atoll relies on); SinkError names the
    object and the field."""
    try:
        if _get(doc, "apiVersion") != "apps/v1" or _get(doc, "kind") != "Deployment":
            raise SinkError("must be apiVersion apps/v1, kind Deployment")
        name = _get(doc, "metadata.name")
        if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.fullmatch(name):
            raise SinkError(f"metadata.name {name!r} is not a DNS-1123 label")
        replicas = _get(doc, "spec.replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise SinkError(f"spec.replicas must be an integer >= 0, got {replicas!r}")
        match = _get(doc, "spec.selector.matchLabels")
        pod_labels = _get(doc, "spec.template.metadata.labels")
        if not match or any(pod_labels.get(k) != v for k, v in match.items()):
            raise SinkError("spec.selector.matchLabels must be non-empty and match the pod template's labels")
        selectors = _get(doc, "spec.template.spec.nodeSelector")
        for k in (GPU_PRODUCT_LABEL, GPU_COUNT_LABEL, REGION_LABEL):
            if not selectors.get(k):
                raise SinkError(f"spec.template.spec.nodeSelector lacks {k}")
        for k, v in {**_get(doc, "metadata.labels"), **pod_labels, **selectors}.items():
            if not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.fullmatch(v):
                raise SinkError(f"label {k}={v!r} is not a valid label value (<= 63 of A-Z a-z 0-9 - _ .)")
        containers = _get(doc, "spec.template.spec.containers")
        if not containers:
            raise SinkError("spec.template.spec.containers is empty")
        for c in containers:
            gpus = _get(c, "resources.limits").get(GPU_RESOURCE)
            if not c.get("name") or not c.get("image") or not isinstance(gpus, int) or gpus < 1:
                raise SinkError(f"container {c.get('name')!r} needs a name, an image and {GPU_RESOURCE} >= 1")
    except SinkError as exc:
        raise SinkError(f"{where}: {exc}") from None


class K8sManifestSink:
    """``k8s:DIR``: one YAML file per Deployment plus a kustomization.yaml listing them
    (``kubectl apply -k DIR``). Each file is re-loaded and validated after writing; manifests
    of templates no longer planned are deleted."""

    def __init__(self, directory: Path | str, options: K8sOptions | None = None) -> None:
        self.directory = Path(directory)
        self.options = options or K8sOptions()
        self.name = f"k8s:{self.directory}"

    def write(self, record: PlanRecord) -> SinkResult:
        docs = render_deployments(record, self.options)
        written: list[str] = []
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for doc in docs:
                path = self.directory / f"{doc['metadata']['name']}.yaml"
                atomic_write_text(path, yaml.safe_dump(doc, sort_keys=False))
                validate_deployment(yaml.safe_load(path.read_text()), str(path))
                written.append(str(path))
            files = sorted(Path(p).name for p in written)
            kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                             "resources": files}
            atomic_write_text(self.directory / "kustomization.yaml", yaml.safe_dump(kustomization))
            written.append(str(self.directory / "kustomization.yaml"))
            removed = []
            for stale in sorted(self.directory.glob("atoll-*.yaml")):
                if stale.name not in files:
                    stale.unlink()
                    removed.append(str(stale))
        except OSError as exc:
            raise SinkError(f"{self.name}: cannot write manifests ({exc}); check that the directory is "
                            f"writable") from exc
        return SinkResult(self.name, True, tuple(written), tuple(removed),
                          f"{len(docs)} Deployment(s) for plan {record.sequence}")


ApiFactory = Callable[[], Any]


def _api_cause(api: Any, exc: Exception) -> str:
    status = getattr(exc, "status", None)
    if status:
        body = str(getattr(exc, "body", "") or "")[:300]
        return f"the API server answered HTTP {status} {getattr(exc, 'reason', '')}".rstrip() + \
            (f": {body}" if body else "")
    host = getattr(getattr(getattr(api, "api_client", None), "configuration", None), "host", "the API server")
    reason = getattr(exc, "reason", None) or exc
    return f"cannot reach {host} ({type(exc).__name__}: {str(reason)[:300]})"


class K8sApplySink:
    """``k8s-apply``: server-side apply of the rendered Deployments through the kubernetes
    client, as a server-side dry run unless ``apply`` is True; atoll-managed Deployments that
    the plan no longer names are deleted (dry-run likewise). ``api_factory`` returns an
    ``AppsV1Api``-like object (tests pass a fake; default: kubeconfig, then in-cluster)."""

    def __init__(self, options: K8sOptions | None = None, *, apply: bool = False,
                 kubeconfig: str | None = None, context: str | None = None, timeout: float = 10.0,
                 api_factory: ApiFactory | None = None) -> None:
        self.options = options or K8sOptions()
        self.apply, self.kubeconfig, self.context, self.timeout = apply, kubeconfig, context, timeout
        self._api_factory = api_factory
        self.name = f"k8s-apply:{self.options.namespace}"

    def _api(self) -> Any:
        if self._api_factory is not None:
            return self._api_factory()
        from kubernetes import client, config  # imported here: heavy, and only this sink needs it

        path = self.kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        problems = []
        try:
            cfg = client.Configuration()
            cfg.retries = 0  # deliver() owns retries; urllib3's would triple every failure's latency
            return client.AppsV1Api(config.new_client_from_config(
                config_file=path, context=self.context, persist_config=False, client_configuration=cfg))
        except (config.ConfigException, OSError, ValueError, TypeError) as exc:
            problems.append(f"kubeconfig {path}: {exc}")
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            try:
                cfg = client.Configuration()
                config.load_incluster_config(client_configuration=cfg)
                cfg.retries = 0
                return client.AppsV1Api(client.ApiClient(cfg))
            except config.ConfigException as exc:
                problems.append(f"in-cluster config: {exc}")
        else:
            problems.append("not inside a cluster (KUBERNETES_SERVICE_HOST unset)")
        raise SinkError(f"{self.name}: no Kubernetes cluster configured ({'; '.join(problems)}); point "
                        f"KUBECONFIG at a cluster's kubeconfig, run inside the cluster, or render "
                        f"manifests with the k8s:DIR sink instead")

    def objects(self, record: PlanRecord) -> list[dict[str, Any]]:
        """The validated Deployment bodies this sink would apply (no cluster needed)."""
        docs = render_deployments(record, self.options)
        for doc in docs:
            validate_deployment(doc, f"Deployment {doc['metadata']['name']}")
        return docs

    def write(self, record: PlanRecord) -> SinkResult:
        docs = self.objects(record)
        api = self._api()
        ns, dry = self.options.namespace, (None if self.apply else "All")
        written, removed = [], []
        what = "server"
        try:
            for doc in docs:
                what = f"Deployment {doc['metadata']['name']}"
                api.patch_namespaced_deployment(
                    doc["metadata"]["name"], ns, doc, field_manager="atoll", force=True, dry_run=dry,
                    _content_type="application/apply-patch+yaml", _request_timeout=self.timeout)
                written.append(f"deployment/{doc['metadata']['name']}")
            what = "the Deployment list"
            wanted = {d["metadata"]["name"] for d in docs}
            listed = api.list_namespaced_deployment(ns, label_selector=f"{MANAGED_BY[0]}={MANAGED_BY[1]}",
                                                    _request_timeout=self.timeout)
            for item in listed.items:
                if item.metadata.name not in wanted:
                    what = f"Deployment {item.metadata.name} (deleting)"
                    api.delete_namespaced_deployment(item.metadata.name, ns, dry_run=dry,
                                                     _request_timeout=self.timeout)
                    removed.append(f"deployment/{item.metadata.name}")
        except SinkError:
            raise
        except Exception as exc:  # ApiException, urllib3 errors, time-outs: all mean "not delivered"
            raise SinkError(f"{self.name}: {what} failed: {_api_cause(api, exc)}") from exc
        mode = "applied" if self.apply else "server-side dry run, nothing changed (pass --apply to apply)"
        return SinkResult(self.name, True, tuple(written), tuple(removed),
                          f"{len(docs)} Deployment(s) for plan {record.sequence}: {mode}")
