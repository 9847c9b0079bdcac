"""Co-located or disaggregated: where each kind of replica wins, as one JSON document on stdout.

A co-located replica serves a model's prefill and decode on one engine (chunked prefill); a
disaggregated plan buys a replica per phase. ``pd="auto"`` lets the exact ILP choose per model
(and mix). This script solves the same problems three ways (``disaggregated``, ``auto``,
``aggregated``) and reports each plan's $/h and, for the auto plan, which kind serves each model:

- ``one_model``: Qwen3-32B with Azure conversation request sizes in one region (the case a user
  found: a published allocation solver with one replica type was 0.75x atoll's plan at 1 req/s),
  at request rates from 0.25 to 256 req/s, on AWS us-east-2 and GCP us-central1;
- ``scenarios``: the bundled core, extended and fleet20 scenarios at their even mix, with every
  model's rate scaled by 0.1, 1 and 10 (ample availability, on-demand prices);
- ``thousand``: the 1,000-model fleet of ``benchmarks/scale.py`` (36 node configs, up to
  ``--n-max`` nodes per template), disaggregated against auto: the cold plan's cost and the warm
  re-solve of every model (the scale target: <= 10 s);
- ``simulated``: one simulated day (day 11, ``fixed:1``, spot) of core and extended under each
  of disaggregated and auto: cost, SLO attainment, and how many co-located instances ran;
- ``charged``: extended in the charged world (the room's: sampled start-up, zone-correlated
  preemptions, spot acquisition that fails, capacities corrected online, latency SLO), day 11,
  ``fixed:1@0.9``, spot, on ``--seeds`` paired seeds (each seed: the same demand, availability
  and preemption draws for both modes): cost, SLO attainment, effective cost (node $ + $2 per
  million tokens lost) and solver seconds, with the paired ratio auto / disaggregated.

``--parts`` picks the parts (default: one_model, scenarios); with ``--out`` an existing document
keeps the parts not run.

Every solve is exact to the gap (1e-4); the auto plan can never cost more than the disaggregated
one (it has all of its columns), so a ratio above 1 would be a solver bug and is flagged.

    .venv/bin/python benchmarks/colocation.py [--parts one_model,scenarios,thousand,simulated]
        [--n-max 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from emit import emit

from atoll.solvers.allocation import solve_allocation
from atoll.solvers.catalog import DEFAULT_GPU_TYPES
from atoll.solvers.problem import AllocationProblem, AllocationResult
from atoll.solvers.scenarios import SCENARIOS, ScenarioSpec, build_problem, request_shapes

MODES = ("disaggregated", "auto", "aggregated")
RATES = (0.25, 1.0, 4.0, 16.0, 64.0, 256.0)
LOADS = (0.1, 1.0, 10.0)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def kinds(problem: AllocationProblem, res: AllocationResult) -> dict[str, float]:
    """Per model, the share of its prompt capacity on co-located replicas (0: disaggregated)."""
    cap: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for key, n in (res.allocation.counts if res.allocation else ()):
        t = problem.template(key)
        if t.service.phase.value in ("prefill", "colocated"):
            cap[t.service.model][t.colocated] += n * t.throughput
    return {m: round(c[1] / (c[0] + c[1]), 4) if c[0] + c[1] > 0 else 0.0 for m, c in cap.items()}


def solve_three(spec: ScenarioSpec) -> dict[str, Any]:
    """The spec's even-mix plan under each serving mode: $/h, status, seconds, and the auto plan's
    co-located share per model."""
    out: dict[str, Any] = {}
    for pd in MODES:
        t0 = time.perf_counter()
        problem = build_problem(spec, pd=pd)
        res = solve_allocation(problem)
        out[pd] = {"cost_per_hour": round(res.cost_per_hour, 4), "status": res.status.value,
                   "seconds": round(time.perf_counter() - t0, 2)}
        if pd == "auto":
            out["auto_colocated_share"] = kinds(problem, res)
    d, a, g = (out[m]["cost_per_hour"] for m in MODES)
    out["auto_over_disaggregated"] = round(a / d, 4)
    out["aggregated_over_disaggregated"] = round(g / d, 4)
    out["auto_dearer_than_disaggregated"] = a > d * (1 + 1e-4) + 1e-9  # must be False: a solver bug
    return out


def one_model() -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for region in ("aws:us-east-2", "gcp:us-central1"):
        rows = {}
        for rate in RATES:
            spec = ScenarioSpec("one", ("Qwen3-32B",), DEFAULT_GPU_TYPES, (region,), rate, 0.25,
                                traces=("conv",))
            rows[f"{rate:g}"] = solve_three(spec)
            _log(f"one model, {region}, {rate:g} req/s: auto/disaggregated "
                 f"{rows[f'{rate:g}']['auto_over_disaggregated']}")
        doc[region] = rows
    one = ScenarioSpec("one", ("Qwen3-32B",), DEFAULT_GPU_TYPES, ("aws:us-east-2",), 1.0, 0.25,
                       traces=("conv",))
    shape = request_shapes(one)["Qwen3-32B"]
    doc["request_shape"] = {"input_tokens": round(shape.input_tokens, 1),
                            "output_tokens": round(shape.output_tokens, 1)}
    return doc


def scenarios() -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for name in ("core", "extended", "fleet20"):
        base = SCENARIOS[name]
        doc[name] = {}
        for load in LOADS:
            spec = replace(base, req_per_s=base.req_per_s * load)
            doc[name][f"x{load:g}"] = row = solve_three(spec)
            row["req_per_s_per_model"] = spec.req_per_s
            _log(f"{name} x{load:g}: auto/disaggregated {row['auto_over_disaggregated']}")
    return doc


def thousand(n_max: int) -> dict[str, Any]:
    """The 1,000-model fleet both ways: set-up, the cold plan's $/h and the warm re-solves."""
    sys.path.insert(0, str(Path(__file__).parent))
    from scale import library36, peak_rss_gb, run

    out: dict[str, Any] = {}
    for pd in ("disaggregated", "auto"):
        t0 = time.perf_counter()
        lib = library36(n_max, pd=pd)
        templates = tuple(lib.templates)
        setup = time.perf_counter() - t0
        rows = run(templates, 1000, 0, step=3000, cap=0.0, fraction=0.1, change=0.05)
        out[pd] = {"templates": len(templates), "library_from_cache": lib.from_cache,
                   "setup_seconds": round(setup, 1), "rows": rows, "peak_rss_gb": round(peak_rss_gb(), 3)}
        _log(f"1,000 models, {pd}: {len(templates)} templates")
    return out


def simulated() -> dict[str, Any]:
    """Day 11 of core and extended under ``fixed:1`` (spot), disaggregated and auto."""
    from atoll.envs.config import FleetConfig
    from atoll.envs.fleet_env import FleetEnv
    from atoll.envs.policies import make_policy
    from atoll.envs.rollout import run_policy
    from atoll.envs.vocabulary import parse_policy

    out: dict[str, Any] = {}
    for name in ("core", "extended"):
        out[name] = {}
        for pd in ("disaggregated", "auto"):
            t0 = time.perf_counter()
            env = FleetEnv(FleetConfig(scenario=name, days=(11, 11), pd=pd))
            peak: dict[str, float] = defaultdict(float)

            def seen(_info: dict[str, Any], env: FleetEnv = env, peak: dict[str, float] = peak) -> None:
                for key, n in env.state.running.items():
                    if "/colocated@" in key:
                        peak[key.split("@")[0]] = max(peak[key.split("@")[0]], float(n))

            rule = make_policy(parse_policy("fixed:1"), len(env.models))
            episode = run_policy(env, rule, days=[11], seed=0, on_step=seen)
            s = episode.sums
            out[name][pd] = {"cost_usd": round(s["cost_usd"], 2),
                             "slo_attainment": round(s["met_requests"] / s["requests"], 4),
                             "preemptions": s["preemptions"], "colocated_peak_instances": dict(peak),
                             "seconds": round(time.perf_counter() - t0, 1)}
            _log(f"{name} day 11, {pd}: ${s['cost_usd']:.2f}")
        out[name]["auto_over_disaggregated"] = round(out[name]["auto"]["cost_usd"] /
                                                     out[name]["disaggregated"]["cost_usd"], 4)
    return out


def charged(seeds: int) -> dict[str, Any]:
    """Extended in the charged world, day 11, both modes on ``seeds`` paired seeds."""
    from atoll.envs import WORLDS
    from atoll.envs.config import FleetConfig
    from atoll.envs.fleet_env import FleetEnv
    from atoll.envs.vocabulary import parse_policy
    from atoll.training.evaluate import resolve_policy
    from atoll.training.lever_oracle import measured, paired_ratio

    out: dict[str, Any] = {"scenario": "extended", "world": "charged", "availability": "spot", "day": 11,
                           "policy": "fixed:1@0.9", "lost_usd_per_mtok": 2.0}
    rows: dict[str, list[dict[str, Any]]] = {}
    for pd in ("disaggregated", "auto"):
        env = FleetEnv(FleetConfig(scenario="extended", availability="spot", days=(11, 11), pd=pd,
                                   **WORLDS["charged"]))
        rule = resolve_policy(parse_policy("fixed:1@0.9"), len(env.models))
        rows[pd] = []
        for seed in range(seeds):
            t0 = time.perf_counter()
            _, totals = measured(env, rule, days=[11], seed=seed, lost_usd_per_mtok=2.0)
            rows[pd].append({**totals, "seconds": round(time.perf_counter() - t0, 1)})
            _log(f"charged extended day 11, {pd}, seed {seed}: ${totals['cost_usd']:.2f}, "
                 f"effective ${totals['effective_usd']:.2f}, SLO {totals['slo_attainment']:.4f}")
    out["runs"] = rows
    for key in ("effective_usd", "cost_usd"):
        out[f"auto_over_disaggregated_{key}"] = paired_ratio([r[key] for r in rows["auto"]],
                                                             [r[key] for r in rows["disaggregated"]])
    out["slo_attainment_difference"] = [a["slo_attainment"] - d["slo_attainment"]
                                        for a, d in zip(rows["auto"], rows["disaggregated"], strict=True)]
    out["seconds_ratio"] = [a["seconds"] / d["seconds"] for a, d in zip(rows["auto"], rows["disaggregated"],
                                                                         strict=True)]
    return out


PARTS = {"one_model": one_model, "scenarios": scenarios, "simulated": simulated}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="one_model,scenarios",
                    help="comma-separated: one_model, scenarios, thousand (minutes, GBs), simulated, "
                         "charged (minutes per seed)")
    ap.add_argument("--n-max", type=int, default=3, help="nodes per template of the 1,000-model library")
    ap.add_argument("--seeds", type=int, default=4, help="paired seeds of the charged part")
    ap.add_argument("--json", action="store_true", help="accepted: the document is printed either way")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON document here")
    args = ap.parse_args()
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in (*PARTS, "thousand", "charged")]
    if unknown:
        ap.error(f"unknown part {unknown[0]!r}; valid: {', '.join((*PARTS, 'thousand', 'charged'))}")
    doc: dict[str, Any] = {"benchmark": "colocation"}
    if args.out is not None and args.out.exists():  # keep the parts not run now
        doc = json.loads(args.out.read_text())
    for part in parts:
        if part == "thousand":
            doc[part] = thousand(args.n_max)
        elif part == "charged":
            doc[part] = charged(args.seeds)
        else:
            doc[part] = PARTS[part]()
    # one entry per run: parts measured at different times keep their own machine load
    doc.pop("machine", None)
    doc.setdefault("runs", []).append({
        "parts": parts, "cpu_count": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in load_start],
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "wall_seconds": round(time.perf_counter() - t0, 1)})
    emit(doc, args.out)


if __name__ == "__main__":
    main()
