"""The fleet the live controller plans: templates, prices, node availability and the re-planner.

Built from a solver scenario (``core``, ``extended``) exactly as :class:`envs.FleetEnv` builds
it — same template library, prices, start-up weight and :class:`atoll.envs.planner.Replanner` — so a
policy trained in the env meets the same planner in production. A *fleet file* narrows it to
what a user actually has:

.. code-block:: json

    {"scenario": "core", "models": ["Phi-4-14B", "Qwen3-32B"], "prices": "spot",
     "availability": {"aws:us-east-2/4xL4": 6, "aws:us-east-2/1xL40S": 2}}

Every key is optional except ``scenario``; ``runtime`` (``vllm`` by default, or ``any``) picks
the template library (:mod:`atoll.solvers.runtime`); ``availability`` (nodes per ``region/config``)
replaces the scenario's ample availability, and cells it leaves out get no nodes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from atoll.envs.config import FleetConfig
from atoll.envs.fleet import StartupTimes
from atoll.envs.fleet_env import _library
from atoll.envs.planner import Replanner
from atoll.solvers.catalog import load_catalog
from atoll.solvers.errors import InputError
from atoll.solvers.problem import AllocationProblem, gpu_type_of
from atoll.solvers.runtime import DEPLOY_RUNTIME, check_runtime
from atoll.solvers.scenarios import SCENARIOS, ample_availability, scenario_prices, scenario_templates
from atoll.solvers.types import Template

Cell = tuple[str, str]
STEP_S = FleetConfig.step_s  # the env's decision step: start-up weight and since-re-optimization units
FLEET_KEYS = ("scenario", "models", "prices", "availability", "runtime")


class FleetFileError(InputError):
    """A fleet file that cannot be used; the message names the file, the entry and the fix."""


class LiveFleet:
    """Static facts of the fleet and the capacity, cost and node use of a plan. ``templates``
    replaces the scenario's library (tests, or a library built elsewhere)."""

    def __init__(self, scenario: str, *, models: Sequence[str] | None = None, prices: str = "on-demand",
                 availability: Mapping[Cell, int] | None = None, solver_time_limit: float = 10.0,
                 solver_gap: float = 1e-3, demand_round: float = 0.02,
                 templates: Sequence[Template] | None = None, runtime: str = DEPLOY_RUNTIME) -> None:
        if prices not in ("on-demand", "spot"):
            raise ValueError(f"LiveFleet: field 'prices' must be 'on-demand' or 'spot', got {prices!r}")
        spec = SCENARIOS[scenario]
        self.scenario = scenario
        self.models: tuple[str, ...] = tuple(models) if models else spec.models
        unknown = [m for m in self.models if m not in spec.models]
        if unknown and templates is None:
            raise ValueError(f"models {unknown} are not in scenario {scenario!r}; valid: "
                             f"{', '.join(spec.models)}")
        # The controller deploys, so its library holds only what the serving runtime can run
        # (vLLM by default: every planned template renders as a Deployment or LeaderWorkerSet).
        self.runtime = check_runtime(runtime)
        library = (tuple(templates) if templates is not None else _library(scenario) if runtime == "any"
                   else scenario_templates(spec, runtime=runtime))
        templates = tuple(t for t in library if t.service.model in self.models)
        price_map = scenario_prices(spec, spot=prices == "spot")
        self.availability: dict[Cell, int] = dict(availability if availability is not None
                                                  else ample_availability(spec))
        bad = [c for c in self.availability if c not in price_map]
        if bad:
            valid = ", ".join(f"{r}/{c}" for r, c in sorted(price_map))
            raise ValueError(f"availability names unknown (region, node config) {bad[0][0]}/{bad[0][1]}; "
                             f"valid: {valid}")
        catalog = load_catalog()
        self.startup = StartupTimes({name: catalog.config(name) for _, name in price_map})
        median = self.startup.median(templates)
        self.base = AllocationProblem(templates, {}, None, price_map, startup_weight=median / STEP_S,
                                      time_limit=solver_time_limit, gap=solver_gap)
        self.replanner = Replanner(self.base, demand_round=demand_round)
        self.templates: dict[str, Template] = dict(self.base.index.by_key)
        self.gpu_types: tuple[str, ...] = tuple(dict.fromkeys(gpu_type_of(cfg) for _, cfg in price_map))
        self._index = {m: i for i, m in enumerate(self.models)}

    def known(self, plan: Mapping[str, int]) -> dict[str, int]:
        """The plan's entries whose template this fleet knows (others cannot be costed or planned)."""
        return {k: n for k, n in plan.items() if k in self.templates and n}

    def capacity(self, plan: Mapping[str, int]) -> np.ndarray:
        """[models, 2] tokens/s per (prefill, decode) of ``plan``."""
        out = np.zeros((len(self.models), 2))
        for key, n in self.known(plan).items():
            t = self.templates[key]
            phase = 0 if t.service.phase.value == "prefill" else 1
            out[self._index[t.service.model], phase] += n * t.throughput
        return out

    def cost_by_model(self, plan: Mapping[str, int]) -> np.ndarray:
        """[models] $/h of ``plan``."""
        out = np.zeros(len(self.models))
        for key, n in self.known(plan).items():
            out[self._index[self.templates[key].service.model]] += n * self.base.template_cost(key)
        return out

    def headroom(self, plan: Mapping[str, int]) -> np.ndarray:
        """[gpu types] (nodes offered - nodes held) / nodes offered; 0 where none are offered."""
        held: dict[Cell, int] = {}
        for key, n in self.known(plan).items():
            t = self.templates[key]
            for cfg, k in t.nodes:
                held[(t.region, cfg)] = held.get((t.region, cfg), 0) + n * k
        out = np.zeros(len(self.gpu_types))
        for j, g in enumerate(self.gpu_types):
            cap = sum(n for (_, cfg), n in self.availability.items() if gpu_type_of(cfg) == g)
            use = sum(n for (_, cfg), n in held.items() if gpu_type_of(cfg) == g)
            out[j] = (cap - use) / cap if cap > 0 else 0.0
        return out


def _fail(path: Path, what: str) -> FleetFileError:
    return FleetFileError(f"fleet file {path}: {what}")


def load_fleet_file(path: Path | str, **settings: Any) -> LiveFleet:
    """A :class:`LiveFleet` from a JSON fleet file (see the module docstring)."""
    path = Path(path)
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
    availability: dict[Cell, int] | None = None
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
        return LiveFleet(str(doc["scenario"]), models=models, prices=str(doc.get("prices", "on-demand")),
                         availability=availability, **settings)
    except (KeyError, ValueError) as exc:
        raise _fail(path, str(exc).strip("'\"")) from exc
