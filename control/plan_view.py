"""What the running plan looks like at a tick, in the numbers a dashboard wants.

Per tick: the delivered plan's cost per hour, and per model its planning demand (the last
interval's, estimated arrivals where a phase is saturated), its forecast at the planning level and
the share of requests the plan is expected to serve within both latency budgets — the
simulator's own latency model (:func:`atoll.envs.servers.server_report`) run on the plan's
capacity (corrected by the learned factors) against that demand. The ``metrics:`` sink exports
it (:meth:`atoll.control.sinks.MetricsSink.observe_tick`) and ``atoll control --json`` prints it.

:func:`plan_bill` is what a plan costs line by line: one line per (region, node config, price
tier) with its whole nodes, the tier's $/node-hour and the line's $/h — ``atoll solve``'s bill of
materials, for the live plan. Every record the controller makes carries it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from atoll.envs.fleet import FleetState
from atoll.envs.fleet_model import FleetModel
from atoll.envs.latency import ServiceLatency
from atoll.envs.servers import server_report
from atoll.solvers.catalog import load_catalog
from atoll.solvers.tiers import TIERS, split_tier

STEP_S = 300.0  # the latency model's step: the window over which an overload queue builds


def plan_bill(model: FleetModel, plan: Mapping[str, int], default_tier: str = "on-demand") -> dict[str, Any]:
    """What ``plan`` (template key -> instances; keys the fleet does not know are listed under
    ``unpriced``) costs per hour: one line per (region, node config, tier) — the catalog's instance
    type, whole nodes (slices: the ceil of their share, as the ILP buys), the tier's $/node-hour
    and the line's $/h — the total ``usd_per_h`` and its split ``usd_per_h_by_tier``. A template
    in a plain region is at ``default_tier`` (:meth:`atoll.control.live_fleet.LiveFleet.tier`)."""
    use: dict[tuple[str, str], float] = {}
    unpriced = sorted(k for k, n in plan.items() if n and k not in model.templates)
    for key, n in plan.items():
        t = model.templates.get(key)
        if t is None or not n:
            continue
        for cfg, k in t.node_use:
            use[(t.region, cfg)] = use.get((t.region, cfg), 0.0) + n * k
    catalog = load_catalog()
    lines = []
    by_tier = dict.fromkeys(TIERS, 0.0)
    for (tiered, cfg), used in sorted(use.items()):
        region, tier = split_tier(tiered, default_tier)
        nodes = math.ceil(used - 1e-9)
        price = float(model.base.prices[(tiered, cfg)])
        offer = catalog.offers_in(region).get(cfg) if region in catalog.regions else None
        lines.append({"region": region, "config": cfg, "instance": offer.instance if offer else "-",
                      "tier": tier, "nodes": nodes, "price_per_node_hour": price,
                      "cost_per_hour": nodes * price})
        by_tier[tier] += nodes * price
    return {"usd_per_h": sum(line["cost_per_hour"] for line in lines),
            "usd_per_h_by_tier": {t: v for t, v in by_tier.items() if v}, "lines": lines,
            **({"unpriced": unpriced} if unpriced else {})}


def plan_view(model: FleetModel, running: Mapping[str, int], demand: np.ndarray, forecast: np.ndarray,
              latency: tuple[list[ServiceLatency], list[ServiceLatency]],
              factors: Mapping[str, float] | None, wall_s: float,
              default_tier: str = "on-demand") -> dict[str, Any]:
    """The view of ``running`` (known templates only): ``demand`` and ``forecast`` [M, 2] tokens/s
    (NaN: none yet), ``factors`` the planning factors (None: the model's capacities); its $/h
    split by price tier as :func:`plan_bill` bills it."""
    state = FleetState(running=dict(running))
    cost = float(model.cost(state, 3600.0).sum())
    by_tier = plan_bill(model, running, default_tier)["usd_per_h_by_tier"]
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
    return {"usd_per_h": cost, "usd_per_h_by_tier": by_tier, "wall_s": float(wall_s), "models": models}
