"""Which slices share which node: the packing of a plan.

The allocation ILP buys integer nodes per (region, config) >= the GPUs its slices use / G and
never says which slice goes where. That aggregate row is exact because slice sizes and node
sizes are powers of two: first-fit decreasing (FFD) packs any multiset of power-of-two items,
each <= G, whose total is <= k x G into k bins of G. Why: in decreasing order every item size
divides every larger one, so when an item of size s arrives, each open bin's fill is a multiple
of s (a sum of multiples of s) and so is G; a bin with room has at least s free. FFD therefore
opens a new bin only when every open bin is exactly full, and all bins but the last are full:
bins = ceil(total / G). ``tests/solvers/test_packing.py`` checks it against brute-force bin
packing on random small multisets.

:func:`pack_plan` turns a solved allocation into nodes (region, config, the slices on it), and
:func:`check_packing` is its independent evaluator: every stage of every instance placed exactly
once, no node over its GPUs, no more nodes of a (region, config) than are available, and the
node count per (region, config) the ILP paid for (ceil of the use).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from atoll.solvers.errors import AtollError
from atoll.solvers.problem import Allocation, AllocationProblem
from atoll.solvers.types import Template, gpus_of, node_config_of, parse_config_name


class PackingError(AtollError):
    """A packing does not hold a plan's slices (the evaluator's finding, or bad input)."""


def first_fit_decreasing(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins (lists of item positions) of ``sizes`` packed first-fit in decreasing size order
    (ties by position, so the result is deterministic and an engine's equal-size stages, listed
    together, fill one node before the next: TP x PP inside a node when they fit)."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"first_fit_decreasing: capacity must be an integer >= 1, got {capacity!r}")
    for i, s in enumerate(sizes):
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= capacity:
            raise ValueError(f"first_fit_decreasing: item {i} has size {s!r}; sizes must be integers "
                             f"in 1..{capacity}")
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        for b, room in enumerate(free):
            if room >= sizes[i]:
                bins[b].append(i)
                free[b] -= sizes[i]
                break
        else:
            bins.append([i])
            free.append(capacity - sizes[i])
    return bins


@dataclass(frozen=True)
class PlacedSlice:
    """One stage's GPUs on a node: stage ``stage`` (pipeline order) of instance ``instance``
    (0-based, per template) of template ``template``, on ``gpus`` of the node's GPUs."""

    template: str
    instance: int
    stage: int
    gpus: int

    def __post_init__(self) -> None:
        for name in ("instance", "stage"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"PlacedSlice: field '{name}' must be an integer >= 0, got {v!r}")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"PlacedSlice: field 'gpus' must be an integer >= 1, got {self.gpus!r}")


@dataclass(frozen=True)
class PackedNode:
    """One bought node: its (region, config), its GPUs and the slices on it."""

    region: str
    config: str
    gpus: int
    slices: tuple[PlacedSlice, ...]

    def __post_init__(self) -> None:
        if node_config_of(self.config) != self.config:
            raise ValueError(f"PackedNode: field 'config' must be a node config, got slice {self.config!r}")
        if self.gpus != gpus_of(self.config):
            raise ValueError(f"PackedNode: field 'gpus' must be {gpus_of(self.config)} for {self.config}, "
                             f"got {self.gpus!r}")

    @property
    def used_gpus(self) -> int:
        return sum(s.gpus for s in self.slices)


@dataclass(frozen=True)
class Packing:
    """The nodes of a plan, in (region, config) order, each pool's nodes fullest first."""

    nodes: tuple[PackedNode, ...]

    def node_counts(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = defaultdict(int)
        for n in self.nodes:
            out[(n.region, n.config)] += 1
        return dict(out)

    def to_json(self) -> list[dict[str, Any]]:
        return [{"region": n.region, "config": n.config, "gpus": n.gpus, "used_gpus": n.used_gpus,
                 "slices": [[s.template, s.instance, s.stage, s.gpus] for s in n.slices]}
                for n in self.nodes]

    @staticmethod
    def from_json(data: Any) -> Packing:
        if not isinstance(data, list):
            raise PackingError(f"packing JSON must be a list of nodes, got {type(data).__name__}")
        try:
            return Packing(tuple(PackedNode(str(d["region"]), str(d["config"]), int(d["gpus"]),
                                            tuple(PlacedSlice(str(t), int(i), int(s), int(g))
                                                  for t, i, s, g in d["slices"]))
                                 for d in data))
        except (KeyError, TypeError, ValueError) as exc:
            raise PackingError(f"packing JSON: {exc}") from exc


def _stage_slices(problem: AllocationProblem, allocation: Allocation,
                  ) -> dict[tuple[str, str], list[tuple[PlacedSlice, int]]]:
    """Per (region, node config): every stage node of every instance, with the node's GPUs."""
    return _plan_slices(problem.template, allocation.counts)


def _plan_slices(template_of: Callable[[str], Template], counts: Iterable[tuple[str, int]],
                 ) -> dict[tuple[str, str], list[tuple[PlacedSlice, int]]]:
    items: dict[tuple[str, str], list[tuple[PlacedSlice, int]]] = defaultdict(list)
    for key, n in counts:
        t = template_of(key)
        for i in range(n):
            for j, stage in enumerate(t.stages):
                for c in stage.nodes:  # data-parallel nodes of a stage (runtime 'any') are nodes too
                    g, node_gpus, _ = parse_config_name(c)
                    items[(t.region, node_config_of(c))].append((PlacedSlice(key, i, j, g), node_gpus))
    return items


def pack_plan(problem: AllocationProblem, allocation: Allocation) -> Packing:
    """The nodes a plan buys and the slices on each, by first-fit decreasing per (region,
    config): ceil(GPUs used / G) nodes per pool (module docstring), the count the ILP paid for."""
    nodes: list[PackedNode] = []
    for (region, config), items in sorted(_stage_slices(problem, allocation).items()):
        node_gpus = items[0][1]
        bins = first_fit_decreasing([s.gpus for s, _ in items], node_gpus)
        for b in bins:
            nodes.append(PackedNode(region, config, node_gpus, tuple(items[i][0] for i in b)))
    return Packing(tuple(nodes))


def repack(templates: Mapping[str, Template], plan: Mapping[str, int], previous: Packing | None = None,
           ) -> Packing:
    """The nodes of ``plan`` when ``previous`` is the packing running now (the controller's
    plans, one after another). A running vLLM pod is not moved: every slice of an instance the
    plan keeps (instance numbers below its new count) stays on its node; slices of instances the
    plan drops leave, and a node is released only when none of its slices is left (make-before-
    break counts nodes: a plan that still holds a replaced instance keeps its node). New slices go
    first-fit decreasing into the room left on the kept nodes, in their order, then onto new nodes
    packed as :func:`pack_plan` packs. Without ``previous`` this is :func:`pack_plan`'s packing,
    ceil(use) nodes per pool; after removals a pool may hold more (its nodes' free room too
    fragmented for the new slices), which :func:`describe_packing` reports as ``extra_nodes``."""
    unknown = sorted(k for k, n in plan.items() if n and k not in templates)
    if unknown:
        raise PackingError(f"repack: the plan names {len(unknown)} template(s) not in 'templates', first "
                           f"{unknown[0]!r}; pass the library the plan was solved with")
    want = _plan_slices(templates.__getitem__, sorted((k, n) for k, n in plan.items() if n))
    kept: dict[tuple[str, str], list[list[PlacedSlice]]] = defaultdict(list)
    # a multiset: the research runtime's data-parallel nodes of one stage are equal slices
    left = Counter((r, c, s) for (r, c), items in want.items() for s, _ in items)
    for node in (previous.nodes if previous is not None else ()):
        stay = []
        for s in node.slices:
            if left[(node.region, node.config, s)] > 0:
                left[(node.region, node.config, s)] -= 1
                stay.append(s)
        if stay:  # a node none of whose slices is still needed is released
            kept[(node.region, node.config)].append(stay)
    nodes: list[PackedNode] = []
    for cell in sorted(set(want) | set(kept)):
        region, config = cell
        items = want.get(cell, [])
        node_gpus = gpus_of(config)
        bins = kept.get(cell, [])
        room = [node_gpus - sum(s.gpus for s in b) for b in bins]
        new = []
        for s, _ in items:
            if left[(region, config, s)] > 0:
                left[(region, config, s)] -= 1
                new.append(s)
        fresh: list[PlacedSlice] = []
        # decreasing size (ties in plan order), as first_fit_decreasing orders them
        for s in sorted(new, key=lambda s: -s.gpus):
            at = next((b for b, r in enumerate(room) if r >= s.gpus), None)
            if at is None:
                fresh.append(s)
            else:
                bins[at].append(s)
                room[at] -= s.gpus
        for positions in first_fit_decreasing([s.gpus for s in fresh], node_gpus) if fresh else []:
            bins.append([fresh[i] for i in positions])
        nodes.extend(PackedNode(region, config, node_gpus, tuple(b)) for b in bins)
    return Packing(tuple(nodes))


def check_packing(problem: AllocationProblem, allocation: Allocation, packing: Packing) -> list[str]:
    """Violations of ``packing`` as the packing of ``allocation`` (empty when it is one): each
    stage of each instance on exactly one node of its (region, config) with its GPUs, no node
    over its GPUs, node counts within availability and equal to ceil(use) (what the ILP paid)."""
    out = check_slices(_stage_slices(problem, allocation), packing)
    counts = packing.node_counts()
    use = problem.node_use(allocation)
    for rc in sorted(set(counts) | set(use)):
        n = counts.get(rc, 0)
        need = math.ceil(use.get(rc, 0.0) - 1e-9)
        if n != need:
            out.append(f"{rc[0]}/{rc[1]}: {n} nodes packed, the plan pays for {need}")
        if n > problem.available(rc):
            out.append(f"{rc[0]}/{rc[1]}: {n} nodes packed, {problem.available(rc):g} available")
    return out


def check_plan_packing(templates: Mapping[str, Template], plan: Mapping[str, int], packing: Packing,
                       ) -> list[str]:
    """Violations of ``packing`` as a packing of ``plan`` (template key -> instances) whatever
    its node counts (a controller's packing may hold more than ceil(use) nodes, see
    :func:`repack`): each stage of each instance on exactly one node of its (region, config)
    with its GPUs, no node over its GPUs, no empty node."""
    unknown = sorted(k for k, n in plan.items() if n and k not in templates)
    if unknown:
        return [f"the plan names template {unknown[0]!r}, not in the library"]
    out = check_slices(_plan_slices(templates.__getitem__, ((k, n) for k, n in plan.items() if n)), packing)
    out += [f"node {i} ({n.region}/{n.config}) holds no slice: it should have been released"
            for i, n in enumerate(packing.nodes) if not n.slices]
    return out


def check_slices(want: Mapping[tuple[str, str], list[tuple[PlacedSlice, int]]], packing: Packing,
                 ) -> list[str]:
    """Each slice of ``want`` (per (region, node config)) on exactly one node of its pool, no
    node over its GPUs."""
    out: list[str] = []
    expected: dict[tuple[PlacedSlice, str, str], int] = defaultdict(int)
    for (region, config), items in want.items():
        for s, _ in items:
            expected[(s, region, config)] += 1
    got: dict[tuple[PlacedSlice, str, str], int] = defaultdict(int)
    for n, node in enumerate(packing.nodes):
        if node.used_gpus > node.gpus:
            out.append(f"node {n} ({node.region}/{node.config}) holds {node.used_gpus} GPUs of slices, "
                       f"has {node.gpus}")
        for s in node.slices:
            got[(s, node.region, node.config)] += 1
    for k in sorted(set(expected) | set(got), key=lambda k: (k[1], k[2], k[0].template, k[0].instance,
                                                              k[0].stage)):
        if expected.get(k, 0) != got.get(k, 0):
            s, region, config = k
            out.append(f"{s.template} instance {s.instance} stage {s.stage} ({s.gpus} GPUs of "
                       f"{region}/{config}): in the plan {expected.get(k, 0)} times, packed "
                       f"{got.get(k, 0)} times")
    return out


def describe_packing(packing: Packing) -> dict[str, Any]:
    """Nodes per pool and the node list, as a plan's JSON carries them; ``extra_nodes``: pools
    holding more nodes than ceil(their slices' GPUs / G) (a controller's packing after removals,
    :func:`repack`), by how many."""
    gpus: dict[tuple[str, str], int] = defaultdict(int)
    for n in packing.nodes:
        gpus[(n.region, n.config)] += n.used_gpus
    counts = packing.node_counts()
    extra = {f"{r}/{c}": counts[(r, c)] - math.ceil(g / gpus_of(c)) for (r, c), g in sorted(gpus.items())
             if counts[(r, c)] > math.ceil(g / gpus_of(c))}
    return {"nodes_per_pool": {f"{r}/{c}": n for (r, c), n in sorted(counts.items())},
            "nodes": packing.to_json(), **({"extra_nodes": extra} if extra else {})}
