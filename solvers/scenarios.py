"""Evaluation scenarios: models, GPU types, regions, request shapes, demand mixes, availability.

The bundled scenarios (:data:`SCENARIOS`) are the fleet files under ``atoll/solvers/data/fleets``,
each read as a scenario by :func:`scenario_from_fleet` (see :mod:`atoll.solvers.fleet`).
``core``: Phi-4-14B, GPT-OSS-20B, Qwen3-32B on L4/A10G/L40S x {1,2,4,8} in aws:us-east-2 and
aws:ap-northeast-2, 10 req/s per model. ``extended``: the six default models, adds A100-80GB,
H100 and gcp:us-central1, 25 req/s per model. ``fleet20``: 20 models (the six, then their
fine-tunes) on extended's GPUs and regions, 10 req/s per model.

Request lengths come from the Azure LLM inference 2023 traces (the files' ``request_shapes``),
assigned to models alternately as in the Coral paper (model 0 "code", model 1 "conv", ...): per model a
``RequestShape(mean input, mean output)``; demand tokens/s = req/s x mean input (prefill
service) and req/s x mean output (decode service).

Mixes keep the total request rate: ``even`` (every model the same), ``large-heavy`` (80% of
requests to the largest third of the models by total parameters, rounded to at least one
model, split evenly; 20% evenly over the rest), ``small-heavy`` (80% to the smallest third).

Availability per (region, config): ``ample`` = AMPLE_NODES nodes of every offered config
(every method is feasible); ``scarce`` = ceil((1 + headroom) x u_rc), where u_rc is the number
of nodes of config c in region r used by the cheapest plan of the even mix under ample
availability (the cost-mode ILP), headroom 0.25 (core) / 0.75 (extended); configs that plan
does not use get none. So the total node capacity is only 25% / 75% above (plus rounding up)
what the cheapest even plan needs, and only in the configs it chose.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from atoll.solvers.allocation import solve_allocation
from atoll.solvers.catalog import Catalog, catalog_for, fleet_catalog
from atoll.solvers.errors import InputError
from atoll.solvers.fleet import AZURE_TRACES, FleetFileError, FleetSpec, bundled_fleets, load_fleet
from atoll.solvers.models import get_model
from atoll.solvers.paths import shared_data_dir
from atoll.solvers.perf import RequestShape
from atoll.solvers.problem import AllocationProblem, SolveStatus
from atoll.solvers.registry import Registry, UnknownNameError
from atoll.solvers.runtime import DEFAULT_RUNTIME, check_runtime, slices_default
from atoll.solvers.templates import LibrarySpec, build_library
from atoll.solvers.types import (
    DEFAULT_PD,
    NODE_GPU_COUNTS,
    PD_MODES,
    GpuType,
    ModelSpec,
    Offer,
    Phase,
    Service,
    Template,
)

AMPLE_NODES = 1000
AVAILABILITIES: tuple[str, ...] = ("ample", "scarce")
# what `solve` plans a static plan for: the two caps above, and the markets (spot prices; both
# tiers; a fleet file's own market per pool)
SOLVE_AVAILABILITIES: tuple[str, ...] = ("ample", "scarce", "spot", "hedged", "market")
MIXES: tuple[str, ...] = ("even", "large-heavy", "small-heavy")
HEAVY_SHARE = 0.8


@dataclass(frozen=True)
class ScenarioSpec:
    """Everything a plan of a scenario depends on besides its demand series: models, GPU types,
    regions, request shapes and rates, availability and markets, the library's settings and, for a
    fleet file (:func:`atoll.envs.fleet_file.read_fleet`), its own models, GPU types and offers.
    A value: the bundled scenarios are in :data:`SCENARIOS`; a fleet's is passed to whatever plans
    it (it pickles to worker processes and Ray tasks like any frozen dataclass)."""

    name: str
    models: tuple[str, ...]
    gpu_types: tuple[str, ...]
    regions: tuple[str, ...]
    req_per_s: float  # per model in the even mix
    scarce_headroom: float
    traces: tuple[str, ...] = ("code", "conv")
    # A fleet file's scenario (atoll.envs.fleet_file) carries its own request shapes and mean
    # request rates per model (from its workloads), its node caps and its serving runtime.
    shapes: tuple[tuple[str, RequestShape], ...] = ()
    rates: tuple[tuple[str, float], ...] = ()
    static_availability: tuple[tuple[tuple[str, str], int], ...] | None = None
    pool_traces: tuple[tuple[tuple[str, str], Any], ...] = ()  # (cell, atoll.solvers.fleet.PoolTrace)
    runtime: str = DEFAULT_RUNTIME
    n_max: int = 6
    rho: float = 12.0
    # a fleet file's ``slices: true``: its library's stages may use g of a node's G GPUs (vllm)
    slices: bool = False
    # a fleet file's market per pool (on-demand, spot, hedged; cells left out: on-demand) and the
    # on-demand quota of its hedged pools (left out: AMPLE_NODES)
    markets: tuple[tuple[tuple[str, str], str], ...] = ()
    ondemand_quota: tuple[tuple[tuple[str, str], int], ...] = ()
    # a fleet file's own model definitions (they override built-ins of the same name), GPU types
    # and offers (the regions it offers in sell exactly these): its catalog and models
    user_models: tuple[ModelSpec, ...] = ()
    gpus: tuple[GpuType, ...] = ()
    offers: tuple[Offer, ...] = ()
    # how its models are served (atoll.solvers.types.PD_MODES), and a fleet file's per-model modes
    pd: str = DEFAULT_PD
    model_pd: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        owner = f"ScenarioSpec {self.name!r}"
        check_runtime(self.runtime)
        if self.pd not in PD_MODES:
            raise ValueError(f"{owner}: field 'pd' must be one of {', '.join(PD_MODES)}, got {self.pd!r}")
        if not isinstance(self.slices, bool):
            raise ValueError(f"{owner}: field 'slices' must be a bool, got {self.slices!r}")
        if self.slices and self.runtime != "vllm":
            raise ValueError(f"{owner}: field 'slices' needs runtime 'vllm', got {self.runtime!r}")
        if not self.models:
            raise ValueError(f"{owner}: field 'models' must name at least one model")
        if not (self.req_per_s > 0 and math.isfinite(self.req_per_s)):
            raise ValueError(f"{owner}: field 'req_per_s' must be > 0, got {self.req_per_s!r}")
        if self.scarce_headroom < 0:
            raise ValueError(f"{owner}: field 'scarce_headroom' must be >= 0")
        unknown = [t for t in self.traces if t not in AZURE_TRACES]
        if unknown or not self.traces:
            raise ValueError(f"{owner}: field 'traces' must be from {sorted(AZURE_TRACES)}, got {unknown}")

    @property
    def configs(self) -> tuple[str, ...]:
        return tuple(f"{n}x{g}" for g in self.gpu_types for n in NODE_GPU_COUNTS)

    @property
    def catalog(self) -> Catalog:
        """The catalog this scenario plans with: the shipped table, with a fleet's GPU types and
        offers overlaid."""
        return fleet_catalog(self.gpus, self.offers)

    @property
    def own_catalog(self) -> bool:
        """Whether the scenario brings models, GPU types or offers of its own (a fleet file)."""
        return bool(self.user_models or self.gpus or self.offers)

    def model(self, name: str) -> ModelSpec:
        """A model by name or alias, the scenario's own definitions first."""
        return get_model(name, self.user_models)


def scenario_from_fleet(fleet: FleetSpec) -> ScenarioSpec:
    """A fleet file read as a bundled scenario (:mod:`atoll.solvers.fleet`, "The bundled scenarios
    are fleet files"): its models, regions, GPU types as its regions list them, its Azure request
    shapes (``request_shapes``), its workloads' one ``mean_rate`` as the even mix's req/s per model,
    ``scarce_headroom``, runtime, ``n_max``, ``rho``, ``slices`` and ``pd``. Whatever such a
    scenario could not hold is a :class:`FleetFileError` naming the field: own models, GPU types or
    offers, an ``availability`` section, a ``removal_weight``, the workloads' own request shapes,
    or workloads without one common ``mean_rate``."""

    def refuse(field_: str, why: str) -> FleetFileError:
        return FleetFileError(f"{fleet.path}: {field_}: a bundled scenario {why}")

    if fleet.user_models:
        raise refuse("models", f"plans catalog models; {fleet.user_models[0].name!r} is the file's own")
    if fleet.gpus:
        raise refuse("gpus", "plans the catalog's GPU types; drop the file's own")
    catalog = fleet_catalog()  # the shipped table
    own = [o for o in fleet.offers
           if o.region not in catalog.regions or catalog.offers_in(o.region).get(o.config) != o]
    if own:
        raise refuse("regions", f"buys at catalog prices ('catalog: true'); {own[0].region} has offers of "
                                f"its own")
    if fleet.availability is not None or fleet.pool_traces or fleet.ondemand_quota:
        raise refuse("availability", "takes its availability from each command (ample, scarce, spot, "
                                     "hedged); drop the section")
    if fleet.removal_weight is not None:
        raise refuse("removal_weight", "takes the price of churn from each command (--removal-weight)")
    if not fleet.request_traces:
        raise refuse("request_shapes", "plans with the Azure LLM 2023 means; give e.g. [code, conv]")
    rates = {w.mean_rate for w in fleet.workloads}
    rate = next(iter(rates))
    if len(rates) != 1 or rate is None:
        raise refuse("workloads", f"has one mean_rate for every model (its even mix), got "
                                  f"{sorted(str(r) for r in rates)}")
    gpu_types = fleet.listed_gpu_types or fleet.gpu_types
    return ScenarioSpec(fleet.name, fleet.model_names, gpu_types, fleet.regions, float(rate),
                        fleet.scarce_headroom, traces=fleet.request_traces, runtime=fleet.runtime,
                        n_max=fleet.n_max, rho=fleet.rho, slices=fleet.slices,
                        pd=fleet.pd, model_pd=fleet.model_pd)


def _bundled_scenarios() -> dict[str, ScenarioSpec]:
    """Every bundled fleet file, read as a scenario and named after its file."""
    out = {}
    for name, path in bundled_fleets().items():
        spec = scenario_from_fleet(load_fleet(path))
        if spec.name != name:
            raise FleetFileError(f"{path}: name: a bundled scenario is named after its file, {name!r}; "
                                 f"got {spec.name!r}")
        out[name] = spec
    return out


# core, extended and fleet20 (the contest's many-model cell, where one re-planning rule for every
# model is a poor fit): atoll/solvers/data/fleets/<name>.yaml
SCENARIOS: Registry[ScenarioSpec] = Registry("scenario", _bundled_scenarios())


def _choice(kind: str, value: str, valid: Sequence[str], plural: str = "") -> str:
    if value not in valid:
        raise UnknownNameError(f"unknown {kind} {value!r}; valid {plural or kind + 's'}: {', '.join(valid)}")
    return value


@lru_cache(maxsize=8)
def trace_shape(trace: str, data_dir: Path | None = None) -> RequestShape:
    """Mean context (input) and generated (output) tokens of one Azure LLM 2023 trace (read with
    the csv module: pandas would add its 0.3 s import to every command that builds a fleet)."""
    _choice("trace", trace, list(AZURE_TRACES))
    path = (data_dir or shared_data_dir()) / "azure-llm-inference-2023" / AZURE_TRACES[trace]
    if not path.exists():
        raise FileNotFoundError(f"{path}: Azure LLM inference 2023 trace not found")
    columns = ("ContextTokens", "GeneratedTokens")
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError(f"{path}: columns {missing} missing (has {reader.fieldnames}); an Azure LLM "
                             f"inference 2023 trace has {', '.join(columns)}")
        try:
            rows = [(int(row[columns[0]]), int(row[columns[1]])) for row in reader]
        except (TypeError, ValueError) as exc:
            raise InputError(f"{path}: a token count is not an integer ({exc}); re-download the "
                             f"trace") from exc
    if not rows:
        raise InputError(f"{path}: no requests; re-download the trace")
    # one contiguous column each: numpy's pairwise sum, the one pandas' mean takes
    context, generated = (np.asarray(col, dtype=np.float64) for col in zip(*rows, strict=True))
    return RequestShape(float(context.sum() / len(rows)), float(generated.sum() / len(rows)))


def request_shapes(spec: ScenarioSpec, data_dir: Path | None = None) -> dict[str, RequestShape]:
    if spec.shapes:
        return dict(spec.shapes)
    return {m: trace_shape(spec.traces[i % len(spec.traces)], data_dir) for i, m in enumerate(spec.models)}


def model_shapes(spec: ScenarioSpec, models: Sequence[str], data_dir: Path | None = None
                 ) -> list[RequestShape]:
    """The request shape of each of ``models``: the scenario's own for its models; models outside
    it take the Azure traces' shapes in turn, as the scenario's do."""
    known = request_shapes(spec, data_dir)
    return [known.get(name) or trace_shape(spec.traces[i % len(spec.traces)], data_dir)
            for i, name in enumerate(models)]


def request_rates(spec: ScenarioSpec, mix: str) -> dict[str, float]:
    """req/s per model; every mix has the same total, len(models) x req_per_s."""
    _choice("mix", mix, MIXES, "mixes")
    if spec.rates:  # a fleet's own demand: the workloads' mean rates, whatever the mix
        return dict(spec.rates)
    total = spec.req_per_s * len(spec.models)
    if mix == "even" or len(spec.models) == 1:
        return {m: spec.req_per_s for m in spec.models}
    by_size = sorted(spec.models, key=lambda m: spec.model(m).params_b, reverse=(mix == "large-heavy"))
    k = max(1, round(len(spec.models) / 3))
    heavy, rest = by_size[:k], by_size[k:]
    rates = {m: HEAVY_SHARE * total / k for m in heavy}
    rates.update({m: (1 - HEAVY_SHARE) * total / len(rest) for m in rest})
    return {m: rates[m] for m in spec.models}


def scenario_demand(spec: ScenarioSpec, mix: str, shapes: Mapping[str, RequestShape] | None = None,
                    ) -> dict[str, float]:
    """service name -> tokens/s: prefill = req/s x mean input, decode = req/s x mean output."""
    shapes = shapes or request_shapes(spec)
    demand = {}
    for m, rate in request_rates(spec, mix).items():
        demand[Service(m, Phase.PREFILL).name] = rate * shapes[m].input_tokens
        demand[Service(m, Phase.DECODE).name] = rate * shapes[m].output_tokens
    return demand


def scenario_prices(spec: ScenarioSpec, *, spot: bool = False, catalog: Catalog | None = None,
                    ) -> dict[tuple[str, str], float]:
    """On-demand $/node-hour of every config of the scenario's GPU types each region offers
    (``catalog``: default the scenario's own)."""
    catalog = catalog or spec.catalog
    wanted = set(spec.configs)
    return {(r, c): o.price(spot=spot) for r in spec.regions
            for c, o in catalog.offers_in(r).items() if c in wanted}


def ample_availability(spec: ScenarioSpec, catalog: Catalog | None = None) -> dict[tuple[str, str], int]:
    """AMPLE_NODES of every offered config, or a fleet file's static caps and, for a pool with an
    availability trace, the most nodes it ever offers (0 where the file names none)."""
    prices = scenario_prices(spec, catalog=catalog)
    if spec.static_availability is not None:
        caps = dict(spec.static_availability)
        caps.update({cell: max(trace.nodes) for cell, trace in spec.pool_traces})
        return {rc: caps.get(rc, 0) for rc in prices}
    return {rc: AMPLE_NODES for rc in prices}


def market_caps(spec: ScenarioSpec, markets: Mapping[tuple[str, str], str],
                catalog: Catalog | None = None) -> dict[tuple[str, str], int]:
    """Static caps of a market per pool, for a plan that does not move with time: an on-demand
    tier gets the pool's cap (hedged: its on-demand quota, default AMPLE_NODES), a spot tier the
    pool's cap (a pool with a trace: the most nodes it ever offers)."""
    from atoll.solvers.tiers import tiered_region, tiers_of

    quota = dict(spec.ondemand_quota)
    out: dict[tuple[str, str], int] = {}
    for cell, cap in ample_availability(spec, catalog).items():
        market = markets.get(cell, "on-demand")
        tiers = tiers_of(market)
        if "on-demand" in tiers:
            out[cell] = quota.get(cell, AMPLE_NODES) if market == "hedged" else cap
        if "spot" in tiers:
            out[(tiered_region(cell[0], "spot"), cell[1])] = cap
    return out


def fleet_markets(spec: ScenarioSpec, availability: str) -> dict[tuple[str, str], str]:
    """The market of every pool under ``availability``: the fleet file's own (``market``), or
    every pool ``spot`` or ``hedged``."""
    cells = scenario_prices(spec)
    if availability == "market":
        own = dict(spec.markets)
        return {cell: own.get(cell, "on-demand") for cell in cells}
    return dict.fromkeys(cells, availability)


BUNDLED_SCENARIOS: tuple[str, ...] = tuple(SCENARIOS)


def scenario_spec(scenario: str | ScenarioSpec) -> ScenarioSpec:
    """A bundled scenario by name, or the given spec (a fleet file's) itself."""
    return scenario if isinstance(scenario, ScenarioSpec) else SCENARIOS[scenario]


def _slices(spec: ScenarioSpec, runtime: str, slices: bool | None) -> bool:
    """``slices``, or when None the scenario's own for its own runtime and vllm's default (slices)
    otherwise; refused (InputError) unless ``runtime`` is vllm."""
    want = slices_default(runtime, spec.runtime, spec.slices) if slices is None else slices
    if want and runtime != "vllm":
        said = "the fleet file's 'slices: true'" if slices is None else "slices"
        raise InputError(f"scenario {spec.name!r}: {said} needs runtime 'vllm', got runtime {runtime!r}; "
                         f"plan with runtime vllm or without slices")
    return want


def library_spec(spec: ScenarioSpec, runtime: str | None = None, slices: bool | None = None,
                 pd: str | None = None) -> LibrarySpec:
    """The scenario's ``LibrarySpec`` with each model's own request shape, for ``runtime``
    (:mod:`atoll.solvers.runtime`; default the scenario's own); ``slices``: stages may use g of
    a node's G GPUs (``vllm`` only; None: :func:`~atoll.solvers.runtime.slices_default`);
    ``pd``: how every model is served (None: the scenario's own, with its per-model modes)."""
    runtime = runtime or spec.runtime
    slices = _slices(spec, runtime, slices)
    shapes = tuple(request_shapes(spec).items())
    modes = {"pd": spec.pd, "model_pd": spec.model_pd} if pd is None else {"pd": pd, "model_pd": ()}
    return LibrarySpec(models=spec.models, regions=spec.regions, gpu_types=spec.gpu_types,
                           model_shapes=shapes, runtime=runtime, n_max=spec.n_max, rho=spec.rho,
                           slices=slices, fleet=spec if spec.own_catalog else None, **modes)


# Here, not in atoll.solvers.templates: the library is library_spec's (this module's request shapes)
# and build_problem below builds it, so in templates.py it would import this module, which imports it.
def scenario_templates(spec: ScenarioSpec, *, cache_dir: Path | None = None, workers: int | None = None,
                       progress: bool | Callable[[int, int], None] = False, runtime: str | None = None,
                       catalog: Catalog | None = None, slices: bool | None = None,
                       pd: str | None = None) -> tuple[Template, ...]:
    """The scenario's template library (built once, then read from the on-disk cache)."""
    library = build_library(library_spec(spec, runtime, slices, pd), cache_dir=cache_dir, workers=workers,
                                progress=progress, catalog=catalog)
    return tuple(library.templates)


_SCARCE: dict[tuple[ScenarioSpec, int, int], dict[tuple[str, str], int]] = {}


def scarce_availability(spec: ScenarioSpec, templates: Sequence[Template],
                        catalog: Catalog | None = None) -> dict[tuple[str, str], int]:
    """ceil((1 + headroom) x nodes of each (region, config) in the cheapest even-mix plan)."""
    prices = scenario_prices(spec, catalog=catalog)
    memo = (spec, hash(tuple(t.key for t in templates)), hash(tuple(sorted(prices.items()))))
    if memo in _SCARCE:
        return dict(_SCARCE[memo])
    problem = AllocationProblem(tuple(templates), scenario_demand(spec, "even"),
                                ample_availability(spec, catalog), prices)
    res = solve_allocation(problem)
    if res.allocation is None or res.status is not SolveStatus.OPTIMAL:
        raise RuntimeError(f"scenario {spec.name}: the even-mix plan behind 'scarce' availability "
                           f"failed ({res.status.value}: {res.message})")
    used: dict[tuple[str, str], float] = {}
    for key, n in res.allocation.counts:
        t = problem.template(key)
        for c, k in t.node_use:
            used[(t.region, c)] = used.get((t.region, c), 0) + k * n
    caps = {rc: (math.ceil((1 + spec.scarce_headroom) * used[rc] - 1e-9) if rc in used else 0)
            for rc in problem.prices}
    _SCARCE[memo] = caps
    return dict(caps)


AVAILABILITY: Mapping[str, Callable[[ScenarioSpec, Sequence[Template], Catalog | None],
                                     dict[tuple[str, str], int]]] = {
    "ample": lambda spec, _templates, catalog: ample_availability(spec, catalog),
    "scarce": scarce_availability,
}


def build_problem(scenario: str | ScenarioSpec, availability: str = "ample", mix: str = "even", *,
                  templates: Sequence[Template] | None = None, mode: str = "cost",
                  time_limit: float | None = None, gap: float = 1e-4,
                  cache_dir: Path | None = None, progress: bool | Callable[[int, int], None] = False,
                  runtime: str | None = None, what_if_2gpu: bool = False,
                  slices: bool | None = None, pd: str | None = None) -> AllocationProblem:
    """The allocation problem of a scenario (a bundled one's name, or a fleet file's spec);
    ``templates`` overrides the library (tests);
    ``runtime`` picks the library of what that serving runtime can run. ``what_if_2gpu``: the
    HYPOTHETICAL catalog with 2-GPU AWS nodes (:func:`atoll.solvers.catalog.what_if_two_gpu_nodes`),
    for the paper comparison only. ``slices``: the ``vllm`` library whose stages may use g of a
    node's G GPUs (the ILP then buys whole nodes, :mod:`atoll.solvers.packing`); None: the
    scenario's own (a fleet file's ``slices``). ``pd``: how every model is served
    (:data:`~atoll.solvers.types.PD_MODES`; None: the scenario's own)."""
    spec = scenario_spec(scenario)
    _choice("availability", availability, SOLVE_AVAILABILITIES, "availabilities")
    _choice("mix", mix, MIXES, "mixes")
    if availability == "market" and not spec.markets:
        raise InputError(f"availability 'market' is a fleet file's own market per pool and scenario "
                         f"{spec.name!r} has none; give --fleet FILE, or one of ample, scarce, spot, hedged")
    catalog = catalog_for(what_if_2gpu, spec.catalog)
    if templates is None:
        check_runtime(runtime or spec.runtime)
        templates = scenario_templates(spec, cache_dir=cache_dir, progress=progress, runtime=runtime,
                                       catalog=catalog, slices=slices, pd=pd)
    demand = scenario_demand(spec, mix)
    if availability in ("ample", "scarce"):
        caps = AVAILABILITY[availability](spec, templates, catalog)
        return AllocationProblem(tuple(templates), demand, caps, scenario_prices(spec, catalog=catalog),
                                 mode=mode, time_limit=time_limit, gap=gap)
    from atoll.solvers.tiers import market_tiers

    markets = fleet_markets(spec, availability)
    tiered, prices = market_tiers(templates, markets, scenario_prices(spec, catalog=catalog),
                                  scenario_prices(spec, spot=True, catalog=catalog))
    caps = market_caps(spec, markets, catalog)
    if availability == "hedged" and not spec.markets:
        # a bundled scenario's hedged market: the on-demand quota at the scarce level, as its env's
        caps.update(scarce_availability(spec, templates, catalog))
    return AllocationProblem(tiered, demand, caps, prices, mode=mode, time_limit=time_limit, gap=gap)
