"""Plan sinks: where a new plan goes, chosen by a spec string.

- ``json:DIR``: ``DIR/plan-<sequence:06d>.json`` per plan change plus ``DIR/latest.json``, each
  written atomically (temporary file + ``os.replace``); the newest ``keep`` (200) numbered plans
  are kept, and a folder whose ``latest.json`` another controller wrote is refused;
- ``k8s:DIR``: rendered Kubernetes objects that start vLLM (Deployments, LeaderWorkerSets,
  Services; see ``atoll.control.k8s.render``), validated, stale ones deleted;
- ``k8s-apply[:NAMESPACE]``: server-side apply through the kubernetes client; a server-side
  dry run unless ``apply=True``;
- ``metrics:PORT`` (or ``metrics:HOST:PORT``; 127.0.0.1 unless a host is given): owns no
  workload; serves the delivered plan's desired replicas per template on ``/metrics`` for HPA's
  external metrics or KEDA's Prometheus scaler — with the plan's $/h (also per price tier), each
  model's planning demand, forecast and estimated SLO attainment and the last tick's time — and an
  example KEDA ScaledObject per workload on ``/scaledobjects.yaml`` (:mod:`atoll.control.k8s.scale`).
  It cannot starve the controller: every connection has a time-out, at most ``max_connections`` are served
  at once (more are closed at once, counted), the listen backlog is sized for a fleet of scrapers,
  and running out of file descriptors is named as such.

Every sink writes the *whole* plan (not just the diff), so delivering a record is idempotent
and a newer record supersedes an older undelivered one. :func:`deliver` retries; see it for
the rule that keeps a failed plan from being lost.

The modules: :mod:`~atoll.control.sinks.json_dir`, :mod:`~atoll.control.sinks.metrics_server` and
the Kubernetes sinks of :mod:`atoll.control.k8s.apply`; this package holds the protocol, the
factory (:func:`make_sink`), the dry run and :func:`deliver`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from atoll.control.k8s.apply import K8sApplySink, K8sManifestSink, K8sOptions, dump_yaml_all
from atoll.control.plans import PlanRecord, SinkError, SinkResult
from atoll.control.sinks.json_dir import JsonDirSink
from atoll.control.sinks.metrics_server import METRICS_HOST, SINK_SPECS, MetricsSink, metrics_address

__all__ = ["METRICS_HOST", "SINK_SPECS", "DryRunSink", "JsonDirSink", "K8sApplySink", "K8sManifestSink",
           "K8sOptions", "MetricsSink", "PlanRecord", "PlanSink", "SinkError", "SinkResult", "deliver",
           "make_sink"]


class PlanSink(Protocol):
    """Delivers a :class:`PlanRecord`; raises :class:`SinkError` when it cannot."""

    name: str

    def write(self, record: PlanRecord) -> SinkResult: ...


class DryRunSink:
    """``--dry-run``: renders what the sink ``spec`` would be given — the plan record, and for
    the Kubernetes sinks the manifests — and delivers nothing."""

    def __init__(self, spec: str, options: K8sOptions | None = None) -> None:
        kind, _, arg = spec.partition(":")
        if kind not in ("json", "k8s", "k8s-apply", "metrics") or (kind in ("json", "k8s") and not arg):
            raise SinkError(f"unknown plan sink {spec!r}; use {SINK_SPECS}")
        if kind == "metrics":
            metrics_address(arg)
        self.spec, self.kind, self.options = spec, kind, options or K8sOptions()
        self.name = f"dry-run:{spec}"
        self.rendered: list[dict[str, Any]] = []

    def write(self, record: PlanRecord) -> SinkResult:
        from atoll.control.k8s.render import render_manifests

        doc: dict[str, Any] = {"plan": record.as_dict()}
        if self.kind in ("k8s", "k8s-apply"):
            doc["manifests"] = render_manifests(record, self.options)
        self.rendered.append(doc)
        return SinkResult(self.name, True, (), (),
                          f"plan {record.sequence}: rendered, not delivered (dry run)")

    def text(self) -> str:
        """What was rendered, as YAML documents (the manifests, or the plan)."""
        if not self.rendered:
            return "dry run: no plan to deliver"
        docs = [m for d in self.rendered for m in d.get("manifests", [])] or \
            [d["plan"] for d in self.rendered]
        return dump_yaml_all(docs)


def make_sink(spec: str, *, apply: bool = False, image: str | None = None,
              options: K8sOptions | None = None) -> PlanSink:
    """The sink a spec names; ``apply`` (only for k8s-apply) turns the dry run into a real
    apply; ``options`` (a fleet file's kubernetes section) configure the Kubernetes sinks, and
    ``image`` overrides their serving image; ``k8s-apply:NAMESPACE`` overrides the namespace."""
    kind, sep, arg = spec.partition(":")
    if apply and kind != "k8s-apply":
        raise SinkError(f"--apply only applies to the k8s-apply sink, not {spec!r}; drop --apply or use "
                        f"--sink k8s-apply")
    base = options or K8sOptions()
    if image:
        base = replace(base, image=image)
    if kind == "json" and arg:
        return JsonDirSink(Path(arg))
    if kind == "k8s" and arg:
        return K8sManifestSink(Path(arg), base)
    if kind == "k8s-apply" and (arg or not sep):
        return K8sApplySink(replace(base, namespace=arg) if arg else base, apply=apply)
    if kind == "metrics" and arg:
        host, port = metrics_address(arg)
        return MetricsSink(port, host, base)
    raise SinkError(f"unknown plan sink {spec!r}; use {SINK_SPECS}")


def deliver(sink: PlanSink, record: PlanRecord, attempts: int = 3, backoff_s: float = 1.0,
            sleep: Callable[[float], None] = time.sleep) -> SinkResult:
    """``sink.write(record)``, retried up to ``attempts`` times in all with waits of
    ``backoff_s``, ``2 x backoff_s``, ... between them.

    Never raises :class:`SinkError`: after the last failure it returns ``ok=False`` with the
    cause. The plan must not be lost then, so the caller:
    1. keeps ``record`` as ``ControllerState.pending`` and persists the state before anything
       else, and keeps counting its running plan as the last *delivered* one;
    2. delivers the pending record again at the next tick, before solving;
    3. if it solves a newer plan meanwhile, builds the new record's diff against the last
       delivered plan (not the pending one) and lets it replace the pending record: sinks
       write whole plans, so the newer record carries everything the older one did.
    """
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"deliver: 'attempts' must be an integer >= 1, got {attempts!r}")
    if not (math.isfinite(backoff_s) and backoff_s >= 0):
        raise ValueError(f"deliver: 'backoff_s' must be >= 0, got {backoff_s!r}")
    last = ""
    for attempt in range(1, attempts + 1):
        try:
            result = sink.write(record)
        except Exception as exc:  # noqa: BLE001 - any sink failure is a held plan, retried next tick
            # (a sink's own errors are SinkErrors; anything else — a parser's error out of a
            # half-written kubeconfig — must not take the controller down either)
            last = str(exc) if isinstance(exc, SinkError) else f"{type(exc).__name__}: {exc}"
            if attempt < attempts:
                sleep(backoff_s * 2 ** (attempt - 1))
            continue
        return SinkResult(result.sink, result.ok, result.written, result.removed, result.message, attempt)
    return SinkResult(sink.name, False, (), (),
                      f"plan {record.sequence} not delivered after {attempts} attempt(s): {last}; "
                      f"kept as pending", attempts)
