"""Figures of the closed loop, as one JSON document on stdout (progress on stderr).

``sim`` part: per scenario, rule and world, SLO attainment (latency-based, :mod:`atoll.envs.latency`),
the fluid served share beside it, and cost over the test days (default 11-14) and seeds (default
0-2), spot market. Worlds:

- ``exact``: the performance model is the truth (``capacity_error=0``);
- ``calibration`` / ``calibration+correction``: true capacities drawn with the calibration's
  held-out spread, planned on the model's capacities / corrected online;
- ``stress`` / ``stress+correction``: every family 25% off the model, up or down at random;
- ``calibration+truth`` / ``stress+truth``: the planner is told the true factors — the plan a
  perfect correction would make in that world, the fair reference for the corrected cost (the
  exact world is another world: there no family is faster than its profile).

Convergence (corrected worlds): for every family that served traffic for 12 steps (1 hour) in a
day, the relative error of its learned factor at that moment; share within 5%, median and max.
Every world of one seed meets the same demand, availability and preemption draws.

``live`` part (``--live``): the controller against a served replay of the README's example (the
three ServeGen services as the core models, day 11, 5-minute ticks for two hours), in a world
25% below the model (``scale:0.75``) and in the exact one (:mod:`atoll.control.live_check`):
each family's error one hour after it first served, and each phase's planning demand over its
measured rate x the forecast's headroom.

``--scenarios``, ``--rules``, ``--days``, ``--seeds`` shrink the run; ``--jobs`` worker processes.
``--merge A.json B.json`` prints the union of earlier documents.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.policies import make_policy  # noqa: E402
from atoll.envs.vocabulary import parse_policy  # noqa: E402

WORLDS: dict[str, dict[str, Any]] = {
    "exact": {"capacity_error": 0, "correction": False},
    "calibration": {"capacity_error": "calibration", "correction": False},
    "calibration+correction": {"capacity_error": "calibration", "correction": True},
    "stress": {"capacity_error": "stress:0.25", "correction": False},
    "stress+correction": {"capacity_error": "stress:0.25", "correction": True},
    # references: the planner told the true factors (what a perfect correction would reach)
    "calibration+truth": {"capacity_error": "calibration", "correction": True},
    "stress+truth": {"capacity_error": "stress:0.25", "correction": True},
}
HOUR_STEPS = 12


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(job: tuple[str, str, str, int, tuple[int, ...]]) -> dict[str, Any]:
    scenario, rule, world, seed, days = job
    t0 = time.perf_counter()
    env = FleetEnv(FleetConfig(scenario=scenario, availability="spot", days=(min(days), max(days)),
                               slo_model="latency", **WORLDS[world]))
    policy = make_policy(parse_policy(rule), len(env.models))
    if world.endswith("+truth"):  # the planner (and the observation) see the world's own factors
        env._factors = lambda: dict(env.truth)  # type: ignore[method-assign]
    cost = requests = met = served = 0.0
    errors: list[float] = []
    for i, day in enumerate(days):
        obs, info = env.reset(seed=seed + i, options={"day": day, **policy.reset_options()})
        exposure: dict[str, int] = {}
        done = False
        while not done:
            obs, _, term, trunc, info = env.step(np.asarray(policy.act(obs, info)))
            done = term or trunc
            total = info["total"]
            cost += total["cost_usd"]
            requests += total["requests"]
            met += total["slo_attainment"] * total["requests"]
            served += total["served_requests"]
            for fam in info.get("exposed_families", ()):
                exposure[fam] = exposure.get(fam, 0) + 1
                if exposure[fam] == HOUR_STEPS:
                    errors.append(abs(env.correction.factor(fam) / env.truth.get(fam, 1.0) - 1.0))
    out = {"scenario": scenario, "rule": rule, "world": world, "seed": seed, "cost_usd": cost,
           "slo_attainment": met / requests if requests else 1.0,
           "served_share": served / requests if requests else 1.0, "seconds": time.perf_counter() - t0}
    if errors:
        out["factor_errors_after_1h"] = errors
    log(f"  {scenario} {rule} {world} seed {seed}: ${cost:.0f}, SLO {out['slo_attainment']:.4f} "
        f"({out['seconds']:.0f} s)")
    return out


def live() -> dict[str, Any]:
    import tempfile

    from atoll.control.live_check import run_live_loop, summary
    from atoll.control.live_fleet import LiveFleet
    from atoll.forecast.workloads import load_workload

    models = ["Phi-4-14B", "GPT-OSS-20B", "Qwen3-32B"]
    series = [load_workload(f"servegen:{w}", step_s=300.0) for w in ("m-large", "m-mid", "m-small")]
    fleet = LiveFleet("core", models=models)
    out: dict[str, Any] = {}
    for spec in ("scale:0.75", "0"):
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as d:
            result = run_live_loop(fleet, series, models, Path(d), capacity_error=spec, ticks=24)
        out[spec] = {**summary(result, HOUR_STEPS), "seconds": time.perf_counter() - t0,
                     "max_error_by_tick": [row["max_error"] for row in result.ticks]}
        log(f"  live {spec}: {out[spec]['max_error_after_1h']}")
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    cells: dict[str, Any] = {}
    for key in sorted({(r["scenario"], r["rule"], r["world"]) for r in rows}):
        group = [r for r in rows if (r["scenario"], r["rule"], r["world"]) == key]
        cell: dict[str, Any] = {"seeds": sorted(r["seed"] for r in group)}
        for k in ("cost_usd", "slo_attainment", "served_share"):
            v = np.array([r[k] for r in group])
            cell[k] = {"mean": float(v.mean()), "std": float(v.std())}
        errs = [e for r in group for e in r.get("factor_errors_after_1h", [])]
        if errs:
            e = np.array(errs)
            cell["factors_after_1h"] = {"families": len(e), "within_5pct": float((e <= 0.05).mean()),
                                        "median_error": float(np.median(e)), "max_error": float(e.max())}
        cells["/".join(key)] = cell
    # the targets: with correction, SLO within 1 point and cost within 3% of the exact world; and
    # against the plan made knowing the world's true factors (+truth)
    for key, cell in list(cells.items()):
        scenario, rule, world = key.split("/")
        refs = {"vs_exact": cells.get(f"{scenario}/{rule}/exact"),
                "vs_truth": cells.get(f"{scenario}/{rule}/{world.split('+')[0]}+truth")}
        for name, ref in refs.items():
            if ref is not None and ref is not cell and world != "exact":
                cell[name] = {
                    "slo_points": 100 * (cell["slo_attainment"]["mean"] - ref["slo_attainment"]["mean"]),
                    "cost_ratio": cell["cost_usd"]["mean"] / ref["cost_usd"]["mean"]}
    return cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="core")
    ap.add_argument("--rules", default="fixed:1@0.9,threshold")
    ap.add_argument("--worlds", default=",".join(WORLDS))
    ap.add_argument("--days", default="11,12,13,14")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--merge", nargs="*")
    ap.add_argument("--live", action="store_true", help="run the live part only")
    args = ap.parse_args()
    if args.live:
        print(json.dumps({"live": live()}, indent=1))
        return
    if args.merge:
        rows = [r for p in args.merge for r in json.loads(Path(p).read_text())["runs"]]
        print(json.dumps({"runs": rows, "cells": summarize(rows)}, indent=1))
        return
    days = tuple(int(d) for d in args.days.split(","))
    jobs = [(sc, rule, world, int(seed), days) for sc in args.scenarios.split(",")
            for rule in args.rules.split(",") for seed in args.seeds.split(",")
            for world in args.worlds.split(",")]
    log(f"closed_loop: {len(jobs)} runs of {len(days)} days on {args.jobs} processes")
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(run, jobs))
    print(json.dumps({"settings": {"scenarios": args.scenarios, "rules": args.rules, "days": list(days),
                                   "seeds": args.seeds, "market": "spot", "slo_model": "latency"},
                      "wall_seconds": time.perf_counter() - t0, "runs": rows, "cells": summarize(rows)},
                     indent=1))


if __name__ == "__main__":
    main()
