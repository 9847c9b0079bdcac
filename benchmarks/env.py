"""Figures of the FleetEnv issue, as one JSON document on stdout (progress on stderr).

- env steps/s on the core scenario (spot availability): hold steps (the ``never`` policy) and a
  re-optimization of every model every step (``fixed:1``), with the memo cold (first pass over
  the day) and warm (the same day again); targets >= 1,000 and >= 50 steps/s;
- wall time of a 1-day ``fixed:1`` episode of the extended scenario, memo cold; target <= 60 s;
- every rule policy on core and extended, spot availability, ServeGen days 11-14 (seed 0):
  the baselines the learned policy must beat.

``--quick`` runs day 11 only and skips the extended table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.fleet_model import clear_replanners  # noqa: E402
from atoll.envs.policies import make_policy  # noqa: E402
from atoll.envs.rollout import TOTAL_KEYS, run_policy  # noqa: E402

POLICIES = ("fixed:1", "fixed:3", "fixed:6", "fixed:12", "threshold", "never", "hindsight")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def steps_per_second(env: FleetEnv, policy: str, day: int) -> tuple[float, float]:
    t = time.perf_counter()
    ep = run_policy(env, make_policy(policy, len(env.models)), days=[day], seed=0)
    dt = time.perf_counter() - t
    return len(ep.steps) / dt, dt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    out: dict[str, object] = {}
    t = time.perf_counter()
    core = FleetEnv(FleetConfig(scenario="core", days=(11, 14)))
    out["core_init_seconds"] = time.perf_counter() - t
    hold, _ = steps_per_second(core, "never", 11)
    clear_replanners()
    core = FleetEnv(FleetConfig(scenario="core", days=(11, 14)))
    cold, _ = steps_per_second(core, "fixed:1", 11)
    warm, _ = steps_per_second(core, "fixed:1", 11)
    out["core_steps_per_s"] = {"hold": hold, "reoptimize_every_step_cold_memo": cold,
                               "reoptimize_every_step_warm_memo": warm}
    log(f"core steps/s: {out['core_steps_per_s']}")
    clear_replanners()
    t = time.perf_counter()
    ext = FleetEnv(FleetConfig(scenario="extended", days=(11, 14)))
    out["extended_init_seconds"] = time.perf_counter() - t
    _, seconds = steps_per_second(ext, "fixed:1", 11)
    out["extended_fixed1_day_seconds"] = seconds
    log(f"extended fixed:1 day: {seconds:.1f} s")
    days = [11] if args.quick else [11, 12, 13, 14]
    tables: dict[str, dict[str, dict[str, float]]] = {}
    for name, env in (("core", core), ("extended", ext)):
        if args.quick and name == "extended":
            continue
        tables[name] = {}
        for policy in POLICIES:
            t = time.perf_counter()
            totals = run_policy(env, make_policy(policy, len(env.models)), days=days, seed=0).totals()
            tables[name][policy] = {k: totals[k] for k in (*TOTAL_KEYS, "solves", "preemptions")}
            tables[name][policy]["wall_seconds"] = time.perf_counter() - t
            log(f"{name} {policy}: {json.dumps(tables[name][policy])}")
    out["days"] = days
    out["availability"] = "spot"
    out["policies"] = tables
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
