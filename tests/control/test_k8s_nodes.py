"""Node selection per cloud: aws -> Karpenter's labels, gcp -> GKE's, others -> GPU Feature
Discovery's, spot and on-demand for each; a fleet file's own labels, validated by field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from atoll.control.cli.control import _k8s_options
from atoll.control.k8s.apply import validate_object
from atoll.control.k8s.nodes import EKS, GFD, GKE, NodeLabels, node_labels_for, parse_node_labels
from atoll.control.k8s.render import K8sOptions, k8s_options, render_manifests
from atoll.control.plans import PlanRecord, SinkError
from atoll.solvers.problem import Allocation
from atoll.solvers.tiers import tiered_region
from atoll.solvers.types import Phase, Service, Stage, Template

K8S_VERSION = kubernetes_validate.latest_version()


def template(region: str, config: str, phase: Phase = Phase.DECODE) -> Template:
    return Template(Service("Phi-4-14B", phase), region, ((config, 1),), (Stage(40, (config,)),), 100.0)


def pod_of(region: str, config: str, options: K8sOptions | None = None) -> dict[str, Any]:
    t = template(region, config)
    record = PlanRecord.from_allocation(1, 0.0, Allocation.of({t.key: 1}), None, {t.key: t}, {}, "t")
    docs = render_manifests(record, options or K8sOptions())
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        validate_object(d)
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    pod: dict[str, Any] = dep["spec"]["template"]["spec"]
    return pod


def not_in(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"]


def test_a_gke_plan_selects_gke_labels_for_both_tiers() -> None:
    on_demand = pod_of("gcp:us-central1", "4xL4")
    assert on_demand["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-l4", "cloud.google.com/machine-family": "g2",
        "node.kubernetes.io/instance-type": "g2-standard-48", "topology.kubernetes.io/region": "us-central1"}
    assert not_in(on_demand) == [{"key": "cloud.google.com/gke-spot", "operator": "NotIn",
                                  "values": ["true"]}]
    spot = pod_of(tiered_region("gcp:us-central1", "spot"), "8xH100")
    assert spot["nodeSelector"]["cloud.google.com/gke-spot"] == "true" and "affinity" not in spot
    assert spot["nodeSelector"]["cloud.google.com/gke-accelerator"] == "nvidia-h100-80gb"
    assert spot["nodeSelector"]["node.kubernetes.io/instance-type"] == "a3-highgpu-8g"
    # T4 rides n1 machines of any shape: no machine type, the family and the accelerator only
    t4 = pod_of("gcp:us-central1", "2xT4")["nodeSelector"]
    assert "node.kubernetes.io/instance-type" not in t4 and t4["cloud.google.com/machine-family"] == "n1"
    # a slice selects the 8-GPU machine it shares
    assert pod_of("gcp:us-central1", "2/8xA100-80GB")["nodeSelector"][
        "node.kubernetes.io/instance-type"] == "a2-ultragpu-8g"


def test_an_eks_plan_selects_karpenter_labels_for_both_tiers() -> None:
    od = pod_of("aws:us-east-2", "8xA100-40GB")["nodeSelector"]
    assert od == {"karpenter.k8s.aws/instance-gpu-name": "a100", "karpenter.k8s.aws/instance-gpu-count": "8",
                  "karpenter.k8s.aws/instance-gpu-memory": "40960", "karpenter.sh/capacity-type": "on-demand",
                  "topology.kubernetes.io/region": "us-east-2"}
    spot = pod_of(tiered_region("aws:us-east-2", "spot"), "1xL40S")
    assert spot["nodeSelector"]["karpenter.sh/capacity-type"] == "spot" and "affinity" not in spot
    # the fleet's default tier applies to templates without one
    assert pod_of("aws:us-east-2", "1xL4", K8sOptions(capacity_type="spot"))["nodeSelector"][
        "karpenter.sh/capacity-type"] == "spot"


def test_other_clouds_default_to_gpu_feature_discovery_and_can_be_overridden() -> None:
    lab = pod_of("lab:rack-1", "8xH100")["nodeSelector"]
    assert lab["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3" and lab["nvidia.com/gpu.count"] == "8"
    assert node_labels_for("azure:eastus", {}) is GFD and node_labels_for("aws:x", {}) is EKS
    assert node_labels_for("gcp:x", {}) is GKE and node_labels_for("lab:x", {"*": EKS}) is EKS
    own = {"lab": {"gpu_key": "example.com/gpu", "gpu_values": {"H100": "h100-sxm"},
                   "capacity_key": "example.com/tier",
                   "capacity_values": {"on-demand": "reserved", "spot": "preemptible"},
                   "region_key": None},
           "aws": "gfd"}
    options = k8s_options({"node_labels": own})
    sel = pod_of("lab:rack-1", "8xH100", options)["nodeSelector"]
    assert sel == {"example.com/gpu": "h100-sxm", "example.com/tier": "reserved"}
    assert pod_of("aws:us-east-2", "1xL4", options)["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
    # gpu_products (every cloud) and capacity_label still apply on top of a preset
    legacy = K8sOptions(gpu_products={"L4": "L4-PCIE"}, capacity_label="example.com/capacity")
    sel = pod_of("aws:us-east-2", "1xL4", legacy)["nodeSelector"]
    assert sel["karpenter.k8s.aws/instance-gpu-name"] == "L4-PCIE"
    assert sel["example.com/capacity"] == "on-demand"


@pytest.mark.parametrize("spec, message", [
    ({"lab": "aks"}, r"node_labels\[lab\]: unknown preset 'aks'; valid: eks, gke, gfd"),
    ({"lab": {"gpu_values": {}}}, r"node_labels\[lab\]: field 'gpu_key' is required"),
    ({"lab": {"gpu_key": "bad key!"}}, r"node_labels\[lab\]: .*field 'gpu_key' must be a label key"),
    ({"lab": {"gpu_key": "g", "gpu_values": {"H100": "not ok!"}}},
     r"field 'gpu_values' value of 'H100' must be a label value"),
    ({"lab": {"gpu_key": "g", "capacity_key": "t", "capacity_values": {"spot": "s"}}},
     r"field 'capacity_values' lacks tier\(s\) \['on-demand'\]"),
    ({"lab": {"gpu_key": "g", "capacity_values": {"reserved": "r"}}},
     r"field 'capacity_values' has key 'reserved'; valid: on-demand, spot"),
    ({"lab": {"gpu_key": "g", "colour": "blue"}}, r"node_labels\[lab\]: unknown field\(s\) \['colour'\]"),
    ({"AWS": "eks"}, r"node_labels\[AWS\]: a cloud prefix"),
    (["eks"], r"must map cloud prefixes"),
])
def test_bad_overrides_name_the_field(spec: Any, message: str) -> None:
    with pytest.raises(SinkError, match=message):
        k8s_options({"node_labels": spec}, "fleet.yaml: kubernetes")
    with pytest.raises(SinkError, match="^fleet.yaml: kubernetes: "):
        k8s_options({"node_labels": spec}, "fleet.yaml: kubernetes")


def test_parse_keeps_node_labels_objects_and_presets() -> None:
    own = NodeLabels("lab", "example.com/gpu")
    assert parse_node_labels({"lab": own, "gcp": "gke"}) == {"lab": own, "gcp": GKE}


def test_the_fleet_files_kubernetes_section_reaches_the_renderer(tmp_path: Path) -> None:
    fleet = {"name": "acme", "models": ["Phi-4-14B"],
             "regions": [{"name": "gcp:us-central1", "catalog": True, "gpu_types": ["L4"]}],
             "workloads": {"Phi-4-14B": {"source": "servegen:m-large", "mean_rate": 2.0}},
             "kubernetes": {"namespace": "llm", "capacity_type": "spot",
                            "node_labels": {"gcp": {"gpu_key": "acme.io/gpu", "region_key": None}}}}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    from atoll.control.cli import build_parser

    args = build_parser().parse_args(["control", "--scrape", "http://x", "--state", str(tmp_path / "s"),
                                      "--sink", f"k8s:{tmp_path / 'k'}", "--fleet", str(path)])
    options = _k8s_options(args)
    assert pod_of("gcp:us-central1", "1xL4", options)["nodeSelector"] == {"acme.io/gpu": "L4"}
    fleet["kubernetes"]["node_labels"] = {"gcp": {"gpu_key": "acme.io/gpu", "count_key": "no good"}}
    path.write_text(yaml.safe_dump(fleet))
    with pytest.raises(Exception, match=r"fleet.yaml: kubernetes: .*node_labels\[gcp\].*'count_key'"):
        _k8s_options(args)
