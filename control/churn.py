"""Churn as a figure: instances added plus removed per hour, over the fleet's size.

A re-plan costs a real cluster more than its dollars: every added vLLM instance pays minutes of
start-up (a node, an image, the weights, a compile) and every removal drops its caches. The
controller keeps the changes it delivered over the last day (:func:`record`, persisted with its
state) and reports, at every tick, the last hour's churn (:func:`figure`):

    churn = (instances added + instances removed) per hour / instances in the running plan

A fleet of 100 instances that adds 5 and removes 5 in an hour churns 10% per hour. The simulator
reports the same figure over a rollout (:mod:`atoll.envs.rollout`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

WINDOW_S = 3600.0  # the figure's window: the last hour
KEEP_S = 86400.0  # changes older than a day are forgotten (the state stays small)

Change = tuple[float, int, int]  # (time, instances added, instances removed)


def diff_counts(before: Mapping[str, int], after: Mapping[str, int]) -> tuple[int, int]:
    """(instances added, instances removed) going from plan ``before`` to plan ``after``."""
    keys = set(before) | set(after)
    added = sum(max(after.get(k, 0) - before.get(k, 0), 0) for k in keys)
    removed = sum(max(before.get(k, 0) - after.get(k, 0), 0) for k in keys)
    return int(added), int(removed)


def record(log: Sequence[Change], now_s: float, added: int, removed: int) -> tuple[Change, ...]:
    """``log`` with a delivered change appended (nothing for an empty one), older ones dropped."""
    kept = [c for c in log if c[0] > now_s - KEEP_S]
    if added or removed:
        kept.append((float(now_s), int(added), int(removed)))
    return tuple(kept)


def figure(log: Sequence[Change], now_s: float, fleet_size: int,
           window_s: float = WINDOW_S) -> dict[str, Any]:
    """The last ``window_s`` seconds' churn: instances added and removed, the running plan's
    size, and (added + removed) per hour / size (None for an empty fleet)."""
    recent = [c for c in log if now_s - window_s < c[0] <= now_s + 1e-9]
    added = sum(c[1] for c in recent)
    removed = sum(c[2] for c in recent)
    hours = window_s / 3600.0
    share = (added + removed) / hours / fleet_size if fleet_size > 0 else None
    return {"window_s": window_s, "added": added, "removed": removed, "fleet_instances": int(fleet_size),
            "per_hour_over_fleet": share}
