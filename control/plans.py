"""What the controller hands to a plan sink: :class:`PlanRecord`, and the sinks' shared types.

A record is self-contained: the full plan (template key -> instances), a description of every
template it names (so a sink needs no template library to render it), the diff against the
plan delivered before, the demand it was solved for and why it was made. Records are plain
JSON (``as_dict`` / ``from_dict``) so an undelivered one can be persisted with the controller
state and delivered after a restart.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from atoll.solvers.errors import AtollError
from atoll.solvers.packing import Packing, PackingError, PlacedSlice, check_slices, describe_packing
from atoll.solvers.problem import Allocation
from atoll.solvers.tiers import TIERS, split_tier, tiered_region
from atoll.solvers.types import Template, node_config_of, parse_config_name

TEMPLATE_FIELDS: tuple[str, ...] = ("service", "model", "phase", "region", "nodes", "stages", "throughput")


class SinkError(AtollError):
    """A plan could not be delivered (or a sink spec is malformed); the message names the sink,
    the thing that failed and what to do."""


def describe_template(t: Template, default_tier: str = "") -> dict[str, Any]:
    """The JSON description of a template that a :class:`PlanRecord` carries: ``region`` is the
    plain region and ``tier`` its price tier — ``spot`` for a spot tier's template (see
    :mod:`atoll.solvers.tiers`), ``default_tier`` for a plain region's (the live controller
    names every line's tier this way); without a tier the Kubernetes sinks' ``capacity_type``
    applies."""
    region, tier = split_tier(t.region, default=default_tier)
    return {"service": t.service.name, "model": t.service.model, "phase": t.service.phase.value,
            "region": region, **({"tier": tier} if tier else {}), "nodes": [[c, k] for c, k in t.nodes],
            "stages": [[s.layers, list(s.nodes)] for s in t.stages], "throughput": float(t.throughput),
            # a co-located template serves both phases: its generated tokens/s beside the prompt's
            **({"decode_throughput": float(t.decode_throughput)} if t.colocated else {})}


def _check_description(owner: str, key: str, d: Any) -> None:
    if not isinstance(d, Mapping) or any(f not in d for f in TEMPLATE_FIELDS):
        have = sorted(d) if isinstance(d, Mapping) else type(d).__name__
        raise ValueError(f"{owner}: field 'templates' entry {key!r} needs fields {list(TEMPLATE_FIELDS)}, "
                         f"got {have}")
    nodes = d["nodes"]
    if not nodes or not all(isinstance(n, list | tuple) and len(n) == 2 and isinstance(n[0], str)
                            and isinstance(n[1], int) and n[1] >= 1 for n in nodes):
        raise ValueError(f"{owner}: template {key!r} field 'nodes' must be [[config, count >= 1], ...], "
                         f"got {nodes!r}")


def _packing_violations(plan: Mapping[str, int], templates: Mapping[str, Mapping[str, Any]],
                        packing: Packing) -> list[str]:
    """:func:`atoll.solvers.packing.check_slices` of ``packing`` against the plan's stages, read
    from the templates' descriptions (a record needs no library)."""
    want: dict[tuple[str, str], list[tuple[PlacedSlice, int]]] = {}
    for key, n in plan.items():
        d = templates[key]
        region = tiered_region(d["region"], d["tier"]) if d.get("tier") else d["region"]
        for j, (_, configs) in enumerate(d["stages"]):
            for c in configs:
                g, node_gpus, _ = parse_config_name(c)
                want.setdefault((region, node_config_of(c)), []).extend(
                    (PlacedSlice(key, i, j, g), node_gpus) for i in range(n))
    return check_slices(want, packing)


def _checked_bill(owner: str, bill: Any) -> dict[str, Any]:
    """A plan's bill: a finite ``usd_per_h`` >= 0 equal to its lines' sum, each line a tier."""
    if not isinstance(bill, Mapping) or not isinstance(bill.get("lines"), list):
        raise ValueError(f"{owner}: field 'bill' must be a mapping with 'usd_per_h' and a 'lines' list "
                         f"(atoll.control.plan_view.plan_bill), got {bill!r:.120}")
    total = bill.get("usd_per_h")
    if isinstance(total, bool) or not isinstance(total, int | float) or not math.isfinite(total) or total < 0:
        raise ValueError(f"{owner}: field 'bill' 'usd_per_h' must be finite and >= 0, got {total!r}")
    lines = 0.0
    for line in bill["lines"]:
        cost = line.get("cost_per_hour") if isinstance(line, Mapping) else None
        if not isinstance(line, Mapping) or line.get("tier") not in TIERS or isinstance(cost, bool) \
                or not isinstance(cost, int | float) or not math.isfinite(cost) or cost < 0:
            raise ValueError(f"{owner}: field 'bill' line {line!r:.120} needs a 'tier' ({', '.join(TIERS)}) "
                             f"and a finite 'cost_per_hour' >= 0")
        lines += float(cost)
    if not math.isclose(lines, float(total), rel_tol=1e-9, abs_tol=1e-6):
        raise ValueError(f"{owner}: field 'bill' says usd_per_h {total!r}, its lines sum to {lines!r}")
    return dict(bill)


@dataclass(frozen=True)
class PlanRecord:
    """One plan as delivered to sinks.

    sequence: increasing plan number (file names and ordering); created_s: when it was made
    (seconds, the controller's clock); plan: template key -> instances (> 0); templates: key ->
    description (service "model/phase", model, phase, region, nodes [[config, count]], stages
    [[layers, [configs]]], throughput tokens/s) for every key in ``plan`` and, when known, in
    ``diff``; diff: key -> instances added (> 0) or removed (< 0) against the plan delivered
    before; demand: service -> tokens/s it was solved for; reason: why it was made; shapes:
    model -> the request shape of each re-optimized model's traffic against the one its
    templates were profiled at (``atoll.control.live_demand.ShapeReport.as_dict``: profiled,
    measured, ratio, mix, source, tolerance, drifted, message), so a plan solved for a drifted
    shape says so. correction: family -> the capacity factor the plan was solved with (learned
    online from the servers' latency and throughput, :mod:`atoll.envs.correction`; families
    absent are 1). packing: for a fleet with slices (several instances per node), the
    nodes the plan holds (:func:`atoll.solvers.packing.describe_packing`: ``nodes_per_pool``
    "region/config" -> nodes, ``nodes`` [{region, config, gpus, used_gpus, slices [[template,
    instance, stage, GPUs]]}], ``extra_nodes`` when a pool holds more than ceil(use)); running
    slices stay on their nodes from one plan to the next (:func:`atoll.solvers.packing.repack`);
    None for whole-node fleets. bill: what the plan costs per hour, one line per (region, node
    config, tier) at that tier's price (:func:`atoll.control.plan_view.plan_bill`); the live
    controller prices every record it makes, and names every template's ``tier``.
    """

    sequence: int
    created_s: float
    plan: dict[str, int]
    templates: dict[str, dict[str, Any]]
    diff: dict[str, int] = field(default_factory=dict)
    demand: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    shapes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the controller that made it (ControllerState.controller_id): sinks label every object and
    # file with it and prune only their own
    owner: str = ""
    correction: dict[str, float] = field(default_factory=dict)
    packing: dict[str, Any] | None = None
    # what the plan costs, line by line at each line's tier (atoll.control.plan_view.plan_bill):
    # usd_per_h, usd_per_h_by_tier, lines [{region, config, instance, tier, nodes,
    # price_per_node_hour, cost_per_hour}]; None when the maker did not price it
    bill: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        owner = f"PlanRecord {self.sequence!r}"
        if self.bill is not None:
            object.__setattr__(self, "bill", _checked_bill(owner, self.bill))
        correction = {}
        for family, k in dict(self.correction).items():
            if isinstance(k, bool) or not isinstance(k, int | float) or not math.isfinite(k) or k <= 0:
                raise ValueError(f"{owner}: field 'correction' of {family!r} must be a finite factor > 0, "
                                 f"got {k!r}")
            correction[str(family)] = float(k)
        object.__setattr__(self, "correction", dict(sorted(correction.items())))
        if not isinstance(self.owner, str) or len(self.owner) > 40 \
                or not re.fullmatch(r"[a-z0-9-]*", self.owner):
            raise ValueError(f"{owner}: field 'owner' must be '' or a controller id (<= 40 of a-z 0-9 -), "
                             f"got {self.owner!r:.60}")
        if isinstance(self.sequence, bool) or not isinstance(self.sequence, int) or self.sequence < 0:
            raise ValueError(f"{owner}: field 'sequence' must be an integer >= 0, got {self.sequence!r}")
        if not isinstance(self.created_s, int | float) or not math.isfinite(self.created_s):
            raise ValueError(f"{owner}: field 'created_s' must be a finite number, got {self.created_s!r}")
        plan = {}
        for key, n in dict(self.plan).items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"{owner}: field 'plan' count of {key!r} must be an integer >= 0, got {n!r}")
            if n:
                plan[str(key)] = n
        templates = {str(k): dict(v) for k, v in dict(self.templates).items()}
        for key in plan:
            if key not in templates:
                raise ValueError(f"{owner}: field 'templates' lacks template {key!r} used by the plan; "
                                 f"describe every planned key (describe_template)")
        for key, d in templates.items():
            _check_description(owner, key, d)
        diff = {}
        for key, n in dict(self.diff).items():
            if isinstance(n, bool) or not isinstance(n, int):
                raise ValueError(f"{owner}: field 'diff' of {key!r} must be an integer, got {n!r}")
            if n:
                diff[str(key)] = n
        demand: dict[str, float] = {}
        for service, rate in dict(self.demand).items():
            number = isinstance(rate, int | float) and not isinstance(rate, bool)
            if not number or not math.isfinite(rate) or rate < 0:
                raise ValueError(f"{owner}: field 'demand' of {service!r} must be finite and >= 0, "
                                 f"got {rate!r}")
            demand[str(service)] = float(rate)
        if not isinstance(self.reason, str):
            raise ValueError(f"{owner}: field 'reason' must be a string, got {self.reason!r}")
        shapes = {}
        for model, report in dict(self.shapes).items():
            if not isinstance(report, Mapping) or not isinstance(report.get("drifted"), bool):
                raise ValueError(f"{owner}: field 'shapes' of {model!r} must be a shape report with a "
                                 f"boolean 'drifted', got {report!r:.120}")
            shapes[str(model)] = dict(report)
        object.__setattr__(self, "shapes", dict(sorted(shapes.items())))
        if self.packing is not None:
            object.__setattr__(self, "packing", self._checked_packing(owner, plan, templates))
        object.__setattr__(self, "plan", dict(sorted(plan.items())))
        object.__setattr__(self, "templates", dict(sorted(templates.items())))
        object.__setattr__(self, "diff", dict(sorted(diff.items())))
        object.__setattr__(self, "demand", dict(sorted(demand.items())))

    def _checked_packing(self, owner: str, plan: Mapping[str, int],
                         templates: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """The packing, checked against the plan: every stage of every instance on one node of
        its pool, no node over its GPUs, ``nodes_per_pool`` what the nodes say."""
        doc = self.packing
        if not isinstance(doc, Mapping) or not isinstance(doc.get("nodes"), list):
            raise ValueError(f"{owner}: field 'packing' must be a mapping with a 'nodes' list "
                             f"(atoll.solvers.packing.describe_packing), got {doc!r:.120}")
        try:
            packing = Packing.from_json(doc["nodes"])
        except PackingError as exc:
            raise ValueError(f"{owner}: field 'packing': {exc}") from exc
        described = describe_packing(packing)
        if doc.get("nodes_per_pool", described["nodes_per_pool"]) != described["nodes_per_pool"]:
            raise ValueError(f"{owner}: field 'packing' says nodes_per_pool {doc['nodes_per_pool']!r}, its "
                             f"nodes hold {described['nodes_per_pool']!r}")
        bad = _packing_violations(plan, templates, packing)
        if bad:
            raise ValueError(f"{owner}: field 'packing' does not hold the plan ({len(bad)} finding(s)): "
                             f"{'; '.join(bad[:3])}")
        return described

    @property
    def nodes_per_pool(self) -> dict[str, int] | None:
        """"region/config" -> nodes the plan holds, for a fleet with slices (None otherwise)."""
        return None if self.packing is None else dict(self.packing["nodes_per_pool"])

    @classmethod
    def from_allocation(cls, sequence: int, created_s: float, allocation: Allocation,
                        previous: Allocation | Mapping[str, int] | None,
                        templates_by_key: Mapping[str, Template], demand: Mapping[str, float],
                        reason: str, shapes: Mapping[str, Mapping[str, Any]] | None = None,
                        owner: str = "", correction: Mapping[str, float] | None = None,
                        packing: Packing | None = None, default_tier: str = "") -> PlanRecord:
        """The record of ``allocation`` with its diff against ``previous`` (the plan delivered
        before; None = nothing running). Removed keys missing from ``templates_by_key`` (the
        library changed) are kept in the diff without a description. ``packing``: the nodes it
        holds, for a fleet with slices. ``default_tier``: the tier of a template in a plain region
        (see :func:`describe_template`)."""
        old = previous.as_dict() if isinstance(previous, Allocation) else dict(previous or {})
        new = allocation.as_dict()
        diff = {k: new.get(k, 0) - old.get(k, 0) for k in set(old) | set(new)}
        diff = {k: d for k, d in diff.items() if d}
        missing = sorted(k for k in new if k not in templates_by_key)
        if missing:
            raise ValueError(f"PlanRecord.from_allocation: 'templates_by_key' lacks {len(missing)} planned "
                             f"template(s), first {missing[0]!r}; pass the library the plan was solved with")
        described = {k: describe_template(templates_by_key[k], default_tier) for k in set(new) | set(diff)
                     if k in templates_by_key}
        return cls(sequence, float(created_s), new, described, diff, dict(demand), reason,
                   {m: dict(r) for m, r in (shapes or {}).items()}, owner, dict(correction or {}),
                   None if packing is None else describe_packing(packing))

    def packed(self) -> Packing | None:
        """The record's packing as a :class:`~atoll.solvers.packing.Packing` (None without one)."""
        return None if self.packing is None else Packing.from_json(self.packing["nodes"])

    @property
    def changed(self) -> bool:
        return bool(self.diff)

    @property
    def added(self) -> dict[str, int]:
        return {k: n for k, n in self.diff.items() if n > 0}

    @property
    def removed(self) -> dict[str, int]:
        return {k: -n for k, n in self.diff.items() if n < 0}

    def as_dict(self) -> dict[str, Any]:
        return {"sequence": self.sequence, "created_s": self.created_s, "plan": dict(self.plan),
                "templates": {k: dict(v) for k, v in self.templates.items()}, "diff": dict(self.diff),
                "demand": dict(self.demand), "reason": self.reason,
                "shapes": {m: dict(r) for m, r in self.shapes.items()},
                "shape_drift": {m: r.get("message", "") for m, r in self.shapes.items() if r["drifted"]},
                "owner": self.owner, "correction": dict(self.correction),
                **({"packing": dict(self.packing)} if self.packing is not None else {}),
                **({"bill": dict(self.bill)} if self.bill is not None else {})}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> PlanRecord:
        return cls(int(doc["sequence"]), float(doc["created_s"]), dict(doc["plan"]), dict(doc["templates"]),
                   dict(doc.get("diff", {})), dict(doc.get("demand", {})), str(doc.get("reason", "")),
                   dict(doc.get("shapes", {})), str(doc.get("owner", "")),
                   dict(doc.get("correction", {})), doc.get("packing"), doc.get("bill"))


@dataclass(frozen=True)
class SinkResult:
    """What one delivery did: the sink's name, whether it succeeded, the files or objects it
    wrote and removed, a message, and the attempts it took (see ``atoll.control.sinks.deliver``)."""

    sink: str
    ok: bool
    written: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    message: str = ""
    attempts: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {"sink": self.sink, "ok": self.ok, "written": list(self.written),
                "removed": list(self.removed), "message": self.message, "attempts": self.attempts}
