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
from atoll.envs.rollout import run_policy

__all__ = ["BUCKETS", "MissCounter", "miss_breakdown"]

BUCKETS = ("after_preemption", "capacity", "latency")


class MissCounter:
    """Puts the missed requests of each step it is shown in one bucket (module docstring).

    Feed it every step's ``info`` in order (``run_policy(..., on_step=counter.add)``); a step
    that does not follow the last one (another day, or the step count starting again) starts
    the preemption window afresh, as each day's episode starts with nothing preempted.
    :meth:`result` gives the shares."""

    def __init__(self, models: Sequence[str], *, window: int = 1) -> None:
        if window < 1:
            raise ValueError(f"MissCounter: window must be >= 1 step, got {window}")
        self.models, self.window = list(models), window
        m = len(self.models)
        self.missed = np.zeros((m, len(BUCKETS)))
        self.requests = np.zeros(m)
        self.cost = np.zeros(m)
        self.steps_after = np.zeros(m)
        self.steps = 0
        self._since = np.full(m, window + 1)  # steps since the model's last preemption
        self._last: tuple[object, int] = (None, -1)  # (day, step) of the last step counted

    def add(self, info: dict[str, Any]) -> None:
        """Count one step's misses from its ``info``."""
        day, step = info.get("day"), int(info.get("step", 0))
        if day != self._last[0] or step <= self._last[1]:
            self._since = np.full(len(self.models), self.window + 1)
        self._last = (day, step)
        self.steps += 1
        after = self._since <= self.window
        self.steps_after += after
        for j, name in enumerate(self.models):
            row = info["models"][name]
            n = row["requests"]
            served = row.get("served_share", row["slo_attainment"])
            miss_capacity = (1.0 - served) * n
            miss_latency = max(0.0, served - row["slo_attainment"]) * n
            self.requests[j] += n
            self.cost[j] += row["cost_usd"]
            if after[j]:
                self.missed[j, 0] += miss_capacity + miss_latency
            else:
                self.missed[j, 1] += miss_capacity
                self.missed[j, 2] += miss_latency
        # a preemption at this boundary shortens the steps that follow it
        lost = np.array([info["models"][name]["preemptions"] for name in self.models])
        self._since = np.where(lost > 0, 1, self._since + 1)

    def _shares(self, row: np.ndarray, n: float, after: float, usd: float) -> dict[str, float]:
        total = float(row.sum())
        return {"cost_usd": usd, "slo_attainment": 1.0 - total / n if n > 0 else 1.0,
                "missed_requests": total,
                **{f"{b}_share": float(row[k] / total) if total > 0 else 0.0 for k, b in enumerate(BUCKETS)},
                "steps_after_preemption_share": after / self.steps if self.steps else 0.0}

    def result(self) -> dict[str, Any]:
        """``{"fleet": figures, "models": {name: figures}}`` (see :func:`miss_breakdown`)."""
        per_model = {name: self._shares(self.missed[j], self.requests[j], self.steps_after[j],
                                        float(self.cost[j]))
                     for j, name in enumerate(self.models)}
        fleet = self._shares(self.missed.sum(axis=0), self.requests.sum(), float(self.steps_after.mean()),
                             float(self.cost.sum()))
        return {"fleet": fleet, "models": per_model}


def miss_breakdown(env: FleetEnv, policy: Policy, *, days: Sequence[int], seed: int, window: int = 1
                   ) -> dict[str, Any]:
    """Run ``policy`` on ``days`` with :func:`atoll.envs.rollout.run_policy` (day ``i`` reset
    with ``seed + i``) and split its missed requests: ``{"fleet": figures, "models": {name:
    figures}}``, figures = ``cost_usd``, ``slo_attainment``, ``missed_requests``, ``<bucket>_share``
    per bucket (summing to 1 when anything was missed) and ``steps_after_preemption_share``."""
    counter = MissCounter(env.models, window=window)
    run_policy(env, policy, days=days, seed=seed, on_step=counter.add)
    return counter.result()
