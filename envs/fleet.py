"""The fleet's instance state: running, starting (with time left) and draining instances per
template, and how plans, preemptions and time move them.

Semantics (DESIGN.md §6):
- a new plan adds instances that serve only after their start-up time; removals first cancel
  instances still starting (they serve nothing yet), then remove running ones: make-before-break
  (the default), a running instance replaced within a service to which the plan adds instances
  keeps serving (and billing) until the slowest addition is ready, then drains; a pure
  scale-down, and every removal under break-before-make, stops serving at once and is billed
  for the drain time;
- when availability of a (region, config) drops below the nodes held, instances holding that
  config are preempted at once (starting ones first, then running; among templates in an order
  drawn from the caller's generator, so the same seed preempts the same instances);
- with slices (several instances per node) a (region, config) holds ceil(its GPUs
  used / G) nodes (first-fit decreasing packs them, :mod:`atoll.solvers.packing`), billed whole,
  and a preemption takes nodes: the held slices are packed, nodes drawn from the generator are
  withdrawn, and every instance with a slice on one of them is lost (fleets without slices keep
  the per-instance rule above, draw for draw);
- every node of a running or starting instance is billed, a draining one until its drain ends.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from atoll.solvers.models import get_model
from atoll.solvers.packing import first_fit_decreasing
from atoll.solvers.problem import Allocation
from atoll.solvers.types import ModelSpec, NodeConfig, Template, node_config_of, parse_config_name

NODE_BOOT_S = 180.0  # VM boot + container start of a GPU node (3 min)
WEIGHT_LOAD_GBS = 1.0  # weights pulled from object storage per node, GB/s

Cell = tuple[str, str]


def startup_seconds(template: Template, model: ModelSpec, configs: Mapping[str, NodeConfig]) -> float:
    """Boot plus loading the weights of the stage a node holds; the nodes start in parallel, so
    the slowest node sets the instance's start-up time."""
    worst = 0.0
    for stage in template.stages:
        for node in stage.nodes:
            if node_config_of(node) not in configs:  # a slice boots with its node
                raise KeyError(f"unknown node config {node!r} in template {template.key}")
            load = stage.layers * model.layer_weight_bytes / (WEIGHT_LOAD_GBS * 1e9)
            worst = max(worst, load)
    return NODE_BOOT_S + worst


class StartupTimes:
    """:func:`startup_seconds` per template key, computed once per key; ``seconds`` is the
    key -> seconds mapping :meth:`FleetState.apply_plan` takes."""

    def __init__(self, configs: Mapping[str, NodeConfig]) -> None:
        self.configs = configs
        self.seconds: dict[str, float] = {}

    def of(self, template: Template) -> float:
        if template.key not in self.seconds:
            self.seconds[template.key] = startup_seconds(template, get_model(template.service.model),
                                                         self.configs)
        return self.seconds[template.key]

    def median(self, templates: Sequence[Template]) -> float:
        """The median over an even sample of at most ~2000 of ``templates`` (0 without any)."""
        sample = templates[:: max(1, len(templates) // 2000)]
        return float(np.median([self.of(t) for t in sample])) if sample else 0.0


@dataclass
class FleetState:
    """Instance counts by template key; ``starting`` and ``draining`` hold [count, seconds left];
    ``replaced`` holds [count, seconds it still serves, drain seconds after that] of instances a
    re-plan replaces make-before-break (they serve and bill until their replacement is ready)."""

    running: dict[str, int] = field(default_factory=dict)
    starting: dict[str, list[list[float]]] = field(default_factory=dict)
    draining: dict[str, list[list[float]]] = field(default_factory=dict)
    replaced: dict[str, list[list[float]]] = field(default_factory=dict)

    def held(self, key: str) -> int:
        """Instances that hold nodes now (and count against availability)."""
        return (self.running.get(key, 0) + sum(int(e[0]) for e in self.starting.get(key, []))
                + sum(int(e[0]) for e in self.draining.get(key, []))
                + sum(int(e[0]) for e in self.replaced.get(key, [])))

    def planned(self) -> Allocation:
        """The plan in force: running plus starting instances (draining and replaced ones are
        leaving)."""
        keys = set(self.running) | set(self.starting)
        return Allocation.of({k: self.running.get(k, 0)
                              + sum(int(c) for c, _ in self.starting.get(k, [])) for k in keys})

    def ready(self) -> dict[str, int]:
        return {k: n for k, n in self.running.items() if n}

    def starting_count(self, key: str) -> int:
        return sum(int(c) for c, _ in self.starting.get(key, []))

    def apply_plan(self, target: Allocation, startup_s: Mapping[str, float], drain_s: float, *,
                   service_of: Callable[[str], object] | None = None) -> int:
        """Move toward ``target``; returns the number of instances started.

        Without ``service_of`` removals are break-before-make: running instances removed stop
        serving at once and drain. With it (make-before-break), a removal from a service to which
        this plan adds instances keeps serving until the slowest of those additions is ready,
        then drains; a pure scale-down drains at once. Additions first bring back instances of the
        same template that are still being replaced (they are running: no start-up)."""
        added = 0
        ready_in: dict[object, float] = {}
        keys = sorted(set(target.as_dict()) | set(self.running) | set(self.starting))
        for key in keys:
            have = self.running.get(key, 0) + self.starting_count(key)
            need = target[key] - have
            if need <= 0:
                continue
            for entry in sorted(self.replaced.get(key, []), key=lambda e: e[1]):
                take = min(need, int(entry[0]))
                entry[0] -= take
                self.running[key] = self.running.get(key, 0) + take
                need -= take
            if key in self.replaced:
                self.replaced[key] = [e for e in self.replaced[key] if e[0] > 0]
            if need > 0:
                self.starting.setdefault(key, []).append([float(need), startup_s[key]])
                added += need
                if service_of is not None:
                    svc = service_of(key)
                    ready_in[svc] = max(ready_in.get(svc, 0.0), startup_s[key])
        for key in keys:
            have = self.running.get(key, 0) + self.starting_count(key)
            if target[key] < have:
                hold = ready_in.get(service_of(key)) if service_of is not None else None
                self._remove(key, have - target[key], drain_s, hold)
        return added

    def _remove(self, key: str, n: int, drain_s: float, hold_s: float | None = None) -> None:
        # Cancel the instances furthest from ready first: they have served nothing.
        queue = sorted(self.starting.get(key, []), key=lambda e: -e[1])
        while n and queue:
            take = min(n, int(queue[0][0]))
            queue[0][0] -= take
            n -= take
            if queue[0][0] == 0:
                queue.pop(0)
        self.starting[key] = queue
        if n:
            self.running[key] = self.running.get(key, 0) - n
            if hold_s is not None and hold_s > 0:
                self.replaced.setdefault(key, []).append([float(n), hold_s, drain_s])
            elif drain_s > 0:
                self.draining.setdefault(key, []).append([float(n), drain_s])

    def advance(self, seconds: float) -> None:
        """Let time pass: start-ups that finish join ``running``; replaced instances whose
        replacement is ready start draining; drains that end release nodes."""
        for key, entries in self.starting.items():
            keep = []
            for count, left in entries:
                if left <= seconds + 1e-9:
                    self.running[key] = self.running.get(key, 0) + int(count)
                else:
                    keep.append([count, left - seconds])
            self.starting[key] = keep
        for key, entries in self.draining.items():
            self.draining[key] = [[c, left - seconds] for c, left in entries if left > seconds + 1e-9]
        for key, entries in self.replaced.items():
            keep = []
            for count, left, drain in entries:
                if left <= seconds + 1e-9:
                    rest = drain - (seconds - left)
                    if rest > 1e-9:
                        self.draining.setdefault(key, []).append([count, rest])
                else:
                    keep.append([count, left - seconds, drain])
            self.replaced[key] = keep
        # forget keys with nothing left, so per-step scans stay as short as the fleet
        for bucket in (self.starting, self.draining, self.replaced):
            for key in [k for k, entries in bucket.items() if not entries]:
                del bucket[key]
        for key in [k for k, n in self.running.items() if not n]:
            del self.running[key]

    def nodes_held(self, templates: Mapping[str, Template]) -> dict[Cell, int]:
        use: dict[Cell, float] = defaultdict(float)
        for key in set(self.running) | set(self.starting) | set(self.draining) | set(self.replaced):
            n = self.held(key)
            if n:
                t = templates[key]
                for config, k in t.node_use:  # slices as shares of a node
                    use[(t.region, config)] += n * k
        # whole nodes: exact integers; slices: the ceil(use) nodes their packing needs
        return {cell: math.ceil(u - 1e-9) for cell, u in use.items()}

    def preempt(self, capacity: Mapping[Cell, int], templates: Mapping[str, Template],
                rng: np.random.Generator) -> dict[str, int]:
        """Remove instances at once until every (region, config) is within ``capacity``."""
        if any(templates[k].has_slices for k in templates if self.held(k)):
            return self._preempt_nodes(capacity, templates, rng)
        lost: dict[str, int] = defaultdict(int)
        use = self.nodes_held(templates)
        for cell in sorted(use):
            excess = use[cell] - capacity.get(cell, 0)
            if excess <= 0:
                continue
            holders = sorted(k for k in templates if self.held(k) and cell in
                             {(templates[k].region, c) for c, _ in templates[k].nodes})
            order = [holders[i] for i in rng.permutation(len(holders))]
            for key in order:
                per = dict(templates[key].nodes)[cell[1]]
                while excess > 0 and self.held(key):
                    self._drop_one(key)
                    lost[key] += 1
                    excess -= per
                    for config, k in templates[key].nodes:
                        use[(templates[key].region, config)] -= k
                if excess <= 0:
                    break
        return dict(lost)

    def _preempt_nodes(self, capacity: Mapping[Cell, int], templates: Mapping[str, Template],
                       rng: np.random.Generator) -> dict[str, int]:
        """Per node (slices): pack each over-capacity cell's held slices by first-fit decreasing,
        withdraw as many of its nodes as it is over (drawn from ``rng``), lose every instance
        with a slice on them. Starting instances of a key go first (as :meth:`_drop_one`)."""
        lost: dict[str, int] = defaultdict(int)
        for cell in sorted(self.nodes_held(templates)):
            excess = self.nodes_held(templates).get(cell, 0) - capacity.get(cell, 0)
            if excess <= 0:
                continue
            items: list[tuple[str, int]] = []  # (template key, instance) per slice on the cell
            sizes: list[int] = []
            node_gpus = 0
            for key in sorted(k for k in templates if self.held(k)):
                t = templates[key]
                for i in range(self.held(key)):
                    for stage in t.stages:
                        for c in stage.nodes:
                            g, node_gpus_c, _ = parse_config_name(c)
                            if (t.region, node_config_of(c)) == cell:
                                items.append((key, i))
                                sizes.append(g)
                                node_gpus = node_gpus_c
            bins = first_fit_decreasing(sizes, node_gpus)
            gone = [bins[j] for j in rng.permutation(len(bins))[:excess]]
            victims = sorted({items[i] for b in gone for i in b})
            for key, _ in victims:
                self._drop_one(key)
                lost[key] += 1
        return dict(lost)

    def _drop_one(self, key: str) -> None:
        # A preempted instance is gone at once: no drain. Starting ones go first.
        for bucket in (self.starting, self.draining, self.replaced):
            entries = bucket.get(key, [])
            if entries:
                entries[-1][0] -= 1
                if entries[-1][0] <= 0:
                    entries.pop()
                return
        self.running[key] -= 1


def node_hours_cost(state: FleetState, templates: Mapping[str, Template],
                    prices: Mapping[Cell, float], seconds: float) -> float:
    """$ for holding the fleet ``seconds`` from now: running and starting nodes for the whole
    interval, draining nodes until their drain ends (as the env bills them)."""
    total = 0.0
    shares: dict[Cell, float] = defaultdict(float)
    for key in set(state.running) | set(state.starting) | set(state.draining) | set(state.replaced):
        t = templates[key]
        per_s = sum(k * prices[(t.region, c)] for c, k in t.node_use) / 3600.0  # a slice: its share
        if t.has_slices:
            for c, k in t.node_use:
                shares[(t.region, c)] += state.held(key) * k
        whole = state.running.get(key, 0) + state.starting_count(key)
        total += whole * per_s * seconds
        total += sum(c * per_s * min(left, seconds) for c, left in state.draining.get(key, []))
        total += sum(c * per_s * min(left + drain, seconds) for c, left, drain in state.replaced.get(key, []))
    # the idle GPUs of nodes bought for slices, at what is held now (draining slices leaving
    # during the interval keep their node's share billed: a slight overestimate)
    total += sum((math.ceil(u - 1e-9) - u) * prices[cell] / 3600.0 * seconds for cell, u in shares.items())
    return total


def steps_for(seconds: float, step_s: float) -> int:
    return max(1, math.ceil(seconds / step_s - 1e-9))
