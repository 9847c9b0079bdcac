"""Figures of GPU slices: what slices (several vLLM instances per node, TP x PP inside a node)
buy, as one JSON document on stdout.

Fleets (the extended scenario's six models, its request shapes and its even-mix demand, ample
availability, cost mode, ``runtime: vllm``):

- ``h100x8``: only 8xH100 nodes (AWS us-east-2's p5.48xlarge price);
- ``a100x8_l40sx8``: only 8xA100-80GB (GCP us-central1's price) and 8xL40S (us-east-2's) nodes,
  a lab fleet offered under us-east-2's name (the library keys hold the configs, not the name);
- ``aws``: the extended fleet (its GPU types) limited to its two AWS regions, offers as in the
  catalog.

Per fleet, three plans: ``whole_nodes`` (vllm, each stage a whole node: the default library),
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

``scaled``: the lab fleets' slices plan against the emulation at ``--scales`` x the demand,
with the emulation's plan put back on whole nodes (``on_whole_nodes_cost_per_hour``: ceil of its
GPUs per region and GPU type / G x the node's price). The emulation may buy fractions of a node,
so it is a lower bound; equal sliced and on-whole-nodes costs say the remaining gap is whole
nodes rounding up (at most one node per pool), which shrinks as the fleet grows.

``libraries``: cold build seconds, template count and bytes on disk of the extended vllm
library, whole nodes and with slices (each into a fresh temporary cache folder).
``n_models``: ``--n-models`` copies of the extended models (demand U(0.5, 1.5) x the even mix)
solved over the whole-node and the sliced library with ``--n-models-time-limit``, and the sliced
one warm-started from the whole-node plan (``slices_warm``). The JSON records
``os.getloadavg()`` at the start and end: on a shared machine the seconds are inflated.

    .venv/bin/python benchmarks/slices.py [--fleets h100x8,a100x8_l40sx8,aws] [--workers 2]
        [--ladders core] [--cache-dir DIR] [--scaled-fleets h100x8,a100x8_l40sx8]
        [--scales 1,4,10,20,40] [--libraries extended] [--n-models 200]
        [--n-models-time-limit 600] [--n-models-rows whole_nodes,slices,slices_warm] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from emit import emit

from atoll.solvers.allocation import evaluate_plan, solve_allocation
from atoll.solvers.catalog import Catalog, load_catalog
from atoll.solvers.ladder import decompose
from atoll.solvers.packing import check_packing
from atoll.solvers.problem import Allocation, AllocationProblem
from atoll.solvers.scenarios import SCENARIOS, build_problem, library_spec, scenario_demand, scenario_prices
from atoll.solvers.templates import build_library
from atoll.solvers.types import NODE_GPU_COUNTS, Offer, Service, Template, gpus_of, parse_config_name

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


def emulation_on_whole_nodes(problem: AllocationProblem, allocation: Allocation,
                             offers: tuple[Offer, ...]) -> float | None:
    """$/h of the emulation's plan with its pieces put back on whole nodes: per (region, GPU
    type), ceil(GPUs its instances use / G) nodes of the fleet's G-GPU offer. An upper bound on
    what whole nodes with slices can reach with the emulation's own engines (a piece performs as
    a slice of the same GPUs), next to the emulation's lower bound. None when a (region, GPU
    type) sells more than one node size (which node would the pieces go back on?)."""
    node: dict[tuple[str, str], Offer] = {}
    for o in offers:
        cell = (o.region, parse_config_name(o.config)[2])
        if cell in node:
            return None
        node[cell] = o
    gpus: dict[tuple[str, str], int] = defaultdict(int)
    for key, n in allocation.counts:
        t = problem.template(key)
        for c, k in t.nodes:
            g, _, gpu = parse_config_name(c)
            gpus[(t.region, gpu)] += n * k * g
    total = 0.0
    for cell, used in gpus.items():
        o = node[cell]
        total += math.ceil(used / gpus_of(o.config)) * o.on_demand_per_hour
    return round(total, 4)


def plan(catalog: Catalog, offers: tuple[Offer, ...], *, slices: bool, workers: int,
         cache_dir: Path | None, scale: float = 1.0, whole_offers: tuple[Offer, ...] | None = None,
         ) -> dict[str, Any]:
    cat = dataclasses.replace(catalog, offers=offers)
    spec = SCENARIOS["extended"]
    regions = tuple(sorted({o.region for o in offers}))
    gpus = tuple(sorted({cat.config(o.config).gpu.name for o in offers}))
    lib_spec = dataclasses.replace(library_spec(spec, "vllm"), regions=regions, gpu_types=gpus, slices=slices)
    t0 = time.perf_counter()
    lib = build_library(lib_spec, catalog=cat, workers=workers, progress=False, cache_dir=cache_dir)
    build_s = time.perf_counter() - t0
    prices = {(o.region, o.config): o.on_demand_per_hour for o in offers}
    demand = {svc: d * scale for svc, d in scenario_demand(spec, "even").items()}
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
    row["gpus_used"] = sum(n * k * gpus_of(c) for key, n in res.allocation.counts
                           for c, k in problem.template(key).nodes)
    if whole_offers is not None:
        row["on_whole_nodes_cost_per_hour"] = emulation_on_whole_nodes(problem, res.allocation, whole_offers)
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


def scaled(catalog: Catalog, name: str, offers: tuple[Offer, ...], scales: list[float], workers: int,
           cache_dir: Path | None) -> dict[str, Any]:
    """The fleet's slices plan against the emulation at ``scales`` x the extended demand: how
    much of the gap is whole nodes rounding up (it shrinks as the fleet grows)."""
    out: dict[str, Any] = {}
    for x in scales:
        s = plan(catalog, offers, slices=True, workers=workers, cache_dir=cache_dir, scale=x)
        e = plan(catalog, emulation(offers), slices=False, workers=workers, cache_dir=cache_dir, scale=x,
                 whole_offers=offers)
        row = {"slices": {k: s.get(k) for k in ("status", "cost_per_hour", "gap", "solve_seconds",
                                                "gpus_used", "idle_gpus", "nodes_per_pool",
                                                "packing_violations", "tp_x_pp_in_a_node_instances")},
               "emulation": {k: e.get(k) for k in ("status", "cost_per_hour", "gap", "solve_seconds",
                                                   "gpus_used", "on_whole_nodes_cost_per_hour")}}
        sc, ec, ew = s["cost_per_hour"], e["cost_per_hour"], e.get("on_whole_nodes_cost_per_hour")
        row["slices_over_emulation"] = None if sc is None or ec is None else round(sc / ec, 4)
        row["slices_over_emulation_on_whole_nodes"] = None if sc is None or ew is None else round(sc / ew, 4)
        out[f"x{x:g}"] = row
        print(f"{name} x{x:g}: slices {sc} emulation {ec} (on whole nodes {ew}) "
              f"load {os.getloadavg()[0]:.2f}", flush=True, file=sys.stderr)
    return out


def library_size(scenario: str, workers: int) -> dict[str, Any]:
    """Cold build seconds and on-disk size of the scenario's vllm library, whole nodes and with
    slices (each into a fresh cache folder, so nothing is read from an earlier build)."""
    out: dict[str, Any] = {}
    for name, slices in (("whole_nodes", False), ("slices", True)):
        with tempfile.TemporaryDirectory(prefix="atoll-slices-lib-") as tmp:
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            lib = build_library(library_spec(SCENARIOS[scenario], "vllm", slices), cache_dir=Path(tmp),
                                workers=workers, progress=False)
            seconds = time.perf_counter() - t0
            size = sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file())
        out[name] = {"templates": len(lib.templates), "cold_build_seconds": round(seconds, 2),
                     "from_cache": lib.from_cache, "cache_bytes": size, "workers": workers,
                     "load_1min_at_start": round(load, 2)}
        print(f"library {scenario} {name}: {len(lib.templates)} templates {seconds:.1f} s {size} B "
              f"load {load:.2f}", flush=True, file=sys.stderr)
    return out


def copies_problem(templates: tuple[Template, ...], scenario: str, n_models: int, seed: int,
                   time_limit: float | None) -> AllocationProblem:
    """``n_models`` models: copy i of the scenario's model i mod M with its templates, demand
    scaled by U(0.5, 1.5) (as benchmarks/solver.py's scaling rows)."""
    rng = random.Random(seed)
    spec = SCENARIOS[scenario]
    base = scenario_demand(spec, "even")
    by_model: dict[str, list[Template]] = defaultdict(list)
    for t in templates:
        by_model[t.service.model].append(t)
    out: list[Template] = []
    demand: dict[str, float] = {}
    for i in range(n_models):
        src = spec.models[i % len(spec.models)]
        name = f"{src}#{i}"
        x = rng.uniform(0.5, 1.5)
        # the source templates were validated when built: copy them without re-validating
        out.extend(Template.trusted(Service(name, t.service.phase), t.region, t.nodes, t.stages, t.throughput)
                   for t in by_model[src])
        for svc, d in base.items():
            if svc.startswith(src + "/"):
                demand[f"{name}/{svc.rpartition('/')[2]}"] = d * x
    return AllocationProblem(tuple(out), demand, None, scenario_prices(spec), time_limit=time_limit)


N_MODEL_ROWS = ("whole_nodes", "slices", "slices_warm")


def n_models_row(scenario: str, n_models: int, time_limit: float | None, cache_dir: Path | None,
                 workers: int, rows: tuple[str, ...] = N_MODEL_ROWS) -> dict[str, Any]:
    """The ``n_models``-model solve over the scenario's vllm library, whole nodes vs slices;
    ``slices_warm``: the sliced solve warm-started from the whole-node plan (a sliced library
    holds every whole-node template, so that plan is feasible and bounds the sliced cost)."""
    out: dict[str, Any] = {}
    whole_plan: Allocation | None = None
    for name in ("whole_nodes", *(r for r in rows if r != "whole_nodes")):
        slices = name != "whole_nodes"
        lib = build_library(library_spec(SCENARIOS[scenario], "vllm", slices), cache_dir=cache_dir,
                            workers=workers, progress=False)
        t0 = time.perf_counter()
        problem = copies_problem(tuple(lib.templates), scenario, n_models, n_models, time_limit)
        problem_s = time.perf_counter() - t0
        load = os.getloadavg()[0]
        start = None
        if name == "slices_warm" and whole_plan is not None:
            start = Allocation.of({k: n for k, n in whole_plan.counts if k in problem.index.by_key})
        t0 = time.perf_counter()
        res = solve_allocation(problem, warm_start=start)
        wall = time.perf_counter() - t0
        if name == "whole_nodes":
            whole_plan = res.allocation
            if "whole_nodes" not in rows:
                continue
        out[name] = {"templates": len(problem.templates), "problem_seconds": round(problem_s, 2),
                     "status": res.status.value, "gap": res.gap,
                     **({"warm_start_accepted": res.warm_start_accepted} if start is not None else {}),
                     "cost_per_hour": None if res.allocation is None else round(res.cost_per_hour, 4),
                     "build_seconds": round(res.build_seconds, 2),
                     "solve_seconds": round(res.solve_seconds, 2),
                     "wall_seconds": round(wall, 2), "time_limit": time_limit,
                     "load_1min_at_start": round(load, 2)}
        print(f"{n_models} models {name}: {out[name]}", flush=True, file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleets", default="h100x8,a100x8_l40sx8,aws")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ladders", default="core", help="scenarios whose ladder to compare ('' for none)")
    ap.add_argument("--scenarios", default="extended", help="bundled scenarios to plan whole vs sliced")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--scaled-fleets", default="h100x8,a100x8_l40sx8",
                    help="fleets planned at --scales x the demand ('' for none)")
    ap.add_argument("--scales", default="1,4,10,20,40")
    ap.add_argument("--libraries", default="extended", help="scenarios whose cold library build to size")
    ap.add_argument("--n-models", type=int, default=200, help="models of the scaling solve (0: none)")
    ap.add_argument("--n-models-time-limit", type=float, default=600.0)
    ap.add_argument("--n-models-rows", default=",".join(N_MODEL_ROWS),
                    help="which n-model solves to run (the whole-node plan is solved for slices_warm anyway)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON document here")
    args = ap.parse_args()
    load_start = os.getloadavg()
    cache = args.cache_dir
    catalog = load_catalog()
    all_fleets = fleets(catalog)
    out: dict[str, Any] = {}
    for name in (f for f in args.fleets.split(",") if f):
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
    scales = [float(x) for x in args.scales.split(",") if x]
    scaled_rows = {f: scaled(catalog, f, all_fleets[f], scales, args.workers, cache)
                   for f in args.scaled_fleets.split(",") if f}
    libraries = {s: library_size(s, args.workers) for s in args.libraries.split(",") if s}
    n_models = ({} if not args.n_models else
                {f"extended x{args.n_models}": n_models_row(
                    "extended", args.n_models, args.n_models_time_limit, cache, args.workers,
                    tuple(r for r in args.n_models_rows.split(",") if r))})
    doc = {"demand": "extended scenario, even mix, ample availability, cost mode, runtime vllm",
           "machine": {"cpu_count": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in load_start],
                       "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
                       "note": "2 cores shared with other sessions: seconds are not from an idle machine"},
           "fleets": out, "scaled": scaled_rows, "scenarios": scenarios, "ladders": ladders,
           "libraries": libraries, "n_models": n_models}
    emit(doc, args.out)


if __name__ == "__main__":
    main()
