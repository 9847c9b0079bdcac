"""The fleet the live controller plans: the env's fleet model plus what only the live side has.

The fleet model — templates, prices, request shapes, start-up times, the re-planner, and the
capacity, billed cost and headroom of a fleet state — is :class:`atoll.envs.fleet_model.FleetModel`,
built from a :class:`~atoll.envs.config.FleetConfig` exactly as :class:`atoll.envs.FleetEnv`
builds it, so a policy trained in the env meets the same numbers and the same planner in
production. What is live-specific stays here: the static node availability the user has and the
plan entries a changed library no longer knows.

A fleet file is the YAML fleet file of :mod:`atoll.solvers.fleet` (read through
:func:`atoll.envs.fleet_file.read_fleet`, as every command reads it). It plans in its own market
per pool, as the simulator and ``solve`` do (:mod:`atoll.solvers.tiers`): a spot pool's templates
live in its spot tier, a hedged pool has both tiers (its on-demand quota beside the spot pool),
and the ILP picks the tier per instance. Every plan line then has its tier (:meth:`LiveFleet.tier`)
and is billed at it.

The older JSON narrowing of a scenario (``{"scenario": "core", "models": [...], "prices": "spot",
"availability": {"aws:us-east-2/4xL4": 6}, "runtime": "vllm"}``) is retired: a ``.json`` fleet file
is a :class:`~atoll.solvers.fleet.FleetFileError` that prints the YAML fleet file planning the same
fleet (:func:`yaml_of_json_fleet`: the scenario's bundled fleet file, narrowed) and says where it
differs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from atoll.envs.config import MARKET_KINDS, FleetConfig
from atoll.envs.fleet_file import Fleet, read_fleet
from atoll.envs.fleet_model import FleetModel
from atoll.envs.vocabulary import Pool
from atoll.solvers.fleet import FleetFileError, bundled_fleets, resolve_fleet
from atoll.solvers.runtime import DEPLOY_RUNTIME, RUNTIMES, check_runtime
from atoll.solvers.scenarios import (
    SCENARIOS,
    ScenarioSpec,
    ample_availability,
    fleet_markets,
    market_caps,
    scenario_prices,
)
from atoll.solvers.tiers import split_tier, tiered_region
from atoll.solvers.types import DEFAULT_PD, Template

STEP_S = FleetConfig.step_s  # the env's decision step: start-up weight and since-re-optimization units
# the keys of the retired JSON fleet format
JSON_FLEET_KEYS = ("scenario", "models", "prices", "availability", "runtime")


class LiveFleet:
    """The env's :class:`FleetModel` of a scenario (a bundled one's name, or a fleet file's given
    as ``fleet``: ``Fleet.scenario``), narrowed to ``models``, priced at ``prices``,
    and the nodes the user can hold. ``templates`` replaces the scenario's library and
    ``request_shapes`` its shapes (tests, or a library built elsewhere); ``runtime`` picks the
    scenario's library (see :mod:`atoll.solvers.runtime`). ``market`` (``market``: a fleet
    file's own per pool; ``spot`` or ``hedged``: every pool in it) plans with price tiers, each
    tier at its own prices and caps (``prices`` then does not apply); None plans one tier at
    ``prices``. ``removal_weight``: the re-planner's price of churn; ``pd``: how every model is
    served (None: the scenario's own, a fleet file's ``pd``; see
    :class:`~atoll.envs.config.FleetConfig`)."""

    def __init__(self, scenario: str, *, models: Sequence[str] | None = None, prices: str = "on-demand",
                 availability: Mapping[Pool, int] | None = None, solver_time_limit: float = 10.0,
                 solver_gap: float = 1e-3, demand_round: float = 0.02,
                 templates: Sequence[Template] | None = None,
                 request_shapes: Sequence[tuple[float, float]] | None = None,
                 runtime: str = DEPLOY_RUNTIME,
                 min_instances: int | Mapping[str, tuple[int, int]] = 1, fleet: ScenarioSpec | None = None,
                 market: str | None = None, removal_weight: float = 0.0, pd: str | None = None) -> None:
        if market is not None and market not in MARKET_KINDS:
            raise ValueError(f"LiveFleet: field 'market' must be one of {', '.join(MARKET_KINDS)} or None, "
                             f"got {market!r}")
        if prices not in ("on-demand", "spot"):
            raise ValueError(f"LiveFleet: field 'prices' must be 'on-demand' or 'spot', got {prices!r}")
        if fleet is None and scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; valid: {', '.join(SCENARIOS)}")
        spec = fleet if fleet is not None else SCENARIOS[scenario]
        if market == "spot" and not spec.markets:
            raise ValueError(f"LiveFleet: field 'market' 'spot' needs a fleet file's pools; scenario "
                             f"{scenario!r} has none: give prices='spot' instead")
        models = tuple(models) if models else spec.models
        unknown = [m for m in models if m not in spec.models]
        if unknown and templates is None:
            raise ValueError(f"models {unknown} are not in scenario {scenario!r}; valid: "
                             f"{', '.join(spec.models)}")
        # The controller deploys, so its library holds only what the serving runtime can run
        # (vLLM by default: every planned template renders as a Deployment or LeaderWorkerSet).
        self.runtime = check_runtime(runtime)
        self.config = FleetConfig(
            scenario=scenario, fleet=fleet, models=models, prices=None if market else prices,
            availability=market or "ample", runtime=self.runtime, removal_weight=removal_weight, pd=pd,
            solver_time_limit=solver_time_limit, solver_gap=solver_gap, demand_round=demand_round,
            templates=tuple(templates) if templates is not None else None,
            request_shapes=tuple((float(a), float(b)) for a, b in request_shapes) if request_shapes else None)
        self.model = FleetModel.from_config(self.config)
        self.scenario = scenario
        self.models: tuple[str, ...] = self.model.models
        default_caps = (market_caps(spec, fleet_markets(spec, market)) if market
                        else ample_availability(spec))
        self.availability: dict[Pool, int] = dict(availability if availability is not None else default_caps)
        bad = [c for c in self.availability if c not in self.model.prices]
        if bad:
            valid = ", ".join(f"{r}/{c}" for r, c in sorted(self.model.prices))
            raise ValueError(f"availability names unknown (region, node config) {bad[0][0]}/{bad[0][1]}; "
                             f"valid: {valid}")
        self.replanner = self.model.replanner  # the controller plans through this (tests swap it)
        # the floor of (prefill, decode) instances per model: a model planned to zero has no
        # server left whose counters would show its traffic coming back (see Controller)
        floors = min_instances if isinstance(min_instances, Mapping) else {}
        default = (min_instances, min_instances) if isinstance(min_instances, int) else (1, 1)
        self.min_instances: dict[str, tuple[int, int]] = {}
        for m in self.models:
            pair = tuple(floors.get(m, default))
            if len(pair) != 2 or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in pair):
                raise ValueError(f"LiveFleet: field 'min_instances' of {m!r} must be two whole numbers "
                                 f">= 0 (prefill, decode), got {pair!r}")
            self.min_instances[m] = (int(pair[0]), int(pair[1]))
        unknown_floor = sorted(set(floors) - set(self.models))
        if unknown_floor:
            raise ValueError(f"LiveFleet: field 'min_instances' names {unknown_floor[0]!r}, not a model of "
                             f"this fleet ({', '.join(self.models)})")

    @property
    def templates(self) -> dict[str, Template]:
        return self.model.templates

    @property
    def default_tier(self) -> str:
        """The tier of a template in a plain (untiered) region: the one-tier price kind, or
        on-demand in a market (its spot capacity lives in tiered regions)."""
        return "spot" if self.config.price_kind == "spot" else "on-demand"

    def tier(self, key: str) -> str:
        """The price tier a template of this fleet is bought and billed at."""
        return split_tier(self.templates[key].region, self.default_tier)[1]

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return self.model.gpu_types

    @property
    def shapes(self) -> dict[str, tuple[float, float]]:
        return {m: (float(self.model.shape[i, 0]), float(self.model.shape[i, 1]))
                for i, m in enumerate(self.models)}

    def known(self, plan: Mapping[str, int]) -> dict[str, int]:
        """The plan's entries whose template this fleet knows (others cannot be costed or planned)."""
        return {k: n for k, n in plan.items() if k in self.model.templates and n}


def _fail(path: Path, what: str) -> FleetFileError:
    return FleetFileError(f"fleet file {path}: {what}")


def live_fleet(active: Fleet, *, prices: str | None = None, market: str | None = None,
               **settings: Any) -> LiveFleet:
    """The :class:`LiveFleet` of a loaded YAML fleet file (:mod:`atoll.envs.fleet_file`): its
    scenario, runtime, request shapes and node caps, planned in its own market per pool (each
    plan line at its pool's tier: spot, on-demand, or either in a hedged pool), and its
    ``removal_weight``, unless ``settings`` say. The controller takes no availability: ``prices``
    picks the market (:meth:`FleetSpec.market_choice` with ``prices_pick_market``): ``spot`` puts
    every pool in the spot market, ``on-demand`` plans every pool on-demand at its static cap.
    ``market`` (``market``, ``spot`` or ``hedged``) asks for a market kind instead; prices with
    it are refused."""
    spec = active.spec
    if market is not None and market not in MARKET_KINDS:
        raise ValueError(f"live_fleet: field 'market' must be one of {', '.join(MARKET_KINDS)} or None, "
                         f"got {market!r}; give prices='on-demand' for every pool on-demand at its cap")
    choice = spec.market_choice(market, prices, prices_pick_market=True)
    shapes = dict(active.scenario.shapes)
    settings.setdefault("runtime", spec.runtime)
    if spec.removal_weight is not None:
        settings.setdefault("removal_weight", spec.removal_weight)
    if choice.market is None:
        # one tier: the fleet's static caps (ample where it names none), as the simulator's ``ample``
        settings.setdefault("availability", spec.availability)
    if spec.min_instances is not None:
        settings.setdefault("min_instances", dict(spec.min_instances))
    return LiveFleet(active.name, fleet=active.scenario, models=spec.model_names,
                     request_shapes=[(shapes[m].input_tokens, shapes[m].output_tokens)
                                     for m in spec.model_names],
                     market=choice.market, prices=choice.prices or "on-demand", **settings)


def load_fleet_file(path: Path | str, **settings: Any) -> LiveFleet:
    """A :class:`LiveFleet` from a YAML fleet file of :mod:`atoll.solvers.fleet` (a bundled
    fleet's name, ``core`` or ``extended``, loads the shipped file). A ``.json`` file, the retired
    JSON format, is a :class:`FleetFileError` that gives the YAML file to use instead."""
    path = resolve_fleet(path)
    if path.suffix.lower() == ".json" and path.is_file():
        raise retired_json_fleet(path)
    return live_fleet(read_fleet(path), **settings)


def retired_json_fleet(path: Path) -> FleetFileError:
    """The error a JSON fleet file gets: the format is retired; when the file reads as that format,
    the message holds the equivalent YAML fleet file (:func:`yaml_of_json_fleet`) to paste."""
    retired = ("the JSON fleet format is retired; fleet files are YAML (the fleet file of every "
               "command, docs: 'The fleet file, field by field')")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        text, notes = yaml_of_json_fleet(doc, source=path)
    except (OSError, ValueError) as exc:
        return _fail(path, f"{retired}. It cannot be translated ({exc}); "
                           f"write a YAML fleet file, or pass --scenario")
    said = "".join(f"\n- {n}" for n in notes)
    return _fail(path, f"{retired}. Save this as a .yaml file and pass it instead; it plans the same "
                       f"fleet:\n\n{text}\nWhere it differs from the JSON fleet:{said}")


def yaml_of_json_fleet(doc: Any, *, source: Path | str = "the JSON fleet") -> tuple[str, list[str]]:
    """(the YAML fleet file that plans what the retired JSON fleet ``doc`` planned, the notes on
    where it differs). It is the scenario's bundled fleet file (:func:`atoll.solvers.fleet.bundled_fleets`)
    narrowed as ``doc`` says: ``models``, ``runtime`` (the JSON format's default, ``vllm``),
    ``prices`` as each region's market (``spot``: ``market: spot``), ``availability`` as
    ``availability.static``; it keeps the scenario's GPU types, whole nodes or slices, and request
    shapes (``request_shapes``, one Azure trace per model). A ``doc`` that is not that format is a
    ValueError saying why."""
    spec, models, prices, runtime, caps = _json_fleet_fields(doc)
    bundled = yaml.safe_load(bundled_fleets()[spec.name].read_text(encoding="utf-8"))
    workloads = {str(k).lower(): v for k, v in (bundled.get("workloads") or {}).items()}
    q = json.dumps  # JSON is YAML: a string stays a string (names with ':'), an object a flow mapping
    shapes = [spec.traces[spec.models.index(m) % len(spec.traces)] for m in models]
    name = f"{spec.name}-fleet"
    lines = [f"# {source} as a YAML fleet file: scenario {spec.name!r}"
             f"{', narrowed' if models != spec.models or caps is not None else ''}",
             f"name: {name}",
             f"runtime: {runtime}",
             f"slices: {str(spec.slices).lower()}",
             f"models: [{', '.join(q(m) for m in models)}]",
             "regions:"]
    market = ", market: spot" if prices == "spot" else ""
    gpus = ", ".join(q(g) for g in spec.gpu_types)
    lines += [f"  - {{name: {q(r)}, catalog: true{market}, gpu_types: [{gpus}]}}" for r in spec.regions]
    if caps is not None:
        lines += ["availability:", "  static:" + (" {}" if not caps else "")]
        lines += [f"    {q(f'{r}/{c}')}: {n}" for (r, c), n in caps.items()]
    lines.append(f"request_shapes: [{', '.join(shapes)}]")
    lines += [f"{key}: {value}" for key, value, default in (("n_max", spec.n_max, 6), ("rho", spec.rho, 12.0))
              if value != default]
    if spec.pd != DEFAULT_PD or spec.model_pd:
        lines.append(f"pd: {q({'default': spec.pd, **dict(spec.model_pd)})}")
    lines.append("workloads:")
    lines += [f"  {q(m)}: {q(workloads[m.lower()])}" for m in models if m.lower() in workloads]
    notes = [f"name: {name!r}, where the JSON fleet took its scenario's, {spec.name!r} (a bundled "
             f"fleet's, which a fleet file may not reuse); so 'learned:champion' is atoll-trigger-{name}: "
             f"give --policy learned:models:/atoll-trigger-{spec.name}@champion to keep the scenario's",
             f"workloads: the JSON format had none (the controller measures each model's demand); "
             f"these are the bundled {spec.name!r} fleet's, for the commands that simulate"]
    if prices == "spot":
        notes.append(f"prices spot: each region is in the spot market (market: spot), billed at spot "
                     f"prices at the same caps; its plan lines carry the spot tier "
                     f"({tiered_region(spec.regions[0], 'spot')}/...), where the JSON fleet's had none")
    return "\n".join(lines) + "\n", notes


def _json_fleet_fields(doc: Any) -> tuple[ScenarioSpec, tuple[str, ...], str, str,
                                          dict[Pool, int] | None]:
    """(scenario, models, prices, runtime, availability or None) of a retired JSON fleet; a
    ValueError naming the key when ``doc`` is not one."""
    if not isinstance(doc, dict):
        raise ValueError(f"it holds a {type(doc).__name__}, not an object with keys "
                         f"{', '.join(JSON_FLEET_KEYS)}")
    extra = sorted(set(doc) - set(JSON_FLEET_KEYS))
    if extra:
        raise ValueError(f"unknown key {extra[0]!r}; the JSON format had {', '.join(JSON_FLEET_KEYS)}")
    if not isinstance(doc.get("scenario"), str) or doc["scenario"] not in SCENARIOS:
        raise ValueError(f"'scenario' {doc.get('scenario')!r} is not a bundled scenario "
                         f"({', '.join(SCENARIOS)})")
    spec = SCENARIOS[doc["scenario"]]
    models = doc.get("models") or list(spec.models)
    if not (isinstance(models, list) and all(isinstance(m, str) for m in models)):
        raise ValueError(f"'models' must be a list of model names, got {models!r}")
    unknown = [m for m in models if m not in spec.models]
    if unknown:
        raise ValueError(f"models {unknown} are not in scenario {spec.name!r}; valid: "
                         f"{', '.join(spec.models)}")
    prices, runtime = doc.get("prices", "on-demand"), doc.get("runtime", DEPLOY_RUNTIME)
    if prices not in ("on-demand", "spot"):
        raise ValueError(f"'prices' must be 'on-demand' or 'spot', got {prices!r}")
    if runtime not in RUNTIMES:
        raise ValueError(f"'runtime' must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if "availability" not in doc:
        return spec, tuple(models), prices, runtime, None
    raw = doc["availability"]
    if not isinstance(raw, dict):
        raise ValueError("'availability' must map 'region/config' to a node count")
    caps: dict[Pool, int] = {}
    offered = scenario_prices(spec)
    for cell, n in raw.items():
        region, sep, cfg = str(cell).rpartition("/")
        if not sep or not region or not cfg:
            raise ValueError(f"availability key {cell!r} must look like 'aws:us-east-2/4xL4'")
        if (region, cfg) not in offered:
            raise ValueError(f"availability names {cell!r}, which scenario {spec.name!r} does not offer; "
                             f"valid: {', '.join(f'{r}/{c}' for r, c in sorted(offered))}")
        if isinstance(n, bool) or not isinstance(n, int | float) or not math.isfinite(n) or n < 0 \
                or int(n) != n:
            raise ValueError(f"availability of {cell!r} must be a whole number of nodes >= 0, got {n!r}")
        caps[(region, cfg)] = int(n)
    return spec, tuple(models), prices, runtime, caps
