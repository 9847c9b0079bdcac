"""The price of churn in the ILP: the rule ``fixed:1`` on ``core`` (spot, seed 0) under removal
weights R (each running instance a re-plan removes costs R x its $/h), on validation days 8-10
and test days 11-14: cost, SLO attainment, instances added and removed, and churn (added +
removed per hour over the mean fleet). Prints ONE JSON document (progress on stderr).

    .venv/bin/python benchmarks/churn.py [--weights 0,0.25,0.5,1] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from emit import emit  # this folder's own module, imported while the folder is on sys.path

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.policies import make_policy  # noqa: E402
from atoll.envs.rollout import run_policy  # noqa: E402
from atoll.envs.vocabulary import parse_policy  # noqa: E402

KEYS = ("cost_usd", "slo_attainment", "churn_per_hour", "instances_added", "instances_removed")
PHASES = (("validation", [8, 9, 10]), ("test", [11, 12, 13, 14]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="core")
    ap.add_argument("--weights", default="0,0.25,0.5,1")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    doc: dict[str, Any] = {"scenario": args.scenario, "rule": "fixed:1", "availability": "spot", "seed": 0,
                           "load_before": [round(x, 2) for x in os.getloadavg()], "runs": {}}
    for phase, days in PHASES:
        for w in (float(x) for x in args.weights.split(",")):
            env = FleetEnv(FleetConfig(scenario=args.scenario, days=(min(days), max(days)),
                                       availability="spot", removal_weight=w))
            t0 = time.process_time()
            rule = make_policy(parse_policy("fixed:1"), len(env.models))
            totals = run_policy(env, rule, days=days, seed=0).totals()
            row = {k: round(float(totals[k]), 4) for k in KEYS}
            row.update(cpu_s=round(time.process_time() - t0, 1), load=round(os.getloadavg()[0], 2))
            doc["runs"][f"{phase} R={w:g}"] = row
            print(f"{phase} R={w:g}: {row}", file=sys.stderr, flush=True)
    emit(doc, args.out)


if __name__ == "__main__":
    main()
