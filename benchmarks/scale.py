"""The allocation ILP at fleet scale: 1,000 models on 36 node configs, a cold solve and a warm
re-solve after a small demand change, as one JSON document on stdout.

The instance (seeded, :func:`scale_instance`): the template library covers the six catalog
models (Phi-4 14B to Qwen3 235B-A22B) on all 9 GPU types x {1, 2, 4, 8} GPUs per node = 36
node configs, in the three default regions, priced on demand from the bundled catalog, with
``--n-max`` nodes per template. Each of the ``--models`` models is a copy of one catalog
model (drawn at random: sizes from 14B to 235B) with that model's templates, and its demand is
one of the ServeGen client groups' series (:func:`atoll.forecast.workloads.n_model_scenario`),
scaled to a log-normal popularity x the extended scenario's 25 req/s, read at one planning step
(``--step``) and turned into prefill and decode tokens/s with the model's request shape.
Availability is every offered (region, config) capped at ``--cap`` nodes x models / 100
(``--cap 0``: unlimited).

The timed path, as the simulator and the controller run it:

1. ``cold``: :func:`~atoll.solvers.allocation.solve_allocation` from scratch.
2. ``changed``: ``--changed`` of the models (drawn at random) see their demand move by a factor
   in 1 +- U(``--change`` / 2, ``--change``); only they are re-optimized (the others held at
   their running counts), warm-started from the running plan, with the start-up weight K on
   instances added (as :class:`atoll.envs.planner.Replanner` solves a trigger's choice).
3. ``all``: the same demand change, every model re-optimized, warm-started from the running plan
   (what ``fixed:1`` asks at every step).

Each row reports wall seconds (problem change included), the solver's build and solve seconds,
status, proven gap, objective and $/h, and the process's peak RSS. ``verify`` solves the
same generator at ``--verify-models`` models both ways: every warm re-solve's objective equals a
cold solve's of the same changed problem, to the solver's gap; ``verify_large_change`` does the
same with half the models moved by 15-30%, a change the running plan's slack cannot absorb.

    .venv/bin/python benchmarks/scale.py [--models 1000] [--n-max 3] [--seed 0] [--cap 0]
        [--changed 0.1] [--change 0.05] [--verify-models 20] [--workers 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import os
import random
import resource
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from emit import emit

from atoll.forecast.workloads import DemandSeries, n_model_scenario, scale_to_mean_rate
from atoll.solvers.allocation import solve_allocation
from atoll.solvers.catalog import DEFAULT_REGIONS, load_catalog
from atoll.solvers.models import DEFAULT_MODELS
from atoll.solvers.problem import Allocation, AllocationProblem, AllocationResult
from atoll.solvers.scenarios import SCENARIOS, library_spec, request_shapes
from atoll.solvers.templates import TemplateLibrary, build_library
from atoll.solvers.types import Service, Template

STARTUP_WEIGHT = 0.5  # 3 min start-up / 6 min re-plan interval, as benchmarks/solver.py
POPULARITY_SIGMA = 1.0  # log-normal spread of the models' mean request rates
TRACE_GROUPS = 30  # ServeGen client groups whose daily shapes the models' demands follow


@functools.lru_cache(maxsize=1)
def trace_series() -> tuple[DemandSeries, ...]:
    """The ServeGen client groups' series (parsed once per process)."""
    return tuple(n_model_scenario(TRACE_GROUPS))


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def peak_rss_gb() -> float:
    """The process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def library36(n_max: int, *, workers: int | None = None, cache_dir: Path | None = None,
              pd: str = "disaggregated") -> TemplateLibrary:
    """The six catalog models on every GPU type x {1, 2, 4, 8} in the default regions (cached on
    disk by :func:`~atoll.solvers.templates.build_library`); ``pd``: how models are served."""
    all_types = tuple(g.name for g in load_catalog().gpus.values())
    spec = replace(library_spec(SCENARIOS["extended"], pd=pd), gpu_types=all_types, n_max=n_max)
    return build_library(spec, workers=workers, progress=False, cache_dir=cache_dir)


@dataclass(frozen=True)
class ScaleInstance:
    """A seeded fleet of copies of the catalog models: the problem and where each model came from."""

    problem: AllocationProblem
    source: dict[str, str]  # model -> catalog model it copies
    trace: dict[str, str]  # model -> ServeGen client group its demand follows


def scale_instance(templates: tuple[Template, ...], n_models: int, seed: int, *, step: int = 3000,
                   cap: float = 0.0, series: tuple[DemandSeries, ...] | None = None,
                   req_per_s: float | None = None) -> ScaleInstance:
    """``n_models`` copies of the library's models with trace-shaped demands (module docstring);
    ``step``: the step of the series the demand is read at; ``cap``: nodes per offered (region,
    config) per 100 models (0: unlimited); ``series``: the demand shapes to draw from (default
    :func:`trace_series`); ``req_per_s``: the median model's mean request rate (default the
    extended scenario's)."""
    rng = random.Random(seed)
    spec = SCENARIOS["extended"]
    shapes = request_shapes(spec)
    series = series or trace_series()
    by_model: dict[str, list[Template]] = {}
    for t in templates:
        by_model.setdefault(t.service.model, []).append(t)
    sources = [m for m in DEFAULT_MODELS if m in by_model]
    out: list[Template] = []
    demand: dict[str, float] = {}
    source: dict[str, str] = {}
    trace: dict[str, str] = {}
    for i in range(n_models):
        src = rng.choice(sources)
        name = f"{src}#{i}"
        group = series[rng.randrange(len(series))]
        mean = (req_per_s or spec.req_per_s) * rng.lognormvariate(0.0, POPULARITY_SIGMA)
        rate = scale_to_mean_rate(group, mean)
        req_s = float(rate.requests_per_s[step % len(rate)])
        # the source templates were validated when built: copy them without re-validating
        out.extend(Template.trusted(Service(name, t.service.phase), t.region, t.nodes, t.stages, t.throughput,
                                    t.decode_throughput)
                   for t in by_model[src])
        shape = shapes[src]
        demand[f"{name}/prefill"] = req_s * shape.input_tokens
        demand[f"{name}/decode"] = req_s * shape.output_tokens
        source[name], trace[name] = src, group.name
    catalog = load_catalog()
    used = {(t.region, c) for t in templates for c, _ in t.nodes}
    prices = {(r, c): o.price() for r in DEFAULT_REGIONS for c, o in catalog.offers_in(r).items()
              if (r, c) in used}
    availability = None if cap <= 0 else {rc: max(1, math.floor(cap * n_models / 100)) for rc in prices}
    problem = AllocationProblem(tuple(out), demand, availability, prices, startup_weight=STARTUP_WEIGHT)
    return ScaleInstance(problem, source, trace)


def changed_demand(problem: AllocationProblem, fraction: float, change: float, seed: int
                   ) -> tuple[dict[str, float], frozenset[str]]:
    """The demand with ``fraction`` of the models (at least one) moved by a factor 1 +- U(change
    / 2, change), both phases alike, and the set of moved models."""
    rng = random.Random(seed + 1)
    models = problem.models
    moved = frozenset(rng.sample(models, max(1, round(fraction * len(models)))))
    factor = {m: 1 + rng.choice((-1, 1)) * rng.uniform(change / 2, change) for m in sorted(moved)}
    demand = {s: d * factor.get(s.rpartition("/")[0], 1.0) for s, d in problem.demand.items()}
    return demand, moved


def _row(res: AllocationResult, wall: float, problem_s: float = 0.0) -> dict[str, Any]:
    return {"status": res.status.value, "gap": res.gap,
            "objective": None if res.allocation is None else round(res.objective, 4),
            "cost_per_hour": None if res.allocation is None else round(res.cost_per_hour, 4),
            "instances": None if res.allocation is None else res.allocation.total_instances,
            "wall_seconds": round(wall, 3), "problem_seconds": round(problem_s, 3),
            "build_seconds": round(res.build_seconds, 3), "solve_seconds": round(res.solve_seconds, 3),
            "warm_start_accepted": res.warm_start_accepted, "message": res.message,
            "peak_rss_gb": round(peak_rss_gb(), 3), "load_1min": round(os.getloadavg()[0], 2)}


def resolve(problem: AllocationProblem, running: Allocation, demand: dict[str, float],
            reoptimize: frozenset[str] | None, *, warm: bool = True) -> tuple[AllocationResult, float, float]:
    """The re-solve for ``demand`` with ``running`` in place: (result, wall seconds with the
    problem change, seconds of the problem change alone)."""
    t0 = time.perf_counter()
    changed = problem.with_changes(demand=demand, running=running, reoptimize=reoptimize)
    problem_s = time.perf_counter() - t0
    res = solve_allocation(changed, warm_start=running if warm else None)
    return res, time.perf_counter() - t0, problem_s


def run(templates: tuple[Template, ...], n_models: int, seed: int, *, step: int, cap: float,
        fraction: float, change: float, with_cold_resolves: bool = False) -> dict[str, Any]:
    """The cold solve and both warm re-solves of the ``n_models`` instance; with
    ``with_cold_resolves`` each re-solve is solved again without a start (the check)."""
    t0 = time.perf_counter()
    inst = scale_instance(templates, n_models, seed, step=step, cap=cap)
    problem = inst.problem
    out: dict[str, Any] = {"models": n_models, "services": len(problem.demand),
                           "templates": len(problem.templates),
                           "instance_seconds": round(time.perf_counter() - t0, 2),
                           "availability": "unlimited" if problem.availability is None else
                           f"{cap:g} nodes per offered (region, config) per 100 models",
                           "peak_rss_gb_after_instance": round(peak_rss_gb(), 3)}
    _log(f"{n_models} models: {out}")
    t0 = time.perf_counter()
    cold = solve_allocation(problem)
    out["cold"] = _row(cold, time.perf_counter() - t0)
    _log(f"{n_models} models cold: {out['cold']}")
    if cold.allocation is None:
        return out
    demand, moved = changed_demand(problem, fraction, change, seed)
    out["changed_models"] = len(moved)
    for name, reopt in (("changed", moved), ("all", None)):
        res, wall, problem_s = resolve(problem, cold.allocation, demand, reopt)
        out[name] = _row(res, wall, problem_s)
        out[name]["plan_changed"] = res.allocation is not None and res.allocation != cold.allocation
        _log(f"{n_models} models warm re-solve {name}: {out[name]}")
        if with_cold_resolves:
            ref, ref_wall, ref_problem_s = resolve(problem, cold.allocation, demand, reopt, warm=False)
            out[name]["without_start"] = _row(ref, ref_wall, ref_problem_s)
            same = (res.allocation is not None and ref.allocation is not None
                    and abs(res.objective - ref.objective) <= problem.gap * max(abs(ref.objective), 1.0))
            out[name]["same_optimum_as_without_start"] = same
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--n-max", type=int, default=3, help="nodes per template of the 36-config library")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step", type=int, default=3000,
                    help="5-minute step of the traces the demand is read at")
    ap.add_argument("--cap", type=float, default=0.0,
                    help="nodes per offered (region, config) per 100 models (0: unlimited)")
    ap.add_argument("--changed", type=float, default=0.1, help="share of models whose demand moves")
    ap.add_argument("--change", type=float, default=0.05, help="largest relative demand change")
    ap.add_argument("--verify-models", type=int, default=20,
                    help="models of the warm-vs-cold check (0: none)")
    ap.add_argument("--workers", type=int, default=2, help="processes of a cold library build")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON document here")
    ap.add_argument("--pd", default="disaggregated", choices=("auto", "aggregated", "disaggregated"),
                    help="how models are served (auto: the ILP chooses per model)")
    args = ap.parse_args()
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    lib = library36(args.n_max, workers=args.workers, cache_dir=args.cache_dir, pd=args.pd)
    templates = tuple(lib.templates)
    # millions of long-lived template objects: keep the cyclic collector from walking them
    gc.freeze()
    doc: dict[str, Any] = {
        "library": {"models": sorted({t.service.model for t in templates}), "configs": 36,
                    "regions": list(DEFAULT_REGIONS), "n_max": args.n_max, "templates": len(templates),
                    "pd": args.pd,
                    "from_cache": lib.from_cache, "build_seconds": round(lib.build_seconds, 2),
                    "wall_seconds": round(time.perf_counter() - t0, 2)},
        "settings": {"seed": args.seed, "step": args.step, "cap": args.cap, "changed": args.changed,
                     "change": args.change, "startup_weight": STARTUP_WEIGHT,
                     "popularity_sigma": POPULARITY_SIGMA, "trace_groups": TRACE_GROUPS},
    }
    _log(f"library: {doc['library']}")
    if args.verify_models:
        doc["verify"] = run(templates, args.verify_models, args.seed, step=args.step, cap=args.cap,
                            fraction=args.changed, change=args.change, with_cold_resolves=True)
        # a move the running plan's slack cannot absorb, so the re-solve must change the plan
        doc["verify_large_change"] = run(templates, args.verify_models, args.seed, step=args.step,
                                         cap=args.cap, fraction=0.5, change=0.3, with_cold_resolves=True)
    doc["scale"] = run(templates, args.models, args.seed, step=args.step, cap=args.cap,
                       fraction=args.changed, change=args.change)
    doc["machine"] = {"cpu_count": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in load_start],
                      "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
                      "peak_rss_gb": round(peak_rss_gb(), 3)}
    emit(doc, args.out)


if __name__ == "__main__":
    main()
