"""Kubernetes plan sinks: rendered manifests in a directory (``k8s:DIR``), or server-side apply
through the API (``k8s-apply``). What the objects are — Deployments and LeaderWorkerSets that
start vLLM, one Service per (model, phase), and for disaggregated serving each model's
prefill/decode router behind the model's entry Service (vllm-router: a Deployment with its
ServiceAccount, Role and RoleBinding, and a metrics Service; the built-in router: a Deployment
and its script's ConfigMap) — is :mod:`atoll.control.k8s.render`.

Before anything is written or applied every object passes :func:`validate_object`, a
structural check of the fields atoll relies on (names, selectors matching pod labels, node
selectors, GPU limits, the serving container's command and probes, the router's readiness);
with ``K8sOptions.kube_version`` set (``--kube-version``) also the checks an API server of that
version would make (:mod:`atoll.control.k8s.validate`: Kubernetes' OpenAPI schemas, the
LeaderWorkerSet CRD's structural schema). ``k8s-apply`` needs RBAC to patch, list and delete
Deployments, Services, ConfigMaps, LeaderWorkerSets, ServiceAccounts, Roles and RoleBindings in
its namespace, and (to grant vllm-router's Role) get, list and watch on pods itself: Kubernetes
lets no one grant a permission they do not hold.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from atoll.control.k8s.render import (
    CAPACITY_LABEL,
    COMPONENT_LABEL,
    CONTROLLER_LABEL,
    DEFAULT_GPU_PRODUCTS,
    DEFAULT_MODEL_SOURCES,
    GPU_COUNT_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    LWS_API,
    MANAGED_BY,
    RBAC_API,
    REGION_LABEL,
    K8sOptions,
    render_manifests,
    service_name,
    workload_name,
)
from atoll.control.k8s.validate import check_api
from atoll.control.plans import PlanRecord, SinkError, SinkResult
from atoll.solvers.files import atomic_write_text

__all__ = ["CAPACITY_LABEL", "DEFAULT_GPU_PRODUCTS", "DEFAULT_MODEL_SOURCES", "GPU_COUNT_LABEL",
           "GPU_PRODUCT_LABEL", "REGION_LABEL", "K8sApplySink", "K8sManifestSink", "K8sOptions",
           "render_manifests", "service_name", "validate_object", "workload_name"]

_KINDS = {"ConfigMap": "v1", "Deployment": "apps/v1", "LeaderWorkerSet": LWS_API, "Service": "v1",
          "ServiceAccount": "v1", "Role": RBAC_API, "RoleBinding": RBAC_API}
# the order objects are applied in: the router's script and identity before the pods that use
# them, workloads before the Services that route to them
_APPLY_ORDER = {"ConfigMap": 0, "ServiceAccount": 0, "Role": 0, "RoleBinding": 0, "Deployment": 1,
                "LeaderWorkerSet": 1, "Service": 2}
# kinds pruned, in this order: what uses an identity before the identity
_PRUNE_ORDER = ("Deployment", "LeaderWorkerSet", "Service", "ConfigMap", "RoleBinding", "Role",
                "ServiceAccount")
# kinds without pods: the fields that must be non-empty, and the error when one is not
_NON_EMPTY: dict[str, tuple[tuple[str, ...], str]] = {
    "Service": (("spec.selector", "spec.ports"), "spec.selector and spec.ports must be non-empty"),
    "ConfigMap": (("data",), "data must be non-empty"),
    "ServiceAccount": ((), ""),
    "Role": (("rules",), "rules must be non-empty"),
}
_DNS = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors and aliases: an object the renderer shares between two places
    (a label map, a port list) is written out twice, as kubectl and every reader expect."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(doc: Any) -> str:
    """One manifest as plain YAML (keys in their given order, no anchors)."""
    return yaml.dump(doc, Dumper=_PlainDumper, sort_keys=False)


def dump_yaml_all(docs: Iterable[Any]) -> str:
    return yaml.dump_all(docs, Dumper=_PlainDumper, sort_keys=False)


def _get(doc: Any, path: str) -> Any:
    cur = doc
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            raise SinkError(f"field '{path}' is missing")
        cur = cur[part]
    return cur


def _labels_ok(where: str, labels: Mapping[str, Any]) -> None:
    for k, v in labels.items():
        if not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.fullmatch(v):
            raise SinkError(f"{where}: label {k}={v!r} is not a valid label value "
                            f"(<= 63 of A-Z a-z 0-9 - _ .)")


def _pod_ok(where: str, template: Any, serving: bool) -> None:
    _labels_ok(where, _get(template, "metadata.labels"))
    selectors = _get(template, "spec.nodeSelector")
    if not isinstance(selectors, Mapping) or not selectors:
        # a GPU pod without a node selector would land on any node the scheduler likes
        raise SinkError(f"{where}: spec.nodeSelector is empty; a GPU pod must select its node type")
    _labels_ok(f"{where} nodeSelector", selectors)
    containers = _get(template, "spec.containers")
    if not containers:
        raise SinkError(f"{where}: spec.containers is empty")
    for c in containers:
        gpus = _get(c, "resources.limits").get(GPU_RESOURCE)
        if not c.get("name") or not c.get("image") or not isinstance(gpus, int) or gpus < 1:
            raise SinkError(f"{where}: container {c.get('name')!r} needs a name, an image and "
                            f"{GPU_RESOURCE} >= 1")
        if not c.get("command"):
            raise SinkError(f"{where}: container {c['name']!r} has no command")
        if serving and not (c.get("readinessProbe") and c.get("livenessProbe")):
            raise SinkError(f"{where}: serving container {c['name']!r} needs readiness and liveness probes")


def _router_ok(template: Any) -> None:
    """The prefill/decode router: a CPU pod, ready when both sides are: vllm-router in P/D mode
    (readiness ``/readiness``, a service account to discover pods with), or the built-in
    router's script (readiness ``/health``, both sides' URLs)."""
    (c,) = _get(template, "spec.containers")
    if not c.get("command") or not c.get("image"):
        raise SinkError("spec.template: the router container needs an image and a command")
    if GPU_RESOURCE in (c.get("resources", {}).get("limits") or {}):
        raise SinkError("spec.template: the router needs no GPU")
    if c["command"] == ["vllm-router"]:
        args = c.get("args") or []
        if "--vllm-pd-disaggregation" not in args:
            raise SinkError("spec.template: vllm-router needs --vllm-pd-disaggregation")
        if "--service-discovery" in args and not _get(template, "spec").get("serviceAccountName"):
            raise SinkError("spec.template: vllm-router's service discovery needs a serviceAccountName")
        if _get(c, "readinessProbe.httpGet.path") != "/readiness" or not c.get("livenessProbe"):
            raise SinkError("spec.template: vllm-router needs readiness on /readiness (a prefill and a "
                            "decode worker healthy) and liveness")
        return
    if _get(c, "readinessProbe.httpGet.path") != "/health" or not c.get("livenessProbe"):
        raise SinkError("spec.template: the router needs readiness on /health (both sides ready) "
                        "and liveness")
    env = {e["name"] for e in c.get("env", [])}
    if not {"PREFILL_URL", "DECODE_URL"} <= env:
        raise SinkError("spec.template: the router needs PREFILL_URL and DECODE_URL")


def validate_object(doc: Any, where: str = "object") -> None:
    """Check the fields atoll relies on; SinkError names the object and the field."""
    try:
        kind = _get(doc, "kind")
        if kind not in _KINDS or _get(doc, "apiVersion") != _KINDS[kind]:
            raise SinkError(f"must be one of {', '.join(f'{a} {k}' for k, a in _KINDS.items())}")
        name = _get(doc, "metadata.name")
        if not isinstance(name, str) or len(name) > 63 or not _DNS.fullmatch(name):
            raise SinkError(f"metadata.name {name!r} is not a DNS-1123 label")
        _labels_ok("metadata.labels", _get(doc, "metadata.labels"))
        if kind in _NON_EMPTY:
            fields, error = _NON_EMPTY[kind]
            if not all(_get(doc, f) for f in fields):
                raise SinkError(error)
            return
        if kind == "RoleBinding":
            if _get(doc, "roleRef.kind") != "Role" or not _get(doc, "subjects"):
                raise SinkError("roleRef must name a Role and subjects must be non-empty")
            return
        replicas = _get(doc, "spec.replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise SinkError(f"spec.replicas must be an integer >= 0, got {replicas!r}")
        if kind == "Deployment":
            match = _get(doc, "spec.selector.matchLabels")
            pod_labels = _get(doc, "spec.template.metadata.labels")
            if not match or any(pod_labels.get(k) != v for k, v in match.items()):
                raise SinkError("spec.selector.matchLabels must be non-empty and match the pod "
                                "template's labels")
            if pod_labels.get(COMPONENT_LABEL) == "router":
                _router_ok(_get(doc, "spec.template"))
            else:
                _pod_ok("spec.template", _get(doc, "spec.template"), True)
        else:
            size = _get(doc, "spec.leaderWorkerTemplate.size")
            if isinstance(size, bool) or not isinstance(size, int) or size < 2:
                raise SinkError(f"spec.leaderWorkerTemplate.size must be an integer >= 2, got {size!r}")
            _pod_ok("leaderTemplate", _get(doc, "spec.leaderWorkerTemplate.leaderTemplate"), True)
            _pod_ok("workerTemplate", _get(doc, "spec.leaderWorkerTemplate.workerTemplate"), False)
    except SinkError as exc:
        raise SinkError(f"{where}: {exc}") from None


def _file_name(doc: Mapping[str, Any]) -> str:
    return f"{doc['metadata']['name']}.{doc['kind'].lower()}.yaml"


class K8sManifestSink:
    """``k8s:DIR``: one YAML file per object (``<name>.<kind>.yaml``) plus a kustomization.yaml
    listing them, in a real folder that ``kubectl apply -f DIR`` and ``kubectl apply -k DIR``
    both read (the LeaderWorkerSet CRD must be installed).

    Every object is rendered, dumped, re-loaded and validated before anything is written, so a
    failing plan leaves none of its files. Then each changed file is written beside its final
    name and renamed over it (a reader sees a whole file, old or new, never a torn one), in the
    plan's order: objects first, the kustomization.yaml naming exactly the new set after them,
    and the files of objects the plan deleted last — a reader between two renames sees every
    object of the new plan that is already written and none missing that both plans hold, as
    make-before-break delivers. Unchanged files are not touched. The folder belongs to one
    controller (the plan's ``owner``): a folder holding files this sink did not write, or
    another controller's, is refused by name; the symbolic link an older atoll kept at DIR
    (to ``.DIR.<owner>.<sequence>.<random>`` beside it) becomes a real folder, its versions
    removed."""

    def __init__(self, directory: Path | str, options: K8sOptions | None = None) -> None:
        self.directory = Path(directory)
        self.options = options or K8sOptions()
        self.name = f"k8s:{self.directory}"

    def _prefix(self, owner: str) -> str:
        return f".{self.directory.name}.{owner or 'atoll'}."

    def _check_owner(self, owner: str) -> None:
        d = self.directory
        if d.is_symlink():  # an older atoll's layout: a link to a versioned folder
            target = os.readlink(d)
            if not Path(target).name.startswith(self._prefix(owner)):
                raise SinkError(f"{self.name}: {d} points at {target}, the manifests of another controller "
                                f"(this one is {owner or 'unnamed'!r}); give each controller its own "
                                f"k8s:DIR folder")
            return
        if not d.exists():
            return
        if not d.is_dir():
            raise SinkError(f"{self.name}: {d} is a file; give k8s: a folder path")
        for f in sorted(d.iterdir()):
            theirs = f.name != "kustomization.yaml" and not _temporary(f.name)
            writer = None
            if f.name.startswith("atoll-") and f.suffix == ".yaml":
                with contextlib.suppress(OSError, yaml.YAMLError, AttributeError, TypeError):
                    labels = yaml.safe_load(f.read_text())["metadata"]["labels"]
                    writer = labels.get(CONTROLLER_LABEL, owner)
                    theirs = writer != owner
            if theirs:
                who = owner or "unnamed"
                if writer:
                    raise SinkError(f"{self.name}: {d} holds {f.name}, the manifests of another controller "
                                    f"({writer!r}; this one is {who!r}); give each controller its own "
                                    f"k8s:DIR folder")
                raise SinkError(f"{self.name}: {d} holds {f.name}, which this controller ({who!r}) did not "
                                f"write; give it an empty or new k8s:DIR folder")

    def _real_folder(self, owner: str) -> None:
        """DIR as a real folder: made when missing; an older atoll's symbolic link replaced by a
        real folder holding the files it pointed at (then the versioned folders go)."""
        d = self.directory
        d.parent.mkdir(parents=True, exist_ok=True)
        if d.is_symlink():
            staged = d.parent / f"{self._prefix(owner)}real.{secrets.token_hex(4)}"
            shutil.copytree(d, staged, symlinks=False)
            d.unlink()
            os.replace(staged, d)
            _fsync_dir(d.parent)
        d.mkdir(exist_ok=True)
        for old in d.parent.glob(f"{self._prefix(owner)}*"):  # versions and a crash's leftovers
            if old.is_symlink() or not old.is_dir():
                old.unlink(missing_ok=True)
            else:
                shutil.rmtree(old, ignore_errors=True)
        for tmp in d.iterdir():  # a write killed mid-way
            if _temporary(tmp.name):
                tmp.unlink(missing_ok=True)

    def write(self, record: PlanRecord) -> SinkResult:
        docs = render_manifests(record, self.options)
        texts: dict[str, str] = {}
        for doc in docs:  # everything validated before anything is written
            name = _file_name(doc)
            if name in texts:
                raise SinkError(f"{self.name}: two objects render to {name}; plan {record.sequence} "
                                f"not written")
            text = dump_yaml(doc)
            validate_object(yaml.safe_load(text), name)
            if self.options.kube_version:
                check_api(yaml.safe_load(text), self.options.kube_version, f"{self.name}: {name}")
            texts[name] = text
        files = sorted(texts)
        texts["kustomization.yaml"] = dump_yaml({"apiVersion": "kustomize.config.k8s.io/v1beta1",
                                                      "kind": "Kustomization", "resources": files})
        d, owner = self.directory, record.owner
        changed: list[str] = []
        try:
            self._check_owner(owner)
            self._real_folder(owner)
            before = {f.name for f in d.iterdir() if f.name.startswith("atoll-") and f.suffix == ".yaml"}
            for name in [*files, "kustomization.yaml"]:  # the kustomization after the objects it names
                path = d / name
                with contextlib.suppress(OSError):
                    if path.read_text(encoding="utf-8") == texts[name]:
                        continue
                atomic_write_text(path, texts[name])
                changed.append(name)
            stale = sorted(before - set(files))
            for name in stale:  # deleted objects last
                (d / name).unlink(missing_ok=True)
            _fsync_dir(d)
        except OSError as exc:
            raise SinkError(f"{self.name}: cannot write manifests ({exc}); check that the folder is "
                            f"writable") from exc
        written = tuple(str(d / name) for name in texts)
        removed = tuple(str(d / name) for name in stale)
        return SinkResult(self.name, True, written, removed,
                          f"{_summary(docs)} for plan {record.sequence} ({len(changed)} file(s) changed)")


def _temporary(name: str) -> bool:
    """A file :func:`atomic_write_text` stages before its rename (``.<name>.<random>.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _summary(docs: Iterable[Mapping[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for d in docs:
        counts[d["kind"]] = counts.get(d["kind"], 0) + 1
    return ", ".join(f"{n} {k}(s)" for k, n in sorted(counts.items())) or "no objects"


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


class KubeObjects:
    """Server-side apply, list and delete of atoll's kinds through the kubernetes client
    (AppsV1Api, CoreV1Api, RbacAuthorizationV1Api, and CustomObjectsApi for LeaderWorkerSets).
    Tests pass an object with the same three methods instead."""

    LWS = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.api_client = api_client
        # Any: the client's generated types are stricter than the plain dicts atoll applies
        self.apps: Any = client.AppsV1Api(api_client)
        self.core: Any = client.CoreV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.rbac: Any = client.RbacAuthorizationV1Api(api_client)

    def _typed(self, kind: str) -> tuple[Any, str] | None:
        """(API object, the method names' kind) of the kinds the generated client knows."""
        return {"Deployment": (self.apps, "deployment"), "Service": (self.core, "service"),
                "ConfigMap": (self.core, "config_map"), "ServiceAccount": (self.core, "service_account"),
                "Role": (self.rbac, "role"), "RoleBinding": (self.rbac, "role_binding")}.get(kind)

    def apply(self, doc: Mapping[str, Any], namespace: str, dry_run: str | None, timeout: float) -> None:
        name = doc["metadata"]["name"]
        kw: dict[str, Any] = {"field_manager": "atoll", "force": True, "dry_run": dry_run,
                              "_content_type": "application/apply-patch+yaml", "_request_timeout": timeout}
        typed = self._typed(doc["kind"])
        if typed:
            getattr(typed[0], f"patch_namespaced_{typed[1]}")(name, namespace, doc, **kw)
        else:
            self.custom.patch_namespaced_custom_object(*self.LWS[:2], namespace, self.LWS[2], name, doc, **kw)

    def list_names(self, kind: str, namespace: str, selector: str, timeout: float) -> list[str]:
        typed = self._typed(kind)
        if typed:
            items = getattr(typed[0], f"list_namespaced_{typed[1]}")(namespace, label_selector=selector,
                                                                      _request_timeout=timeout).items
            return [i.metadata.name for i in items]
        got = self.custom.list_namespaced_custom_object(*self.LWS[:2], namespace, self.LWS[2],
                                                        label_selector=selector, _request_timeout=timeout)
        return [i["metadata"]["name"] for i in got.get("items", [])]

    def delete(self, kind: str, name: str, namespace: str, dry_run: str | None, timeout: float) -> None:
        typed = self._typed(kind)
        if typed:
            getattr(typed[0], f"delete_namespaced_{typed[1]}")(name, namespace, dry_run=dry_run,
                                                               _request_timeout=timeout)
        else:
            self.custom.delete_namespaced_custom_object(*self.LWS[:2], namespace, self.LWS[2], name,
                                                        dry_run=dry_run, _request_timeout=timeout)


class K8sApplySink:
    """``k8s-apply``: server-side apply of the rendered objects (Deployments, LeaderWorkerSets,
    Services) through the kubernetes client, as a server-side dry run unless ``apply`` is True;
    atoll-managed objects the plan no longer names are deleted (dry-run likewise). The cluster
    needs the LeaderWorkerSet CRD for multi-node templates. ``api_factory`` returns a
    :class:`KubeObjects`-like object (tests pass a fake; default: kubeconfig, then in-cluster)."""

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
            return KubeObjects(config.new_client_from_config(
                config_file=path, context=self.context, persist_config=False, client_configuration=cfg))
        except (config.ConfigException, OSError, ValueError, TypeError, KeyError, AttributeError,
                yaml.YAMLError) as exc:
            # a kubeconfig caught half-written (``aws eks update-kubeconfig`` rewrites it in place)
            # is a failed delivery, retried next tick, not an exception out of the controller
            problems.append(f"kubeconfig {path}: {type(exc).__name__}: {str(exc)[:300]}")
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            try:
                cfg = client.Configuration()
                config.load_incluster_config(client_configuration=cfg)
                cfg.retries = 0
                return KubeObjects(client.ApiClient(cfg))
            except config.ConfigException as exc:
                problems.append(f"in-cluster config: {exc}")
        else:
            problems.append("not inside a cluster (KUBERNETES_SERVICE_HOST unset)")
        raise SinkError(f"{self.name}: no Kubernetes cluster configured ({'; '.join(problems)}); point "
                        f"KUBECONFIG at a cluster's kubeconfig, run inside the cluster, or render "
                        f"manifests with the k8s:DIR sink instead")

    def objects(self, record: PlanRecord) -> list[dict[str, Any]]:
        """The validated objects this sink would apply (no cluster needed)."""
        docs = render_manifests(record, self.options)
        for doc in docs:
            validate_object(doc, f"{doc['kind']} {doc['metadata']['name']}")
            if self.options.kube_version:
                where = f"{self.name}: {doc['kind']} {doc['metadata']['name']}"
                check_api(doc, self.options.kube_version, where)
        return docs

    def write(self, record: PlanRecord) -> SinkResult:
        docs = self.objects(record)
        api = self._api()
        ns, dry = self.options.namespace, (None if self.apply else "All")
        written, removed = [], []
        what = "server"
        # only this controller's objects are pruned (an ownerless plan: only ownerless objects)
        owned = f"{CONTROLLER_LABEL}={record.owner}" if record.owner else f"!{CONTROLLER_LABEL}"
        selector = f"{MANAGED_BY[0]}={MANAGED_BY[1]},{owned}"
        try:
            # workloads before the Services that route to them
            for doc in sorted(docs, key=lambda d: _APPLY_ORDER[d["kind"]]):
                what = f"{doc['kind']} {doc['metadata']['name']}"
                api.apply(doc, ns, dry, self.timeout)
                written.append(f"{doc['kind'].lower()}/{doc['metadata']['name']}")
            for kind in _PRUNE_ORDER:
                what = f"the {kind} list"
                wanted = {d["metadata"]["name"] for d in docs if d["kind"] == kind}
                for name in api.list_names(kind, ns, selector, self.timeout):
                    if name not in wanted:
                        what = f"{kind} {name} (deleting)"
                        api.delete(kind, name, ns, dry, self.timeout)
                        removed.append(f"{kind.lower()}/{name}")
        except SinkError:
            raise
        except Exception as exc:  # ApiException, urllib3 errors, time-outs: all mean "not delivered"
            raise SinkError(f"{self.name}: {what} failed: {_api_cause(api, exc)}") from exc
        mode = "applied" if self.apply else "server-side dry run, nothing changed (pass --apply to apply)"
        return SinkResult(self.name, True, tuple(written), tuple(removed),
                          f"{_summary(docs)} for plan {record.sequence}: {mode}")
