"""Scaling what a cluster already runs: the desired replicas of a plan as Prometheus metrics
(served by the ``metrics:PORT`` sink, :class:`atoll.control.sinks.MetricsSink`) and an example
KEDA ``ScaledObject`` per workload that reads them.

``atoll_desired_replicas{model, phase, template, region, tier, workload}`` is a template's
instances in the plan last delivered; ``workload`` is the Deployment or LeaderWorkerSet name
the ``k8s:DIR`` sink would give it (a team scaling its own Deployments points the
ScaledObject's ``scaleTargetRef`` at theirs). A template that left the plan stays at 0, so a
ScaledObject that reads it scales its workload to zero rather than losing its metric.
``atoll_plan_sequence`` is the delivered plan's number, ``atoll_desired_nodes{pool}`` the nodes
each pool pays for.

The ScaledObject's Prometheus trigger uses ``metricType: AverageValue`` with ``threshold: 1``:
the HPA KEDA drives then wants ceil(value / 1) = the desired replicas; ``ignoreNullValues:
"false"`` turns an empty answer (atoll's target lost) into an error that holds the replicas
instead of KEDA's default reading of 0 (``pkg/scalers/prometheus_scaler.go``, KEDA v2.20.2).
Make-before-break is the controller's (``atoll.control.controller``): it delivers a plan with
the additions first (old and new templates both desired) and the removals only once the
additions are ready, so the metric never asks to remove before the replacement serves.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from atoll.control.k8s.render import (
    CONTROLLER_LABEL,
    LWS_API,
    MANAGED_BY,
    K8sOptions,
    node_pools,
    vllm_stages,
    workload_name,
)
from atoll.control.plans import PlanRecord

KEDA_API = "keda.sh/v1alpha1"
DESIRED = "atoll_desired_replicas"
SEQUENCE = "atoll_plan_sequence"
NODES = "atoll_desired_nodes"


class DesiredPage(NamedTuple):
    """What a scrape of the metrics sink's page reads: template -> desired replicas, the plan
    sequence (None before the first plan) and template -> the labels of its series."""

    replicas: dict[str, float]
    sequence: float | None
    labels: dict[str, dict[str, str]]


def read_desired(text: str) -> DesiredPage:
    """The desired replicas and the plan sequence of an exposition the metrics sink serves (the
    text format, parsed with prometheus_client's parser, as Prometheus or KEDA reads it)."""
    replicas: dict[str, float] = {}
    labels: dict[str, dict[str, str]] = {}
    sequence = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == DESIRED:
                replicas[s.labels["template"]] = s.value
                labels[s.labels["template"]] = s.labels
            elif s.name == SEQUENCE:
                sequence = s.value
    return DesiredPage(replicas, sequence, labels)


def desired_rows(record: PlanRecord, options: K8sOptions, seen: dict[str, dict[str, str]] | None = None
                 ) -> list[tuple[dict[str, str], int]]:
    """(labels, desired replicas) per template of ``record`` and, at 0, per template in
    ``seen`` (labels of templates exported before) that the record no longer plans; ``seen``
    is updated with this record's templates."""
    rows: dict[str, tuple[dict[str, str], int]] = {}
    for key, d in record.templates.items():
        labels = {"model": str(d["model"]), "phase": str(d["phase"]), "template": key,
                  "region": str(d["region"]), "tier": str(d.get("tier") or options.capacity_type),
                  "workload": workload_name(str(d["model"]), str(d["phase"]), key, record.owner)}
        rows[key] = (labels, record.plan.get(key, 0))
    for key, labels in (seen or {}).items():
        if key not in rows:
            rows[key] = (labels, 0)
    if seen is not None:
        seen.update({k: labels for k, (labels, _) in rows.items()})
    return [rows[k] for k in sorted(rows)]


def scaled_object(record: PlanRecord, key: str, options: K8sOptions, prometheus_url: str,
                  max_replicas: int = 64) -> dict[str, Any]:
    """An example KEDA ScaledObject that scales template ``key``'s workload to the desired
    replicas the metrics sink exports (Prometheus at ``prometheus_url`` scrapes the sink)."""
    d = record.templates[key]
    model, phase = str(d["model"]), str(d["phase"])
    name = workload_name(model, phase, key, record.owner)
    lws = len(vllm_stages(key, d)) > 1
    target = ({"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "name": name} if lws
              else {"apiVersion": "apps/v1", "kind": "Deployment", "name": name})
    owned = {CONTROLLER_LABEL: record.owner} if record.owner else {}
    return {
        "apiVersion": KEDA_API, "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": options.namespace,
                     "labels": {MANAGED_BY[0]: MANAGED_BY[1], **owned},
                     "annotations": {"atoll.io/template-key": key, "atoll.io/model-name": model}},
        "spec": {
            "scaleTargetRef": target,
            # 0: a template the plan dropped scales away; the controller's floors keep a model up
            "minReplicaCount": 0, "maxReplicaCount": max_replicas,
            "pollingInterval": 15, "cooldownPeriod": 300,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                # the controller already waited for readiness before lowering a count
                "scaleDown": {"stabilizationWindowSeconds": 60},
                "scaleUp": {"stabilizationWindowSeconds": 0}}}},
            "triggers": [{"type": "prometheus", "metricType": "AverageValue", "metadata": {
                "serverAddress": prometheus_url,
                "query": f'max({DESIRED}{{workload="{name}"}})',
                "threshold": "1", "activationThreshold": "0.5",
                # KEDA's default (true) reads an empty answer as 0: a Prometheus that lost atoll's
                # target would scale every workload to zero. False makes it an error, and the HPA
                # keeps the replicas it has (missing data never scales a model to zero)
                "ignoreNullValues": "false"}}]}}


def scaled_objects(record: PlanRecord, options: K8sOptions, prometheus_url: str) -> list[dict[str, Any]]:
    """One ScaledObject per planned template, by name."""
    out = [scaled_object(record, key, options, prometheus_url) for key in record.plan]
    return sorted(out, key=lambda d: d["metadata"]["name"])


def pool_rows(record: PlanRecord) -> list[tuple[dict[str, str], int]]:
    return [({"pool": pool}, n) for pool, n in sorted(node_pools(record).items())]
