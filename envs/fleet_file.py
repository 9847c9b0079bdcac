"""Putting a fleet file to work: its workloads loaded and scaled, and the fleet as one value.

:func:`read_fleet` is what ``--fleet FILE`` does: it returns a :class:`Fleet` and changes nothing
else in the process. ``Fleet.scenario`` is a ``ScenarioSpec`` named after the fleet whose models
(with the file's own definitions), regions, GPU types, offers and prices, node caps and markets are
the file's, whose request shapes are its ``request_shapes`` (the Azure traces' means; by default
each workload's request-weighted mean input and output tokens), whose mean request rates come from
its workloads, and whose template library is built for its runtime. It is passed
to whatever plans the fleet (``build_problem``, ``FleetConfig.fleet``, the controller's fleet) and
pickles to worker processes and Ray tasks with them. The simulator, training, evaluation, the
controller and ``atoll replay`` all read the same scaled demand series (:attr:`Fleet.series`), so a
policy is trained on the demand a replay serves.

The parsing and validation of the file itself is :mod:`atoll.solvers.fleet`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import numpy as np

from atoll.envs.availability import SPOT_TRACES, untraced_spot_pools
from atoll.envs.config import FleetConfig
from atoll.forecast.logrows import FileCheck, ModelCheck
from atoll.forecast.scaling import Scale, apply_scale, split_scale
from atoll.forecast.workloads import DemandSeries, WorkloadError, load_workload
from atoll.solvers.fleet import FleetFileError, FleetSpec, bundled_fleets, load_fleet
from atoll.solvers.perf import RequestShape
from atoll.solvers.scenarios import BUNDLED_SCENARIOS, ScenarioSpec, trace_shape

STEP_S = 300.0  # the simulator's decision step
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fleet:
    """A fleet file, loaded: its spec, its scenario (the value planning takes) and one demand series per model
    (named after the model, at the simulator's step, scaled as the file says). ``checks`` are
    what the loaders read of each request log or counts file and corrected (one per file), and
    ``mean_rates`` each model's scaled mean rate as the solve plans for it (gaps left out unless
    its workload says ``gaps: zero``)."""

    spec: FleetSpec
    scenario: ScenarioSpec
    series: tuple[DemandSeries, ...]
    checks: tuple[FileCheck, ...] = ()
    model_checks: tuple[tuple[str, ModelCheck], ...] = ()
    mean_rates: tuple[tuple[str, float], ...] = ()
    scalings: tuple[tuple[str, str], ...] = ()  # model -> the scaling applied, said in words

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def days(self) -> int:
        """Whole days of demand every model's series covers."""
        return int(min(len(s.requests_per_s) for s in self.series) * STEP_S // 86400)


@dataclass(frozen=True)
class _Loaded:
    series: tuple[DemandSeries, ...]
    checks: tuple[FileCheck, ...]
    model_checks: tuple[tuple[str, ModelCheck], ...]
    mean_rates: tuple[tuple[str, float], ...]
    scalings: tuple[tuple[str, str], ...]


def _csv_parts(source: str) -> tuple[str, str] | None:
    """(path, model in the file) of a ``csv:PATH#MODEL`` source without a scale suffix."""
    base, _ = split_scale(source)
    if not base.startswith("csv:"):
        return None
    path, _, model = base[4:].partition("#")
    return path, model


def _scaled(spec: FleetSpec, step_s: float) -> _Loaded:
    # The request logs and counts files the fleet names, each read once for the models the
    # fleet takes from it: rows of other models in the same file never shape its time axis.
    per_file: dict[str, list[str]] = {}
    for w in spec.workloads:
        parts = _csv_parts(w.source)
        if parts is not None and parts[1]:
            per_file.setdefault(parts[0], []).append(parts[1])
    loaded: dict[str, tuple[dict[str, DemandSeries], FileCheck]] = {}
    out = []
    model_checks = []
    rates = []
    scalings = []
    for w in spec.workloads:
        where = f"{spec.path}: workloads[{w.model!r}]"
        base, suffix = split_scale(w.source)
        if suffix is not None and (w.mean_rate is not None or w.scale is not None):
            raise FleetFileError(f"{where}: field 'source' {w.source!r} carries a scale and the entry "
                                 f"gives 'scale' or 'mean_rate' too; give the scaling once")
        parts = _csv_parts(w.source)
        try:
            check: ModelCheck | None = None
            if parts is not None:
                path, model = parts
                if path not in loaded:
                    from atoll.forecast.counts import load_csv_checked

                    pairs, fcheck = load_csv_checked(path, step_s=step_s, models=per_file.get(path))
                    loaded[path] = (dict(pairs), fcheck)
                series, fcheck = loaded[path]
                if not model:
                    if len(series) != 1:
                        raise WorkloadError(f"{path} holds models {sorted(series)}; name one as "
                                            f"csv:{path}#MODEL")
                    model = next(iter(series))
                if model not in series:
                    from atoll.forecast.counts import load_csv

                    raise WorkloadError(f"model {model!r} not in {path}; it holds "
                                        f"{sorted(load_csv(path, step_s=step_s))}")
                s, check = series[model], fcheck.model(model)
            else:
                s = load_workload(base, step_s=step_s)
            # the file's explicit scaling, logged at INFO (a fleet file is read by every command)
            scale: Scale | None = suffix
            if w.mean_rate is not None:
                scale = Scale("mean", w.mean_rate)
            elif w.scale is not None:
                scale = Scale("factor", w.scale)
            # the mean a mean_rate scales from, and the one solve plans for: a request log's gaps
            # left out unless the workload counts them as zero
            mean = float(np.mean(s.requests_per_s)) if check is None else check.mean_rate(w.gaps)
            scaled = apply_scale(s, scale, source=f"{where}: {w.source}", level=logging.INFO, mean=mean)
            factor = 1.0 if scale is None or scale.kind == "none" else scale.factor_for(mean)
        except (WorkloadError, FileNotFoundError, KeyError, ValueError) as exc:
            raise FleetFileError(f"{where}: field 'source' {w.source!r}: {exc}") from exc
        if scale is None or scale.kind == "none":
            said = "as recorded"
        else:
            said = f"{scale}: x{factor:.4g}"
            if check is not None and scale.kind == "mean":
                how = "left out" if w.gaps == "exclude" else "as zero"
                said += f" (from its mean over its span, gaps {how})"
        out.append(replace(scaled, name=w.model))
        rates.append((w.model, mean * factor))
        scalings.append((w.model, said))
        if check is not None:
            model_checks.append((w.model, check))
    by_model = {s.name: s for s in out}
    order = {m: i for i, m in enumerate(spec.model_names)}
    return _Loaded(tuple(by_model[m] for m in spec.model_names),
                   tuple(c for _, c in loaded.values()),
                   tuple(sorted(model_checks, key=lambda mc: order[mc[0]])),
                   tuple(sorted(rates, key=lambda r: order[r[0]])),
                   tuple(sorted(scalings, key=lambda r: order[r[0]])))


def _check_traces(spec: FleetSpec, series: tuple[DemandSeries, ...], step_s: float) -> None:
    """Availability traces against the workloads' span: times in milliseconds (the trace would
    never change inside the simulated days) are an error; changes after the end are said."""
    span = min(len(s) for s in series) * step_s
    for (region, cfg), trace in spec.pool_traces:
        late = [t for t in trace.times_s if t > span]
        if not late:
            continue
        where = f"{spec.path}: availability.traces[{region}/{cfg!s}] ({trace.source})"
        if max(trace.times_s) / 1000 <= span and len(late) == len([t for t in trace.times_s if t > 0]):
            raise FleetFileError(f"{where}: every change is after the workloads end ({span:g} s = "
                                 f"{span / 86400:.3g} days; first at time_s {late[0]:g}): the times "
                                 f"look like milliseconds; give seconds from the workloads' start "
                                 f"(divide by 1000)")
        log.warning("%s: %d change(s) after the workloads end (%g s = %.3g days) are never used",
                    where, len(late), span, span / 86400)


def _shape(s: DemandSeries) -> RequestShape:
    r = np.asarray(s.requests_per_s, dtype=float)
    total = float(r.sum())
    if total <= 0:
        raise FleetFileError(f"workload of {s.name!r} has no requests")
    return RequestShape(float((r * s.input_tokens).sum() / total), float((r * s.output_tokens).sum() / total))


def read_fleet(path: Path | str, *, step_s: float = STEP_S) -> Fleet:
    """Load and validate a fleet file (a path, or a bundled fleet's name); errors name the file,
    the entry and the field. Nothing outside the returned value changes."""
    spec = load_fleet(path)
    shipped = bundled_fleets().get(spec.name)
    if spec.name in BUNDLED_SCENARIOS and (shipped is None or spec.path.resolve() != shipped.resolve()):
        raise FleetFileError(f"{spec.path}: field 'name' {spec.name!r} is a bundled scenario's; name the "
                             f"fleet otherwise")
    untraced = untraced_spot_pools({(o.region, o.config): spec.market_of((o.region, o.config))
                                    for o in spec.offers}, dict(spec.pool_traces))
    if untraced:
        shown = ", ".join(f"{r}/{c}" for r, c in untraced[:4])
        raise FleetFileError(f"{spec.path}: availability.traces: spot or hedged pool(s) {shown} have no "
                             f"trace, and only {', '.join(sorted(SPOT_TRACES))} have bundled ones; give "
                             f"each a trace (a CSV time_s,nodes or a preemption log time_s,event,nodes) "
                             f"or put them in the on-demand market")
    loaded = _scaled(spec, step_s)
    series = loaded.series
    _check_traces(spec, series, step_s)
    shapes = tuple((s.name, _shape(s)) for s in series)
    traces = spec.request_traces
    if traces:  # request_shapes: the Azure traces' means, dealt to the models in turn
        shapes = tuple((m, trace_shape(traces[i % len(traces)])) for i, m in enumerate(spec.model_names))
    rates = loaded.mean_rates
    scenario = ScenarioSpec(
        spec.name, spec.model_names, spec.gpu_types, spec.regions,
        req_per_s=max(float(np.mean([r for _, r in rates])), 1e-9), scarce_headroom=spec.scarce_headroom,
        traces=traces or ScenarioSpec.traces, shapes=shapes, rates=rates,
        static_availability=None if spec.availability is None else tuple(sorted(spec.availability.items())),
        pool_traces=spec.pool_traces,
        runtime=spec.runtime, n_max=spec.n_max, rho=spec.rho, slices=spec.slices,
        markets=tuple(sorted(((o.region, o.config), spec.market_of((o.region, o.config)))
                             for o in spec.offers)),
        ondemand_quota=tuple(sorted((spec.ondemand_quota or {}).items())),
        user_models=spec.user_models, gpus=spec.gpus, offers=spec.offers, pd=spec.pd, model_pd=spec.model_pd)
    return Fleet(spec, scenario, series, loaded.checks, loaded.model_checks, loaded.mean_rates,
                       loaded.scalings)


def fleet_config(fleet: Fleet, days: tuple[int, int], **settings: object) -> FleetConfig:
    """The simulator's configuration for a fleet: its scenario (``FleetConfig.fleet``), models,
    runtime and its own scaled demand series; availability ``market`` (the default) puts each pool in the
    market its file says, billed at that tier; ``spot`` or ``hedged`` put every pool in that
    market; ``ample`` means the fleet's static caps (or ample nodes when it names none), every
    pool on-demand. ``prices`` apply only under ``ample`` or ``scarce`` (a market bills each pool
    at the tier that serves it; :meth:`FleetSpec.market_choice` decides, and refuses them under a
    market kind). The file's ``removal_weight`` unless ``settings`` give one."""
    base: dict[str, object] = {}
    if fleet.spec.removal_weight is not None:  # the file's price of churn; --removal-weight overrides
        base["removal_weight"] = fleet.spec.removal_weight
    base.update(settings)
    choice = fleet.spec.market_choice(cast("str | None", base.pop("availability", None)),
                                      cast("str | None", base.pop("prices", None)))
    last = fleet.days
    if days[1] > last:
        raise FleetFileError(f"{fleet.spec.path}: workloads cover days 1-{last}; days {days[0]}-{days[1]} "
                             f"are out of range (the simulator fits its forecasts on days 1-3 and "
                             f"starts episodes on day 4, so give at least 4 days of requests)")
    check_days(fleet, days)
    return FleetConfig(scenario=fleet.name, fleet=fleet.scenario, days=days, models=fleet.spec.model_names,
                       demand=common_span(fleet.series), runtime=fleet.spec.runtime,
                       availability=choice.availability, prices=choice.prices,
                       **base)  # type: ignore[arg-type]


def common_span(series: tuple[DemandSeries, ...]) -> tuple[DemandSeries, ...]:
    """Each series cut to the whole days every one covers (a user's 5-day log beside a 14-day
    bundled trace simulates days 1-5; ``atoll check`` shows each model's span, and the day range
    asked for is checked against ``Fleet.days`` first)."""
    per_day = max(int(round(86400 / series[0].step_s)), 1) if series else 1
    n = min(len(s) for s in series) // per_day * per_day if series else 0
    return tuple(s if len(s) == n else replace(s, requests_per_s=s.requests_per_s[:n],
                                                input_tokens=s.input_tokens[:n],
                                                output_tokens=s.output_tokens[:n]) for s in series)


def data_span(fleet: Fleet, model: str) -> str:
    """A model's span of data in words: its days on the fleet's axis and, for a request log, the
    times of its first and last rows."""
    s = next(x for x in fleet.series if x.name == model)
    hit = np.flatnonzero(np.asarray(s.requests_per_s) > 0)
    if not len(hit):
        return "no requests at all"
    per = s.steps_per_day
    span = f"days {hit[0] // per + 1}-{hit[-1] // per + 1}"
    mc = dict(fleet.model_checks).get(model)
    return span if mc is None else f"{span}, {mc.first} to {mc.last}"


def check_days(fleet: Fleet, days: tuple[int, int]) -> None:
    """Refuse days that hold no requests of a model (before its first row, after its last, or a
    whole day in a gap): simulated, they would be served at no cost and count as met."""
    for s in fleet.series:
        per = s.steps_per_day
        r = np.asarray(s.requests_per_s)
        empty = [d for d in range(days[0], days[1] + 1) if not r[(d - 1) * per: d * per].sum() > 0]
        if empty:
            shown = ", ".join(str(d) for d in empty[:8]) + (" ..." if len(empty) > 8 else "")
            raise FleetFileError(f"{fleet.spec.path}: workloads[{s.name!r}]: day(s) {shown} hold no requests "
                                 f"of {s.name!r} (its data: {data_span(fleet, s.name)}); pick days within "
                                 f"every model's span (--days) or give the missing requests")
