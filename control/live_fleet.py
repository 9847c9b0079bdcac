"""The fleet the live controller plans: the env's fleet model plus what only the live side has.

The fleet model — templates, prices, request shapes, start-up times, the re-planner, and the
capacity, billed cost and headroom of a fleet state — is :class:`atoll.envs.fleet_model.FleetModel`,
built from a :class:`~atoll.envs.config.FleetConfig` exactly as :class:`atoll.envs.FleetEnv`
builds it, so a policy trained in the env meets the same numbers and the same planner in
production. What is live-specific stays here: the static node availability the user has (a
*fleet file* narrows the scenario to it) and the plan entries a changed library no longer knows.

.. code-block:: json

    {"scenario": "core", "models": ["Phi-4-14B", "Qwen3-32B"], "prices": "spot",
     "availability": {"aws:us-east-2/4xL4": 6, "aws:us-east-2/1xL40S": 2}}

Every key is optional except ``scenario``; ``runtime`` (``vllm`` by default, or ``any``) picks
the template library (:mod:`atoll.solvers.runtime`); ``availability`` (nodes per ``region/config``)
replaces the scenario's ample availability, and cells it leaves out get no nodes.

A YAML fleet file plans in its own market per pool, as the simulator and ``solve`` do
(:mod:`atoll.solvers.tiers`): a spot pool's templates live in its spot tier, a hedged pool has
both tiers (its on-demand quota beside the spot pool), and the ILP picks the tier per instance.
Every plan line then has its tier (:meth:`LiveFleet.tier`) and is billed at it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from atoll.envs.config import MARKET_KINDS, FleetConfig
from atoll.envs.fleet_file import Fleet, read_fleet
from atoll.envs.fleet_model import FleetModel
from atoll.envs.vocabulary import Pool
from atoll.solvers.fleet import FleetFileError, resolve_fleet
from atoll.solvers.runtime import DEPLOY_RUNTIME, check_runtime
from atoll.solvers.scenarios import SCENARIOS, ScenarioSpec, ample_availability, fleet_markets, market_caps
from atoll.solvers.tiers import split_tier
from atoll.solvers.types import Template

STEP_S = FleetConfig.step_s  # the env's decision step: start-up weight and since-re-optimization units
FLEET_KEYS = ("scenario", "models", "prices", "availability", "runtime")


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
    """A :class:`LiveFleet` from a fleet file: the YAML fleet file of :mod:`atoll.solvers.fleet`
    (``.yaml``/``.yml``; a bundled fleet's name, ``core`` or ``extended``, loads the shipped
    file), or the older JSON narrowing of a scenario (see the module docstring)."""
    path = resolve_fleet(path)
    if path.suffix in (".yaml", ".yml"):
        return live_fleet(read_fleet(path), **settings)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(path, "not found; pass an existing JSON file or --scenario instead") from None
    except (OSError, ValueError) as exc:
        raise _fail(path, f"cannot be read as JSON ({exc}); fix the file") from exc
    if not isinstance(doc, dict):
        raise _fail(path, f"holds a {type(doc).__name__}; it must be a JSON object with keys {FLEET_KEYS}")
    extra = sorted(set(doc) - set(FLEET_KEYS))
    if extra:
        raise _fail(path, f"unknown key {extra[0]!r}; valid keys: {', '.join(FLEET_KEYS)}")
    if "scenario" not in doc:
        raise _fail(path, f"lacks 'scenario'; name one of {', '.join(SCENARIOS)}")
    models = doc.get("models")
    if models is not None and not (isinstance(models, list) and all(isinstance(m, str) for m in models)):
        raise _fail(path, f"'models' must be a list of model names, got {models!r}")
    availability: dict[Pool, int] | None = None
    if "availability" in doc:
        raw = doc["availability"]
        if not isinstance(raw, dict):
            raise _fail(path, "'availability' must map 'region/config' to a node count")
        availability = {}
        for cell, n in raw.items():
            region, sep, cfg = str(cell).rpartition("/")
            if not sep or not region or not cfg:
                raise _fail(path, f"availability key {cell!r} must look like 'aws:us-east-2/4xL4'")
            if isinstance(n, bool) or not isinstance(n, int | float) or not math.isfinite(n) or n < 0 \
                    or int(n) != n:
                raise _fail(path, f"availability of {cell!r} must be a whole number of nodes >= 0, got {n!r}")
            availability[(region, cfg)] = int(n)
    try:
        settings.setdefault("runtime", str(doc.get("runtime", DEPLOY_RUNTIME)))
        prices = settings.pop("prices", None) or str(doc.get("prices", "on-demand"))
        return LiveFleet(str(doc["scenario"]), models=models, prices=prices,
                         availability=availability, **settings)
    except (KeyError, ValueError) as exc:
        raise _fail(path, str(exc).strip("'\"")) from exc
