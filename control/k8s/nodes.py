"""Which nodes a pod may land on, per cloud: the node labels of EKS (Karpenter), GKE and
NVIDIA GPU Feature Discovery, or a cluster's own.

A plan's template names a region (``aws:us-east-2``), a price tier (on-demand or spot) and a
node config (``4xL40S``, or a slice ``2/8xH100`` of an 8-GPU node). A pod of it selects nodes by:

- **aws -> ``eks``**: Karpenter's well-known labels, which Karpenter knows *before* a node
  exists and so can provision from a pending pod: ``karpenter.k8s.aws/instance-gpu-name``
  (``l40s``, ``h100``, ...), ``karpenter.k8s.aws/instance-gpu-count``, for the A100 sizes
  ``karpenter.k8s.aws/instance-gpu-memory`` (MiB per GPU), ``karpenter.sh/capacity-type``
  (``on-demand`` / ``spot``) and ``topology.kubernetes.io/region``. (GPU Feature Discovery's
  ``nvidia.com/gpu.product`` appears only once a node runs the GPU operator, so a cluster
  autoscaler scaling from zero cannot match it; that preset is ``gfd``.)
- **gcp -> ``gke``**: ``cloud.google.com/gke-accelerator`` (``nvidia-l4``, ``nvidia-h100-80gb``,
  ...), ``cloud.google.com/machine-family`` (``g2``, ``a2``, ``a3``, ``n1``), the machine type
  ``node.kubernetes.io/instance-type`` where the GPU count fixes it (``g2-standard-48`` holds 4
  L4; n1 machines take T4 and V100 in any count, so those go without), and the tier: spot nodes
  carry ``cloud.google.com/gke-spot: "true"``; on-demand nodes carry no such label, so an
  on-demand pod gets a required node affinity ``cloud.google.com/gke-spot NotIn ["true"]``
  (which an absent label satisfies) rather than a selector no node has.
- **anything else -> ``gfd``** (on-premises, ``lab:`` regions): ``nvidia.com/gpu.product``,
  ``nvidia.com/gpu.count``, ``karpenter.sh/capacity-type``, the region label.

A fleet file's ``kubernetes.node_labels`` maps a cloud prefix to a preset name or to a cluster's
own labels (:class:`NodeLabels` fields); each field is validated and an error names it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from atoll.control.plans import SinkError

REGION_LABEL = "topology.kubernetes.io/region"
TIERS = ("on-demand", "spot")
_QUALIFIED = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def _key_ok(owner: str, name: str, key: Any, optional: bool = False) -> None:
    if key is None and optional:
        return
    if not isinstance(key, str) or len(key) > 316 or not _QUALIFIED.fullmatch(key) \
            or len(key.rpartition("/")[2]) > 63:
        raise SinkError(f"{owner}: field '{name}' must be a label key such as 'example.com/gpu' "
                        f"(prefix/name, name <= 63 of A-Z a-z 0-9 - _ .), got {key!r}")


def _values_ok(owner: str, name: str, values: Any, keys: tuple[str, ...] | None = None,
               nullable: bool = False) -> dict[str, str | None]:
    if not isinstance(values, Mapping):
        raise SinkError(f"{owner}: field '{name}' must map names to label values, got {values!r}")
    out: dict[str, str | None] = {}
    for k, v in values.items():
        if keys is not None and k not in keys:
            raise SinkError(f"{owner}: field '{name}' has key {k!r}; valid: {', '.join(keys)}")
        if v is None and nullable:
            out[str(k)] = None
            continue
        if not isinstance(v, str) or len(v) > 63 or not _VALUE.fullmatch(v):
            raise SinkError(f"{owner}: field '{name}' value of {k!r} must be a label value (<= 63 of "
                            f"A-Z a-z 0-9 - _ .), got {v!r}")
        out[str(k)] = v
    return out


@dataclass(frozen=True)
class NodeLabels:
    """How one cluster labels its GPU nodes.

    gpu_key: the label naming the GPU (required); gpu_values: atoll GPU type -> its value (a
    type left out selects ``gpu_key`` = the type's name); count_key: the label of GPUs per node
    (None: not selected); count_values: "<GPU type>/<count>" -> a value replacing the count for
    that pair (GKE's machine types); with ``count_values`` given, a pair left out gets no count
    label (n1 machines take T4 in any count), without it the label's value is the count;
    capacity_key: the tier's label (None: tiers are not selected); capacity_values: tier ->
    value, or None for "the nodes that do not carry the spot value" (a required node affinity
    ``NotIn``); region_key: the region label (None: not selected); family_key/family_values: a
    machine-family label and its value per GPU type; extra: GPU type -> further labels (Karpenter's
    GPU memory tells the A100 sizes apart)."""

    name: str
    gpu_key: str
    gpu_values: Mapping[str, str] = field(default_factory=dict)
    count_key: str | None = None
    count_values: Mapping[str, str] = field(default_factory=dict)
    capacity_key: str | None = None
    capacity_values: Mapping[str, str | None] = field(default_factory=lambda: {t: t for t in TIERS})
    region_key: str | None = REGION_LABEL
    family_key: str | None = None
    family_values: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        owner = f"node_labels {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise SinkError(f"node_labels: field 'name' must be a non-empty string, got {self.name!r}")
        _key_ok(owner, "gpu_key", self.gpu_key)
        for name in ("count_key", "capacity_key", "region_key", "family_key"):
            _key_ok(owner, name, getattr(self, name), optional=True)
        object.__setattr__(self, "gpu_values",
                           MappingProxyType(_values_ok(owner, "gpu_values", self.gpu_values)))
        object.__setattr__(self, "count_values",
                           MappingProxyType(_values_ok(owner, "count_values", self.count_values)))
        object.__setattr__(self, "family_values",
                           MappingProxyType(_values_ok(owner, "family_values", self.family_values)))
        caps = _values_ok(owner, "capacity_values", self.capacity_values, TIERS, nullable=True)
        if self.capacity_key is not None:
            missing = [t for t in TIERS if t not in caps]
            if missing:
                raise SinkError(f"{owner}: field 'capacity_values' lacks tier(s) {missing}; give a value for "
                                f"each of {', '.join(TIERS)} (null: the nodes without the other's value)")
            if all(v is None for v in caps.values()):
                raise SinkError(f"{owner}: field 'capacity_values' needs a label value for at least one tier")
        object.__setattr__(self, "capacity_values", MappingProxyType(caps))
        if not isinstance(self.extra, Mapping):
            raise SinkError(f"{owner}: field 'extra' must map GPU types to labels, got {self.extra!r}")
        extra = {}
        for gpu, labels in self.extra.items():
            checked = _values_ok(owner, f"extra[{gpu}]", labels)
            for k in checked:
                _key_ok(owner, f"extra[{gpu}]", k)
            extra[str(gpu)] = MappingProxyType(checked)
        object.__setattr__(self, "extra", MappingProxyType(extra))

    def select(self, gpu: str, node_gpus: int, region: str, tier: str,
               gpu_override: Mapping[str, str] | None = None) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """(nodeSelector, required node-affinity expressions) of a pod on a node of ``node_gpus``
        GPUs of type ``gpu`` in ``region`` (without the cloud prefix) at ``tier``."""
        if tier not in TIERS:
            raise SinkError(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")
        values = {**self.gpu_values, **(gpu_override or {})}
        selector = {self.gpu_key: values.get(gpu, gpu)}
        if self.family_key and gpu in self.family_values:
            selector[self.family_key] = self.family_values[gpu]
        if self.count_key:
            pair = f"{gpu}/{node_gpus}"
            if pair in self.count_values:
                selector[self.count_key] = self.count_values[pair]
            elif not self.count_values:  # a table of machine types: a pair left out is any shape
                selector[self.count_key] = str(node_gpus)
        selector.update(self.extra.get(gpu, {}))
        if self.region_key:
            selector[self.region_key] = region
        affinity: list[dict[str, Any]] = []
        if self.capacity_key:
            value = self.capacity_values[tier]
            if value is not None:
                selector[self.capacity_key] = value
            else:  # the tier is the absence of the other tiers' values
                others = sorted({v for t, v in self.capacity_values.items() if t != tier and v is not None})
                affinity.append({"key": self.capacity_key, "operator": "NotIn", "values": others})
        return selector, affinity


# Karpenter's instance-gpu-name values are the EC2 API's GPU names, lower-cased.
EKS = NodeLabels(
    "eks", "karpenter.k8s.aws/instance-gpu-name",
    {"T4": "t4", "L4": "l4", "A10G": "a10g", "L40S": "l40s", "V100": "v100", "A100-40GB": "a100",
     "A100-80GB": "a100", "H100": "h100", "H200": "h200"},
    count_key="karpenter.k8s.aws/instance-gpu-count",
    capacity_key="karpenter.sh/capacity-type",
    extra={"A100-40GB": {"karpenter.k8s.aws/instance-gpu-memory": "40960"},
           "A100-80GB": {"karpenter.k8s.aws/instance-gpu-memory": "81920"}})
# GKE's accelerator names; machine types exist for these (GPU type, count) pairs only (g2 holds
# L4, a2-highgpu A100 40GB, a2-ultragpu A100 80GB, a3-highgpu H100, a3-ultragpu H200); T4 and
# V100 attach to n1 machines of any shape.
_GKE_MACHINES = {
    **{f"L4/{n}": m for n, m in ((1, "g2-standard-4"), (2, "g2-standard-24"), (4, "g2-standard-48"),
                                 (8, "g2-standard-96"))},
    **{f"A100-40GB/{n}": f"a2-highgpu-{n}g" for n in (1, 2, 4, 8)},
    **{f"A100-80GB/{n}": f"a2-ultragpu-{n}g" for n in (1, 2, 4, 8)},
    **{f"H100/{n}": f"a3-highgpu-{n}g" for n in (1, 2, 4, 8)},
    "H200/8": "a3-ultragpu-8g",
}
GKE = NodeLabels(
    "gke", "cloud.google.com/gke-accelerator",
    {"T4": "nvidia-tesla-t4", "L4": "nvidia-l4", "V100": "nvidia-tesla-v100",
     "A100-40GB": "nvidia-tesla-a100", "A100-80GB": "nvidia-a100-80gb", "H100": "nvidia-h100-80gb",
     "H200": "nvidia-h200-141gb"},
    count_key="node.kubernetes.io/instance-type", count_values=_GKE_MACHINES,
    capacity_key="cloud.google.com/gke-spot", capacity_values={"on-demand": None, "spot": "true"},
    family_key="cloud.google.com/machine-family",
    family_values={"T4": "n1", "V100": "n1", "L4": "g2", "A100-40GB": "a2", "A100-80GB": "a2", "H100": "a3",
                   "H200": "a3"})
# NVIDIA GPU Feature Discovery's product names (the GPU operator labels each node it runs on).
GFD = NodeLabels(
    "gfd", "nvidia.com/gpu.product",
    {"T4": "Tesla-T4", "L4": "NVIDIA-L4", "A10G": "NVIDIA-A10G", "L40S": "NVIDIA-L40S",
     "V100": "Tesla-V100-SXM2-16GB", "A100-40GB": "NVIDIA-A100-SXM4-40GB",
     "A100-80GB": "NVIDIA-A100-SXM4-80GB", "H100": "NVIDIA-H100-80GB-HBM3", "H200": "NVIDIA-H200"},
    count_key="nvidia.com/gpu.count", capacity_key="karpenter.sh/capacity-type")
PRESETS: Mapping[str, NodeLabels] = MappingProxyType({p.name: p for p in (EKS, GKE, GFD)})
DEFAULT_CLOUDS: Mapping[str, str] = MappingProxyType({"aws": "eks", "gcp": "gke"})
DEFAULT_PRESET = "gfd"


def node_labels_for(region: str, overrides: Mapping[str, NodeLabels]) -> NodeLabels:
    """The labels of ``region``'s cloud (its prefix before ':'): a fleet's override, else the
    cloud's preset, else GPU Feature Discovery's."""
    cloud = region.split(":", 1)[0] if ":" in region else ""
    if cloud in overrides:
        return overrides[cloud]
    if "*" in overrides:
        return overrides["*"]
    return PRESETS[DEFAULT_CLOUDS.get(cloud, DEFAULT_PRESET)]


def parse_node_labels(section: Any, where: str = "kubernetes.node_labels") -> dict[str, NodeLabels]:
    """A fleet file's ``node_labels``: cloud prefix (``aws``, ``gcp``, ``lab``, or ``*`` for every
    cloud not named) -> a preset name (eks, gke, gfd) or a mapping of :class:`NodeLabels`
    fields (``name`` defaults to the cloud). Errors name the cloud and the field."""
    if isinstance(section, NodeLabels):
        raise SinkError(f"{where}: give a mapping of cloud prefixes, not one NodeLabels")
    if not isinstance(section, Mapping):
        raise SinkError(f"{where}: must map cloud prefixes (aws, gcp, lab, '*') to a preset "
                        f"({', '.join(PRESETS)}) or labels, got {section!r}")
    allowed = {f.name for f in fields(NodeLabels)}
    out: dict[str, NodeLabels] = {}
    for cloud, spec in section.items():
        here = f"{where}[{cloud}]"
        if not isinstance(cloud, str) or not (cloud == "*" or re.fullmatch(r"[a-z0-9][-a-z0-9]*", cloud)):
            raise SinkError(f"{here}: a cloud prefix is the part of region names before ':' (aws, gcp, lab) "
                            f"or '*', got {cloud!r}")
        if isinstance(spec, NodeLabels):
            out[cloud] = spec
            continue
        if isinstance(spec, str):
            if spec not in PRESETS:
                raise SinkError(f"{here}: unknown preset {spec!r}; valid: {', '.join(PRESETS)} (or a mapping "
                                f"of {', '.join(sorted(allowed - {'name'}))})")
            out[cloud] = PRESETS[spec]
            continue
        if not isinstance(spec, Mapping):
            raise SinkError(f"{here}: must be a preset name ({', '.join(PRESETS)}) or a mapping of labels, "
                            f"got {spec!r}")
        extra = sorted(set(spec) - allowed)
        if extra:
            raise SinkError(f"{here}: unknown field(s) {extra}; valid: {', '.join(sorted(allowed))}")
        if "gpu_key" not in spec:
            raise SinkError(f"{here}: field 'gpu_key' is required (the label that names the GPU)")
        try:
            out[cloud] = NodeLabels(**{"name": cloud, **spec})
        except SinkError as exc:
            raise SinkError(f"{here}: {exc}") from None
    return out
