"""Putting a fleet file to work: its workloads loaded and scaled, its models, GPUs and offers
made known, and the fleet registered as a scenario that every command can name.

:func:`activate` is what ``--fleet FILE`` does. After it, the fleet is an ordinary scenario
(``ScenarioSpec`` named after the fleet) whose models, regions, GPU types, prices and node caps
are the file's, whose request shapes (request-weighted mean input and output tokens) and mean
request rates come from its workloads, and whose template library is built for its runtime. The
simulator, training, evaluation, the controller and ``atoll replay`` all read the same scaled
demand series (:attr:`ActiveFleet.series`), so a policy is trained on the demand a replay serves.

The parsing and validation of the file itself is :mod:`atoll.solvers.fleet`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from atoll.envs.config import FleetConfig
from atoll.forecast.scaling import Scale, apply_scale, split_scale
from atoll.forecast.workloads import DemandSeries, WorkloadError, load_workload
from atoll.solvers.catalog import register_fleet_catalog
from atoll.solvers.fleet import FleetFileError, FleetSpec, load_fleet
from atoll.solvers.models import register_fleet_models
from atoll.solvers.perf import RequestShape
from atoll.solvers.scenarios import ScenarioSpec, register_scenario

STEP_S = 300.0  # the simulator's decision step


@dataclass(frozen=True)
class ActiveFleet:
    """A fleet file in use: its spec, the scenario it registered and one demand series per model
    (named after the model, at the simulator's step, scaled as the file says)."""

    spec: FleetSpec
    scenario: ScenarioSpec
    series: tuple[DemandSeries, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def days(self) -> int:
        """Whole days of demand every model's series covers."""
        return int(min(len(s.requests_per_s) for s in self.series) * STEP_S // 86400)


def _scaled(spec: FleetSpec, step_s: float) -> tuple[DemandSeries, ...]:
    out = []
    for w in spec.workloads:
        where = f"{spec.path}: workloads[{w.model!r}]"
        if split_scale(w.source)[1] is not None and (w.mean_rate is not None or w.scale is not None):
            raise FleetFileError(f"{where}: field 'source' {w.source!r} carries a scale and the entry "
                                 f"gives 'scale' or 'mean_rate' too; give the scaling once")
        try:
            s = load_workload(w.source, step_s=step_s)
            # the file's explicit scaling, logged at INFO (a fleet file is read by every command)
            scale: Scale | None = None
            if w.mean_rate is not None:
                scale = Scale("mean", w.mean_rate)
            elif w.scale is not None:
                scale = Scale("factor", w.scale)
            s = apply_scale(s, scale, source=f"{where}: {w.source}", level=logging.INFO)
        except (WorkloadError, FileNotFoundError, KeyError, ValueError) as exc:
            raise FleetFileError(f"{where}: field 'source' {w.source!r}: {exc}") from exc
        out.append(replace(s, name=w.model))
    by_model = {s.name: s for s in out}
    return tuple(by_model[m] for m in spec.model_names)


def _shape(s: DemandSeries) -> RequestShape:
    r = np.asarray(s.requests_per_s, dtype=float)
    total = float(r.sum())
    if total <= 0:
        raise FleetFileError(f"workload of {s.name!r} has no requests")
    return RequestShape(float((r * s.input_tokens).sum() / total), float((r * s.output_tokens).sum() / total))


def activate(path: Path | str, *, step_s: float = STEP_S) -> ActiveFleet:
    """Load, validate and register a fleet file for this process; errors name the file, the
    entry and the field."""
    spec = load_fleet(path)
    series = _scaled(spec, step_s)
    register_fleet_models(spec.user_models)
    register_fleet_catalog(spec.gpus, spec.offers)
    shapes = tuple((s.name, _shape(s)) for s in series)
    rates = tuple((s.name, float(np.mean(s.requests_per_s))) for s in series)
    scenario = ScenarioSpec(
        spec.name, spec.model_names, spec.gpu_types, spec.regions,
        req_per_s=max(float(np.mean([r for _, r in rates])), 1e-9), scarce_headroom=0.25,
        shapes=shapes, rates=rates,
        static_availability=None if spec.availability is None else tuple(sorted(spec.availability.items())),
        pool_traces=spec.pool_traces,
        runtime=spec.runtime, n_max=spec.n_max, rho=spec.rho)
    register_scenario(scenario)
    return ActiveFleet(spec, scenario, series)


def fleet_config(fleet: ActiveFleet, days: tuple[int, int], **settings: object) -> FleetConfig:
    """The simulator's configuration for an active fleet: its scenario, models, runtime and its
    own scaled demand series; availability ``ample`` means the fleet's static caps (or ample
    nodes when it names none) at on-demand prices unless ``settings`` say otherwise."""
    base: dict[str, object] = {"availability": "ample", "prices": "on-demand"}
    base.update(settings)
    last = fleet.days
    if days[1] > last:
        raise FleetFileError(f"{fleet.spec.path}: workloads cover days 1-{last}; days {days[0]}-{days[1]} "
                             f"are out of range (the simulator fits its forecasts on days 1-3 and "
                             f"starts episodes on day 4, so give at least 4 days of requests)")
    return FleetConfig(scenario=fleet.name, days=days, models=fleet.spec.model_names, demand=fleet.series,
                       runtime=fleet.spec.runtime, **base)  # type: ignore[arg-type]
