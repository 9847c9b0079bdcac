"""Exploratory: does a planning level chosen from the servers' signals beat one level for all?
One JSON document on stdout (progress on stderr).

Hand-written state-dependent level rules, each re-planning every model every step (as the
frontier's high end, ``fixed:1``), run on one validation day of extended / spot / the calibration
world with the contest grid's seed 0, beside ``fixed:1`` at 0.8, 0.9 and 0.95:

- ``unserved``: 0.95 for a model whose recent unserved share is above 3% or whose waiting share is
  above 20% (the closed-loop signals a forecast-based rule never reads), else 0.9;
- ``unserved-lo``: the same with 0.8 as the base level;
- ``preempt``: 0.95 for 12 steps (an hour) after one of the model's instances was preempted,
  else 0.9.

Each rule's ``line_ratio`` is its cost over the fixed:1 line at its SLO attainment (piecewise
linear between the levels run). It shows how much a trigger that reads the signals could buy
by levels alone; it picks nothing for the contest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

from atoll.envs import CLOSED_LOOP  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.observation import model_feature  # noqa: E402
from atoll.envs.rollout import run_policy  # noqa: E402
from atoll.training.evaluate import seed_value  # noqa: E402
from atoll.training.frontier import Point, frontier_cost_at  # noqa: E402

LEVELS = (0.8, 0.9, 0.95)


class LevelRule:
    """Full re-plan of every model every step (hold at step 0) at ``level(observation, model)``."""

    planning_quantile = None

    def __init__(self, name: str, env: FleetEnv, level: Callable[[np.ndarray, int], float]) -> None:
        self.name, self.env, self.level = name, env, level

    def reset_options(self) -> dict[str, Any]:
        return {}

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        if int(info.get("step", 0)) == 0:
            return np.zeros(len(self.env.models), dtype=np.int8)
        return np.array([self.env.codec.encode("full", self.level(observation, i))
                         for i in range(len(self.env.models))], dtype=np.int8)


def closed_loop_feature(env: FleetEnv, observation: np.ndarray, i: int, name: str) -> float:
    """A ``v2`` per-model signal (latency_ratio, waiting_share, correction) of model ``i``."""
    from atoll.envs.observation import CLOSED_LOOP_FEATURES

    m = len(env.models)
    start = observation.shape[0] - len(CLOSED_LOOP_FEATURES) * m
    return float(observation[start + len(CLOSED_LOOP_FEATURES) * i
                             + [f[0] for f in CLOSED_LOOP_FEATURES].index(name)])


def rules(env: FleetEnv) -> dict[str, Callable[[np.ndarray, int], float]]:
    def losing(o: np.ndarray, i: int) -> bool:
        return (model_feature(o, i, "unserved_share") > 0.03
                or closed_loop_feature(env, o, i, "waiting_share") > 0.2)

    out: dict[str, Callable[[np.ndarray, int], float]] = {
        f"fixed:1@{q:g}": (lambda o, i, q=q: q) for q in LEVELS}
    out["unserved"] = lambda o, i: 0.95 if losing(o, i) else 0.9
    out["unserved-lo"] = lambda o, i: 0.95 if losing(o, i) else 0.8
    out["preempt"] = lambda o, i: 0.95 if model_feature(o, i, "since_preempt") < 12 / 288 else 0.9
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--day", type=int, default=8, help="a validation day")
    parser.add_argument("--availability", default="spot")
    args = parser.parse_args()
    config = FleetConfig(scenario="extended", availability=args.availability, planning_quantile=0.9,
                         action_levels=LEVELS, days=(args.day, args.day), **CLOSED_LOOP)
    env = FleetEnv(config)
    out: dict[str, Any] = {"settings": vars(args), "loadavg_start": [round(v, 2) for v in os.getloadavg()]}
    results: dict[str, dict[str, float]] = {}
    for name, level in rules(env).items():
        t = time.perf_counter()
        totals = run_policy(env, LevelRule(name, env, level), days=[args.day], seed=seed_value(0)).totals()
        results[name] = {"cost_usd": totals["cost_usd"], "slo_attainment": totals["slo_attainment"],
                         "seconds": time.perf_counter() - t}
        print(f"{name}: ${totals['cost_usd']:.0f} at {totals['slo_attainment']:.4f}", file=sys.stderr,
              flush=True)
    line = [Point(f"fixed:1@{q:g}", results[f"fixed:1@{q:g}"]["cost_usd"],
                  results[f"fixed:1@{q:g}"]["slo_attainment"], 0.0) for q in LEVELS]
    for r in results.values():
        reading = frontier_cost_at(line, r["slo_attainment"])
        r["line_ratio"] = r["cost_usd"] / reading.cost_usd
        r["line_position"] = reading.position  # type: ignore[assignment]
    out["results"] = results
    out["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
