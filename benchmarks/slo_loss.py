"""Where the SLO is lost: the requests a rule misses, split by cause, as one JSON document on
stdout (progress on stderr).

For each cell (scenario x availability x world) and each rule (default ``fixed:1`` at every
``--levels`` level: re-plan every model every step, the high end of the contest's frontier), the
rule runs on the validation days (seeds as the contest's grid: seed 0 first, one per day after)
and every missed request of every step is put in one bucket:

- ``after_preemption``: the model lost instances at one of the last ``--window`` step boundaries
  (its replacements are still starting: a node boots in 180 s and loads its weights at 1 GB/s,
  so a 5-minute step after a preemption runs short whatever is decided then);
- ``capacity``: otherwise, demand beyond the ready capacity (the fluid shortfall: the plan or the
  correction was short);
- ``latency``: otherwise, served within capacity but over the TTFT / inter-token budget in the
  latency model (queueing at high utilization; only with ``slo_model="latency"``).

Per model and for the fleet: the shares of missed requests in each bucket, the share of steps
that follow a preemption, and the SLO attainment. A trigger decides when and at which level to
re-plan; it does not see a preemption before it happens, so the first bucket is what no trigger
decision at the step itself recovers (only capacity bought ahead, which the level already prices).
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

import numpy as np  # noqa: E402

from atoll.envs import CLOSED_LOOP  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.policies import Policy  # noqa: E402
from atoll.training.evaluate import env_at_level, resolve_policy, seed_value  # noqa: E402

BUCKETS = ("after_preemption", "capacity", "latency")


def attribute(env: FleetEnv, policy: Policy, days: list[int], seed: int, window: int) -> dict[str, Any]:
    """Missed requests of ``policy`` on ``days`` per model and bucket (see the module docstring)."""
    m = len(env.models)
    missed = np.zeros((m, len(BUCKETS)))
    requests = np.zeros(m)
    steps_after = np.zeros(m)
    steps = 0
    for i, day in enumerate(days):
        obs, info = env.reset(seed=seed + i, options={"day": day, **policy.reset_options()})
        since = np.full(m, window + 1)  # steps since the model's last preemption
        done = False
        while not done:
            obs, _, term, trunc, info = env.step(np.asarray(policy.act(obs, info), dtype=np.int8))
            done = term or trunc
            steps += 1
            after = since <= window
            steps_after += after
            for j, name in enumerate(env.models):
                row = info["models"][name]
                n = row["requests"]
                served = row.get("served_share", row["slo_attainment"])
                miss_capacity = (1.0 - served) * n
                miss_latency = max(0.0, served - row["slo_attainment"]) * n
                requests[j] += n
                if after[j]:
                    missed[j, 0] += miss_capacity + miss_latency
                else:
                    missed[j, 1] += miss_capacity
                    missed[j, 2] += miss_latency
            # a preemption at this boundary shortens the steps that follow it
            lost = np.array([info["models"][name]["preemptions"] for name in env.models])
            since = np.where(lost > 0, 1, since + 1)

    def shares(row: np.ndarray, n: float, after: float) -> dict[str, float]:
        total = float(row.sum())
        return {"slo_attainment": 1.0 - total / n if n > 0 else 1.0,
                "missed_requests": total,
                **{f"{b}_share": float(row[k] / total) if total > 0 else 0.0 for k, b in enumerate(BUCKETS)},
                "steps_after_preemption_share": after / steps if steps else 0.0}

    per_model = {name: shares(missed[j], requests[j], steps_after[j]) for j, name in enumerate(env.models)}
    return {"fleet": shares(missed.sum(axis=0), requests.sum(), float(steps_after.mean())),
            "models": per_model}


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
                policy = resolve_policy(spec, len(base.models))
                t = time.perf_counter()
                env = env_at_level(base, policy, {})
                cell[spec] = attribute(env, policy, days, seed_value(0), args.window)
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
