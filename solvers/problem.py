"""Allocation problem and result types shared by the ILP, the evaluator and the baselines.

An :class:`Allocation` is an integer count of instances per template key; an
:class:`AllocationProblem` is everything the online stage needs to choose one; an
:class:`AllocationResult` is a solved plan with its metadata. ``atoll.solvers.allocation`` re-exports
all of them.
"""

from __future__ import annotations

import copy
import enum
import functools
import math
import operator
import weakref
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from atoll.solvers.template_store import paused_gc
from atoll.solvers.tiers import split_tier
from atoll.solvers.types import Phase, Service, Template, node_config_of

MODES = ("cost", "goodput")
RegionConfig = tuple[str, str]


def model_of(service_name: str) -> str:
    """"Qwen3-32B/decode" -> "Qwen3-32B"."""
    return service_name.rpartition("/")[0]


def gpu_type_of(config: str) -> str:
    """"4xL40S" -> "L40S"."""
    return config.partition("x")[2]


class SolveStatus(enum.StrEnum):
    OPTIMAL = "optimal"  # proven within the requested relative gap
    FEASIBLE_TIME_LIMIT = "feasible_time_limit"  # stopped (time/node limit) with an incumbent
    FEASIBLE = "feasible"  # a plan the solver called optimal whose gap could not be proven
    INFEASIBLE = "infeasible"
    ERROR = "error"  # solver failure, or a limit hit before any feasible allocation


# HiGHS's own absolute gap tolerance (mip_abs_gap) is 1e-6 per solve; blocks solved apart add
# theirs up, so a plan's absolute slack is allowed a little more than one solve's.
ABS_GAP_TOLERANCE = 1e-5


def within_tolerance(difference: float, objective: float, gap: float) -> bool:
    """Whether ``difference`` = objective - dual bound (>= 0 for a minimization) proves the
    objective within relative ``gap`` (or the absolute tolerance, for objectives near 0)."""
    return difference <= gap * abs(objective) + ABS_GAP_TOLERANCE + 1e-12 * abs(objective)


@dataclass(frozen=True)
class Allocation:
    """Instances per template key, as sorted (key, count) pairs without zeros (hashable)."""

    counts: tuple[tuple[str, int], ...] = ()
    # lookups by key run once per template of a 1e5-template library: keep the dict
    _dict: Mapping[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        seen = set()
        for pair in self.counts:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
                raise TypeError(f"Allocation: field 'counts' needs (template key, count) pairs, got {pair!r}")
            key, n = pair
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"Allocation: count of {key!r} must be an integer >= 0, got {n!r}")
            if key in seen:
                raise ValueError(f"Allocation: template key {key!r} appears twice")
            seen.add(key)
        object.__setattr__(self, "counts", tuple(sorted((k, n) for k, n in self.counts if n)))
        object.__setattr__(self, "_dict", MappingProxyType(dict(self.counts)))

    @classmethod
    def of(cls, counts: Mapping[str, int]) -> Allocation:
        return cls(tuple(counts.items()))

    def __getitem__(self, key: str) -> int:
        return self._dict.get(key, 0)

    def counts_of(self, keys: Sequence[str]) -> list[int]:
        """``[self[k] for k in keys]`` without a method call per key (a block's columns)."""
        get = self._dict.get
        return [get(k, 0) for k in keys]

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)

    @property
    def total_instances(self) -> int:
        return sum(n for _, n in self.counts)


def _is_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and not math.isnan(v)


def _frozen_map(owner: str, name: str, value: Any) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{owner}: field '{name}' must be a mapping, got {type(value).__name__}")
    return MappingProxyType(dict(value))


@dataclass
class _Scan:
    """The per-template lists and id tables one pass over a template tuple gathers (a 1e5-template
    library is read once); :class:`TemplateIndex` turns them into arrays."""

    keys: list[str] = field(default_factory=list)
    by_key: dict[str, Template] = field(default_factory=dict)
    service_id: dict[str, int] = field(default_factory=dict)
    by_service: dict[str, list[Template]] = field(default_factory=lambda: defaultdict(list))
    rc_id: dict[RegionConfig, int] = field(default_factory=dict)
    kind_id: dict[str, int] = field(default_factory=dict)
    svc: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    multi: list[bool] = field(default_factory=list)
    config_id: dict[str, int] = field(default_factory=dict)
    config_kind: list[int] = field(default_factory=list)
    ptr: list[int] = field(default_factory=lambda: [0])
    rc: list[int] = field(default_factory=list)
    k: list[float] = field(default_factory=list)  # nodes per instance: a slice is a fraction of its node
    models: dict[str, None] = field(default_factory=dict)
    cover1: list[int] = field(default_factory=list)
    cover2: list[int] = field(default_factory=list)
    throughput2: list[float] = field(default_factory=list)
    ratio: dict[str, float] = field(default_factory=dict)  # co-located service -> decode / prompt tokens


def _check_ratio(ratio: dict[str, float], t: Template, r: float) -> None:
    """One decode / prompt ratio per co-located service: dominance compares co-located templates
    by prompt tokens/s, which only ranks them right when every one serves the same mix."""
    name = t.service.name
    if not math.isclose(ratio.setdefault(name, r), r, rel_tol=1e-9):
        raise ValueError(f"AllocationProblem: co-located templates of {t.service.model!r} serve decode and "
                         f"prompt tokens in different ratios ({ratio[name]:.6g} and {r:.6g}); "
                         f"build them from one request shape per model")


def _scan_templates(templates: tuple[Template, ...]) -> _Scan:
    """Ids of services, kinds, configs and (region, config) pairs in order of first use, and each
    template's row, kind and node entries; refuses what is no template library (a non-Template, a
    key given twice, co-located templates in different ratios). One loop with the lists as locals:
    it runs per template of a 1e5-template library."""
    owner = "AllocationProblem"
    s = _Scan()
    by_key, service_id, rc_id, kind_id, config_id = s.by_key, s.service_id, s.rc_id, s.kind_id, s.config_id
    rc, k = s.rc, s.k
    for t in templates:
        if not isinstance(t, Template):
            raise TypeError(f"{owner}: field 'templates' must hold Template objects, got {t!r}")
        key = t.key
        if key in by_key:
            raise ValueError(f"{owner}: field 'templates' has the key {key!r} twice")
        by_key[key] = t
        s.keys.append(key)
        name = t.service.name
        s.by_service[name].append(t)
        s.svc.append(service_id.setdefault(name, len(service_id)))
        rows = t.covers
        s.cover1.append(service_id.setdefault(rows[0][0], len(service_id)))
        if len(rows) > 1:
            s.cover2.append(service_id.setdefault(rows[1][0], len(service_id)))
            s.throughput2.append(rows[1][1])
            _check_ratio(s.ratio, t, rows[1][1] / rows[0][1])
        else:
            s.cover2.append(-1)
            s.throughput2.append(0.0)
        s.models.setdefault(t.service.model)
        types = {gpu_type_of(c) for c, _ in t.nodes}
        s.kind.append(kind_id.setdefault(gpu_type_of(t.nodes[0][0]), len(kind_id)))
        s.multi.append(len(types) > 1)
        s.config_kind.append(config_id.setdefault(t.nodes[0][0], len(config_id)))
        for c, n in t.node_use:  # slices as fractions of the node they are bought as
            rc.append(rc_id.setdefault((t.region, c), len(rc_id)))
            k.append(n)
        s.ptr.append(len(rc))
    return s


# Bump when TemplateIndex.state's fields change: a stored state of another version is not read.
INDEX_STATE_VERSION = 1


def _state_of(templates: tuple[Template, ...], scan: _Scan) -> dict[str, Any]:
    """What :class:`TemplateIndex` keeps of one pass over ``templates``, without the templates:
    plain lists, dicts and arrays, stored beside a library's binary file so a process that loads
    the library skips the pass (2-3 s of a fleet20 day's set-up)."""
    return {
        "version": INDEX_STATE_VERSION, "n": len(templates), "keys": scan.keys,
        "service_id": scan.service_id, "rc_id": scan.rc_id, "models": list(scan.models),
        "n_kinds": max(len(scan.kind_id), 1), "n_configs": max(len(scan.config_id), 1),
        "svc": np.asarray(scan.svc, dtype=np.int64), "kind": np.asarray(scan.kind, dtype=np.int64),
        "multi": np.asarray(scan.multi, dtype=bool),
        "config_kind": np.asarray(scan.config_kind, dtype=np.int64),
        "multi_config": np.asarray([len(t.nodes) > 1 for t in templates], dtype=bool),
        "throughput": np.asarray([t.throughput for t in templates], dtype=np.float64),
        "cover1": np.asarray(scan.cover1, dtype=np.int64), "cover2": np.asarray(scan.cover2, dtype=np.int64),
        "throughput2": np.asarray(scan.throughput2, dtype=np.float64),
        "ptr": np.asarray(scan.ptr, dtype=np.int64), "rc": np.asarray(scan.rc, dtype=np.int64),
        "k": np.asarray(scan.k, dtype=np.float64),
        "sliced_rcs": frozenset((t.region, node_config_of(c)) for t in templates if t.has_slices
                                for c, _ in t.nodes if node_config_of(c) != c),
    }


class TemplateIndex:
    """Array view of a template tuple, shared by every problem over that same tuple.

    Template keys and service names are formatted strings recomputed on each access; a 1e5-
    template library pays seconds per problem for them, and the benchmark and the controller
    build many problems over one library (``with_changes``). Entries: the (region, config) use
    of template i is ``rc[ptr[i]:ptr[i+1]]`` with node counts ``k[ptr[i]:ptr[i+1]]``.

    ``state``: what :meth:`state` gave for this same tuple (a library's stored index, read with
    its templates): the index is made from it without a pass over the templates. It is trusted as
    the templates are (a checksummed file this package wrote); only its version and length are
    checked.
    """

    def __init__(self, templates: tuple[Template, ...], state: Mapping[str, Any] | None = None) -> None:
        self.templates = templates
        if state is None:
            state = _state_of(templates, _scan_templates(templates))
        elif state.get("version") != INDEX_STATE_VERSION or state.get("n") != len(templates):
            raise ValueError(f"TemplateIndex: a stored state of version {state.get('version')!r} for "
                             f"{state.get('n')!r} templates, expected version {INDEX_STATE_VERSION} for "
                             f"{len(templates)}")
        else:
            # an unpickled array's dtype is an equal copy, not numpy's own instance, and some
            # kernels then take a generic path (np.maximum.at: 10-20x slower on fleet20's rows)
            state = {k: v.view(v.dtype.type) if isinstance(v, np.ndarray) else v for k, v in state.items()}
        self._state = state
        self._set_rows(state)
        self._set_lookups(state)
        self._set_entries(state)
        # set on a rescaled index: the index it was scaled from, and its factors
        self._rescaled_from: TemplateIndex | None = None
        self._scale = np.ones(len(templates))
        # and the index it started from (the previous correction, or the one it was scaled from)
        # with the positions whose throughput differ there (weak: a chain of corrections must
        # not keep every earlier index alive)
        self.near: tuple[weakref.ReferenceType[TemplateIndex], np.ndarray] | None = None

    def state(self) -> dict[str, Any]:
        """This index without its templates (see the class docstring): stored with a library."""
        return dict(self._state)

    def _set_lookups(self, state: Mapping[str, Any]) -> None:
        """Keys, services, models and pools by name and by id: the look-ups a problem answers
        without formatting a key."""
        self.rc_id: dict[RegionConfig, int] = state["rc_id"]
        self.keys = tuple(state["keys"])
        self.by_key: Mapping[str, Template] = MappingProxyType(dict(zip(self.keys, self.templates,
                                                                         strict=True)))
        self.position = {key: i for i, key in enumerate(self.keys)}
        self.services = list(state["service_id"])  # service id -> name
        # services in order of their first template, as one pass over the library meets them
        positions = self._service_positions
        firsts = sorted((at[0], j) for j, at in enumerate(positions) if at)
        self.by_service = MappingProxyType({self.services[j]: _pick(self.templates, positions[j])
                                            for _, j in firsts})
        self.models = list(state["models"])
        self.rcs = list(self.rc_id)  # rc id -> (region, config)

    def _set_rows(self, state: Mapping[str, Any]) -> None:
        """Per template: its service, GPU kind and node config ids, and the demand rows it serves."""
        self.service = state["svc"]
        self.kind = state["kind"]
        self.n_kinds = state["n_kinds"]
        self.multi_type = state["multi"]
        # the same for node configs (the one-config-per-model rule of the Homo rungs)
        self.config_kind = state["config_kind"]
        self.n_configs = state["n_configs"]
        self.multi_config = state["multi_config"]
        self.throughput = state["throughput"]
        # the demand rows each template serves (Template.covers): its own service's, or a
        # co-located template's prefill row (cover1, throughput) and decode row (cover2,
        # throughput2); cover2 is -1 and throughput2 0 for one-phase templates
        self.cover1 = state["cover1"]
        self.cover2 = state["cover2"]
        self.throughput2 = state["throughput2"]
        self.colocated = self.cover2 >= 0
        self.any_colocated = bool(self.colocated.any())

    def _set_entries(self, state: Mapping[str, Any]) -> None:
        """The (region, config) entries of every template (``ptr``, ``rc``, ``k``) and the pools
        bought as sliced nodes."""
        self.ptr = state["ptr"]
        self.rc = state["rc"]
        self.k = state["k"]
        # for per-template Python loops (numpy items are slow)
        self.rc_list, self.k_list = self.rc.tolist(), self.k.tolist()
        self.entry_template = np.repeat(np.arange(len(self.templates)), np.diff(self.ptr))
        # (region, config) pairs some template uses a slice of: the ILP buys their nodes as
        # integer variables and packs the slices (:mod:`atoll.solvers.packing`); none in
        # whole-node libraries
        self.sliced_rcs = state["sliced_rcs"]
        self.sliced = np.asarray([rc in self.sliced_rcs for rc in self.rcs], dtype=bool)

    def costs_at(self, price: np.ndarray) -> np.ndarray:
        """$/h per template at ``price`` per (region, config) id (read-only, shared by the
        problems of one price list: a re-plan's problem would otherwise sum 3e5 entries again)."""
        key = price.tobytes()
        memo: dict[bytes, np.ndarray] = self.__dict__.setdefault("_costs_memo", {})
        costs = memo.get(key)
        if costs is None:
            costs = np.bincount(self.entry_template, weights=self.k * price[self.rc],
                                minlength=len(self.keys))
            costs.flags.writeable = False
            if len(memo) >= 8:
                memo.pop(next(iter(memo)))
            memo[key] = costs
        return costs

    def rescaled(self, scale: np.ndarray, *, near: TemplateIndex | None = None) -> TemplateIndex:
        """The index of this index's templates, in the same order, each serving its throughput
        x ``scale[i]`` (the planner's capacity correction): the templates with a factor of 1 are
        this index's own objects, and keys, services, rows and prices are shared. Rebuilding the
        index instead costs seconds per correction on a 1e5-template library (86% of an
        extended closed-loop day's time in a profile).

        ``near``: an earlier result of this index's ``rescaled`` (the previous correction).
        Templates whose factor is the same there are its objects, and services without a changed
        template keep its groups: a correction that moves a few families then makes objects for
        those families' templates only, not for every corrected one (fleet20: 2e5 per step).
        Without it the start is this index itself, every factor 1."""
        scale = np.asarray(scale, dtype=np.float64)
        if scale.shape != self.throughput.shape or not (np.isfinite(scale).all() and (scale > 0).all()):
            raise ValueError(f"TemplateIndex.rescaled: 'scale' must hold {len(self.templates)} finite "
                             f"factors > 0, got shape {scale.shape}")
        throughput = self.throughput * scale
        # the index this one starts from: the previous correction, or this one (every factor 1)
        if near is not None and near._rescaled_from is self:
            prior, changed = near, np.flatnonzero(scale != near._scale)
        else:
            prior, changed = self, np.flatnonzero(scale != 1.0)
        templates = list(prior.templates)
        own = self.templates
        for i in changed.tolist():
            t = own[i]
            templates[i] = t if scale[i] == 1.0 else t.scaled(float(scale[i]))
        index = copy.copy(self)
        index.templates = tuple(templates)
        index.throughput = throughput
        index.throughput2 = self.throughput2 * scale
        index._scale = scale
        index._rescaled_from = self
        index.near = (weakref.ref(prior), changed)
        index.by_key = _Keyed(index.templates, self.position)
        moved = set(np.unique(self.service[changed]).tolist())
        index.by_service = MappingProxyType({
            s: _pick(index.templates, self._service_positions[j]) if j in moved else prior.by_service[s]
            for j, s in enumerate(self.services)})
        _remember(index)
        return index

    @functools.cached_property
    def one_entry_rc(self) -> np.ndarray | None:
        """The (region, config) id of each template when every template has exactly one node
        entry (a whole library of one-config templates), else None: a block's node entries are
        then one gather, not a ragged expansion."""
        if len(self.ptr) > 1 and bool((np.diff(self.ptr) == 1).all()):
            return self.rc[self.ptr[:-1]]
        return None

    @functools.cached_property
    def _service_positions(self) -> list[list[int]]:
        order = np.argsort(self.service, kind="stable")
        bounds = np.cumsum(np.bincount(self.service, minlength=len(self.services)))[:-1]
        return [part.tolist() for part in np.split(order, bounds)]


class _Keyed(Mapping[str, Template]):
    """Key -> template of a rescaled index: its own tuple at the positions of the index it was
    scaled from. A copy of that index's map with the changed entries replaced cost a 2e5-entry
    dict per correction on fleet20 (and a pass of the collector over it)."""

    __slots__ = ("_templates", "_position")

    def __init__(self, templates: tuple[Template, ...], position: Mapping[str, int]) -> None:
        self._templates = templates
        self._position = position

    def __getitem__(self, key: str) -> Template:
        return self._templates[self._position[key]]

    def __contains__(self, key: object) -> bool:
        return key in self._position

    def __iter__(self) -> Iterator[str]:
        return iter(self._position)

    def __len__(self) -> int:
        return len(self._position)


def _pick(items: tuple[Template, ...], positions: list[int]) -> tuple[Template, ...]:
    """``tuple(items[i] for i in positions)`` at C speed (a 3e5-template library regroups per
    correction)."""
    if len(positions) == 1:
        return (items[positions[0]],)
    return tuple(operator.itemgetter(*positions)(items)) if positions else ()


_INDEX_CACHE: dict[int, TemplateIndex] = {}
_INDEX_CACHE_SIZE = 4
# every index some problem still holds, by the id of its tuple: a problem derived from a live one
# (``with_changes``) never rebuilds its index, however many libraries are in use meanwhile
_LIVE: weakref.WeakValueDictionary[int, TemplateIndex] = weakref.WeakValueDictionary()


def template_index(templates: tuple[Template, ...]) -> TemplateIndex:
    """The index of ``templates``, reused while the same tuple object is alive (the cache holds
    the tuple, so its id cannot be reused by another object meanwhile)."""
    hit = _INDEX_CACHE.pop(id(templates), None) or _LIVE.get(id(templates))
    if hit is not None and hit.templates is templates:
        index = hit
    else:
        with paused_gc():  # 1e5 templates' lists and dicts: no cycles to collect meanwhile
            index = TemplateIndex(templates)
    _remember(index)
    return index


def adopt_index(templates: tuple[Template, ...], state: Mapping[str, Any]) -> TemplateIndex | None:
    """Make the index of ``templates`` from its stored ``state`` (a library's binary file) and keep
    it for the problems over that tuple; None, and nothing kept, when the state is of another
    version or length (the index is then built by a pass when a problem first needs it)."""
    try:
        with paused_gc():
            index = TemplateIndex(templates, state)
    except (ValueError, KeyError):
        return None
    _remember(index)
    return index


def _remember(index: TemplateIndex) -> None:
    """Make ``index`` the most recently used entry, evicting the least recently used, and keep it
    findable while it lives."""
    _LIVE[id(index.templates)] = index
    _INDEX_CACHE.pop(id(index.templates), None)
    while len(_INDEX_CACHE) >= _INDEX_CACHE_SIZE:
        _INDEX_CACHE.pop(next(iter(_INDEX_CACHE)))
    _INDEX_CACHE[id(index.templates)] = index


@dataclass(frozen=True, order=True)
class Risk:
    """The risk a re-plan takes for one model: three parameters of the allocation ILP.

    - ``headroom`` u in (0, 1]: the utilization templates are planned at; the ILP covers the
      planning demand / u, so u = 0.8 keeps 20% of each service's capacity spare for latency.
    - ``spread`` sigma in (0, 1]: the largest share of the planning demand one spot pool (a
      region's spot tier) may carry alone — losing any one spot pool leaves capacity for at
      least (1 - sigma) of it. 1 = no spread rule.
    - ``ondemand_floor`` phi in [0, 1]: on-demand capacity alone covers at least phi of the
      planning demand (kept through any spot preemption). 0 = no floor.

    Each is a row per service that only asks for capacity (more never violates it), so the
    ILP's bounds and dominance pruning stay exact; :func:`atoll.solvers.allocation.evaluate_plan`
    checks them independently of the solver.
    """

    headroom: float = 1.0
    spread: float = 1.0
    ondemand_floor: float = 0.0

    def __post_init__(self) -> None:
        for name in ("headroom", "spread"):
            v = getattr(self, name)
            if not (_is_number(v) and 0 < v <= 1):
                raise ValueError(f"Risk: field {name!r} must be in (0, 1], got {v!r}")
        if not (_is_number(self.ondemand_floor) and 0 <= self.ondemand_floor <= 1):
            raise ValueError(f"Risk: field 'ondemand_floor' must be in [0, 1], got {self.ondemand_floor!r}")

    @classmethod
    def parse(cls, text: str) -> Risk:
        """The inverse of :meth:`label`: ``h0.8,s0.5,f0.2`` (any subset, any order) or ``neutral``."""
        fields = {"h": "headroom", "s": "spread", "f": "ondemand_floor"}
        values: dict[str, float] = {}
        text = text.strip()
        if text in ("", "neutral"):
            return cls()
        for part in text.split(","):
            tag, num = part.strip()[:1], part.strip()[1:]
            if tag not in fields or fields[tag] in values:
                raise ValueError(f"risk {text!r}: part {part!r} must be h<headroom>, s<spread> or "
                                 f"f<on-demand floor>, each at most once (e.g. h0.85,s0.5,f0.2)")
            try:
                values[fields[tag]] = float(num)
            except ValueError:
                raise ValueError(f"risk {text!r}: {part!r} needs a number after {tag!r} "
                                 f"(e.g. h0.85,s0.5,f0.2)") from None
        return cls(**values)

    @property
    def neutral(self) -> bool:
        """No constraint beyond the plain ILP's."""
        return self.headroom == 1.0 and self.spread == 1.0 and self.ondemand_floor == 0.0

    def label(self) -> str:
        """``h0.8,s0.5,f0.2`` (the parameters that differ from neutral; ``neutral`` when none)."""
        parts = [f"{tag}{v:g}" for tag, v, neutral in (("h", self.headroom, 1.0), ("s", self.spread, 1.0),
                                                       ("f", self.ondemand_floor, 0.0)) if v != neutral]
        return ",".join(parts) or "neutral"


NEUTRAL_RISK = Risk()


def is_spot_region(region: str) -> bool:
    """Whether ``region`` is a spot pool (a region's spot tier)."""
    return split_tier(region)[1] == "spot"


@dataclass(frozen=True)
class AllocationProblem:
    """One online allocation instance.

    demand: service name ("model/phase") -> tokens/s. availability: (region, config) -> most
    nodes that can be held; a pair missing from the mapping has none; ``None`` = unlimited.
    prices: (region, config) -> $/node-hour, for every pair a template uses. running: the plan
    in place (start-up penalty and fixed models refer to it). startup_weight K = start-up time /
    re-plan interval. removal_weight R: each running instance a re-plan removes costs R x its $/h
    (what a removal costs a cluster: caches dropped, requests drained; the churn's price), so
    objective = $/h + K x added $/h + R x removed $/h. reoptimize: model names to re-solve, the
    others held at their running counts (``None`` = all). grow: re-optimized models whose running
    instances stay (each template's count may only rise above its running count: a ``grow``
    re-optimization).
    gap: relative optimality gap at which the solver may stop.
    one_gpu_type_per_model / one_config_per_model: every template a model uses (both services)
    has nodes of one GPU type / one node config, the same for all of them, chosen by the ILP
    (the baseline ladder's rungs, :mod:`atoll.solvers.ladder`).
    """

    templates: tuple[Template, ...]
    demand: Mapping[str, float]
    availability: Mapping[RegionConfig, float] | None
    prices: Mapping[RegionConfig, float]
    running: Allocation | None = None
    startup_weight: float = 0.0
    reoptimize: frozenset[str] | None = None
    removal_weight: float = 0.0
    mode: str = "cost"
    grow: frozenset[str] = frozenset()
    time_limit: float | None = None
    # HiGHS branch-and-bound nodes per run (None: no limit). Unlike the wall-clock time limit,
    # where it stops does not depend on the machine or its load: a simulation stays a function
    # of its seed (the simulator sets it; a live controller keeps its time limit)
    node_limit: int | None = None
    gap: float = 1e-4
    one_gpu_type_per_model: bool = False
    one_config_per_model: bool = False
    risk: Mapping[str, Risk] | None = None
    _by_key: Mapping[str, Template] = field(init=False, repr=False, compare=False)
    _position: Mapping[str, int] = field(init=False, repr=False, compare=False)
    _by_service: Mapping[str, tuple[Template, ...]] = field(init=False, repr=False, compare=False)
    _index: TemplateIndex = field(init=False, repr=False, compare=False)
    _costs: np.ndarray = field(init=False, repr=False, compare=False)  # $/h per template

    def __post_init__(self) -> None:
        owner = "AllocationProblem"
        templates = tuple(self.templates)
        object.__setattr__(self, "templates", templates)
        index = template_index(templates)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_by_key", index.by_key)
        object.__setattr__(self, "_position", index.position)
        object.__setattr__(self, "_by_service", index.by_service)
        demand = _frozen_map(owner, "demand", self.demand)
        for s, d in demand.items():
            if not (_is_number(d) and math.isfinite(d) and d >= 0):
                raise ValueError(f"{owner}: field 'demand' of service {s!r} must be finite and >= 0, "
                                 f"got {d!r}")
        object.__setattr__(self, "demand", demand)
        prices = _frozen_map(owner, "prices", self.prices)
        for rc, v in prices.items():
            if not (_is_number(v) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{owner}: field 'prices' of {rc!r} must be finite and >= 0, got {v!r}")
        missing = sorted(set(index.rcs) - set(prices))
        if missing:
            raise ValueError(f"{owner}: field 'prices' lacks (region, config) pairs used by templates: "
                             f"{missing[:5]}{' ...' if len(missing) > 5 else ''}")
        object.__setattr__(self, "prices", prices)
        object.__setattr__(self, "_costs", index.costs_at(np.asarray([prices[rc] for rc in index.rcs],
                                                                    dtype=np.float64)))
        if self.availability is not None:
            avail = _frozen_map(owner, "availability", self.availability)
            for rc, v in avail.items():
                if not (_is_number(v) and v >= 0):
                    raise ValueError(f"{owner}: field 'availability' of {rc!r} must be >= 0, got {v!r}")
            object.__setattr__(self, "availability", avail)
        if self.running is not None:
            if not isinstance(self.running, Allocation):
                raise TypeError(f"{owner}: field 'running' must be an Allocation or None")
            unknown = [k for k, _ in self.running.counts if k not in index.by_key]
            if unknown:
                raise ValueError(f"{owner}: field 'running' names unknown template keys {unknown[:3]}")
        k = self.startup_weight
        if not (_is_number(k) and math.isfinite(k) and k >= 0):
            raise ValueError(f"{owner}: field 'startup_weight' must be finite and >= 0, got {k!r}")
        rw = self.removal_weight
        if not (_is_number(rw) and math.isfinite(rw) and rw >= 0):
            raise ValueError(f"{owner}: field 'removal_weight' must be finite and >= 0, got {rw!r}")
        if self.reoptimize is not None:
            reopt = frozenset(self.reoptimize)
            known = self.models
            unknown = sorted(reopt - set(known))
            if unknown:
                raise ValueError(f"{owner}: field 'reoptimize' names unknown models {unknown}; "
                                 f"valid models: {', '.join(known)}")
            object.__setattr__(self, "reoptimize", reopt)
        grow = frozenset(self.grow)
        outside = sorted(grow - self.free_models)
        if outside:
            raise ValueError(f"{owner}: field 'grow' names models {outside} that are not re-optimized; "
                             f"re-optimized models: {', '.join(sorted(self.free_models))}")
        object.__setattr__(self, "grow", grow)
        if self.mode not in MODES:
            raise ValueError(f"{owner}: field 'mode' must be one of {', '.join(MODES)}, got {self.mode!r}")
        tl = self.time_limit
        if tl is not None and not (_is_number(tl) and tl > 0):
            raise ValueError(f"{owner}: field 'time_limit' must be > 0 seconds or None, got {tl!r}")
        nl = self.node_limit
        if nl is not None and (isinstance(nl, bool) or not isinstance(nl, int) or nl < 1):
            raise ValueError(f"{owner}: field 'node_limit' must be a whole number of nodes >= 1 or None, "
                             f"got {nl!r}")
        if not (_is_number(self.gap) and 0 <= self.gap < 1):
            raise ValueError(f"{owner}: field 'gap' must be in [0, 1), got {self.gap!r}")
        if self.risk is not None:
            risk = _frozen_map(owner, "risk", self.risk)
            unknown = sorted(set(risk) - set(self.models))
            if unknown:
                raise ValueError(f"{owner}: field 'risk' names unknown models {unknown}; "
                                 f"valid models: {', '.join(self.models)}")
            for m, r in risk.items():
                if not isinstance(r, Risk):
                    raise TypeError(f"{owner}: field 'risk' of model {m!r} must be a Risk, got {r!r}")
            kept = {m: r for m, r in risk.items() if not r.neutral}
            object.__setattr__(self, "risk", MappingProxyType(kept) if kept else None)

    @property
    def models(self) -> list[str]:
        """Every model named by a template or a demand, in first-appearance order."""
        seen: dict[str, None] = dict.fromkeys(self._index.models)
        for s in self.demand:
            seen.setdefault(model_of(s))
        return list(seen)

    def risk_of(self, model: str) -> Risk:
        return (self.risk or {}).get(model, NEUTRAL_RISK)

    def with_risk(self, risk: Risk) -> AllocationProblem:
        """This problem with every model taking ``risk`` (a rule's lever: one risk for all)."""
        return self.with_changes(risk=None if risk.neutral else dict.fromkeys(self.models, risk))

    def planning_demand(self, service: str) -> float:
        """The demand the ILP covers for ``service``: its demand over its model's headroom."""
        d = self.demand.get(service, 0.0)
        return d if not self.risk else d / self.risk_of(model_of(service)).headroom

    @property
    def free_models(self) -> frozenset[str]:
        return frozenset(self.models) if self.reoptimize is None else self.reoptimize

    def template(self, key: str) -> Template:
        try:  # the tuple at the key's position: no per-key map per library (a correction's is a view)
            return self.templates[self._position[key]]
        except KeyError:
            raise KeyError(f"unknown template key {key!r}") from None

    def templates_of(self, service: str) -> tuple[Template, ...]:
        return self._by_service.get(service, ())

    def serving(self, service: str) -> list[tuple[Template, float]]:
        """Every template that serves ``service``'s demand row, with the tokens/s one instance
        gives it: its own templates and its model's co-located ones."""
        out = [(t, t.throughput) for t in self.templates_of(service)]
        if self._index.any_colocated:
            m = model_of(service)
            out += [(t, thr) for t in self.templates_of(Service(m, Phase.COLOCATED).name)
                    for s, thr in t.covers if s == service]
        return out

    def available(self, rc: RegionConfig) -> float:
        if self.availability is None:
            return math.inf
        return float(self.availability.get(rc, 0))

    @property
    def per_model_rule(self) -> str | None:
        """What all templates of a model must share: "config", "gpu_type" or nothing (None).
        One config implies one GPU type, so "config" wins when both flags are set."""
        if self.one_config_per_model:
            return "config"
        return "gpu_type" if self.one_gpu_type_per_model else None

    @property
    def index(self) -> TemplateIndex:
        return self._index

    @property
    def costs(self) -> np.ndarray:
        """$/h of one instance of each template, in the order of ``templates``."""
        return self._costs

    def template_cost(self, key: str) -> float:
        return float(self._costs[self._index.position[key]])

    def objective_constant(self, fixed: Mapping[str, int]) -> float:
        """Cost of instances held fixed (they add nothing, so no start-up penalty); slices at
        their share of a node (a lower bound on what their nodes cost)."""
        return sum(n * self.template_cost(k) for k, n in fixed.items())

    def node_use(self, allocation: Allocation | Mapping[str, int]) -> dict[RegionConfig, float]:
        """Nodes of each (region, config) the allocation's instances use, slices as fractions."""
        counts = allocation.counts if isinstance(allocation, Allocation) else allocation.items()
        use: dict[RegionConfig, float] = defaultdict(float)
        for key, n in counts:
            t = self.template(key)
            for c, k in t.node_use:
                use[(t.region, c)] += k * n
        return dict(use)

    def removed_cost(self, allocation: Allocation | Mapping[str, int]) -> float:
        """$/h of the running instances ``allocation`` removes (the removal weight's base)."""
        if self.running is None:
            return 0.0
        counts = allocation.as_dict() if isinstance(allocation, Allocation) else allocation
        return sum(max(0, n - counts.get(k, 0)) * self.template_cost(k) for k, n in self.running.counts)

    def idle_cost(self, allocation: Allocation | Mapping[str, int]) -> float:
        """$/h of the GPUs left idle on nodes bought for slices: each sliced (region, config)
        buys ceil(its use) nodes (exact: power-of-two slices pack by first-fit decreasing,
        :mod:`atoll.solvers.packing`), and template costs count only the slices' share."""
        if not self._index.sliced_rcs:
            return 0.0
        return sum(self.prices[rc] * (math.ceil(u - 1e-9) - u)
                   for rc, u in self.node_use(allocation).items() if rc in self._index.sliced_rcs)

    def with_changes(self, **changes: Any) -> AllocationProblem:
        if "templates" not in changes:
            _remember(self._index)  # other problems may have evicted it; the copy reuses it
        return replace(self, **changes)


def served_shares(demand: Mapping[str, float], capacity: Mapping[str, float],
                  models: Iterable[str]) -> tuple[dict[str, float], dict[str, float], float]:
    """served per service = min(demand, capacity); a model's share = min over its services with
    demand of served / demand (a request needs both phases); goodput fraction = the mean share
    over models with demand, every model weighted equally (as the goodput objective)."""
    served = {s: min(d, capacity.get(s, 0.0)) for s, d in demand.items()}
    # grouped in one pass: a scan of every service per model is quadratic at 1,000 models
    fractions: dict[str, list[float]] = defaultdict(list)
    for s, d in demand.items():
        if d > 0:
            fractions[model_of(s)].append(served[s] / d)
    shares = {m: min(fractions[m]) for m in models if m in fractions}
    goodput = sum(shares.values()) / len(shares) if shares else 1.0
    return served, shares, goodput


@dataclass(frozen=True)
class AllocationResult:
    """A solved plan. ``objective`` = cost_per_hour + K x startup_cost_per_hour of the whole plan
    (fixed models included); ``gap`` = proven relative gap of that objective (NaN when unknown:
    goodput stage 1 only, or CBC); ``allocation`` is None when no plan was found. With slices,
    ``cost_per_hour`` pays whole nodes (ceil of each sliced pool's use) and ``packing`` says which
    slices share which node."""

    status: SolveStatus
    allocation: Allocation | None
    objective: float
    cost_per_hour: float
    startup_cost_per_hour: float
    gap: float
    build_seconds: float
    solve_seconds: float
    capacity: Mapping[str, float]
    served: Mapping[str, float]
    served_share: Mapping[str, float]
    goodput_fraction: float
    message: str = ""
    solver: str = "highs"
    warm_start_accepted: bool | None = None
    # node -> slices (atoll.solvers.packing.Packing) of a plan over a library with slices;
    # None for whole-node libraries, where each stage node is its own node
    packing: Any = None
    # HiGHS runs repeated because an answer disagreed with its own columns or was labelled
    # optimal above the gap (atoll.solvers.allocation.highs explains the trap)
    guard_resolves: int = 0

    @classmethod
    def from_allocation(cls, problem: AllocationProblem, status: SolveStatus,
                        allocation: Allocation | None, *, message: str = "",
                        bound: float | None = None, build_seconds: float = 0.0,
                        solve_seconds: float = 0.0, solver: str = "highs",
                        warm_start_accepted: bool | None = None,
                        guard_resolves: int = 0) -> AllocationResult:
        nan = math.nan
        if allocation is None:
            return cls(status, None, nan, nan, nan, nan, build_seconds, solve_seconds, {}, {}, {},
                       nan, message, solver, warm_start_accepted, guard_resolves=guard_resolves)
        running = problem.running or Allocation()
        cost = startup = 0.0
        capacity: dict[str, float] = defaultdict(float)
        for key, n in allocation.counts:
            c = problem.template_cost(key)
            cost += n * c
            startup += max(0, n - running[key]) * c
            t = problem.template(key)
            for s, thr in t.covers:
                capacity[s] += n * thr
        cost += problem.idle_cost(allocation)  # whole nodes bought for slices
        objective = cost + problem.startup_weight * startup + problem.removal_weight * problem.removed_cost(
            allocation)
        served, shares, goodput = served_shares(problem.demand, capacity, problem.models)
        if bound is not None:
            gap = max(0.0, objective - bound) / max(abs(objective), 1e-9)
            if status is SolveStatus.OPTIMAL and not within_tolerance(objective - bound, objective,
                                                                      problem.gap):
                # the last line of defence: whatever a path did, "optimal" means proven
                status = SolveStatus.FEASIBLE
                message = (message + "; " if message else "") + (
                    f"solver said optimal but the plan's gap to the dual bound is {gap:.3g} "
                    f"(tolerance {problem.gap:g})")
        else:
            gap = nan
        return cls(status, allocation, objective, cost, startup, gap, build_seconds, solve_seconds,
                   dict(capacity), served, shares, goodput, message, solver, warm_start_accepted,
                   guard_resolves=guard_resolves)
