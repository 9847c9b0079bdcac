"""Issue 28's figures: what GPU slices (several vLLM instances per node, TP x PP inside a node)
buy, as one JSON document on stdout.

Fleets (the extended scenario's six models, its request shapes and its even-mix demand, ample
availability, cost mode, ``runtime: vllm``):

- ``h100x8``: only 8xH100 nodes (AWS us-east-2's p5.48xlarge price);
- ``a100x8_l40sx8``: only 8xA100-80GB (GCP us-central1's price) and 8xL40S (us-east-2's) nodes,
  a lab fleet offered under us-east-2's name (the library keys hold the configs, not the name);
- ``aws``: the extended fleet (its GPU types) limited to its two AWS regions, offers as in the
  catalog.

Per fleet, three plans: ``whole_nodes`` (vllm, each stage a whole node: today's library),
``slices`` (vllm with slices: stages of g of a node's G GPUs, the ILP buys whole nodes and
packs them) and ``emulation`` (whole-node vllm on a catalog where every G-GPU offer is also sold
as 1/2/4-GPU pieces at G-proportional prices, keeping a cheaper existing offer: perfect packing
for free, a lower bound the slices plan should meet within 1%). The slices plan's packing is
checked by the packing evaluator.

``scenarios``: the bundled scenario (default extended: three regions, GCP selling 1/2/4/8-GPU
nodes) with whole nodes and with slices: templates, cold library seconds, ILP cost and seconds.

``ladder``: the core scenario's decomposition ladder (``atoll solve --decompose``) under vllm
with whole nodes and with slices, side by side. ``--cache-dir DIR`` builds the libraries there
(an empty DIR measures cold builds).

    .venv/bin/python benchmarks/slices.py [--fleets h100x8,a100x8_l40sx8,aws] [--workers 2]
                                          [--ladders core] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from atoll.solvers.allocation import evaluate_plan, solve_allocation
from atoll.solvers.catalog import Catalog, load_catalog
from atoll.solvers.ladder import decompose
from atoll.solvers.packing import check_packing
from atoll.solvers.problem import AllocationProblem
from atoll.solvers.scenarios import SCENARIOS, build_problem, library_spec, scenario_demand
from atoll.solvers.templates import build_library
from atoll.solvers.types import NODE_GPU_COUNTS, Offer

EAST, SEOUL, GCP = "aws:us-east-2", "aws:ap-northeast-2", "gcp:us-central1"


def _offer(catalog: Catalog, region: str, config: str, as_region: str | None = None) -> Offer:
    o = catalog.offers_in(region)[config]
    return dataclasses.replace(o, region=as_region or region)


def fleets(catalog: Catalog) -> dict[str, tuple[Offer, ...]]:
    types = set(SCENARIOS["extended"].gpu_types)
    aws = tuple(o for o in catalog.offers
                if o.region in (EAST, SEOUL) and catalog.config(o.config).gpu.name in types)
    return {
        "h100x8": (_offer(catalog, EAST, "8xH100"),),
        "a100x8_l40sx8": (_offer(catalog, GCP, "8xA100-80GB", EAST), _offer(catalog, EAST, "8xL40S")),
        "aws": aws,
    }


def emulation(offers: tuple[Offer, ...]) -> tuple[Offer, ...]:
    """Every offer plus its 1/2/4-GPU pieces at proportional prices (a cheaper offer of the
    same config in the region is kept)."""
    best: dict[tuple[str, str], Offer] = {(o.region, o.config): o for o in offers}
    for o in offers:
        count, _, gpu = o.config.partition("x")
        for g in NODE_GPU_COUNTS:
            if g >= int(count):
                continue
            share = g / int(count)
            piece = Offer(o.region, f"{g}x{gpu}", o.on_demand_per_hour * share,
                          None if o.spot_per_hour is None else o.spot_per_hour * share,
                          f"EMULATED {g}/{count} of {o.instance}", o.spot_estimated)
            have = best.get((o.region, piece.config))
            if have is None or have.on_demand_per_hour > piece.on_demand_per_hour:
                best[(o.region, piece.config)] = piece
    return tuple(best.values())


def plan(catalog: Catalog, offers: tuple[Offer, ...], *, slices: bool, workers: int,
         cache_dir: Path | None) -> dict[str, Any]:
    cat = dataclasses.replace(catalog, offers=offers)
    spec = SCENARIOS["extended"]
    regions = tuple(sorted({o.region for o in offers}))
    gpus = tuple(sorted({cat.config(o.config).gpu.name for o in offers}))
    lib_spec = dataclasses.replace(library_spec(spec, "vllm"), regions=regions, gpu_types=gpus, slices=slices)
    t0 = time.perf_counter()
    lib = build_library(lib_spec, catalog=cat, workers=workers, progress=False, cache_dir=cache_dir)
    build_s = time.perf_counter() - t0
    prices = {(o.region, o.config): o.on_demand_per_hour for o in offers}
    demand = scenario_demand(spec, "even")
    problem = AllocationProblem(lib.templates, demand, None, prices)
    t0 = time.perf_counter()
    res = solve_allocation(problem)
    solve_s = time.perf_counter() - t0
    row: dict[str, Any] = {
        "templates": len(lib.templates), "library_seconds": round(build_s, 2), "from_cache": lib.from_cache,
        "slice_templates": sum(t.has_slices for t in lib.templates),
        "status": res.status.value, "solve_seconds": round(solve_s, 3),
        "cost_per_hour": None if res.allocation is None else round(res.cost_per_hour, 4),
        "gap": None if res.allocation is None else res.gap,
        "models_without_templates": sorted(m for m in spec.models if not lib.for_model(m)),
    }
    if res.allocation is None:
        row["message"] = res.message
        return row
    ev = evaluate_plan(problem, res.allocation)
    row["evaluator_feasible"] = ev.feasible
    row["evaluator_cost_per_hour"] = round(ev.cost_per_hour, 4)
    row["instances"] = res.allocation.total_instances
    row["slice_instances"] = sum(n for k, n in res.allocation.counts if problem.template(k).has_slices)
    row["tp_x_pp_in_a_node_instances"] = sum(
        n for k, n in res.allocation.counts
        if problem.template(k).has_slices and len(problem.template(k).stages) > 1)
    if res.packing is not None:
        row["packing_violations"] = check_packing(problem, res.allocation, res.packing)
        row["nodes_per_pool"] = {f"{r}/{c}": n for (r, c), n in sorted(res.packing.node_counts().items())}
        row["idle_gpus"] = sum(n.gpus - n.used_gpus for n in res.packing.nodes)
    return row


def scenario_row(scenario: str, cache_dir: Path | None, workers: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, slices in (("whole_nodes", False), ("slices", True)):
        t0 = time.perf_counter()
        lib = build_library(library_spec(SCENARIOS[scenario], "vllm", slices), cache_dir=cache_dir,
                            workers=workers, progress=False)
        build_s = time.perf_counter() - t0
        problem = build_problem(scenario, "ample", "even", runtime="vllm", slices=slices, cache_dir=cache_dir)
        t0 = time.perf_counter()
        res = solve_allocation(problem)
        out[name] = {"templates": len(lib.templates), "library_seconds": round(build_s, 2),
                     "from_cache": lib.from_cache, "status": res.status.value,
                     "cost_per_hour": None if res.allocation is None else round(res.cost_per_hour, 4),
                     "gap": res.gap, "solve_seconds": round(time.perf_counter() - t0, 2)}
    return out


def ladder(scenario: str, cache_dir: Path | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, slices in (("whole_nodes", False), ("slices", True)):
        problem = build_problem(scenario, "ample", "even", runtime="vllm", slices=slices, cache_dir=cache_dir)
        doc = decompose(problem, scenario=scenario, runtime="vllm", slices=slices)
        out[name] = {"templates": len(problem.templates),
                     "all_ilp_rungs_optimal": doc["all_ilp_rungs_optimal"],
                     "cost_per_hour": {r["rung"]: r["cost_per_hour"] for r in doc["rungs"]},
                     "over_joint": doc["over_joint"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleets", default="h100x8,a100x8_l40sx8,aws")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ladders", default="core", help="scenarios whose ladder to compare ('' for none)")
    ap.add_argument("--scenarios", default="extended", help="bundled scenarios to plan whole vs sliced")
    ap.add_argument("--cache-dir", type=Path, default=None)
    args = ap.parse_args()
    cache = args.cache_dir
    catalog = load_catalog()
    all_fleets = fleets(catalog)
    out: dict[str, Any] = {}
    for name in args.fleets.split(","):
        offers = all_fleets[name]
        rows = {"whole_nodes": plan(catalog, offers, slices=False, workers=args.workers, cache_dir=cache),
                "slices": plan(catalog, offers, slices=True, workers=args.workers, cache_dir=cache),
                "emulation": plan(catalog, emulation(offers), slices=False, workers=args.workers,
                                  cache_dir=cache)}
        s, e, w = (rows[k]["cost_per_hour"] for k in ("slices", "emulation", "whole_nodes"))
        rows["slices_over_emulation"] = None if s is None or e is None else round(s / e, 4)
        rows["slices_over_whole_nodes"] = None if s is None or w is None else round(s / w, 4)
        out[name] = rows
        print(f"{name}: whole {w} slices {s} emulation {e}", flush=True, file=sys.stderr)
    ladders = {s: ladder(s, cache) for s in args.ladders.split(",") if s}
    scenarios = {s: scenario_row(s, cache, args.workers) for s in args.scenarios.split(",") if s}
    doc = {"demand": "extended scenario, even mix, ample availability, cost mode, runtime vllm",
           "fleets": out, "scenarios": scenarios, "ladders": ladders}
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
