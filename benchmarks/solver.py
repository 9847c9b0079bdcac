"""Allocation benchmark: prints ONE JSON document of measured figures.

For each scenario x availability x mix: cost and goodput of every method and the Homo/ILP and
independent/ILP cost ratios (next to the Coral paper's Homo/ILP figures, which we report, not
tune to); library build time and template counts; ILP solve time cold and warm; a warm-started
re-solve of one model after a 10% demand change; scaling to 10/20/50 models x 20/36 configs.
Ample availability runs in cost mode; scarce in goodput mode (cost mode may be infeasible).

    .venv/bin/python benchmarks/solver.py [--quick] [--skip-scaling] [--skip-36]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

from solvers.allocation import solve_allocation
from solvers.baselines import run_method
from solvers.catalog import DEFAULT_REGIONS, load_catalog
from solvers.models import DEFAULT_MODELS
from solvers.problem import AllocationProblem, SolveStatus
from solvers.scenarios import (
    AVAILABILITIES,
    MIXES,
    SCENARIOS,
    build_problem,
    library_spec,
    scenario_demand,
)
from solvers.types import Service, Template

PAPER_HOMO_OVER_ILP = {"core": 1.62, "extended": 3.14, "extended/large-heavy": 2.79}
STARTUP_WEIGHT = 0.5  # e.g. 3 min start-up / 6 min re-plan interval (Coral re-solves every 6 min)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _library(name: str) -> tuple[tuple[Template, ...], dict[str, Any]]:
    from solvers.templates import build_library

    lib = build_library(library_spec(SCENARIOS[name]), progress=False)
    per_service: dict[str, int] = {}
    for t in lib.templates:
        per_service[t.service.name] = per_service.get(t.service.name, 0) + 1
    return tuple(lib.templates), {"templates": len(lib.templates), "build_seconds": lib.build_seconds,
                                  "from_cache": lib.from_cache, "per_service": per_service}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and math.isfinite(a) else math.nan


def _cell(problem: AllocationProblem) -> dict[str, Any]:
    out: dict[str, Any] = {}
    results = {}
    for method in ("ilp", "homo", "single-type", "independent"):
        r = run_method(problem, method)
        results[method] = r
        out[method] = {"status": r.status, "feasible": r.ok, "cost_per_hour": r.cost_per_hour,
                       "goodput_fraction": r.goodput_fraction, "solve_seconds": r.solve_seconds,
                       "gap": r.gap}
    ilp = results["ilp"]
    out["homo_over_ilp_cost"] = _ratio(results["homo"].cost_per_hour, ilp.cost_per_hour)
    out["single_type_over_ilp_cost"] = _ratio(results["single-type"].cost_per_hour, ilp.cost_per_hour)
    out["independent_over_ilp_cost"] = _ratio(results["independent"].cost_per_hour, ilp.cost_per_hour)
    # cold vs warm (warm = started from the cold optimum)
    cold = solve_allocation(problem)
    warm = solve_allocation(problem, warm_start=cold.allocation)
    out["ilp_cold"] = {"status": cold.status.value, "solve_seconds": cold.solve_seconds,
                       "build_seconds": cold.build_seconds, "gap": cold.gap}
    out["ilp_warm"] = {"status": warm.status.value, "solve_seconds": warm.solve_seconds,
                       "build_seconds": warm.build_seconds, "gap": warm.gap,
                       "warm_start_accepted": warm.warm_start_accepted}
    return out


def _reoptimize_one(problem: AllocationProblem) -> dict[str, Any]:
    """Re-solve the largest-demand model alone after +10% demand, from the running optimum."""
    base = solve_allocation(problem)
    if base.allocation is None:
        return {"status": base.status.value, "message": base.message}
    load = {m: sum(d for s, d in problem.demand.items() if s.startswith(m + "/")) for m in problem.models}
    model = max(load, key=load.__getitem__)
    demand = {s: d * (1.1 if s.startswith(model + "/") else 1.0) for s, d in problem.demand.items()}
    changed = problem.with_changes(demand=demand, running=base.allocation, reoptimize=frozenset({model}),
                                   startup_weight=STARTUP_WEIGHT)
    t0 = time.perf_counter()
    res = solve_allocation(changed, warm_start=base.allocation)
    wall = time.perf_counter() - t0
    return {"model": model, "status": res.status.value, "solve_seconds": res.solve_seconds,
            "build_seconds": res.build_seconds, "wall_seconds": wall, "gap": res.gap,
            "warm_start_accepted": res.warm_start_accepted}


def _copies(templates: tuple[Template, ...], n_models: int, seed: int) -> AllocationProblem:
    """n_models models: copy i of default model i mod 6, demand scaled by U(0.5, 1.5)."""
    rng = random.Random(seed)
    spec = SCENARIOS["extended"]
    base_demand = scenario_demand(spec, "even")
    by_model: dict[str, list[Template]] = {}
    for t in templates:
        by_model.setdefault(t.service.model, []).append(t)
    out: list[Template] = []
    demand: dict[str, float] = {}
    for i in range(n_models):
        src = DEFAULT_MODELS[i % len(DEFAULT_MODELS)]
        name = f"{src}#{i}"
        scale = rng.uniform(0.5, 1.5)
        for t in by_model.get(src, []):
            out.append(replace(t, service=Service(name, t.service.phase)))
        for s, d in base_demand.items():
            if s.startswith(src + "/"):
                demand[f"{name}/{s.rpartition('/')[2]}"] = d * scale
    prices = {}
    catalog = load_catalog()
    for r in DEFAULT_REGIONS:
        for c, o in catalog.offers_in(r).items():
            prices[(r, c)] = o.price()
    return AllocationProblem(tuple(out), demand, {rc: 1000 for rc in prices}, prices)


def _scaling(n_configs_libs: dict[str, tuple[Template, ...]]) -> list[dict[str, Any]]:
    rows = []
    for label, templates in n_configs_libs.items():
        for n in (10, 20, 50):
            problem = _copies(templates, n, seed=n)
            t0 = time.perf_counter()
            res = solve_allocation(problem)
            rows.append({"configs": label, "models": n, "templates": len(problem.templates),
                         "status": res.status.value, "gap": res.gap, "build_seconds": res.build_seconds,
                         "solve_seconds": res.solve_seconds, "wall_seconds": time.perf_counter() - t0})
            _log(f"scaling {label} x {n}: {rows[-1]}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", default="core,extended")
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--skip-36", action="store_true", help="scale only over the 20 default configs")
    args = ap.parse_args()
    doc: dict[str, Any] = {"paper_homo_over_ilp": PAPER_HOMO_OVER_ILP, "libraries": {}, "cells": {},
                           "startup_weight": STARTUP_WEIGHT}
    libs = {}
    for name in args.scenarios.split(","):
        templates, info = _library(name)
        libs[name] = templates
        doc["libraries"][name] = info
        _log(f"library {name}: {info['templates']} templates, {info['build_seconds']:.1f} s")
        for avail in AVAILABILITIES:
            for mix in MIXES:
                mode = "cost" if avail == "ample" else "goodput"
                problem = build_problem(name, avail, mix, templates=templates, mode=mode)
                cell = _cell(problem)
                cell["mode"] = mode
                cell["demand_tokens_per_s"] = dict(problem.demand)
                cell["reoptimize_one_model"] = _reoptimize_one(problem)
                doc["cells"][f"{name}/{avail}/{mix}"] = cell
                _log(f"{name}/{avail}/{mix}: ilp ${cell['ilp']['cost_per_hour']:.2f} homo/ilp "
                     f"{cell['homo_over_ilp_cost']:.3f} ind/ilp {cell['independent_over_ilp_cost']:.3f} "
                     f"cold {cell['ilp_cold']['solve_seconds']:.2f}s")
    for name in libs:
        times = [c["ilp_cold"]["solve_seconds"] + c["ilp_cold"]["build_seconds"]
                 for k, c in doc["cells"].items() if k.startswith(name + "/")]
        reopt = [c["reoptimize_one_model"].get("wall_seconds", math.nan)
                 for k, c in doc["cells"].items() if k.startswith(name + "/")]
        doc[f"{name}_ilp_seconds"] = {"median": statistics.median(times), "worst": max(times)}
        doc[f"{name}_reoptimize_one_model_wall_seconds"] = {"median": statistics.median(reopt),
                                                             "worst": max(reopt)}
    if not args.skip_scaling and "extended" in libs:
        sets = {"20": libs["extended"]}
        if not args.skip_36:
            from solvers.templates import build_library

            all_types = tuple(g.name for g in load_catalog().gpus.values())
            spec36 = replace(library_spec(SCENARIOS["extended"]), gpu_types=all_types)
            t0 = time.perf_counter()
            lib36 = build_library(spec36, progress=False)
            doc["libraries"]["extended-36"] = {"templates": len(lib36.templates),
                                               "gpu_types": list(all_types),
                                               "build_seconds": lib36.build_seconds,
                                               "wall_seconds": time.perf_counter() - t0}
            sets["36"] = tuple(lib36.templates)
        doc["scaling"] = _scaling(sets)
    doc["all_ilp_optimal"] = all(c["ilp_cold"]["status"] == SolveStatus.OPTIMAL.value
                                 for c in doc["cells"].values())
    print(json.dumps(doc, indent=2, default=str))


if __name__ == "__main__":
    main()
