"""Allocation benchmark: prints ONE JSON document of measured figures.

For each scenario x availability x mix: cost and goodput of every method, the Homo/ILP,
single-type/ILP and independent/ILP cost ratios next to the Coral paper's Homo/ILP figure (which
we report, never tune to); library build seconds and template counts; ILP seconds cold and warm
(median/worst); a warm-started re-solve of one model after a 10% demand change; scaling to
10/20/50 models x 20/36 node configs. Ample availability runs in cost mode; scarce in goodput
mode (cost mode may be infeasible there), so scarce cost ratios compare plans that serve
different shares: read them next to the goodput columns.

Seconds: ``wall_seconds`` of an ILP = one ``solve_allocation`` call (instance build, pruning, PuLP
model, HiGHS, extraction), with the library already loaded and the ``AllocationProblem`` built;
the re-solve's wall also includes building the changed problem (``with_changes``).
``problem_seconds`` = building an ``AllocationProblem`` over a library the first time (it indexes
the templates; later problems over the same template tuple reuse the index).

    .venv/bin/python benchmarks/solver.py [--scenarios core,extended] [--skip-scaling]
        [--skip-36] [--scaling-models 10,20,50] [--n-max-36 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from atoll.solvers.allocation import solve_allocation
from atoll.solvers.baselines import run_method
from atoll.solvers.catalog import DEFAULT_REGIONS, load_catalog
from atoll.solvers.models import DEFAULT_MODELS
from atoll.solvers.problem import AllocationProblem, AllocationResult, SolveStatus
from atoll.solvers.scenarios import (
    AVAILABILITIES,
    MIXES,
    SCENARIOS,
    build_problem,
    library_spec,
    scenario_demand,
)
from atoll.solvers.types import Service, Template

PAPER_HOMO_OVER_ILP = {"core": 1.62, "extended": 3.14, "extended/large-heavy": 2.79}
METHODS = ("ilp", "homo", "single-type", "independent")


def _paper(scenario: str, mix: str) -> float:
    return PAPER_HOMO_OVER_ILP.get(f"{scenario}/{mix}", PAPER_HOMO_OVER_ILP.get(scenario, math.nan))
STARTUP_WEIGHT = 0.5  # e.g. 3 min start-up / 6 min re-plan interval (Coral re-solves every 6 min)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _library(name: str) -> tuple[tuple[Template, ...], dict[str, Any]]:
    from atoll.solvers.templates import build_library

    lib = build_library(library_spec(SCENARIOS[name]), progress=False)
    per_service: dict[str, int] = {}
    for t in lib.templates:
        per_service[t.service.name] = per_service.get(t.service.name, 0) + 1
    return tuple(lib.templates), {"templates": len(lib.templates), "build_seconds": lib.build_seconds,
                                  "from_cache": lib.from_cache, "per_service": per_service}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and math.isfinite(a) else math.nan


def _timed(problem: AllocationProblem, **kw: Any) -> tuple[AllocationResult, float]:
    t0 = time.perf_counter()
    res = solve_allocation(problem, **kw)
    return res, time.perf_counter() - t0


def _cell(problem: AllocationProblem) -> dict[str, Any]:
    out: dict[str, Any] = {}
    results = {}
    for method in METHODS:
        t0 = time.perf_counter()
        r = run_method(problem, method)
        results[method] = r
        out[method] = {"status": r.status, "feasible": r.ok, "cost_per_hour": r.cost_per_hour,
                       "goodput_fraction": r.goodput_fraction, "solve_seconds": r.solve_seconds,
                       "wall_seconds": time.perf_counter() - t0, "gap": r.gap}
    ilp = results["ilp"]
    for method in METHODS[1:]:
        label = method.replace("-", "_")
        out[f"{label}_over_ilp_cost"] = _ratio(results[method].cost_per_hour, ilp.cost_per_hour)
        out[f"ilp_over_{label}_goodput"] = _ratio(ilp.goodput_fraction, results[method].goodput_fraction)
    # cold vs warm (warm = started from the cold optimum)
    cold, cold_wall = _timed(problem)
    warm, warm_wall = _timed(problem, warm_start=cold.allocation)
    out["ilp_cold"] = {"status": cold.status.value, "wall_seconds": cold_wall,
                       "solve_seconds": cold.solve_seconds, "build_seconds": cold.build_seconds,
                       "gap": cold.gap}
    out["ilp_warm"] = {"status": warm.status.value, "wall_seconds": warm_wall,
                       "solve_seconds": warm.solve_seconds, "build_seconds": warm.build_seconds,
                       "gap": warm.gap,
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
    t0 = time.perf_counter()
    changed = problem.with_changes(demand=demand, running=base.allocation, reoptimize=frozenset({model}),
                                   startup_weight=STARTUP_WEIGHT)
    res = solve_allocation(changed, warm_start=base.allocation)
    wall = time.perf_counter() - t0
    cold, cold_wall = _timed(changed)  # the same re-solve without the start, for comparison
    return {"model": model, "status": res.status.value, "solve_seconds": res.solve_seconds,
            "build_seconds": res.build_seconds, "wall_seconds": wall, "gap": res.gap,
            "warm_start_accepted": res.warm_start_accepted, "objective": res.objective,
            "without_start": {"status": cold.status.value, "wall_seconds": cold_wall,
                              "objective": cold.objective}}


def copied_models(templates: tuple[Template, ...], n_models: int, seed: int
                  ) -> tuple[tuple[Template, ...], dict[str, float]]:
    """n_models models: copy i of default model i mod 6 (its templates and extended's even
    demand), demand scaled by U(0.5, 1.5) from a generator seeded by ``seed``."""
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
        # the source templates were validated when built: copy without re-validating 1e5 of them
        out.extend(Template.trusted(Service(name, t.service.phase), t.region, t.nodes, t.stages, t.throughput)
                   for t in by_model.get(src, []))
        for s, d in base_demand.items():
            if s.startswith(src + "/"):
                demand[f"{name}/{s.rpartition('/')[2]}"] = d * scale
    return tuple(out), demand


def _copies(templates: tuple[Template, ...], n_models: int, seed: int) -> AllocationProblem:
    """:func:`copied_models` priced at the default regions' on-demand offers, 1000 nodes each."""
    out, demand = copied_models(templates, n_models, seed)
    prices = {}
    catalog = load_catalog()
    for r in DEFAULT_REGIONS:
        for c, o in catalog.offers_in(r).items():
            prices[(r, c)] = o.price()
    return AllocationProblem(out, demand, {rc: 1000 for rc in prices}, prices)


def _scaling(n_configs_libs: dict[str, tuple[Template, ...]], sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for label, templates in n_configs_libs.items():
        for n in sizes:
            t0 = time.perf_counter()
            problem = _copies(templates, n, seed=n)
            problem_s = time.perf_counter() - t0
            res, wall = _timed(problem)
            rows.append({"configs": label, "models": n, "templates": len(problem.templates),
                         "status": res.status.value, "gap": res.gap, "problem_seconds": problem_s,
                         "build_seconds": res.build_seconds, "solve_seconds": res.solve_seconds,
                         "wall_seconds": wall, "total_seconds": problem_s + wall})
            _log(f"scaling {label} x {n}: {rows[-1]}")
    return rows


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "worst": max(values), "n": len(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="core,extended", help="comma-separated: core, extended")
    ap.add_argument("--availabilities", default=",".join(AVAILABILITIES))
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--skip-36", action="store_true", help="scale only over the 20 default configs")
    ap.add_argument("--scaling-models", default="10,20,50")
    ap.add_argument("--n-max-36", type=int, default=4,
                    help="N_max of the 36-config library (the default 6 places 4.3M multisets)")
    ap.add_argument("--out", help="also write the JSON document to this file")
    args = ap.parse_args()
    doc: dict[str, Any] = {"paper_homo_over_ilp": PAPER_HOMO_OVER_ILP, "libraries": {}, "cells": {},
                           "startup_weight": STARTUP_WEIGHT, "cpu_count": os.cpu_count(),
                           "gc_frozen_after_library_load": True}
    libs = {}
    scenarios = args.scenarios.split(",") if args.scenarios else []
    for name in scenarios:
        templates, info = _library(name)
        # A 1e5-template library is millions of long-lived objects: without this, a full
        # (generation 2) collection every so often walks all of them and adds ~0.5-1 s to
        # whichever ILP call triggers it. A long-running controller would do the same.
        gc.freeze()
        libs[name] = templates
        t0 = time.perf_counter()
        build_problem(name, "ample", "even", templates=templates)
        info["problem_seconds"] = time.perf_counter() - t0
        doc["libraries"][name] = info
        _log(f"library {name}: {info['templates']} templates, {info['build_seconds']:.1f} s")
        for avail in args.availabilities.split(","):
            for mix in args.mixes.split(","):
                mode = "cost" if avail == "ample" else "goodput"
                problem = build_problem(name, avail, mix, templates=templates, mode=mode)
                cell = _cell(problem)
                cell["mode"] = mode
                cell["paper_homo_over_ilp_cost"] = _paper(name, mix)
                cell["demand_tokens_per_s"] = dict(problem.demand)
                cell["reoptimize_one_model"] = _reoptimize_one(problem)
                doc["cells"][f"{name}/{avail}/{mix}"] = cell
                _log(f"{name}/{avail}/{mix}: ilp ${cell['ilp']['cost_per_hour']:.2f} "
                     f"homo/ilp {cell['homo_over_ilp_cost']:.3f} "
                     f"ind/ilp {cell['independent_over_ilp_cost']:.3f} "
                     f"cold {cell['ilp_cold']['wall_seconds']:.2f}s "
                     f"warm {cell['ilp_warm']['wall_seconds']:.2f}s "
                     f"reopt {cell['reoptimize_one_model'].get('wall_seconds', math.nan):.2f}s")
    summary: dict[str, Any] = {}
    for name in [*libs, "all"]:
        cells = [c for k, c in doc["cells"].items() if name == "all" or k.startswith(name + "/")]
        if not cells:
            continue
        summary[name] = {
            "ilp_cold_wall_seconds": _summary([c["ilp_cold"]["wall_seconds"] for c in cells]),
            "ilp_warm_wall_seconds": _summary([c["ilp_warm"]["wall_seconds"] for c in cells]),
            "reoptimize_one_model_wall_seconds": _summary(
                [c["reoptimize_one_model"].get("wall_seconds", math.nan) for c in cells]),
            "all_ilp_optimal": all(c["ilp_cold"]["status"] == SolveStatus.OPTIMAL.value for c in cells),
            "worst_ilp_gap": max(c["ilp_cold"]["gap"] for c in cells),
        }
    doc["summary"] = summary
    if not args.skip_scaling and "extended" in libs:
        sets = {"20": libs["extended"]}
        if not args.skip_36:
            from atoll.solvers.templates import build_library

            all_types = tuple(g.name for g in load_catalog().gpus.values())
            spec36 = replace(library_spec(SCENARIOS["extended"]), gpu_types=all_types, n_max=args.n_max_36)
            t0 = time.perf_counter()
            lib36 = build_library(spec36, progress=False)
            doc["libraries"]["extended-36"] = {"templates": len(lib36.templates),
                                               "gpu_types": list(all_types), "configs": len(all_types) * 4,
                                               "n_max": args.n_max_36,
                                               "build_seconds": lib36.build_seconds,
                                               "from_cache": lib36.from_cache,
                                               "wall_seconds": time.perf_counter() - t0}
            sets["36"] = tuple(lib36.templates)
            gc.freeze()
        doc["scaling"] = _scaling(sets, [int(n) for n in args.scaling_models.split(",")])
    doc["all_ilp_optimal"] = all(c["ilp_cold"]["status"] == SolveStatus.OPTIMAL.value
                                 for c in doc["cells"].values())
    text = json.dumps(doc, indent=2, default=str)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
