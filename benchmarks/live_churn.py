"""The price of churn in the live loop: the controller against a served replay of the README's
live example (core's three models on the ServeGen traces, ``--scenario core``, ``threshold``,
5-minute ticks, time scale 60) in a world 25% below the model (``scale:0.75``), under removal
weights R. One JSON document on stdout (progress on stderr), written to
``benchmarks/results/live_churn.json`` with ``--out``.

    .venv/bin/python benchmarks/live_churn.py [--weights 0,0.1,0.25,0.5,1,2] [--windows 60,120]
        [--rules threshold:0.5:1.2] [--bound 0,60,240] [--trace DIR] [--hours 24]
        [--validation 9,10] [--test 11,12] [--out benchmarks/results/live_churn.json]

Per run (one day's stretch from midnight, a fresh controller and replay): after the first hour
(the ramp from an empty fleet), churn = (instances added + removed) per hour / the mean running
instances, the ticks that changed the plan, the cost billed ($/h: running, starting, draining and
replaced nodes over each interval, as the env bills a step), the share of demand the ready
capacity could not serve (the controller's own account) and the plan's estimated SLO attainment.
Besides R, a second lever: a scale-down window W (``--windows``; the controller's
``--scale-down-window``: a service shrinks only to the most instances the solver wanted over the
last W); a third, the ``threshold`` rule's band (``--rules threshold:0.5:1.2``). A variant is
chosen on the validation days — the lowest churn whose cost is within 1% of R = 0's, else the
cheapest below R = 0's churn — and reported on the test days, never chosen there.
``--from-runs A.json B.json`` makes one document from earlier runs.

``--bound 0,60,240`` adds the hindsight bound (:func:`hindsight`): the churn and cost of a fleet
re-solved every tick for the true demand (its peak over the look-ahead, in minutes) with the
world's true capacities, on every day. ``--trace DIR`` writes each run's ticks (:func:`trace_row`:
per service the true demand, what was served, the arrivals estimate, what was planned, the
forecast's upper and the instances) to ``DIR/<variant>-day<D>.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

from atoll.control.churn import diff_counts  # noqa: E402
from atoll.control.controller import Controller, ControllerSettings  # noqa: E402
from atoll.control.live_fleet import LiveFleet  # noqa: E402
from atoll.control.metrics import ScrapeSource  # noqa: E402
from atoll.control.replay import ReplayExporter  # noqa: E402
from atoll.control.served import ServedFleet, latest_plan  # noqa: E402
from atoll.control.sinks import JsonDirSink  # noqa: E402
from atoll.envs.capacity_error import CapacityError  # noqa: E402
from atoll.envs.fleet import FleetState  # noqa: E402
from atoll.envs.policies import make_policy  # noqa: E402
from atoll.envs.vocabulary import parse_policy  # noqa: E402
from atoll.forecast.workloads import load_workload  # noqa: E402

MODELS = ["Phi-4-14B", "GPT-OSS-20B", "Qwen3-32B"]
WORKLOADS = ("m-large", "m-mid", "m-small")
INTERVAL_S = 300.0
SPEEDUP = 60.0
WORLD = "scale:0.75"
COST_SLACK = 0.01  # the target: at most +1% cost


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def trace_row(ctl: Controller, report: Any, series: list[Any], trace_s: float) -> dict[str, Any]:
    """One tick as the trace writes it, per service: the true demand of the interval that just
    ended (the series' own tokens/s), what was served, the arrivals estimate, what was planned
    (history), the forecast's upper, the instances running before and after the tick."""
    k = max(int(trace_s // INTERVAL_S) - 1, 0)
    counts = ctl._service_counts(ctl.state.running)
    demand = report.metrics.get("demand", {})
    row: dict[str, Any] = {"tick": report.tick, "trace_s": trace_s, "changed": report.plan_changed,
                           "running": dict(ctl.state.running),
                           "factors": report.correction.get("planning_factors", {}), "services": {}}
    for i, (m, s) in enumerate(zip(MODELS, series, strict=True)):
        d = demand.get(m, {})
        f = report.forecast.get(m, {})
        for ph, phase in enumerate(("prefill", "decode")):
            true = (s.prefill_tokens_per_s, s.decode_tokens_per_s)[ph]
            row["services"][f"{m}/{phase}"] = {
                "true": float(true[k]) if k < len(true) else None,
                "served": (d.get("served_tokens_per_s") or [None, None])[ph],
                "arrivals": (d.get("arrivals_tokens_per_s") or [None, None])[ph],
                "planned": (d.get("planned_tokens_per_s") or [None, None])[ph],
                "saturated": (d.get("saturated") or [None, None])[ph],
                "upper": f.get(f"{phase}_upper"), "instances": int(counts[i, ph])}
    return row


def run(weight: float, day: int, hours: float, series: list[Any], policy: str = "threshold",
        window_s: float = 0.0, trace: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One stretch of ``hours`` from day ``day``'s midnight under removal weight ``weight`` and a
    scale-down window of ``window_s`` trace seconds (0: off); ``trace``: a list each tick's
    :func:`trace_row` is appended to."""
    fleet = LiveFleet("core", models=MODELS, removal_weight=weight)
    wall = _Clock()
    start_s = (day - 1) * 86400.0
    ticks = int(round(hours * 3600.0 / INTERVAL_S))
    warm = int(round(3600.0 / INTERVAL_S))  # the first hour: the ramp from an empty fleet
    added = removed = changed = 0
    cost = 0.0
    sizes: list[int] = []
    slo: list[float] = []
    unserved: list[float] = []
    tick_churn: list[float] = []
    estimate: list[float] = []  # planned / true demand of the saturated phases, tick by tick
    resized = moved = 0  # instances: net change per service, and per template, tick to tick
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        served = ServedFleet(fleet.model, latest_plan(root / "plans"), capacity_error=WORLD, seed=0)
        with ReplayExporter(series, MODELS, speedup=SPEEDUP, clock=wall, start_s=start_s,
                            served=served) as exporter:
            rule = make_policy(parse_policy(policy), len(MODELS))
            ctl = Controller(fleet, ScrapeSource(exporter.url, clock=wall), rule,
                             JsonDirSink(root / "plans"), root / "state",
                             settings=ControllerSettings(interval_s=INTERVAL_S, time_scale=SPEEDUP,
                                                         scale_down_window_s=window_s),
                             clock=lambda: start_s + SPEEDUP * wall(), sleep=lambda s: None)
            for i in range(ticks):
                before = len(ctl.state.churn)
                running = dict(ctl.state.running)
                report = ctl.tick()
                row = trace_row(ctl, report, series, start_s + SPEEDUP * wall.now)
                if trace is not None:
                    trace.append(row)
                estimate += [v["planned"] / v["true"] for v in row["services"].values()
                             if v["saturated"] and v["true"] and v["planned"] is not None]
                if i >= warm:
                    now = ctl.state.running
                    moved += sum(abs(now.get(k, 0) - running.get(k, 0)) for k in set(now) | set(running))
                    resized += int(np.abs(ctl._service_counts(now) - ctl._service_counts(running)).sum())
                    for _, a, r in ctl.state.churn[before:]:
                        added, removed = added + a, removed + r
                    changed += int(report.plan_changed)
                    sizes.append(sum(ctl.state.running.values()))
                    # billed over the coming interval: running, starting, draining, replaced nodes
                    cost += float(ctl.fleet.model.cost(ctl.fleet_state(ctl.now()), INTERVAL_S).sum())
                    shares = [w[0] for w in ctl.state.unserved.values() if w]
                    if shares:
                        unserved.append(float(np.mean(shares)))
                    rows = [r.get("slo_attainment") for r in report.plan.get("models", {}).values()]
                    rows = [v for v in rows if v is not None]
                    if rows:
                        slo.append(float(np.mean(rows)))
                    fig = report.churn.get("per_hour_over_fleet")
                    if fig is not None and i >= 2 * warm:  # a whole hour after the ramp in its window
                        tick_churn.append(float(fig))
                wall.now += INTERVAL_S / SPEEDUP
    measured_h = (ticks - warm) * INTERVAL_S / 3600.0
    mean_size = float(np.mean(sizes)) if sizes else 0.0
    out = {
        "removal_weight": weight, "scale_down_window_s": window_s, "policy": policy, "day": day,
        "hours": hours, "ticks": ticks, "measured_hours": measured_h,
        "mean_instances": mean_size, "instances_added": added, "instances_removed": removed,
        "churn_per_hour_over_fleet": (added + removed) / measured_h / mean_size if mean_size else None,
        "tick_churn_median": statistics.median(tick_churn) if tick_churn else None,
        "tick_churn_max": max(tick_churn) if tick_churn else None,
        "plan_changes": changed, "cost_usd_per_h": cost / measured_h,
        # of the instances the running plan moved, the share a service's size change needed (the
        # rest swaps one template for another within a service)
        "resize_share": resized / moved if moved else None,
        "unserved_share_mean": float(np.mean(unserved)) if unserved else None,
        "slo_attainment_estimate_mean": float(np.mean(slo)) if slo else None,
        # how well the saturated phases' planning demand matched the true demand (5/50/95%)
        "saturated_planned_over_true": {"ticks": len(estimate), **(
            {f"p{q:02d}": float(np.percentile(estimate, q)) for q in (5, 50, 95)} if estimate else {})},
        "wall_s": time.perf_counter() - t0,
    }
    log(f"  R={weight:g} W={window_s / 60:g}m {policy} day {day}: "
        f"churn {out['churn_per_hour_over_fleet']:.3f}/h, ${out['cost_usd_per_h']:.1f}/h, "
        f"{changed} changes, {mean_size:.0f} instances ({out['wall_s']:.0f} s)")
    return out


def hindsight(day: int, hours: float, series: list[Any], look_ahead_s: float = 0.0) -> dict[str, Any]:
    """The churn bound: a fleet re-solved every tick for the TRUE demand (the series' own tokens/s
    over the coming interval, or its peak over ``look_ahead_s`` after the tick) with the world's
    true capacities (every family x 0.75), through the controller's own ILP (removal weight 0,
    warm-started from the last plan, each phase at least one instance). Measured as :func:`run`
    measures the controller: after the first hour, (added + removed) per hour / mean instances."""
    fleet = LiveFleet("core", models=MODELS)
    model = fleet.model
    truth = CapacityError.parse(WORLD).draw(model.families(), np.random.default_rng(0))
    replanner = model.corrected_replanner(truth)
    start = int(round((day - 1) * 86400.0 / INTERVAL_S))
    ticks = int(round(hours * 3600.0 / INTERVAL_S))
    warm = int(round(3600.0 / INTERVAL_S))
    ahead = max(int(math.ceil(look_ahead_s / INTERVAL_S)), 1)
    plan: dict[str, int] = {}
    added = removed = resized = moved = 0
    cost = 0.0
    sizes: list[int] = []
    t0 = time.perf_counter()
    for i in range(ticks):
        k = start + i
        demand = np.array([[float(np.max(s.prefill_tokens_per_s[k:k + ahead], initial=0.0)),
                            float(np.max(s.decode_tokens_per_s[k:k + ahead], initial=0.0))] for s in series])
        out = model.replan(FleetState(running=dict(plan)), frozenset(MODELS), demand, fleet.availability,
                           replanner=replanner)
        new = dict(out.allocation.as_dict()) if out.allocation is not None else dict(plan)
        counts = _counts(model, new)
        for mi, ph in zip(*np.nonzero(counts < 1), strict=True):  # the floor: one instance a phase
            key = min((key for key in fleet.templates if model.info(key)[:2] == (mi, ph)),
                      key=lambda key: model.info(key)[3])
            new[key] = new.get(key, 0) + 1
        if i >= warm:
            a, r = diff_counts(plan, new)
            added, removed = added + a, removed + r
            moved += a + r
            resized += int(np.abs(_counts(model, new) - _counts(model, plan)).sum())
            sizes.append(sum(new.values()))
            cost += float(model.cost(FleetState(running=dict(new)), INTERVAL_S).sum())
        plan = new
    measured_h = (ticks - warm) * INTERVAL_S / 3600.0
    mean_size = float(np.mean(sizes)) if sizes else 0.0
    out_doc = {"day": day, "hours": hours, "look_ahead_s": look_ahead_s, "measured_hours": measured_h,
               "mean_instances": mean_size, "instances_added": added, "instances_removed": removed,
               "churn_per_hour_over_fleet": (added + removed) / measured_h / mean_size if mean_size else None,
               "resize_share": resized / moved if moved else None,
               "cost_usd_per_h": cost / measured_h, "wall_s": time.perf_counter() - t0}
    log(f"  hindsight (look-ahead {look_ahead_s / 60:g} min) day {day}: "
        f"churn {out_doc['churn_per_hour_over_fleet']:.3f}/h, ${out_doc['cost_usd_per_h']:.1f}/h, "
        f"{mean_size:.0f} instances ({out_doc['wall_s']:.0f} s)")
    return out_doc


def _counts(model: Any, plan: dict[str, int]) -> np.ndarray:
    counts = np.zeros((len(MODELS), 2), dtype=int)
    for key, n in plan.items():
        mi, ph, _, _ = model.info(key)
        counts[mi, ph] += n
    return counts


def pooled_bound(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Days pooled: churn over every measured hour and instance, cost per measured hour (what a
    hindsight run and a controller run both have)."""
    hours = sum(r["measured_hours"] for r in rows)
    instance_hours = sum(r["mean_instances"] * r["measured_hours"] for r in rows)
    moves = sum(r["instances_added"] + r["instances_removed"] for r in rows)
    return {"days": [r["day"] for r in rows],
            "churn_per_hour_over_fleet": moves / instance_hours if instance_hours else None,
            "cost_usd_per_h": sum(r["cost_usd_per_h"] * r["measured_hours"] for r in rows) / hours,
            "mean_instances": instance_hours / hours, "resize_share": _mean(rows, "resize_share")}


def pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A controller's days pooled: :func:`pooled_bound`'s figures and its plan changes, moves,
    unserved share and SLO estimate."""
    return {**pooled_bound(rows),
            "plan_changes": sum(r["plan_changes"] for r in rows),
            "instances_added": sum(r["instances_added"] for r in rows),
            "instances_removed": sum(r["instances_removed"] for r in rows),
            "unserved_share_mean": _mean(rows, "unserved_share_mean"),
            "slo_attainment_estimate_mean": _mean(rows, "slo_attainment_estimate_mean")}


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(values)) if values else None


def variant(r: dict[str, Any]) -> str:
    """A run's lever setting: ``R=<weight>`` and, when on, ``W=<minutes>m`` (the scale-down window)
    and the rule when it is not the example's ``threshold`` (its band)."""
    w = r.get("scale_down_window_s", 0.0)
    rule = r.get("policy", "threshold")
    return (f"R={r['removal_weight']:g}" + (f",W={w / 60:g}m" if w else "")
            + (f",{rule}" if rule != "threshold" else ""))


def choose(validation: dict[str, dict[str, Any]]) -> str:
    """The variant chosen on the validation days: the lowest churn within COST_SLACK of R = 0's
    cost; else (none within it) the cheapest whose churn is below R = 0's."""
    base = validation["R=0"]
    budget, churn = base["cost_usd_per_h"] * (1 + COST_SLACK), base["churn_per_hour_over_fleet"]
    within = [k for k, v in validation.items() if v["cost_usd_per_h"] <= budget]
    if any(k != "R=0" for k in within):
        return min(within, key=lambda k: (validation[k]["churn_per_hour_over_fleet"], k))
    lower = [k for k, v in validation.items() if v["churn_per_hour_over_fleet"] < churn]
    return min(lower or ["R=0"], key=lambda k: (validation[k]["cost_usd_per_h"], k))



def bound_summary(bound: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per stage and look-ahead (minutes), the pooled hindsight bound."""
    out: dict[str, dict[str, Any]] = {}
    for stage, rows in bound.items():
        looks = sorted({r["look_ahead_s"] for r in rows})
        out[stage] = {f"{la / 60:g}": pooled_bound([r for r in rows if r["look_ahead_s"] == la])
                      for la in looks}
    return out


def document(runs: dict[str, list[dict[str, Any]]], hours: float, wall_s: float,
             loads: list[list[float]], bound: dict[str, list[dict[str, Any]]] | None = None
             ) -> dict[str, Any]:
    """The result document of ``runs`` (per stage, one row per run) and of the hindsight ``bound``
    runs (per stage)."""
    doc = _document(runs, hours, wall_s, loads)
    if bound and any(bound.values()):
        doc["bound"] = {"what": "hindsight: the controller's ILP re-solved every tick for the true demand's "
                                "peak over the look-ahead (minutes; 0: the coming interval) with the "
                                "world's true capacities, removal weight 0",
                        "summary": bound_summary(bound), "runs": bound}
    return doc


def _document(runs: dict[str, list[dict[str, Any]]], hours: float, wall_s: float,
              loads: list[list[float]]) -> dict[str, Any]:
    names = sorted({variant(r) for rows in runs.values() for r in rows})
    summary = {stage: {k: pooled([r for r in rows if variant(r) == k]) for k in names
                       if any(variant(r) == k for r in rows)} for stage, rows in runs.items()}
    days = {stage: sorted({r["day"] for r in rows}) for stage, rows in runs.items()}
    partial = {"variants": names, "validation_days": days["validation"], "test_days": days["test"],
               "hours_per_day": hours, "summary": summary, "runs": runs, "wall_s": wall_s,
               "load_avg_1_5_15": loads}
    if "R=0" not in summary["validation"] or "R=0" not in summary["test"]:
        return partial  # no reference to choose against: merge it with one (--from-runs)
    chosen = choose(summary["validation"])
    test0, testc = summary["test"]["R=0"], summary["test"][chosen]
    return {
        "what": "live controller vs served replay (README live example): core, threshold, 5-min ticks, "
                "time scale 60, world scale:0.75; churn and billed cost after the first hour",
        "world": WORLD, "policy": "threshold", "interval_s": INTERVAL_S, "time_scale": SPEEDUP,
        "variants": names, "validation_days": days["validation"], "test_days": days["test"],
        "hours_per_day": hours, "chosen": chosen,
        "target": {"churn_per_hour_over_fleet_max": 0.10, "cost_increase_max": COST_SLACK},
        "test_result": {
            "churn_r0": test0["churn_per_hour_over_fleet"],
            "churn_chosen": testc["churn_per_hour_over_fleet"],
            "cost_r0_usd_per_h": test0["cost_usd_per_h"], "cost_chosen_usd_per_h": testc["cost_usd_per_h"],
            "cost_change": testc["cost_usd_per_h"] / test0["cost_usd_per_h"] - 1.0,
            "churn_met": testc["churn_per_hour_over_fleet"] <= 0.10,
            "cost_met": testc["cost_usd_per_h"] <= test0["cost_usd_per_h"] * (1 + COST_SLACK)},
        "summary": summary, "runs": runs, "wall_s": wall_s, "load_avg_1_5_15": loads,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", default="0,0.1,0.25,0.5,1,2",
                    help="removal weights R (R = 0, the reference, is run unless --windows is given "
                         "or this is empty)")
    ap.add_argument("--windows", default="", help="scale-down windows in minutes, each run at R = 0")
    ap.add_argument("--rules", default="",
                    help="other bands of the threshold rule (e.g. threshold:0.3:1.0), each run at R = 0")
    ap.add_argument("--validation", default="9,10", help="days a variant is chosen on")
    ap.add_argument("--test", default="11,12", help="days the chosen variant is reported on")
    ap.add_argument("--hours", type=float, default=24.0, help="hours per day's stretch, from midnight")
    ap.add_argument("--from-runs", type=Path, nargs="*", default=None,
                    help="make the document from these earlier documents' runs (nothing is run)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--bound", default="",
                    help="look-aheads in minutes of the hindsight bound, run on every day (0: the "
                         "coming interval; e.g. 0,60,240)")
    ap.add_argument("--trace", type=Path, default=None,
                    help="a folder: each run's ticks (trace_row) to <variant>-day<D>.json in it")
    args = ap.parse_args()
    if args.from_runs:
        docs = [json.loads(f.read_text()) for f in args.from_runs]
        runs, bound = {}, {}
        for stage in ("validation", "test"):  # a variant and day run twice: the first document's
            seen: dict[tuple[str, int], dict[str, Any]] = {}
            for d in docs:
                for r in d["runs"][stage]:
                    seen.setdefault((variant(r), r["day"]), r)
            runs[stage] = list(seen.values())
            hind: dict[tuple[float, int], dict[str, Any]] = {}
            for d in docs:
                for r in d.get("bound", {}).get("runs", {}).get(stage, []):
                    hind.setdefault((r["look_ahead_s"], r["day"]), r)
            bound[stage] = list(hind.values())
        loads = [d.get("load_avg_1_5_15") or [d.get("load_avg_1_5_15_before"), d.get("load_avg_1_5_15_after")]
                 for d in docs]
        doc = document(runs, docs[0]["hours_per_day"], sum(d["wall_s"] for d in docs), loads, bound)
    else:
        weights = {float(x) for x in args.weights.split(",") if x}
        reference = {0.0} if weights and not args.windows else set()
        levers = [(w, 0.0, "threshold") for w in sorted(weights | reference)]
        levers += [(0.0, float(m) * 60.0, "threshold") for m in args.windows.split(",") if m]
        levers += [(0.0, 0.0, rule) for rule in args.rules.split(",") if rule]
        series = [load_workload(f"servegen:{w}", step_s=INTERVAL_S) for w in WORKLOADS]
        t0 = time.perf_counter()
        load_before = list(os.getloadavg())
        runs: dict[str, list[dict[str, Any]]] = {"validation": [], "test": []}
        bound: dict[str, list[dict[str, Any]]] = {"validation": [], "test": []}
        for stage, text in (("validation", args.validation), ("test", args.test)):
            log(f"{stage} days {text}")
            for minutes in (float(x) for x in args.bound.split(",") if x):
                for d in (int(x) for x in text.split(",") if x):
                    bound[stage].append(hindsight(d, args.hours, series, minutes * 60.0))
            for weight, window, rule in levers:
                for d in (int(x) for x in text.split(",") if x):
                    ticks: list[dict[str, Any]] | None = [] if args.trace else None
                    runs[stage].append(run(weight, d, args.hours, series, rule, window_s=window, trace=ticks))
                    if args.trace:
                        args.trace.mkdir(parents=True, exist_ok=True)
                        name = variant(runs[stage][-1]).replace(",", "_")
                        (args.trace / f"{name}-day{d}.json").write_text(json.dumps(ticks) + "\n")
        loads = [load_before, list(os.getloadavg())]
        doc = document(runs, args.hours, time.perf_counter() - t0, loads, bound)
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
