"""Where the savings come from: the ladder of baselines over a grid; prints ONE JSON document.

Grid: core and extended x even, large-heavy, small-heavy x 1x and 3x demand x ample (cost mode)
and scarce (goodput mode) availability; then 20 and 50 models (copies of the extended models,
demand x U(0.5, 1.5), seeded, ample); then the paper comparison: the ladder's Homo/joint ratios
under atoll's defaults and under the what-if catalog (HYPOTHETICAL 2-GPU AWS nodes at 2x the
1-GPU price), next to the Coral paper's 1.62 (core), 3.14 (extended), 2.79 (extended
large-heavy). The performance model is never tuned toward those figures.

``scarce`` at 3x demand is the scarce availability of the 3x even-mix plan (the same headroom
over ceil of the cheapest plan's nodes), so both demand levels are equally tight.

    .venv/bin/python benchmarks/decomposition.py [--scenarios core,extended] [--skip-scaling]
        [--skip-paper] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from emit import emit
from solver import copied_models

from atoll.solvers.allocation import solve_allocation
from atoll.solvers.catalog import WHAT_IF_NOTE, catalog_for
from atoll.solvers.ladder import RUNGS, SIDE, decompose
from atoll.solvers.problem import AllocationProblem, SolveStatus
from atoll.solvers.scenarios import (
    MIXES,
    SCENARIOS,
    ScenarioSpec,
    ample_availability,
    build_problem,
    scenario_demand,
    scenario_prices,
    scenario_templates,
)
from atoll.solvers.types import Template

PAPER_HOMO_OVER_JOINT = {"core": 1.62, "extended": 3.14, "extended/large-heavy": 2.79}
SCALES = (1.0, 3.0)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _paper(scenario: str, mix: str) -> float | None:
    return PAPER_HOMO_OVER_JOINT.get(f"{scenario}/{mix}", PAPER_HOMO_OVER_JOINT.get(scenario))


def _scarce(spec: ScenarioSpec, templates: tuple[Template, ...], scale: float) -> dict[tuple[str, str], int]:
    """ceil((1 + headroom) x nodes per (region, config) of the cheapest even-mix plan at ``scale``."""
    demand = {s: d * scale for s, d in scenario_demand(spec, "even").items()}
    prices = scenario_prices(spec)
    res = solve_allocation(AllocationProblem(templates, demand, ample_availability(spec), prices))
    if res.allocation is None or res.status is not SolveStatus.OPTIMAL:
        raise RuntimeError(f"{spec.name}: even plan at {scale}x failed: {res.status.value} {res.message}")
    used: dict[tuple[str, str], int] = {}
    index = {t.key: t for t in templates}
    for key, n in res.allocation.counts:
        t = index[key]
        for c, k in t.nodes:
            used[(t.region, c)] = used.get((t.region, c), 0) + k * n
    return {rc: (math.ceil((1 + spec.scarce_headroom) * used[rc] - 1e-9) if rc in used else 0)
            for rc in scenario_prices(spec)}


def _summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The figures of one cell: each rung's $/h, goodput, status, gap and seconds; the steps."""
    rungs = {r["rung"]: {k: r[k] for k in ("status", "cost_per_hour", "goodput_fraction", "gap", "seconds",
                                           "model_cost")}
             for r in [*doc["rungs"], *doc["side"]]}
    return {"mode": doc["mode"], "models": doc["models"], "rungs": rungs, "steps": doc["steps"],
            "over_joint": doc["over_joint"], "all_ilp_rungs_optimal": doc["all_ilp_rungs_optimal"],
            "worst_ilp_gap": max((r["gap"] for r in doc["rungs"] if r["gap"] is not None), default=None)}


def _grid(scenarios: list[str]) -> list[dict[str, Any]]:
    cells = []
    for name in scenarios:
        spec = SCENARIOS[name]
        t0 = time.perf_counter()
        templates = scenario_templates(spec)
        _log(f"{name}: {len(templates)} templates ({time.perf_counter() - t0:.1f} s)")
        for scale in SCALES:
            scarce = _scarce(spec, templates, scale)
            for mix in MIXES:
                demand = {s: d * scale for s, d in scenario_demand(spec, mix).items()}
                for availability, mode, avail in (("ample", "cost", ample_availability(spec)),
                                                  ("scarce", "goodput", scarce)):
                    problem = AllocationProblem(templates, demand, avail, scenario_prices(spec), mode=mode)
                    t1 = time.perf_counter()
                    doc = decompose(problem)
                    cell = {"scenario": name, "mix": mix, "demand_scale": scale, "availability": availability,
                            "seconds": round(time.perf_counter() - t1, 2), **_summary(doc)}
                    _log(f"  {name} {mix} {scale:g}x {availability}: {cell['seconds']} s, over joint "
                         + ", ".join(f"{k} {v:.3f}" for k, v in doc["over_joint"].items() if v is not None))
                    cells.append(cell)
    return cells


def _copies(templates: tuple[Template, ...], n_models: int, seed: int) -> AllocationProblem:
    """n_models models: copy i of default model i mod 6, demand scaled by U(0.5, 1.5) (as in
    benchmarks/solver.py), ample availability, cost mode."""
    spec = SCENARIOS["extended"]
    out, demand = copied_models(templates, n_models, seed)
    return AllocationProblem(out, demand, ample_availability(spec), scenario_prices(spec))


def _scaling(sizes: list[int]) -> list[dict[str, Any]]:
    templates = scenario_templates(SCENARIOS["extended"])
    out = []
    for n in sizes:
        t0 = time.perf_counter()
        problem = _copies(templates, n, seed=n)
        build = time.perf_counter() - t0
        doc = decompose(problem)
        summary = _summary(doc)
        summary.pop("models")
        for r in summary["rungs"].values():
            r.pop("model_cost")
        summary["steps"] = [{k: s[k] for k in ("step", "ratio")} for s in summary["steps"]]
        cell = {"models": n, "templates": len(problem.templates), "problem_seconds": round(build, 2),
                "seconds": round(time.perf_counter() - t0 - build, 2), **summary}
        _log(f"  {n} models: {cell['seconds']} s, over joint "
             + ", ".join(f"{k} {v:.3f}" for k, v in doc["over_joint"].items() if v is not None))
        out.append(cell)
    return out


def _paper_comparison(scenarios: list[str]) -> list[dict[str, Any]]:
    rows = []
    for name in scenarios:
        for mix in MIXES:
            row: dict[str, Any] = {"scenario": name, "mix": mix, "paper_homo_over_joint": _paper(name, mix)}
            for label, what_if in (("atoll_defaults", False), ("what_if_2gpu", True)):
                t0 = time.perf_counter()
                problem = build_problem(name, "ample", mix, what_if_2gpu=what_if)
                doc = decompose(problem, hypothetical=what_if)
                row[label] = {"over_joint": doc["over_joint"], "joint_cost_per_hour":
                              doc["rungs"][-1]["cost_per_hour"], "catalog": doc["catalog"],
                              "all_ilp_rungs_optimal": doc["all_ilp_rungs_optimal"],
                              "seconds": round(time.perf_counter() - t0, 2)}
                if what_if:
                    row[label]["warning"] = WHAT_IF_NOTE
                _log(f"  paper {name} {mix} {label}: homo-node/joint {doc['over_joint']['homo-node']:.3f}")
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default="core,extended")
    ap.add_argument("--scaling-models", default="20,50")
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--skip-paper", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON document here")
    args = ap.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    t0 = time.perf_counter()
    doc: dict[str, Any] = {
        "benchmark": "decomposition", "rungs": list(RUNGS), "side": list(SIDE),
        "paper_homo_over_joint": PAPER_HOMO_OVER_JOINT,
        "note": ("ample availability: cost mode; scarce: goodput mode (maximize served share, then cost). "
                 "Ratios are $/h of a rung over the next (or over joint); compare scarce cells' costs "
                 "only where both sides serve the same share."),
    }
    doc["grid"] = _grid(scenarios)
    doc["scaling"] = [] if args.skip_scaling else _scaling([int(n) for n in args.scaling_models.split(",")])
    doc["paper_comparison"] = [] if args.skip_paper else _paper_comparison(scenarios)
    cells = doc["grid"] + doc["scaling"]
    doc["all_ilp_rungs_optimal"] = all(c["all_ilp_rungs_optimal"] for c in cells)
    gaps = [c["worst_ilp_gap"] for c in cells if c["worst_ilp_gap"] is not None]
    doc["worst_ilp_gap"] = max(gaps, default=None)
    doc["catalog_what_if_is_hypothetical"] = WHAT_IF_NOTE
    doc["what_if_catalog_offers_added"] = sorted(
        f"{o.region}/{o.config}" for o in catalog_for(True).offers if o not in catalog_for(False).offers)
    doc["wall_seconds"] = round(time.perf_counter() - t0, 1)
    emit(doc, args.out, indent=1, allow_nan=False, default=lambda v: None)


if __name__ == "__main__":
    main()
