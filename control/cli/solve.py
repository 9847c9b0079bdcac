"""``atoll solve``: the allocation of a scenario by the ILP or a baseline."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from atoll.control.cli.common import (
    Given,
    add_fleet_option,
    add_json,
    add_pd_option,
    add_risk_option,
    check_image_path,
    fleet_market,
    parse_risk,
    read_fleet_arg,
    scenario_of,
)
from atoll.control.cli.output import Output, UserError, as_user_error, output_for, progress
from atoll.solvers.baselines import METHODS, MethodResult, run_method
from atoll.solvers.catalog import load_catalog
from atoll.solvers.ladder import decompose
from atoll.solvers.models import get_model
from atoll.solvers.packing import check_packing, describe_packing, pack_plan
from atoll.solvers.perf import UNVALIDATED_NOTE, template_unvalidated
from atoll.solvers.problem import AllocationProblem
from atoll.solvers.runtime import RUNTIMES, slices_default
from atoll.solvers.scenarios import (
    BUNDLED_SCENARIOS,
    MIXES,
    SCENARIOS,
    SOLVE_AVAILABILITIES,
    ScenarioSpec,
    build_problem,
)
from atoll.solvers.servable import unservable, unservable_message
from atoll.solvers.tiers import split_tier


def plan_rows(problem: AllocationProblem, result: MethodResult, spec: ScenarioSpec | None = None
              ) -> list[dict[str, Any]]:
    """The plan's lines; ``spec``: the scenario planned (a fleet's own models), default built-ins."""
    model = spec.model if spec is not None else get_model
    rows = []
    for key, n in (result.allocation.counts if result.allocation else ()):
        t = problem.template(key)
        region, tier = split_tier(t.region)
        rows.append({
            "service": t.service.name, "template": key, "region": region, "tier": tier,
            "nodes": {c: k for c, k in t.nodes},
            "stages": [{"layers": s.layers, "nodes": list(s.nodes)} for s in t.stages],
            "instances": n, "throughput": n * t.throughput,
            # a co-located replica serves both phases: its prompt tokens/s above, its generated ones here
            **({"decode_throughput": n * t.decode_throughput} if t.colocated else {}),
            "unvalidated": template_unvalidated(model(t.service.model), (c for c, _ in t.nodes)),
        })
    return rows


def bill_of_materials(problem: AllocationProblem, result: MethodResult, spec: ScenarioSpec | None = None
                      ) -> list[dict[str, Any]]:
    """What the plan buys, one line per (region, node config, tier): the instance type, whole
    nodes (slices packed: ceil of their share), the tier, $/node-hour and $/h of the line;
    ``spec``: the scenario planned (a fleet's own offers), default the shipped catalog."""
    if result.allocation is None:
        return []
    catalog = spec.catalog if spec is not None else load_catalog()
    lines = []
    for (tiered, config), used in sorted(problem.node_use(result.allocation).items()):
        region, tier = split_tier(tiered)
        nodes = math.ceil(used - 1e-9)
        offer = catalog.offers_in(region).get(config)
        price = problem.prices[(tiered, config)]
        lines.append({"region": region, "config": config, "instance": offer.instance if offer else "-",
                      "tier": tier, "nodes": nodes, "price_per_node_hour": price,
                      "cost_per_hour": nodes * price})
    return lines


AVAILABILITY_MEANS = {
    "ample": "every pool on-demand at its cap (a fleet's static caps; else 1000 nodes)",
    "scarce": "every pool on-demand, capped at (1 + headroom) x the nodes of the cheapest even-mix plan "
              "(the plan often fits; the caps bind when demand or the mix moves)",
    "spot": "every pool spot, at spot prices; a static plan sees each pool at its cap (a trace: its "
            "most nodes)",
    "hedged": "every pool both tiers: spot at spot prices beside an on-demand quota",
    "market": "each pool in its fleet file's market, billed at that tier",
}


def solve_document(problem: AllocationProblem, result: MethodResult, *, spec: ScenarioSpec | None = None,
                   **context: Any) -> dict[str, Any]:
    """The solve's JSON document: ``context`` first, then the result, plan, bill and packing;
    ``spec``: the scenario planned (a fleet's own models and offers)."""
    ev = result.evaluation
    return {
        **context,
        "method": result.method,
        "status": result.status,
        "message": result.message,
        "cost_per_hour": result.cost_per_hour,
        "objective": math.nan if ev is None else ev.objective,
        "goodput_fraction": result.goodput_fraction,
        "solve_seconds": result.solve_seconds,
        "build_seconds": result.build_seconds,
        "gap": result.gap,
        "feasible": result.ok,
        "violations": [] if ev is None else list(ev.violations),
        "served_share": {} if ev is None else dict(ev.served_share),
        "services": [{"service": s, "demand": d, "capacity": 0.0 if ev is None else ev.capacity.get(s, 0.0),
                      "served": 0.0 if ev is None else ev.served.get(s, 0.0)}
                     for s, d in problem.demand.items()],
        "plan": plan_rows(problem, result, spec),
        "bill": bill_of_materials(problem, result, spec),
        **packing_document(problem, result),
    }


def packing_document(problem: AllocationProblem, result: MethodResult) -> dict[str, Any]:
    """With slices: which slices share which node, nodes per pool, and what the
    packing evaluator finds (empty: every slice placed once, no node over its GPUs, the node
    counts the ILP paid for). Nothing for whole-node libraries."""
    if result.allocation is None or not problem.index.sliced_rcs:
        return {}
    packing = pack_plan(problem, result.allocation)
    return {"packing": dict(describe_packing(packing)),
            "packing_violations": check_packing(problem, result.allocation, packing)}


def _print(out: Output, doc: dict[str, Any]) -> None:
    table = Table(title=f"{doc['scenario']} / {doc['availability']} / {doc['mix']} — {doc['method']}")
    for col in ("service", "region", "tier", "nodes", "pipeline (layers:nodes)", "inst.", "tok/s"):
        table.add_column(col, justify="right" if col in ("inst.", "tok/s") else "left")
    for r in doc["plan"]:
        nodes = " + ".join(f"{k}x {c}" for c, k in r["nodes"].items())
        split = " | ".join(f"{s['layers']}:{','.join(s['nodes'])}" for s in r["stages"])
        mark = "†" if r["unvalidated"] else ""
        table.add_row(r["service"], r["region"], r["tier"], nodes, split, str(r["instances"]),
                      f"{r['throughput']:.0f}{mark}")
    out.result(table)
    bill = Table(title="Bill of materials")
    for col in ("region", "config", "instance", "tier", "nodes", "$/node-h", "$/h"):
        bill.add_column(col, justify="right" if col in ("nodes", "$/node-h", "$/h") else "left")
    for b in doc["bill"]:
        bill.add_row(b["region"], b["config"], b["instance"], b["tier"], str(b["nodes"]),
                     f"{b['price_per_node_hour']:.3f}", f"{b['cost_per_hour']:.2f}")
    if doc["bill"]:
        bill.add_row("total", "", "", "", str(sum(b["nodes"] for b in doc["bill"])), "",
                     f"{sum(b['cost_per_hour'] for b in doc['bill']):.2f}")
        out.result(bill)
    if any(r["unvalidated"] for r in doc["plan"]):
        out.note(f"† {UNVALIDATED_NOTE}")
    svc = Table(title="Throughput vs demand (tokens/s)")
    for col in ("service", "demand", "capacity", "served"):
        svc.add_column(col, justify="left" if col == "service" else "right")
    for s in doc["services"]:
        svc.add_row(s["service"], f"{s['demand']:.0f}", f"{s['capacity']:.0f}", f"{s['served']:.0f}")
    out.result(svc)
    shares = ", ".join(f"{m} {v:.1%}" for m, v in doc["served_share"].items())
    out.result(f"status {doc['status']}  cost ${doc['cost_per_hour']:.2f}/h  goodput "
                  f"{doc['goodput_fraction']:.1%}  gap {doc['gap']:.2e}  solve {doc['solve_seconds']:.2f} s"
                  f"  build {doc['build_seconds']:.2f} s")
    if shares:
        out.result(f"served share per model: {shares}")
    if doc["message"]:
        out.result(Text(doc["message"], style="yellow"))


def _print_ladder(out: Output, doc: dict[str, Any]) -> None:
    if "warning" in doc:
        out.result(Text(doc["warning"], style="bold red"))
    models = doc["models"]
    table = Table(title=f"{doc['scenario']} / {doc['availability']} / {doc['mix']} — ladder "
                        f"({doc['mode']} mode, catalog {doc['catalog']})")
    for col in ("rung", "status", "$/h", "goodput", "/ joint", *models):
        table.add_column(col, justify="left" if col in ("rung", "status") else "right")
    for r in [*doc["rungs"], *doc["side"]]:
        cost = r["cost_per_hour"]
        ratio = doc["over_joint"].get(r["rung"])
        table.add_row(r["rung"], r["status"], "-" if cost is None else f"{cost:.2f}",
                      "-" if r["goodput_fraction"] is None else f"{r['goodput_fraction']:.1%}",
                      "-" if ratio is None else f"{ratio:.3f}",
                      *(f"{r['model_cost'].get(m, 0.0):.2f}" for m in models))
    out.result(table)
    steps = Table(title="each rung over the next ($/h ratio)")
    for col in ("step", "total", *models):
        steps.add_column(col, justify="left" if col == "step" else "right")
    for s in doc["steps"]:
        steps.add_row(s["step"], "-" if s["ratio"] is None else f"{s['ratio']:.3f}",
                      *("-" if s["per_model"][m] is None else f"{s['per_model'][m]:.3f}" for m in models))
    out.result(steps)


def cmd_solve(args: argparse.Namespace) -> int:
    out = output_for(args)
    if args.plot:
        if not args.decompose:
            raise UserError("--plot draws the ladder of --decompose; add --decompose or drop --plot")
        check_image_path(Path(args.plot), "--plot")
    active = read_fleet_arg(args)
    if not args.scenario:
        raise UserError(f"give --scenario ({', '.join(BUNDLED_SCENARIOS)}) or --fleet FILE")
    if active is not None:
        args.availability = fleet_market(args, active)
    elif args.availability is None:
        args.availability = "ample"
    try:
        METHODS[args.method]  # unknown names fail before the library is built
        with progress("templates (multisets placed)", None) as advance:
            spec = scenario_of(args)
            problem = build_problem(spec, args.availability, args.mix,
                                    mode="goodput" if args.goodput else "cost",
                                    time_limit=args.time_limit, gap=args.gap,
                                    progress=lambda n, total: advance(n, total=total),
                                    what_if_2gpu=args.what_if_2gpu, runtime=args.runtime,
                                    slices=args.slices,  # None: the fleet's own, or vllm's default
                                    pd=args.pd)  # None: the fleet's own, or disaggregated
    except (KeyError, ValueError, FileNotFoundError) as exc:
        raise as_user_error(exc) from exc
    risk = parse_risk(args.risk) if args.risk is not None else None
    if risk is not None and not risk.neutral:
        if args.decompose or args.method != "ilp":
            raise UserError(f"--risk {args.risk} applies to the ILP's one plan; the ladder (--decompose) "
                            f"and the baselines (--method {args.method}) compare plain plans: drop --risk, "
                            f"or solve with --method ilp")
        problem = problem.with_risk(risk)
    sliced = args.slices if args.slices is not None else slices_default(
        args.runtime or spec.runtime, spec.runtime, spec.slices)
    context = {"scenario": args.scenario, "fleet": args.fleet, "runtime": args.runtime or
               spec.runtime, "availability": args.availability,
               "availability_means": AVAILABILITY_MEANS[args.availability],
               **({"market": active.spec.market_summary} if active is not None else {}), "mix": args.mix,
               "mode": problem.mode, **({"slices": True} if sliced else {}),
               "pd": args.pd or spec.pd,
               **({"risk": risk.label()} if risk is not None else {})}
    out.note(f"availability {args.availability}: {AVAILABILITY_MEANS[args.availability]}")
    if args.decompose:
        doc = decompose(problem, hypothetical=args.what_if_2gpu, **context)
        _print_ladder(out, doc)
        if args.plot:
            from atoll.control.cli.plots import ladder_bars

            doc["plot"] = str(ladder_bars(doc, Path(args.plot)))
            out.note(f"$/h per rung drawn to {doc['plot']}")
        out.json(doc)
        return 0 if doc["all_ilp_rungs_optimal"] else 1
    if args.what_if_2gpu:
        from atoll.solvers.catalog import WHAT_IF_NOTE

        out.result(Text(WHAT_IF_NOTE, style="bold red"))
        context.update(catalog="what-if-2gpu", warning=WHAT_IF_NOTE)
    # models with no template at all: the reason per model, not "infeasible within availability"
    reasons = unservable(spec, problem.templates, args.runtime, slices=sliced)
    result = run_method(problem, args.method)
    doc = solve_document(problem, result, spec=spec, unservable=reasons, **context)
    if reasons:
        doc["message"] = unservable_message(reasons) + (f". {doc['message']}" if doc["message"] else "")
    _print(out, doc)
    out.json(doc)
    return 0 if result.ok else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", help="allocate a scenario's demand with the ILP or a baseline")
    p.add_argument("--scenario", default=None, action=Given,
                   help=f"one of: {', '.join(SCENARIOS)} (or --fleet)")
    add_fleet_option(p)
    p.add_argument("--runtime", default=None, choices=RUNTIMES,
                   help="templates of this serving runtime (default: the scenario's, any; a fleet's, vllm)")
    p.add_argument("--availability", default=None, choices=SOLVE_AVAILABILITIES,
                   help="pool caps and market: ample, scarce (on-demand caps), spot (spot prices), hedged "
                        "(both tiers), market (a fleet file's own market per pool). Default: ample; with "
                        "--fleet: market (a value given with --fleet overrides the file's market)")
    p.add_argument("--mix", default="even", help=f"demand mix, one of: {', '.join(MIXES)}")
    p.add_argument("--method", default="ilp", help=f"one of: {', '.join(sorted(METHODS))}")
    p.add_argument("--goodput", action="store_true",
                   help="maximize served demand first, then minimize cost (for scarcity)")
    p.add_argument("--time-limit", type=float, default=None, help="solver time limit (s)")
    p.add_argument("--gap", type=float, default=1e-4, help="relative optimality gap (default 1e-4)")
    p.add_argument("--decompose", action="store_true",
                   help="the ladder of baselines (homo-node ... joint) and each rung over the next")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="with --decompose: a bar chart of $/h per rung")
    p.add_argument("--what-if-2gpu", action="store_true",
                   help="HYPOTHETICAL catalog: add 2-GPU AWS nodes at 2x the 1-GPU price (paper comparison)")
    add_pd_option(p)
    p.add_argument("--slices", action=argparse.BooleanOptionalAction, default=None,
                   help="under runtime vllm (default there: slices): stages may use g of a node's G GPUs "
                        "(several vLLM pods per node, TP x PP inside a node); the plan buys whole nodes and "
                        "shows the packing. --no-slices: every stage owns whole nodes")
    add_risk_option(p)
    add_json(p)
    p.set_defaults(handler=cmd_solve)
