"""Run a policy through FleetEnv episodes and total what happened."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import Policy

TOTAL_KEYS: tuple[str, ...] = ("cost_usd", "goodput_share", "slo_attainment", "usd_per_mtok",
                               "reoptimizations", "solver_seconds")

# The one results table (CLI and the MLflow comparison artifact): (total key, header, format).
RESULT_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("cost_usd", "cost $", ".0f"),
    ("goodput_share", "goodput", ".1%"),
    ("slo_attainment", "SLO att.", ".1%"),
    ("usd_per_mtok", "$/M goodput tok", ".4f"),
    ("reoptimizations", "re-opts", ".0f"),
    ("solver_seconds", "solver s", ".1f"),
)


def result_cells(values: dict[str, Any]) -> list[str]:
    """One results-table row: per column, a total (one run) or ``mean ± std`` over seeds."""
    cells = []
    for key, _, fmt in RESULT_COLUMNS:
        v = values[key]
        cells.append(f"{v['mean']:{fmt}} ± {v['std']:{fmt}}" if isinstance(v, dict) else f"{v:{fmt}}")
    return cells


@dataclass
class Episode:
    """One policy's run over one or more days: per-step records and running sums."""

    policy: str
    seed: int
    days: list[int] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    sums: dict[str, float] = field(default_factory=dict)
    # the planner's learned capacity factors after each day (family -> factor; empty without
    # the online correction)
    correction: list[dict[str, float]] = field(default_factory=list)

    def add(self, info: dict[str, Any], reward: float) -> None:
        total = info["total"]
        for k in ("cost_usd", "demand_tokens", "goodput_tokens", "unserved_tokens", "requests",
                  "reoptimizations", "solves", "solver_seconds", "preemptions", "node_hours",
                  "ondemand_node_hours", "time_limited", "grows", "guard_resolves"):
            self.sums[k] = self.sums.get(k, 0.0) + float(total.get(k, 0.0))
        met = total["slo_attainment"] * total["requests"]
        self.sums["met_requests"] = self.sums.get("met_requests", 0.0) + met
        # the fluid count (served within capacity): equal to ``met`` unless the SLO is latency-based
        served = float(total.get("served_requests", met))
        self.sums["served_requests"] = self.sums.get("served_requests", 0.0) + served
        self.sums["reward"] = self.sums.get("reward", 0.0) + reward
        row: dict[str, Any] = {"day": info["day"], "step": info["step"], "seconds": info["seconds"],
                               "reward": reward, **{k: total[k] for k in total}}
        for m, v in info["models"].items():
            for k in ("demand_prefill", "demand_decode", "ready_prefill", "ready_decode", "cost_usd",
                      "reoptimizations", "slo_attainment"):
                row[f"{m}/{k}"] = v[k]
        self.steps.append(row)

    def count_changes(self, before: dict[str, int], after: dict[str, int], step_s: float) -> None:
        """One step's plan change: instances added and removed, the fleet's size after it and the
        step's seconds — the churn figure's inputs (see :meth:`totals`)."""
        keys = set(before) | set(after)
        added = sum(max(after.get(k, 0) - before.get(k, 0), 0) for k in keys)
        removed = sum(max(before.get(k, 0) - after.get(k, 0), 0) for k in keys)
        for name, value in (("instances_added", added), ("instances_removed", removed),
                            ("instance_seconds", sum(after.values()) * step_s), ("plan_seconds", step_s)):
            self.sums[name] = self.sums.get(name, 0.0) + float(value)

    def totals(self) -> dict[str, float]:
        s = self.sums
        hours = s.get("plan_seconds", 0.0) / 3600.0
        mean_size = s.get("instance_seconds", 0.0) / s["plan_seconds"] if s.get("plan_seconds") else 0.0
        changed = s.get("instances_added", 0.0) + s.get("instances_removed", 0.0)
        demand = s.get("demand_tokens", 0.0)
        goodput = s.get("goodput_tokens", 0.0)
        requests = s.get("requests", 0.0)
        return {
            "cost_usd": s.get("cost_usd", 0.0),
            "goodput_share": goodput / demand if demand > 0 else 1.0,
            "slo_attainment": s.get("met_requests", 0.0) / requests if requests > 0 else 1.0,
            "served_share": s.get("served_requests", 0.0) / requests if requests > 0 else 1.0,
            "usd_per_mtok": s.get("cost_usd", 0.0) / (goodput / 1e6) if goodput > 0 else float("inf"),
            "reoptimizations": s.get("reoptimizations", 0.0),
            "solver_seconds": s.get("solver_seconds", 0.0),
            "solves": s.get("solves", 0.0),
            "time_limited_solves": s.get("time_limited", 0.0),
            "guard_resolves": s.get("guard_resolves", 0.0),
            "grows": s.get("grows", 0.0),
            "preemptions": s.get("preemptions", 0.0),
            "node_hours": s.get("node_hours", 0.0),
            "ondemand_node_hour_share": (s.get("ondemand_node_hours", 0.0) / s["node_hours"]
                                         if s.get("node_hours", 0.0) > 0 else 0.0),
            "goodput_tokens": goodput,
            "demand_tokens": demand,
            "reward": s.get("reward", 0.0),
            "steps": float(len(self.steps)),
            # churn: instances added + removed per hour, over the fleet's mean size
            "instances_added": s.get("instances_added", 0.0),
            "instances_removed": s.get("instances_removed", 0.0),
            "churn_per_hour": changed / hours / mean_size if hours > 0 and mean_size > 0 else 0.0,
        }


def run_policy(env: FleetEnv, policy: Policy, *, days: Sequence[int], seed: int,
               tick: Callable[[int], None] | None = None,
               on_step: Callable[[dict[str, Any]], None] | None = None) -> Episode:
    """One episode per day (in order) with the env seeded ``seed`` at the first reset and each
    later reset seeded ``seed + i``, so every policy run with the same seed meets the same
    availability, preemption draws and demand. ``on_step`` sees every step's ``info`` (e.g.
    :class:`atoll.envs.slo_loss.MissCounter`); ``tick`` is called with 1 per step (progress).

    Interrupted (Ctrl-C), it re-raises the KeyboardInterrupt with the episode so far attached as
    ``partial_episode``, so a caller can report the totals of the steps that ran."""
    episode = Episode(policy.name, seed)
    try:
        _run_days(env, policy, days, seed, tick, on_step, episode)
    except KeyboardInterrupt as exc:
        exc.partial_episode = episode  # type: ignore[attr-defined]
        raise
    return episode


def _run_days(env: FleetEnv, policy: Policy, days: Sequence[int], seed: int,
              tick: Callable[[int], None] | None, on_step: Callable[[dict[str, Any]], None] | None,
              episode: Episode) -> None:
    for i, day in enumerate(days):
        obs, info = env.reset(seed=seed + i, options={"day": int(day), **policy.reset_options()})
        episode.days.append(int(day))
        done = False
        while not done:
            action = np.asarray(policy.act(obs, info), dtype=np.int8)
            before = env.state.planned().as_dict()
            obs, reward, terminated, truncated, info = env.step(action)
            episode.add(info, reward)
            episode.count_changes(before, env.state.planned().as_dict(), env.config.step_s)
            if on_step is not None:
                on_step(info)
            done = terminated or truncated
            if tick is not None:
                tick(1)
        if env.config.correction:
            episode.correction.append(env.correction.planning_factors())
