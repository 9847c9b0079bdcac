"""The fleet's instance state: running, starting (with time left) and draining instances per
template, and how plans, preemptions and time move them.

Semantics:
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
- every node of a running or starting instance is billed, a draining one until its drain ends;
- with a warm pool (``warm_s`` > 0, the sampled start-up of :func:`draw_startup`) a whole node
  whose instance has stopped (drain ended, or removed without one) stays held and billed as a
  free node of its (region, config) for ``warm_s`` seconds; a start-up in that cell takes it
  (no boot, image present) and a drop in availability takes it before any instance.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from atoll.envs.vocabulary import Pool
from atoll.solvers.models import get_model
from atoll.solvers.packing import first_fit_decreasing
from atoll.solvers.problem import Allocation
from atoll.solvers.types import ModelSpec, NodeConfig, Template, node_config_of, parse_config_name

NODE_BOOT_S = 180.0  # VM boot + container start of a GPU node (3 min)
WEIGHT_LOAD_GBS = 1.0  # weights pulled from object storage per node, GB/s

# The sampled start-up (``FleetConfig.startup="sampled"``): each part a log-normal around its
# median (log-sd STARTUP_SIGMA), clipped to its range. Public figures:
# - a new GPU node: cloud VM provisioning 60-120 s plus GPU driver initialization 20-40 s, and
#   "about 1 to 10 minutes" end to end for a Kubernetes GPU node (systemoverflow.com, "Cold start
#   problem: model loading and predictive warming"; scaleops.com, "Reducing GPU cold start times
#   in Kubernetes", eight minutes for a full cold start);
# - the serving image: vLLM + PyTorch + CUDA images are 10-20 GB, a fresh pull 30-90 s near the
#   registry and up to 180 s (same sources; paperscode.org, "Cut Kubernetes cold start times");
# - weights: ~1 GB/s per node from object storage in the same region; ~3 GB/s from node-local
#   NVMe (a 70B model, 140 GB, in 30-60 s; kunwar.page, "The model cold-start problem");
# - torch.compile and CUDA graph capture: cold on a new node (vLLM keeps its compile cache in
#   ~/.cache/vllm/torch_compile_cache on the node, docs.vllm.ai "torch.compile integration");
#   5-20 s from a cache (Baseten's torch compile cache docs); cold ~1 minute (assumed, the
#   same order as the uncached figure those pages compare against);
# - a free node: the Kubernetes Cluster Autoscaler removes an unneeded node only after
#   ``--scale-down-unneeded-time``, 10 minutes by default, so a node freed by a scale-down is
#   held (and billed) that long and a new instance in its (region, config) can take it.
STARTUP_SIGMA = 0.4
BOOT_S = (150.0, 60.0, 600.0)  # median, min, max of a new node's provisioning + driver start
PULL_S = (75.0, 20.0, 300.0)  # the serving image's pull on a new node
COMPILE_COLD_S = (60.0, 20.0, 240.0)  # torch.compile + CUDA graphs without a cache
COMPILE_CACHED_S = (12.0, 5.0, 20.0)  # from the node's compile cache (same model)
LOCAL_LOAD_GBS = 3.0  # weights from node-local NVMe: a free node that served the same model
WARM_S = 600.0  # the Cluster Autoscaler's default --scale-down-unneeded-time


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


def _lognormal(rng: np.random.Generator, spec: tuple[float, float, float]) -> float:
    median, lo, hi = spec
    return float(min(max(median * math.exp(STARTUP_SIGMA * rng.standard_normal()), lo), hi))


def draw_startup(template: Template, model: ModelSpec, state: FleetState,
                 rng: np.random.Generator) -> float:
    """One instance's start-up (seconds) drawn from ``rng``, by its cache state: on free nodes
    of its (region, config) (whole-node templates whose every node finds one in
    ``state.warm``, which it takes) no boot and no pull, weights from local disk and the compile
    cache when the free node served the same model, from object storage and cold otherwise; on
    new nodes boot + image pull + weights from object storage + a cold compile. Each node of the
    instance starts in parallel: the slowest sets the time. Draws: per node, boot, pull, load
    and compile in that order, whatever the path, so one decision's draws do not depend on the
    pool's contents."""
    free, same = state.take_warm(template, model.name) if not template.has_slices else (False, False)
    worst = 0.0
    for stage in template.stages:
        for _node in stage.nodes:
            boot, pull = _lognormal(rng, BOOT_S), _lognormal(rng, PULL_S)
            noise = math.exp(STARTUP_SIGMA * rng.standard_normal())
            cold, cached = _lognormal(rng, COMPILE_COLD_S), _lognormal(rng, COMPILE_CACHED_S)
            gbs = LOCAL_LOAD_GBS if same else WEIGHT_LOAD_GBS
            load = stage.layers * model.layer_weight_bytes / (gbs * 1e9) * noise
            seconds = (0.0 if free else boot + pull) + load + (cached if same else cold)
            worst = max(worst, seconds)
    return worst


class StartupTimes:
    """:func:`startup_seconds` per template key, computed once per key; ``seconds`` is the
    key -> seconds mapping :meth:`FleetState.apply_plan` takes."""

    def __init__(self, configs: Mapping[str, NodeConfig],
                 model: Callable[[str], ModelSpec] = get_model) -> None:
        self.configs = configs
        self.model = model  # name -> ModelSpec (a fleet's own definitions first)
        self.seconds: dict[str, float] = {}

    def of(self, template: Template) -> float:
        if template.key not in self.seconds:
            self.seconds[template.key] = startup_seconds(template, self.model(template.service.model),
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
    # free nodes of the warm pool: (region, config, model it last served) -> [[count, seconds left]]
    warm: dict[tuple[str, str, str], list[list[float]]] = field(default_factory=dict)
    warm_s: float = 0.0  # how long a freed whole node stays; 0: it leaves at once
    # running instances that stopped serving since the owner last read them (scale-down)
    stopped: dict[str, int] = field(default_factory=dict)
    # instances started by the last apply_plan (a failed acquisition takes them back)
    fresh: dict[str, int] = field(default_factory=dict)
    # instances removed without a drain, whose nodes join the warm pool at the next advance
    released: dict[str, int] = field(default_factory=dict)

    def warm_nodes(self) -> dict[Pool, int]:
        """Free nodes held in the warm pool per (region, config)."""
        out: dict[Pool, int] = defaultdict(int)
        for (region, config, _), entries in self.warm.items():
            out[(region, config)] += sum(int(e[0]) for e in entries)
        return {cell: n for cell, n in out.items() if n}

    def take_warm(self, template: Template, model: str) -> tuple[bool, bool]:
        """Take free nodes for one instance of ``template`` when every node it needs has one in
        its (region, config), the same model's first; (taken, all of them served ``model``)."""
        have = self.warm_nodes()
        if not self.warm or any(have.get((template.region, c), 0) < k for c, k in template.nodes):
            return False, False
        same = True
        for config, k in template.nodes:
            need = k
            pools = sorted((key for key in self.warm if key[:2] == (template.region, config)),
                           key=lambda key: (key[2] != model, key[2]))
            for key in pools:
                entries = self.warm[key]
                while need and entries:
                    entries[-1][0] -= 1  # the freshest node first: it stays longest
                    need -= 1
                    same = same and key[2] == model
                    if entries[-1][0] <= 0:
                        entries.pop()
                if not entries:
                    del self.warm[key]
        return True, same

    def _release(self, key: str, count: float, left: float, templates: Mapping[str, Template]) -> None:
        """Whole nodes of ``count`` stopped instances of ``key`` join the warm pool for ``left`` s."""
        t = templates.get(key)
        if t is None or t.has_slices or left <= 1e-9 or count <= 0:
            return
        for config, k in t.nodes:
            self.warm.setdefault((t.region, config, t.service.model), []).append([float(count * k), left])

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
                   services_of: Callable[[str], tuple[object, ...]] | None = None,
                   draw: Callable[[str, int], list[float]] | None = None) -> int:
        """Move toward ``target``; returns the number of instances started.

        Without ``services_of`` removals are break-before-make: running instances removed stop
        serving at once and drain. With it (make-before-break; key -> the services a template
        serves, two for a co-located one), a removal from services to which this plan adds
        instances keeps serving until the slowest of those additions is ready, then drains; a pure
        scale-down drains at once. Additions first bring back instances of the
        same template that are still being replaced (they are running: no start-up). ``draw``
        (key, n) -> n start-up seconds replaces ``startup_s`` with a start-up per instance."""
        added = 0
        self.fresh = {}
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
                if draw is None:
                    seconds = [startup_s[key]]
                    self.starting.setdefault(key, []).append([float(need), startup_s[key]])
                else:
                    seconds = draw(key, need)
                    self.starting.setdefault(key, []).extend([1.0, s] for s in seconds)
                added += need
                self.fresh[key] = need
                if services_of is not None:
                    for svc in services_of(key):
                        ready_in[svc] = max(ready_in.get(svc, 0.0), max(seconds))
        for key in keys:
            have = self.running.get(key, 0) + self.starting_count(key)
            if target[key] < have:
                hold = max((ready_in[s] for s in services_of(key) if s in ready_in), default=None) \
                    if services_of is not None else None
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
                return
            self.stopped[key] = self.stopped.get(key, 0) + n
            if drain_s > 0:
                self.draining.setdefault(key, []).append([float(n), drain_s])
            elif self.warm_s > 0:
                self.released[key] = self.released.get(key, 0) + n

    def advance(self, seconds: float, templates: Mapping[str, Template] | None = None) -> None:
        """Let time pass: start-ups that finish join ``running``; replaced instances whose
        replacement is ready start draining; drains that end release nodes — into the warm pool
        for the rest of ``warm_s`` when it is on (``templates`` then names their nodes)."""
        pool = templates if self.warm_s > 0 else None
        for entries in self.warm.values():
            for e in entries:
                e[1] -= seconds
        for wkey in [k for k, es in self.warm.items() if not any(e[1] > 1e-9 and e[0] > 0 for e in es)]:
            del self.warm[wkey]
        for wkey, es in self.warm.items():
            self.warm[wkey] = [e for e in es if e[1] > 1e-9 and e[0] > 0]
        if pool is not None:
            for key, n in self.released.items():
                self._release(key, n, self.warm_s - seconds, pool)
        self.released = {}
        for key, entries in self.starting.items():
            keep = []
            for count, left in entries:
                if left <= seconds + 1e-9:
                    self.running[key] = self.running.get(key, 0) + int(count)
                else:
                    keep.append([count, left - seconds])
            self.starting[key] = keep
        for key, entries in self.draining.items():
            if pool is not None:
                for c, left in entries:
                    if left <= seconds + 1e-9:
                        self._release(key, c, self.warm_s - (seconds - left), pool)
            self.draining[key] = [[c, left - seconds] for c, left in entries if left > seconds + 1e-9]
        for key, entries in self.replaced.items():
            keep = []
            for count, left, drain in entries:
                if left <= seconds + 1e-9:
                    self.stopped[key] = self.stopped.get(key, 0) + int(count)
                    rest = drain - (seconds - left)
                    if rest > 1e-9:
                        self.draining.setdefault(key, []).append([count, rest])
                    elif pool is not None:
                        self._release(key, count, self.warm_s - (seconds - left - drain), pool)
                else:
                    keep.append([count, left - seconds, drain])
            self.replaced[key] = keep
        # forget keys with nothing left, so per-step scans stay as short as the fleet
        for bucket in (self.starting, self.draining, self.replaced):
            for key in [k for k, entries in bucket.items() if not entries]:
                del bucket[key]
        for key in [k for k, n in self.running.items() if not n]:
            del self.running[key]

    def nodes_held(self, templates: Mapping[str, Template]) -> dict[Pool, int]:
        use: dict[Pool, float] = defaultdict(float)
        for key in set(self.running) | set(self.starting) | set(self.draining) | set(self.replaced):
            n = self.held(key)
            if n:
                t = templates[key]
                for config, k in t.node_use:  # slices as shares of a node
                    use[(t.region, config)] += n * k
        for cell, n in self.warm_nodes().items():  # free nodes still held
            use[cell] += n
        # whole nodes: exact integers; slices: the ceil(use) nodes their packing needs
        return {cell: math.ceil(u - 1e-9) for cell, u in use.items()}

    def preempt(self, capacity: Mapping[Pool, int], templates: Mapping[str, Template],
                rng: np.random.Generator) -> dict[str, int]:
        """Remove instances at once until every (region, config) is within ``capacity`` (free
        nodes of the warm pool go first: no instance loses them)."""
        self._drop_warm(capacity, templates)
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

    def fail_acquisitions(self, capacity: Mapping[Pool, int], templates: Mapping[str, Template],
                          rng: np.random.Generator) -> dict[str, int]:
        """Take back instances the last :meth:`apply_plan` started where a (region, config) now
        holds more nodes than ``capacity``: the market did not have the nodes they asked for.
        Which of them, among the templates holding the cell, in an order drawn from ``rng``."""
        lost: dict[str, int] = defaultdict(int)
        use: dict[Pool, float] = defaultdict(float, self.nodes_held(templates))
        for cell in sorted(use):
            if use[cell] - capacity.get(cell, 0) <= 1e-9:
                continue
            holders = sorted(k for k, n in self.fresh.items() if n > 0 and k in templates
                             and cell in {(templates[k].region, c) for c, _ in templates[k].node_use})
            for key in [holders[i] for i in rng.permutation(len(holders))]:
                t = templates[key]
                while use[cell] - capacity.get(cell, 0) > 1e-9 and self.fresh.get(key, 0) > 0:
                    self._drop_one(key)  # the newest starting entry: this plan's
                    self.fresh[key] -= 1
                    lost[key] += 1
                    for config, k in t.node_use:
                        use[(t.region, config)] -= k
        return dict(lost)

    def _drop_warm(self, capacity: Mapping[Pool, int], templates: Mapping[str, Template]) -> dict[Pool, int]:
        """Free nodes taken back where a (region, config) holds more than ``capacity``; per cell."""
        if not self.warm:
            return {}
        dropped: dict[Pool, int] = {}
        use = self.nodes_held(templates)
        for cell, free in sorted(self.warm_nodes().items()):
            excess = n = min(free, use.get(cell, 0) - capacity.get(cell, 0))
            for wkey in sorted(k for k in self.warm if k[:2] == cell):
                entries = self.warm[wkey]
                while n > 0 and entries:
                    entries[0][0] -= 1  # the oldest node first: it would leave soonest
                    n -= 1
                    if entries[0][0] <= 0:
                        entries.pop(0)
                if not entries:
                    del self.warm[wkey]
            if excess > 0:
                dropped[cell] = excess
        return dropped

    def _preempt_nodes(self, capacity: Mapping[Pool, int], templates: Mapping[str, Template],
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
                    prices: Mapping[Pool, float], seconds: float) -> float:
    """$ for holding the fleet ``seconds`` from now: running and starting nodes for the whole
    interval, draining nodes until their drain ends (as the env bills a fleet without a warm
    pool; :meth:`atoll.envs.fleet_model.FleetModel.cost` bills the warm pool's free nodes too)."""
    total = 0.0
    shares: dict[Pool, float] = defaultdict(float)
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
