"""The fleet model shared by the simulator and the live controller.

A :class:`FleetModel` holds the static facts of a fleet — its models, their request shapes,
the template library, prices, start-up times and the re-planner — and computes, for a
:class:`~atoll.envs.fleet.FleetState`, everything both sides need: ready and planned capacity,
the billed cost (running, starting and draining nodes), availability headroom and the nodes
draining instances still hold. :class:`atoll.envs.FleetEnv` and :class:`atoll.control.controller.
Controller` both build one from a :class:`~atoll.envs.config.FleetConfig` with
:meth:`FleetModel.from_config`, so a policy meets the same numbers in both.

Re-planners (and their memo of solves) are shared per process by every fleet model of the same
content — templates, prices, start-up weight and solver settings — so vectorized training envs
and an evaluation's policies reuse each other's solves. The key holds the content itself (never
an ``id()``, which a freed object hands to the next one).
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from atoll.envs import billing
from atoll.envs.capacity_error import families_of, family_of
from atoll.envs.config import MARKET_KINDS, FleetConfig
from atoll.envs.fleet import FleetState, StartupTimes, draw_startup
from atoll.envs.planner import PlanOutcome, Replanner
from atoll.envs.vocabulary import Pool
from atoll.solvers.errors import InputError
from atoll.solvers.problem import Allocation, AllocationProblem, Risk, gpu_type_of
from atoll.solvers.runtime import DEFAULT_RUNTIME
from atoll.solvers.scenarios import (
    ScenarioSpec,
    fleet_markets,
    model_shapes,
    scenario_prices,
    scenario_templates,
)
from atoll.solvers.template_store import paused_gc
from atoll.solvers.tiers import market_tiers, split_tier, spot_twins, tiered_region
from atoll.solvers.types import ModelSpec, Template

_REPLANNERS_MAX = 8
_CORRECTED_MAX = 4
CORRECTION_GRID = 0.02  # learned factors are rounded to a 2% geometric grid before solving
_REPLANNERS: OrderedDict[tuple[object, ...], Replanner] = OrderedDict()


def scenario_library(spec: ScenarioSpec, runtime: str = DEFAULT_RUNTIME) -> tuple[Template, ...]:
    """The scenario's template library for ``runtime``, with slices when the scenario has them (a
    fleet file's ``slices: true``); built or read from the template cache once per process."""
    # the whole spec is the memo key: another fleet of the same name with other regions, GPUs,
    # models or slices must not get the library of the one before
    return _scenario_library(spec, runtime)


@lru_cache(maxsize=4)
def _scenario_library(spec: ScenarioSpec, runtime: str) -> tuple[Template, ...]:
    return scenario_templates(spec, runtime=runtime, slices=spec.slices)


def shared_replanner(base: AllocationProblem, prices: Mapping[Pool, float], config: FleetConfig
                     ) -> Replanner:
    """One re-planner per content (templates, prices, start-up weight, settings) per process."""
    # the library by identity (hashing 2e5 templates costs seconds): the entry holds the tuple,
    # so its id is not reused while the entry lives
    key = (id(base.templates), tuple(sorted(prices.items())), base.startup_weight, config.demand_round,
           config.memoize, config.solver_time_limit, config.solver_node_limit, config.solver_gap, config.risk,
           config.removal_weight)
    hit = _REPLANNERS.get(key)
    if hit is None or hit.base.templates is not base.templates:
        hit = Replanner(base, demand_round=config.demand_round, memoize=config.memoize)
        _REPLANNERS[key] = hit
        while len(_REPLANNERS) > _REPLANNERS_MAX:
            _REPLANNERS.popitem(last=False)
    _REPLANNERS.move_to_end(key)
    return hit


def clear_replanners() -> None:
    """Forget every shared re-planner and its memo (benchmarks measure a cold memo)."""
    _REPLANNERS.clear()


class FleetModel:
    """Static facts of a fleet and the capacity, cost and headroom of a :class:`FleetState`.

    ``shape[m]`` = (input, output) tokens per request of model m: token demand per service is
    requests/s x shape, the unit the templates' throughputs use.
    """

    def __init__(self, config: FleetConfig, models: Sequence[str], templates: Sequence[Template],
                 prices: Mapping[Pool, float], shape: np.ndarray) -> None:
        self.config = config
        self.models: tuple[str, ...] = tuple(models)
        scenario = config.scenario_spec
        self.model_spec = scenario.model  # name -> ModelSpec, the fleet file's own definitions first
        self.specs: tuple[ModelSpec, ...] = tuple(self.model_spec(m) for m in self.models)
        self.prices: dict[Pool, float] = dict(prices)
        self.shape = np.asarray(shape, dtype=float).reshape(len(self.models), 2)
        catalog = scenario.catalog
        self.startup = StartupTimes({name: catalog.config(name) for _, name in prices}, self.model_spec)
        self.median_startup = self.startup.median(tuple(templates))
        k = config.startup_weight
        if k is None:
            k = self.median_startup / config.step_s
        self.base = AllocationProblem(tuple(templates), {}, None, prices, startup_weight=k,
                                      time_limit=config.solver_time_limit, gap=config.solver_gap,
                                      node_limit=config.solver_node_limit,
                                      removal_weight=config.removal_weight).with_risk(config.risk)
        self.replanner = shared_replanner(self.base, prices, config)
        self.templates: dict[str, Template] = dict(self.base.index.by_key)
        self.gpu_types: tuple[str, ...] = tuple(dict.fromkeys(gpu_type_of(cfg) for _, cfg in prices))
        self.cells_by_type = {g: [cell for cell in prices if gpu_type_of(cell[1]) == g]
                              for g in self.gpu_types}
        self.model_index = {name: i for i, name in enumerate(self.models)}
        self._key_info: dict[str, tuple[int, int, float, float]] = {}
        self._key_rows: dict[str, tuple[tuple[int, int, float], ...]] = {}
        self._family: dict[str, str] = {}
        self._family_names: dict[str, int] = {}  # family -> id
        self._family_ids = np.zeros(0, dtype=np.int64)  # family id per position of base.templates
        self._corrected: OrderedDict[tuple[tuple[str, float], ...], Replanner] = OrderedDict()

    @classmethod
    def from_config(cls, config: FleetConfig) -> FleetModel:
        """The fleet of ``config``: its scenario's models (or ``config.models``), library (or
        ``config.templates``), prices of ``config.price_kind`` and request shapes."""
        spec = config.scenario_spec
        models: tuple[str, ...] = config.models or spec.models
        unknown = [m for m in models if m not in spec.models and config.templates is None]
        if unknown:
            raise InputError(f"FleetConfig: models {unknown} are not in scenario {config.scenario!r} "
                             f"({', '.join(spec.models)}); pass templates for them")
        for name in models:
            spec.model(name)
        if config.request_shapes is not None:
            if len(config.request_shapes) != len(models):
                raise InputError(f"FleetConfig: field 'request_shapes' has {len(config.request_shapes)} "
                                 f"pairs for {len(models)} models; give one (input, output) pair per model")
            shape = np.array(config.request_shapes, dtype=float)
        else:
            shape = np.array([[s.input_tokens, s.output_tokens] for s in model_shapes(spec, models)])
        library = (config.templates if config.templates is not None
                   else scenario_library(spec, config.runtime))
        kept = frozenset(models)
        templates = tuple(t for t in library if t.service.model in kept)
        if len(templates) == len(library):  # the library itself: its stored index serves the problems
            templates = tuple(library)
        prices = scenario_prices(spec, spot=config.price_kind == "spot")
        if spec.markets and config.availability in MARKET_KINDS:  # a fleet file's market per pool
            templates, prices = market_tiers(templates, fleet_markets(spec, config.availability),
                                             scenario_prices(spec), scenario_prices(spec, spot=True))
        elif config.availability == "hedged":  # both tiers of every cell: spot twins at spot prices
            spot = scenario_prices(spec, spot=True)
            prices = {**prices, **{(tiered_region(r, "spot"), c): p for (r, c), p in spot.items()}}
            templates = templates + spot_twins(templates)
        return cls(config, models, templates, prices, shape)

    # ----- per template ---------------------------------------------------------------------
    def info(self, key: str) -> tuple[int, int, float, float]:
        """(model index, phase index, throughput tokens/s, $/h) of a template key; a co-located
        template's first row (its prompt tokens/s; :meth:`rows` has both)."""
        hit = self._key_info.get(key)
        if hit is None:
            t = self.base.template(key)
            phase = 1 if t.service.phase.value == "decode" else 0  # a co-located one: its prompt row
            hit = (self.model_index[t.service.model], phase, t.throughput, self.base.template_cost(key))
            self._key_info[key] = hit
        return hit

    def rows(self, key: str) -> tuple[tuple[int, int, float], ...]:
        """(model index, phase index, tokens/s) of each service a template serves: one, or both
        phases of its model for a co-located template."""
        hit = self._key_rows.get(key)
        if hit is None:
            mi, ph, thr, _ = self.info(key)
            t = self.base.template(key)
            hit = ((mi, 0, t.throughput), (mi, 1, t.decode_throughput)) if t.colocated else ((mi, ph, thr),)
            self._key_rows[key] = hit
        return hit

    def family(self, key: str) -> str:
        """The template family of a key (:func:`atoll.envs.capacity_error.family_of`)."""
        hit = self._family.get(key)
        if hit is None:
            hit = self._family[key] = family_of(self.templates[key])
        return hit

    def families(self) -> tuple[str, ...]:
        """Every family of the fleet's templates, sorted."""
        self._name_families()
        return tuple(self._family_names)

    def _name_families(self) -> None:
        """Name every template's family once, in one pass over the library (the env draws the
        world's errors per family at every reset, and the correction indexes them by position):
        ``_family`` per key, ``_family_names`` (sorted family -> id), ``_family_ids`` per position
        of ``base.templates``."""
        if len(self._family_ids) == len(self.base.templates):
            return
        families = families_of(self.base.templates, self.base.index)
        self._family.update(zip(self.base.index.keys, families, strict=True))
        self._family_names = {f: i for i, f in enumerate(sorted(set(families)))}
        self._family_ids = np.asarray([self._family_names[f] for f in families], dtype=np.int64)

    def node_hours(self, state: FleetState, seconds: float) -> tuple[float, float]:
        """(node-hours, of which on-demand) held over the next ``seconds``, billed as :meth:`cost`
        (:func:`atoll.envs.billing.node_hours`)."""
        return billing.node_hours(self, state, seconds)

    def tokens(self, rates: np.ndarray) -> np.ndarray:
        """[M, 2] tokens/s per (prefill, decode) of request rates [M] (req/s)."""
        return np.asarray(rates, dtype=float)[:, None] * self.shape

    # ----- of a fleet state -----------------------------------------------------------------
    def _ready_entries(self, state: FleetState, step_s: float) -> list[tuple[str, float, float]]:
        """(key, instances ready over the next ``step_s`` seconds (fractional for the part of the
        step they are ready), instances planned) of every entry."""
        out = [(key, float(n), float(n)) for key, n in state.running.items() if n]
        for key, entries in state.starting.items():
            for count, left in entries:
                out.append((key, count * (step_s - left) / step_s if left < step_s else 0.0, count))
        for key, entries in state.replaced.items():
            for count, left, _ in entries:  # serving until their replacement is ready
                out.append((key, count * (min(left, step_s) / step_s if step_s > 0 else 1.0), 0.0))
        return out

    def capacity(self, state: FleetState, step_s: float, factors: Mapping[str, float] | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(capacity ready over the next ``step_s`` seconds, planned capacity) per model and
        phase, tokens/s; an instance that becomes ready during the step counts for the part of
        the step it is ready (``step_s`` = 0: ready now). ``factors`` (family -> factor) scales
        each template's throughput: the true world's, or the planner's learned correction."""
        m = len(self.models)
        ready = np.zeros((m, 2))
        planned = np.zeros((m, 2))
        for key, r, p in self._ready_entries(state, step_s):
            factor = factors.get(self.family(key), 1.0) if factors else 1.0
            for mi, ph, thr in self.rows(key):
                if factors:
                    thr *= factor
                ready[mi, ph] += r * thr
                planned[mi, ph] += p * thr
        return ready, planned

    def ready_by_family(self, state: FleetState, step_s: float) -> dict[tuple[int, int], dict[str, float]]:
        """(model index, phase index) -> family -> the model's capacity ready over the next
        ``step_s`` seconds (tokens/s): the exposure the capacity correction learns from."""
        out: dict[tuple[int, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for key, r, _ in self._ready_entries(state, step_s):
            if r > 0:
                for mi, ph, thr in self.rows(key):
                    out[(mi, ph)][self.family(key)] += r * thr
        return {svc: dict(fams) for svc, fams in out.items()}

    def changing(self, state: FleetState, step_s: float) -> set[tuple[int, int]]:
        """(model index, phase index) of the services whose serving capacity changes during the
        next ``step_s`` seconds (an instance becomes ready, or a replaced one stops): averages over
        such an interval mix two fleets, so the capacity correction leaves them out."""
        out: set[tuple[int, int]] = set()
        for key, entries in state.starting.items():
            if any(left < step_s for _, left in entries):
                out.update(self._service_of(key))
        for key, entries in state.replaced.items():
            if any(left < step_s for _, left, _ in entries):
                out.update(self._service_of(key))
        return out

    def instances_ready(self, state: FleetState, step_s: float) -> np.ndarray:
        """[M, 2] instances ready over the next ``step_s`` seconds (fractional as in :meth:`capacity`);
        a co-located instance is a server of both phases."""
        out = np.zeros((len(self.models), 2))
        for key, r, _ in self._ready_entries(state, step_s):
            for mi, ph, _ in self.rows(key):
                out[mi, ph] += r
        return out

    def cost(self, state: FleetState, seconds: float) -> np.ndarray:
        """$ per model for holding the fleet ``seconds`` from now: running and starting nodes for
        the whole interval, draining nodes until their drain ends, replaced ones (make-before-
        break) until their replacement is ready plus their drain (:func:`atoll.envs.billing.cost`)."""
        return billing.cost(self, state, seconds)

    def nodes_held(self, state: FleetState) -> dict[Pool, int]:
        return state.nodes_held(self.templates)

    def draining_by_cell(self, state: FleetState) -> dict[Pool, int]:
        """Nodes still held by draining and replaced instances (the solver may not hand them
        out yet); leaving slices count the ceil of their share (their nodes stay until they
        drain: conservative when they share a node with staying slices)."""
        use: dict[Pool, float] = defaultdict(float)
        for key, entries in [*state.draining.items(), *state.replaced.items()]:
            n = sum(int(e[0]) for e in entries)
            if n:
                t = self.templates[key]
                for cfg, k in t.node_use:
                    use[(t.region, cfg)] += n * k
        return {cell: math.ceil(u - 1e-9) for cell, u in use.items()}

    def held_by_gpu_type(self, state: FleetState) -> np.ndarray:
        """[GPU types] nodes held (:meth:`nodes_held`), in the order of ``gpu_types``."""
        index = {g: j for j, g in enumerate(self.gpu_types)}
        out = np.zeros(len(self.gpu_types))
        for (_, config), n in self.nodes_held(state).items():
            out[index[gpu_type_of(config)]] += n
        return out

    def headroom(self, state: FleetState, caps: Mapping[Pool, int]) -> np.ndarray:
        """[GPU types] (nodes offered - nodes held) / nodes offered; 0 where none are offered."""
        held = self.nodes_held(state)
        out = np.zeros(len(self.gpu_types))
        for j, g in enumerate(self.gpu_types):
            cap = sum(caps.get(cell, 0) for cell in self.cells_by_type[g])
            use = sum(held.get(cell, 0) for cell in self.cells_by_type[g])
            out[j] = (cap - use) / cap if cap > 0 else 0.0
        return out

    def spare_ondemand(self, state: FleetState, caps: Mapping[Pool, int]) -> float:
        """Under ``hedged``: (on-demand nodes offered - held) / offered over every on-demand
        cell; 0 in the other markets (they have no separate on-demand quota)."""
        if self.config.availability not in ("hedged", "market"):
            return 0.0
        held = self.nodes_held(state)
        cells = [cell for cell in caps if split_tier(cell[0])[1] == "on-demand"]
        offered = sum(caps[cell] for cell in cells)
        if offered <= 0:
            return 0.0
        return max(0.0, (offered - sum(held.get(cell, 0) for cell in cells)) / offered)

    # ----- re-planning ----------------------------------------------------------------------
    def corrected_replanner(self, factors: Mapping[str, float] | None) -> Replanner:
        """The re-planner whose templates serve their throughput x the learned factor of their
        family. Factors are rounded to the nearest point of a 2% geometric grid (the demand's
        rounding), so a factor moving by a fraction of a percent reuses the library, its index
        and its memo; all 1 after rounding is the plain re-planner."""
        step = math.log1p(CORRECTION_GRID)
        rounded = tuple(sorted((f, round(math.exp(round(math.log(v) / step) * step), 6))
                               for f, v in (factors or {}).items() if v > 0))
        rounded = tuple((f, v) for f, v in rounded if v != 1.0)
        if not rounded:
            return self.replanner
        hit = self._corrected.get(rounded)
        if hit is None:
            # a 2e5-entry index per correction on fleet20: built with the collector paused and
            # frozen out of it after (see atoll.solvers.template_store.paused_gc)
            with paused_gc(young_first=True):
                hit = self._corrected[rounded] = self._rescaled_replanner(rounded)
            while len(self._corrected) > _CORRECTED_MAX:
                self._corrected.popitem(last=False)
        self._corrected.move_to_end(rounded)
        return hit

    def _rescaled_replanner(self, rounded: tuple[tuple[str, float], ...]) -> Replanner:
        """A re-planner over the library with each family's throughput x its rounded factor."""
        self._name_families()
        factor = np.ones(len(self._family_names))
        for fam, v in rounded:
            if fam in self._family_names:
                factor[self._family_names[fam]] = v
        # keys and rows are the base library's: only the throughputs change
        near = next(reversed(self._corrected.values())).base.index if self._corrected else None
        templates = self.base.index.rescaled(factor[self._family_ids], near=near).templates
        base = AllocationProblem(templates, {}, None, self.prices,
                                 startup_weight=self.base.startup_weight,
                                 time_limit=self.base.time_limit, gap=self.base.gap,
                                 node_limit=self.base.node_limit,
                                 risk=self.base.risk, removal_weight=self.base.removal_weight)
        return Replanner(base, demand_round=self.config.demand_round, memoize=self.config.memoize)

    def replan(self, state: FleetState, models: frozenset[str], demand: np.ndarray,
               caps: Mapping[Pool, int], replanner: Replanner | None = None,
               grow: frozenset[str] = frozenset(), factors: Mapping[str, float] | None = None,
               risk: Mapping[str, Risk] | None = None, diagnose: bool = True) -> PlanOutcome:
        """Re-optimize ``models`` for ``demand`` ([M, 2] tokens/s) within ``caps`` minus the nodes
        draining instances still hold, the others fixed at their planned counts; the ``grow``
        ones (a subset of ``models``) keep every planned instance and may only add. With
        ``factors`` (family -> learned capacity factor) it solves with corrected capacities; with
        ``risk`` (model -> Risk) those models take that risk instead of the configured one;
        ``diagnose`` as :meth:`Replanner.plan`'s."""
        if factors and replanner is None:
            replanner = self.corrected_replanner(factors)
        svc: dict[str, float] = {}
        for i, m in enumerate(self.models):
            svc[f"{m}/prefill"] = float(demand[i, 0])
            svc[f"{m}/decode"] = float(demand[i, 1])
        drain = self.draining_by_cell(state)
        avail = {cell: max(0, n - drain.get(cell, 0)) for cell, n in caps.items()}
        return (replanner or self.replanner).plan(models, svc, avail, state.planned(), grow=grow, risk=risk,
                                                  diagnose=diagnose)

    def apply(self, state: FleetState, allocation: Allocation, rng: np.random.Generator | None = None) -> int:
        """Move ``state`` toward ``allocation`` with the config's transition (see
        :meth:`FleetState.apply_plan`); instances started. With ``startup="sampled"`` and a
        generator each added instance's start-up is drawn from it (:func:`atoll.envs.fleet.
        draw_startup`); ``scale_down="lose"`` stops removed instances without a drain."""
        for key in set(allocation.as_dict()) - set(self.startup.seconds):
            self.startup.of(self.templates[key])
        services_of = self._service_of if self.config.transition == "make-before-break" else None
        draw = None
        if self.config.startup == "sampled" and rng is not None:
            def draw(key: str, n: int) -> list[float]:
                t = self.templates[key]
                model = self.model_spec(t.service.model)
                return [draw_startup(t, model, state, rng) for _ in range(n)]
        drain = 0.0 if self.config.scale_down == "lose" else self.config.drain_s
        return state.apply_plan(allocation, self.startup.seconds, drain, services_of=services_of, draw=draw)

    def spot_pool(self, key: str) -> str | None:
        """The spot pool a template's nodes are bought in (its region's spot tier; every region
        when the whole fleet is on spot), None for on-demand."""
        t = self.templates[key]
        if self.config.availability != "hedged" and self.config.price_kind == "spot":
            return t.region
        return t.region if split_tier(t.region)[1] == "spot" else None

    def risk_exposure(self, state: FleetState) -> tuple[np.ndarray, np.ndarray]:
        """([M] spread, [M] on-demand share) of the planned fleet (running + starting): per model
        the largest share of its planned capacity on one spot pool, max over phases, and the
        share on on-demand, min over phases (0 and 0 for a model with no planned capacity)."""
        m = len(self.models)
        total = np.zeros((m, 2))
        ondemand = np.zeros((m, 2))
        pools: dict[tuple[int, int, str], float] = defaultdict(float)
        for key, n in state.planned().counts:
            if not n:
                continue
            pool = self.spot_pool(key)
            for mi, ph, thr in self.rows(key):
                total[mi, ph] += n * thr
                if pool is None:
                    ondemand[mi, ph] += n * thr
                else:
                    pools[(mi, ph, pool)] += n * thr
        largest = np.zeros((m, 2))
        for (mi, ph, _), c in pools.items():
            largest[mi, ph] = max(largest[mi, ph], c)
        with np.errstate(divide="ignore", invalid="ignore"):
            safe = np.where(total > 0, total, 1.0)
            spread = np.where(total > 0, largest / safe, 0.0).max(axis=1)
            share = np.where(total > 0, ondemand / safe, 1.0)  # a phase without capacity: no say
        return spread, np.where((total > 0).any(axis=1), share.min(axis=1), 0.0)

    def _service_of(self, key: str) -> tuple[tuple[int, int], ...]:
        """(model index, phase index) of each service the template serves."""
        return tuple((mi, ph) for mi, ph, _ in self.rows(key))
