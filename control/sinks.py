"""Plan sinks: where a new plan goes, chosen by a spec string.

- ``json:DIR``: ``DIR/plan-<sequence:06d>.json`` per plan change plus ``DIR/latest.json``, each
  written atomically (temporary file + ``os.replace``); the newest ``keep`` (200) numbered plans
  are kept, and a folder whose ``latest.json`` another controller wrote is refused;
- ``k8s:DIR``: rendered Kubernetes objects that start vLLM (Deployments, LeaderWorkerSets,
  Services; see ``atoll.control.k8s_render``), validated, stale ones deleted;
- ``k8s-apply[:NAMESPACE]``: server-side apply through the kubernetes client; a server-side
  dry run unless ``apply=True``.

Every sink writes the *whole* plan (not just the diff), so delivering a record is idempotent
and a newer record supersedes an older undelivered one. :func:`deliver` retries; see it for
the rule that keeps a failed plan from being lost.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from atoll.control.k8s import K8sApplySink, K8sManifestSink, K8sOptions
from atoll.control.plans import PlanRecord, SinkError, SinkResult, atomic_write_text

__all__ = ["JsonDirSink", "K8sApplySink", "K8sManifestSink", "K8sOptions", "PlanRecord", "PlanSink",
           "SinkError", "SinkResult", "deliver", "make_sink"]

SINK_SPECS = "json:DIR, k8s:DIR or k8s-apply[:NAMESPACE]"


class PlanSink(Protocol):
    """Delivers a :class:`PlanRecord`; raises :class:`SinkError` when it cannot."""

    name: str

    def write(self, record: PlanRecord) -> SinkResult: ...


class JsonDirSink:
    """``json:DIR``: one JSON file per plan plus ``latest.json`` (the same document); the newest
    ``keep`` numbered files are kept (a month of 5 s ticks must not fill the disk)."""

    def __init__(self, directory: Path | str, keep: int = 200) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise SinkError(f"JsonDirSink: field 'keep' must be an integer >= 1, got {keep!r}")
        self.directory = Path(directory)
        self.keep = keep
        self.name = f"json:{self.directory}"

    def _check_owner(self, latest: Path, owner: str) -> None:
        try:
            theirs = json.loads(latest.read_text(encoding="utf-8")).get("owner", "")
        except (OSError, ValueError, AttributeError):
            return  # no plan yet, or not one of ours to judge: it is replaced
        if theirs and owner and theirs != owner:
            raise SinkError(f"{self.name}: {latest} was written by controller {theirs!r}, this one is "
                            f"{owner!r}; give each controller its own json:DIR folder")

    def write(self, record: PlanRecord) -> SinkResult:
        text = json.dumps(record.as_dict(), indent=2) + "\n"
        path = self.directory / f"plan-{record.sequence:06d}.json"
        latest = self.directory / "latest.json"
        removed: list[str] = []
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._check_owner(latest, record.owner)
            # the numbered file first: latest.json never names a plan whose own file is missing
            atomic_write_text(path, text)
            atomic_write_text(latest, text)
            plans = sorted(self.directory.glob("plan-[0-9]*.json"))  # zero-padded: oldest first
            for old in plans[:-self.keep]:
                old.unlink(missing_ok=True)
                removed.append(str(old))
            for tmp in self.directory.glob(".*.json.*.tmp"):  # left by a write killed mid-way
                tmp.unlink(missing_ok=True)
        except OSError as exc:
            raise SinkError(f"{self.name}: cannot write {path.name} ({exc}); check that the directory is "
                            f"writable and the disk not full") from exc
        return SinkResult(self.name, True, (str(path), str(latest)), tuple(removed),
                          f"plan {record.sequence}: {len(record.plan)} template(s), "
                          f"{len(record.diff)} changed")


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
