"""What a fleet state is billed: dollars per model and node-hours over the next seconds.

Functions over a :class:`~atoll.envs.fleet_model.FleetModel` (its templates, prices and config)
and a :class:`~atoll.envs.fleet.FleetState`; :meth:`FleetModel.cost` and
:meth:`FleetModel.node_hours` are these. Billed: running and starting nodes for the whole interval,
draining nodes until their drain ends, replaced ones (make-before-break) until their replacement
is ready plus their drain; with a warm pool (``startup="sampled"``) a whole node that stops within
the interval stays billed to its end as a free node, billed to the model it last served; nodes
bought for slices also bill their idle GPUs (a sliced cell holds ceil(use) whole nodes).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np

from atoll.envs.fleet import FleetState
from atoll.envs.vocabulary import Pool
from atoll.solvers.tiers import split_tier

if TYPE_CHECKING:
    from atoll.envs.fleet_model import FleetModel

__all__ = ["billed", "cost", "idle_cost", "node_hours", "warm_billed"]


def warm_billed(state: FleetState, seconds: float) -> list[tuple[tuple[str, str, str], float, float]]:
    """((region, config, model), free nodes, seconds billed) of the warm pool's entries."""
    return [(wkey, c, min(left, seconds)) for wkey, es in state.warm.items() for c, left in es]


def billed(model: FleetModel, state: FleetState, seconds: float) -> list[tuple[str, float, float]]:
    """(key, instances, seconds billed) of every entry held over the next ``seconds``; with a
    warm pool a whole node that stops within them stays billed to their end (as a free node),
    and a node released without a drain for all of them."""
    warm = state.warm_s
    out: list[tuple[str, float, float]] = [(k, float(n), seconds) for k, n in state.running.items() if n]
    out += [(k, c, seconds) for k, es in state.starting.items() for c, _ in es]
    for k, es in state.draining.items():
        after = warm if warm and not model.templates[k].has_slices else 0.0
        out += [(k, c, min(left + after, seconds)) for c, left in es]
    for k, es in state.replaced.items():
        after = warm if warm and not model.templates[k].has_slices else 0.0
        out += [(k, c, min(left + drain + after, seconds)) for c, left, drain in es]
    if warm:
        out += [(k, float(n), seconds) for k, n in state.released.items()
                if n and not model.templates[k].has_slices]
    return out


def node_hours(model: FleetModel, state: FleetState, seconds: float) -> tuple[float, float]:
    """(node-hours, of which on-demand) held over the next ``seconds``, billed as :func:`cost`."""
    total = on_demand = 0.0
    # without the hedged market's tiers every node is bought at the config's price kind
    all_spot = model.config.availability != "hedged" and model.config.price_kind == "spot"
    for key, n, span in billed(model, state, seconds):
        t = model.templates[key]
        hours = n * sum(k for _, k in t.node_use) * span / 3600.0  # a slice: its node share
        total += hours
        if not all_spot and split_tier(t.region)[1] == "on-demand":
            on_demand += hours
    for (region, _config, _), n, span in warm_billed(state, seconds):
        hours = n * span / 3600.0
        total += hours
        if not all_spot and split_tier(region)[1] == "on-demand":
            on_demand += hours
    return total, on_demand


def cost(model: FleetModel, state: FleetState, seconds: float) -> np.ndarray:
    """$ per model for holding the fleet ``seconds`` from now: running and starting nodes for
    the whole interval, draining nodes until their drain ends, replaced ones (make-before-
    break) until their replacement is ready plus their drain."""
    out = np.zeros(len(model.models))
    for key, n, span in billed(model, state, seconds):
        mi, _, _, per_h = model.info(key)
        out[mi] += n * per_h * span / 3600.0
    for (region, config, name), n, span in warm_billed(state, seconds):
        if name in model.model_index:  # a free node is billed to the model it last served
            price = model.base.prices.get((region, config), 0.0)
            out[model.model_index[name]] += n * price * span / 3600.0
    if model.base.index.sliced_rcs:
        out += idle_cost(model, state, seconds)
    return out


def idle_cost(model: FleetModel, state: FleetState, seconds: float) -> np.ndarray:
    """$ per model of the idle GPUs on nodes bought for slices (a sliced cell holds
    ceil(use) whole nodes; template costs count a slice's share only), split over the models
    by their share of the cell, at what is held now for the whole interval."""
    m = len(model.models)
    shares: dict[Pool, np.ndarray] = defaultdict(lambda: np.zeros(m))
    for key in set(state.running) | set(state.starting) | set(state.draining) | set(state.replaced):
        t = model.templates[key]
        n = state.held(key)
        if n and t.has_slices:
            mi = model.model_index[t.service.model]
            for c, k in t.node_use:
                shares[(t.region, c)][mi] += n * k
    out = np.zeros(m)
    for cell, by_model in shares.items():
        use = float(by_model.sum())
        idle = math.ceil(use - 1e-9) - use
        if idle > 0 and use > 0:
            out += by_model / use * idle * model.base.prices[cell] * seconds / 3600.0
    return out
