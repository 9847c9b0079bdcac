"""Where the SLO is lost: the requests a rule misses, split by cause, as one JSON document on
stdout (progress on stderr).

For each cell (scenario x availability x world) and each rule (default ``fixed:1`` at 0.8, 0.9
and 0.95: re-plan every model every step, the high end of the contest's frontier), the rule runs
on the validation days with the contest grid's seeds, and every missed request is put in one
bucket by :func:`atoll.envs.slo_loss.miss_breakdown`: ``after_preemption`` (the step after the
model lost instances), ``capacity`` (demand beyond ready capacity) or ``latency`` (served, but over
the TTFT / inter-token budget). Per model and for the fleet: the shares, the share of steps after a
preemption and the SLO attainment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.envs import CLOSED_LOOP  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.slo_loss import BUCKETS, miss_breakdown  # noqa: E402
from atoll.envs.vocabulary import parse_policy  # noqa: E402
from atoll.training.evaluate import env_at_level, resolve_policy, seed_value  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default="extended")
    parser.add_argument("--availabilities", default="spot,hedged")
    parser.add_argument("--worlds", default="calibration", help="exact and/or calibration, comma-separated")
    parser.add_argument("--rules", default="fixed:1@0.8,fixed:1@0.9,fixed:1@0.95")
    parser.add_argument("--days", default="8-10", help="validation days")
    parser.add_argument("--window", type=int, default=1,
                        help="steps after a preemption whose misses count as its own (default 1)")
    parser.add_argument("--out", default=None, help="also write the document here")
    args = parser.parse_args()
    a, _, b = args.days.partition("-")
    days = list(range(int(a), int(b or a) + 1))
    out: dict[str, Any] = {"settings": vars(args), "loadavg_start": [round(v, 2) for v in os.getloadavg()]}
    for availability in args.availabilities.split(","):
        for world in args.worlds.split(","):
            closed = CLOSED_LOOP if world == "calibration" else {}
            config = FleetConfig(scenario=args.scenario, availability=availability, days=(days[0], days[-1]),
                                 **closed)
            base = FleetEnv(config)
            cell: dict[str, Any] = {}
            for spec in args.rules.split(","):
                policy = resolve_policy(parse_policy(spec), len(base.models))
                t = time.perf_counter()
                env = env_at_level(base, policy, {})
                cell[spec] = miss_breakdown(env, policy, days=days, seed=seed_value(0), window=args.window)
                cell[spec]["seconds"] = time.perf_counter() - t
                f = cell[spec]["fleet"]
                split = ", ".join(f"{bk} {f[f'{bk}_share']:.0%}" for bk in BUCKETS)
                print(f"{args.scenario}/{availability}/{world} {spec}: SLO {f['slo_attainment']:.4f}; "
                      f"missed {split}", file=sys.stderr, flush=True)
            out[f"{args.scenario}/{availability}/{world}"] = cell
    out["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
    text = json.dumps(out, indent=2)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
