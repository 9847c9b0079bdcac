"""Figures of the fleet world (``FleetEnv``), as one JSON document on stdout (progress on stderr).

Parts (``--parts``, comma-separated; default all):

- ``speed``: env steps/s on core (spot): hold steps (``never``) and re-optimizing every model every
  step (``fixed:1``) with a fresh memo; targets >= 1,000 and >= 50 steps/s; and the wall time of a
  1-day ``fixed:1`` episode of the extended scenario (fresh memo, spot), target <= 60 s;
- ``demand``: sampled vs held demand on core, days 11-14: share of steps equal to the previous
  one, 1- and 3-step MAPE of the env's ETS forecast against persistence, coefficient of
  variation of per-minute counts (sampled at 60 s steps; the held series' minutes repeat their
  window's rate);
- ``core`` / ``extended``: the rule table (fixed:1/3/6/12, threshold, never, hindsight) per
  availability, days 11-14, mean and spread over the demand/env seeds;
- ``variants``: the same table on core/spot with ``resample="hold"`` and with
  ``transition="break-before-make"``, each change on its own;
- ``charges``: core/spot, ``fixed:1`` and ``hindsight``, in the plain world with each of the
  charged world's settings on its own (``startup="sampled"``, ``preemption="zone"``,
  ``spot_acquisition="trace"``, ``scale_down="lose"``): what each one costs.

``--world`` picks the world every table runs in: ``plain`` (the default: ``atoll/Fleet-v1``'s),
``charged`` (the plain world where a re-plan costs what a cluster charges: sampled start-ups,
zone-correlated preemptions, spot acquisition that fails — each change of ``atoll/Fleet-v3``'s
world except the closed loop), ``closed`` (``atoll/Fleet-v2``'s closed loop without the charges)
or ``v3`` (``atoll/Fleet-v3``'s whole world: the closed loop and the charges).

``--seeds``, ``--days``, ``--availability`` and ``--policies`` shrink the run; the document records what ran.
``--merge A.json B.json ...`` prints the union of earlier documents (parts run in parallel).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.envs import CHARGED, CLOSED_LOOP  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.demand import workload_series  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.fleet_model import clear_replanners  # noqa: E402
from atoll.envs.policies import make_policy  # noqa: E402
from atoll.envs.rollout import run_policy  # noqa: E402
from atoll.envs.vocabulary import parse_policy  # noqa: E402
from atoll.solvers.scenarios import SCENARIOS  # noqa: E402

POLICIES = ("fixed:1", "fixed:3", "fixed:6", "fixed:12", "threshold", "never", "hindsight")
KEYS = ("cost_usd", "slo_attainment", "goodput_share", "usd_per_mtok", "reoptimizations", "preemptions",
        "ondemand_node_hour_share")
# the settings of each world (observation settings left out: rules read the v1 features only)
WORLDS: dict[str, dict[str, Any]] = {
    "plain": {},
    "charged": {k: v for k, v in CHARGED.items() if k not in CLOSED_LOOP},
    "closed": {k: v for k, v in CLOSED_LOOP.items() if k != "observation"},
    "v3": {k: v for k, v in CHARGED.items() if k != "observation"},
}
# the figures only the charged worlds produce, summed over an episode's steps
CHARGED_KEYS = ("failed_acquisitions", "lost_in_flight", "free_nodes")
FIRST = {"startup": "fixed", "preemption": "independent", "spot_acquisition": "seen", "scale_down": "drain"}
SINGLE = {"startup": "sampled", "preemption": "zone", "spot_acquisition": "trace", "scale_down": "lose"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def episode_seconds(env: FleetEnv, policy: str, day: int) -> tuple[float, int]:
    t = time.perf_counter()
    ep = run_policy(env, make_policy(parse_policy(policy), len(env.models)), days=[day], seed=0)
    return time.perf_counter() - t, len(ep.steps)


def speed() -> dict[str, Any]:
    out: dict[str, Any] = {}
    core = FleetEnv(FleetConfig(scenario="core", days=(11, 14)))
    dt, n = episode_seconds(core, "never", 11)
    out["core_hold_steps_per_s"] = n / dt
    clear_replanners()
    core = FleetEnv(FleetConfig(scenario="core", days=(11, 14)))
    dt, n = episode_seconds(core, "fixed:1", 11)
    out["core_reoptimize_steps_per_s_fresh_memo"] = n / dt
    log(f"speed core: {out}")
    clear_replanners()
    t = time.perf_counter()
    ext = FleetEnv(FleetConfig(scenario="extended", days=(11, 14)))
    out["extended_init_seconds"] = time.perf_counter() - t
    out["extended_fixed1_day_seconds"], _ = episode_seconds(ext, "fixed:1", 11)
    log(f"speed extended: {out}")
    out["targets"] = {"core_hold_steps_per_s": ">= 1000", "core_reoptimize_steps_per_s_fresh_memo": ">= 50",
                      "extended_fixed1_day_seconds": "<= 60"}
    return out


def demand(days: list[int]) -> dict[str, Any]:
    spec = SCENARIOS["core"]
    out: dict[str, Any] = {}
    for resample in ("sampled", "hold"):
        env = FleetEnv(FleetConfig(scenario="core", days=(11, 14), resample=resample))
        book = env.book
        rates = book.rates
        gs = np.concatenate([np.arange((d - 1) * book.steps_per_day, d * book.steps_per_day) for d in days])
        gs = gs[gs + 3 <= rates.shape[1]]  # forecasts whose 3rd step is still in the trace
        row: dict[str, Any] = {"equal_to_previous_share": float(np.mean(rates[:, gs] == rates[:, gs - 1]))}
        for h in (1, 3):
            truth = rates[:, gs + h - 1]
            ok = truth > 0
            ets = np.abs(book.mean[:, gs, h - 1] - truth)[ok] / truth[ok]
            persist = np.abs(rates[:, gs - 1] - truth)[ok] / truth[ok]
            row[f"mape_{h}_step"] = {"ets": float(np.mean(ets)), "persistence": float(np.mean(persist))}
        minute = workload_series("servegen", env.models, spec.req_per_s, 60.0, resample=resample, seed=0)
        lo, hi = (days[0] - 1) * 1440, days[-1] * 1440
        counts = np.array([s.requests_per_s[lo:hi] * 60.0 for s in minute])
        row["per_minute_count_cv"] = float(np.mean(counts.std(axis=1) / counts.mean(axis=1)))
        out[resample] = row
        log(f"demand {resample}: {row}")
    out["note"] = ("ServeGen lists per-window rates and fitted inter-arrival distributions, not requests: "
                   "the raw trace has no per-minute counts to compare the sampled burstiness with")
    return out


def table(scenario: str, availability: str, days: list[int], seeds: list[int],
          policies: tuple[str, ...] = POLICIES, **changes: Any) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    envs = {s: FleetEnv(FleetConfig(scenario=scenario, availability=availability, days=(min(days), max(days)),
                                    demand_seed=s, **changes)) for s in seeds}
    for policy in policies:
        per_seed = []
        t = time.perf_counter()
        for s, env in envs.items():
            episode = run_policy(env, make_policy(parse_policy(policy), len(env.models)), days=days, seed=s)
            totals = episode.totals()
            row = {k: float(totals[k]) for k in KEYS}
            if any(changes.get(k) not in (None, v) for k, v in FIRST.items()):
                for k in CHARGED_KEYS:
                    row[k] = float(sum(step.get(k, 0) for step in episode.steps))
            per_seed.append(row)
        rows[policy] = {k: {"mean": float(np.mean([r[k] for r in per_seed])),
                            "min": float(np.min([r[k] for r in per_seed])),
                            "max": float(np.max([r[k] for r in per_seed]))} for k in per_seed[0]}
        rows[policy]["wall_seconds"] = time.perf_counter() - t
        log(f"{scenario}/{availability} {changes or ''} {policy}: "
            + ", ".join(f"{k}={rows[policy][k]['mean']:.4g}" for k in KEYS))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default="speed,demand,core,variants,extended")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--days", default="11-14")
    parser.add_argument("--availability", default="spot,ample")
    parser.add_argument("--merge", nargs="+", type=Path)
    parser.add_argument("--world", choices=tuple(WORLDS), default="plain")
    parser.add_argument("--policies", default=",".join(POLICIES), help="the rule table's policies")
    args = parser.parse_args()
    if args.merge:
        merged: dict[str, Any] = {}
        for path in args.merge:
            for key, value in json.loads(path.read_text()).items():
                if isinstance(value, dict) and isinstance(merged.get(key), dict):
                    merged[key] = {**merged[key], **value}
                else:
                    merged[key] = value
        print(json.dumps(merged, indent=2))
        return
    first, last = (int(x) for x in args.days.split("-"))
    days = list(range(first, last + 1))
    seeds = list(range(args.seeds))
    avail = [a for a in args.availability.split(",") if a]
    parts = set(args.parts.split(","))
    world = WORLDS[args.world]
    policies = tuple(p for p in args.policies.split(",") if p)
    out: dict[str, Any] = {"run": {"days": days, "seeds": seeds, "availability": avail,
                                   "parts": sorted(parts), "policies": list(policies),
                                   "seed_meaning": "demand_seed and the env's reset seed",
                                   "world": args.world, "world_settings": world,
                                   "load_before": list(os.getloadavg())}}
    if "speed" in parts:
        out["speed"] = speed()
    if "demand" in parts:
        out["demand"] = demand(days)
    tables: dict[str, Any] = {}
    for scenario in ("core", "extended"):
        if scenario in parts:
            for a in avail:
                tables[f"{scenario}/{a}"] = table(scenario, a, days, seeds, policies, **world)
    if "variants" in parts:
        tables["core/spot/resample=hold"] = table("core", "spot", days, seeds, resample="hold")
        tables["core/spot/transition=break-before-make"] = table("core", "spot", days, seeds,
                                                                 transition="break-before-make")
    if "charges" in parts:
        tables["core/spot/plain"] = table("core", "spot", days, seeds, ("fixed:1", "hindsight"))
        for key, value in SINGLE.items():
            tables[f"core/spot/{key}={value}"] = table("core", "spot", days, seeds, ("fixed:1", "hindsight"),
                                                       **{key: value})
    if tables:
        out["tables"] = tables
    out["run"]["load_after"] = list(os.getloadavg())
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
