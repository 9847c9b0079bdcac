"""The coupled blocks of a charged-world day, and whether Lagrangian decomposition would prove them:
one JSON document on stdout (progress on stderr), written to ``--out``.

In the charged world spot acquisition can fail, pools bind, and availability rows couple several
services into one block that HiGHS answers in 1-4 s (docs/results/speed.md). The decomposition the
speed issue proposes relaxes the shared pool rows with multipliers ``lam >= 0``; each service is
then a covering knapsack (``atoll.solvers.allocation.knapsack.cover``), and

    L(lam) = sum over services of min cost_s(x_s) + lam . (use x_s) - lam . capacity

is a proven lower bound for every ``lam`` (each service's term is the search's own proven bound).
A block would be *proven by the decomposition* when the best ``L`` is within the block's gap of a
feasible plan. This script measures that on the real blocks before any of it goes into the solver:

1. one day (``--scenario``, ``--day``, ``--policy``, spot market, the charged world) runs with every
   block HiGHS answered recorded — its arrays, start, gap, seconds, objective and dual bound;
2. for the ``--top`` slowest blocks without risk rows: projected subgradient ascent on ``lam``
   (Polyak steps toward HiGHS's objective, the step halved after 5 iterations without a better
   bound, at most ``--iterations``), each service's knapsack solved by the exact search to a
   relative gap of 1e-5. Reported per block: HiGHS's seconds, objective and bound; the best ``L``,
   its gap to HiGHS's objective, whether that is within the block's gap, the seconds it took, and
   the best relaxed point that happened to be feasible.

    .venv/bin/python benchmarks/coupled_blocks.py --scenario extended --day 11 --top 12
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

from atoll.envs import CHARGED  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.vocabulary import parse_policy  # noqa: E402
from atoll.solvers.allocation import direct  # noqa: E402
from atoll.solvers.allocation.knapsack import cover  # noqa: E402
from atoll.solvers.files import atomic_write_text  # noqa: E402
from atoll.training.evaluate import env_at_level, resolve_policy  # noqa: E402
from atoll.training.lever_oracle import step_costs  # noqa: E402

SUB_GAP = 1e-5  # each service's knapsack: close to exact, so L is the dual's value, not the search's slack


def capture_day(scenario: str, day: int, policy: str, seed: int
                ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run one charged-world day, recording every block HiGHS answered (not the search or the memo)."""
    blocks: list[dict[str, Any]] = []
    original = direct.DirectRun.__init__

    def recording(self: direct.DirectRun, inst: Any, start: Any, time_limit: float | None,
                  gap: float) -> None:
        original(self, inst, start, time_limit, gap)
        if self.engine == "highs" and self.column_objective is not None:
            blocks.append({"costs": self.costs.copy(), "upper": self.upper.copy(),
                           "rows": tuple(a.copy() for a in self._rows), "n_added": self.n_added,
                           "gap": gap, "seconds": self.solve_seconds, "objective": self.column_objective,
                           "bound": self.bound, "services": len(inst.services)})

    config = FleetConfig(scenario=scenario, availability="spot", action_levels=(0.9,), days=(day, day),
                         **CHARGED)
    env = FleetEnv(config)
    chosen = resolve_policy(parse_policy(policy), len(env.models))
    direct.DirectRun.__init__ = recording  # type: ignore[method-assign]
    t0 = time.perf_counter()
    try:
        _, episode = step_costs(env_at_level(env, chosen, {}), chosen, days=[day], seed=seed,
                                lost_usd_per_mtok=2.0)
    finally:
        direct.DirectRun.__init__ = original  # type: ignore[method-assign]
    totals = episode.totals()
    return blocks, {"day_wall_s": round(time.perf_counter() - t0, 1),
                    "cost_usd": round(totals["cost_usd"], 2)}


def parse(block: dict[str, Any]) -> dict[str, Any] | None:
    """The block as services' knapsacks and pool rows; None when it has risk rows (a service with
    more than one covering row is not one knapsack)."""
    starts, index, value, lower, upper = block["rows"]
    na, costs = block["n_added"], block["costs"]
    n = len(costs) - na
    ends = [*starts[1:].tolist(), len(index)]
    x_cost = costs[na:].copy()
    held = np.zeros(n, dtype=int)
    extra = x_cost.copy()
    for j in range(na):  # start-up rows a_j - x_i >= -r_i: the running r_i, then at cost (1 + k)
        i = int(index[starts[j]:ends[j]][1]) - na
        held[i] = int(round(-lower[j]))
        extra[i] = x_cost[i] + costs[j]
    caps: list[float] = []
    use_rows: list[np.ndarray] = []
    demand: list[tuple[np.ndarray, np.ndarray, float]] = []
    for r in range(na, len(starts)):
        cols, vals = index[starts[r]:ends[r]] - na, value[starts[r]:ends[r]]
        if lower[r] == -np.inf:
            row = np.zeros(n)
            row[cols] = vals
            use_rows.append(row)
            caps.append(float(upper[r]))
        else:
            demand.append((cols, vals, float(lower[r])))
    if len(demand) != block["services"]:
        return None
    return {"x_cost": x_cost, "held": held, "extra": extra, "units": block["upper"][na:].astype(int),
            "use": np.array(use_rows).reshape(len(caps), n), "cap": np.array(caps), "demand": demand, "n": n}


def relaxed(p: dict[str, Any], lam: np.ndarray) -> tuple[np.ndarray, float]:
    """Each service's knapsack at pool prices ``lam``: the points and L(lam)."""
    price = lam @ p["use"]
    x = np.zeros(p["n"], dtype=int)
    bound = 0.0
    for cols, vals, need in p["demand"]:
        found = cover((p["x_cost"][cols] + price[cols]).tolist(), (p["extra"][cols] + price[cols]).tolist(),
                      p["held"][cols].tolist(), p["units"][cols].tolist(), vals.tolist(), need,
                      gap=SUB_GAP, node_limit=10**7)
        if found is None or found.counts is None:
            raise RuntimeError("a service's knapsack has no cover: the block itself is infeasible")
        x[cols] = found.counts
        bound += found.bound
    return x, bound - float(lam @ p["cap"])


def plan_cost(p: dict[str, Any], x: np.ndarray) -> float:
    return float(np.sum(p["x_cost"] * np.minimum(x, p["held"]) + p["extra"] * np.maximum(x - p["held"], 0)))


def dual(p: dict[str, Any], target: float, gap: float, iterations: int) -> dict[str, Any]:
    """Projected subgradient ascent on L (module docstring)."""
    t0 = time.perf_counter()
    lam = np.zeros(len(p["cap"]))
    best, feasible, scale, stale, done = -math.inf, math.inf, 2.0, 0, 0
    for it in range(1, iterations + 1):
        done = it
        x, value = relaxed(p, lam)
        if value > best + 1e-9:
            best, stale = value, 0
        else:
            stale += 1
            if stale >= 5:
                scale, stale = scale / 2, 0
        g = p["use"] @ x - p["cap"]
        if (g <= 1e-9).all():
            feasible = min(feasible, plan_cost(p, x))
        if target - best <= gap * target or scale < 1e-4 or not float(g @ g):
            break
        lam = np.maximum(0.0, lam + scale * (target - value) / float(g @ g) * g)
    return {"lagrangian_bound": round(best, 4), "gap_to_highs_objective": round((target - best) / target, 5),
            "proves_within_gap": bool(target - best <= gap * target),
            "best_feasible_relaxed_point": None if feasible == math.inf else round(feasible, 4),
            "iterations": done, "seconds": round(time.perf_counter() - t0, 2),
            "multipliers": np.round(lam, 4).tolist()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="extended")
    ap.add_argument("--day", type=int, default=11)
    ap.add_argument("--policy", default="fixed:1@0.9")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", type=int, default=12, help="the slowest blocks the dual is tried on")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/coupled_blocks.json"))
    args = ap.parse_args()
    print(f"running {args.scenario} day {args.day} ({args.policy}, spot, charged world)...", file=sys.stderr)
    load_before = [round(v, 2) for v in os.getloadavg()]
    blocks, day = capture_day(args.scenario, args.day, args.policy, args.seed)
    pools: Counter[int] = Counter()
    seconds: Counter[int] = Counter()
    parsed = [(b, parse(b)) for b in blocks]
    for b, p in parsed:
        k = -1 if p is None else len(p["cap"])  # -1: blocks with risk rows
        pools[k] += 1
        seconds[k] += b["seconds"]
    rows = []
    slowest = sorted((bp for bp in parsed if bp[1] is not None), key=lambda bp: -bp[0]["seconds"])[:args.top]
    for n, (b, p) in enumerate(slowest, 1):
        assert p is not None
        print(f"  block {n}/{len(slowest)}: {p['n']} columns, {len(p['cap'])} pool rows", file=sys.stderr)
        rows.append({"columns": p["n"], "services": len(p["demand"]), "pool_rows": len(p["cap"]),
                     "pool_capacity": p["cap"].tolist(), "highs_seconds": round(b["seconds"], 3),
                     "highs_objective": round(b["objective"], 4), "highs_bound": round(b["bound"], 4),
                     "gap": b["gap"], **dual(p, b["objective"], b["gap"], args.iterations)})
    doc = {
        "settings": vars(args) | {"out": str(args.out), "world": "charged", "market": "spot"},
        "day": day | {"highs_blocks": len(blocks),
                      "highs_seconds": round(sum(b["seconds"] for b in blocks), 1)},
        "blocks_by_pool_rows": {str(k): {"blocks": pools[k], "highs_seconds": round(seconds[k], 1)}
                                for k in sorted(pools)},
        "slowest": rows,
        "summary": {"proven_by_the_dual": sum(r["proves_within_gap"] for r in rows), "tried": len(rows),
                    "median_dual_gap": (float(np.median([r["gap_to_highs_objective"] for r in rows]))
                                        if rows else None),
                    "dual_seconds": round(sum(r["seconds"] for r in rows), 1),
                    "highs_seconds": round(sum(r["highs_seconds"] for r in rows), 1)},
        "load": {"before": load_before, "after": [round(v, 2) for v in os.getloadavg()]},
    }
    text = json.dumps(doc, indent=2)
    atomic_write_text(args.out, text + "\n")
    print(text)


if __name__ == "__main__":
    main()
