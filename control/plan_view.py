"""What the running plan looks like at a tick, in the numbers a dashboard wants.

Per tick: the delivered plan's cost per hour, and per model its planning demand (the last
interval's, estimated arrivals where a phase is saturated), its forecast at the planning level and
the share of requests the plan is expected to serve within both latency budgets — the
simulator's own latency model (:func:`atoll.envs.servers.server_report`) run on the plan's
capacity (corrected by the learned factors) against that demand. The ``metrics:`` sink exports
it (:meth:`atoll.control.sinks.MetricsSink.observe_tick`) and ``atoll control --json`` prints it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from atoll.envs.fleet import FleetState
from atoll.envs.fleet_model import FleetModel
from atoll.envs.latency import ServiceLatency
from atoll.envs.servers import server_report

STEP_S = 300.0  # the latency model's step: the window over which an overload queue builds


def plan_view(model: FleetModel, running: Mapping[str, int], demand: np.ndarray, forecast: np.ndarray,
              latency: tuple[list[ServiceLatency], list[ServiceLatency]],
              factors: Mapping[str, float] | None, wall_s: float) -> dict[str, Any]:
    """The view of ``running`` (known templates only): ``demand`` and ``forecast`` [M, 2] tokens/s
    (NaN: none yet), ``factors`` the planning factors (None: the model's capacities)."""
    state = FleetState(running=dict(running))
    cost = float(model.cost(state, 3600.0).sum())
    capacity, _ = model.capacity(state, 0.0, factors or None)
    instances = model.instances_ready(state, 0.0)
    known = np.nan_to_num(np.asarray(demand, dtype=float))
    report = server_report(*latency, known, capacity, instances, STEP_S)
    models: dict[str, Any] = {}
    for i, name in enumerate(model.models):
        row: dict[str, Any] = {"instances": [int(instances[i, 0]), int(instances[i, 1])]}
        if np.all(np.isfinite(demand[i])):
            row["demand"] = [float(demand[i, 0]), float(demand[i, 1])]
            row["slo_attainment"] = float(report.slo_share[i])
        if np.all(np.isfinite(forecast[i])):
            row["forecast"] = [float(forecast[i, 0]), float(forecast[i, 1])]
        models[name] = row
    return {"usd_per_h": cost, "wall_s": float(wall_s), "models": models}
