"""Where a policy misses its SLO: each missed request of each step put in one bucket.

- ``after_preemption``: the model lost instances at one of the last ``window`` step boundaries
  (its replacements are still starting: a node boots in 180 s and loads its weights at 1 GB/s, so
  the 5-minute step after a preemption runs short whatever is decided then);
- ``capacity``: otherwise, demand beyond the ready capacity (the fluid shortfall: the plan or the
  planner's capacities were short);
- ``latency``: otherwise, served within capacity but over the TTFT / inter-token budget of the
  latency model (queueing at high utilization; only with ``slo_model="latency"``).

A trigger decides when and at which level to re-plan; it does not see a preemption before it
happens, so the first bucket is what no decision at the step itself recovers (only capacity
bought ahead, which a higher planning level already prices). ``benchmarks/slo_loss.py`` reports
it for the contest's cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import Policy

__all__ = ["BUCKETS", "miss_breakdown"]

BUCKETS = ("after_preemption", "capacity", "latency")


def miss_breakdown(env: FleetEnv, policy: Policy, *, days: Sequence[int], seed: int, window: int = 1
                   ) -> dict[str, Any]:
    """Run ``policy`` on ``days`` as :func:`atoll.envs.rollout.run_policy` does (day ``i`` reset
    with ``seed + i``) and split its missed requests: ``{"fleet": figures, "models": {name:
    figures}}``, figures = ``cost_usd``, ``slo_attainment``, ``missed_requests``, ``<bucket>_share``
    per bucket (summing to 1 when anything was missed) and ``steps_after_preemption_share``."""
    if window < 1:
        raise ValueError(f"miss_breakdown: window must be >= 1 step, got {window}")
    m = len(env.models)
    missed = np.zeros((m, len(BUCKETS)))
    requests = np.zeros(m)
    cost = np.zeros(m)
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
                cost[j] += row["cost_usd"]
                if after[j]:
                    missed[j, 0] += miss_capacity + miss_latency
                else:
                    missed[j, 1] += miss_capacity
                    missed[j, 2] += miss_latency
            # a preemption at this boundary shortens the steps that follow it
            lost = np.array([info["models"][name]["preemptions"] for name in env.models])
            since = np.where(lost > 0, 1, since + 1)

    def shares(row: np.ndarray, n: float, after: float, usd: float) -> dict[str, float]:
        total = float(row.sum())
        return {"cost_usd": usd, "slo_attainment": 1.0 - total / n if n > 0 else 1.0,
                "missed_requests": total,
                **{f"{b}_share": float(row[k] / total) if total > 0 else 0.0 for k, b in enumerate(BUCKETS)},
                "steps_after_preemption_share": after / steps if steps else 0.0}

    per_model = {name: shares(missed[j], requests[j], steps_after[j], float(cost[j]))
                 for j, name in enumerate(env.models)}
    return {"fleet": shares(missed.sum(axis=0), requests.sum(), float(steps_after.mean()), float(cost.sum())),
            "models": per_model}
