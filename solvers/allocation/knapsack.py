"""An exact branch and bound for a block with one demand row and no availability row.

Most blocks a simulated day solves are one service's cost stage whose templates touch no enforced
availability row: choose counts ``x_t`` in ``[0, u_t]`` of templates of throughput ``w_t`` so that
``sum w_t x_t >= D`` at least cost, where a template's first ``r_t`` instances (those running)
cost ``c_t`` each and the rest ``c_t (1 + k)`` (the start-up weight). The cost of a template is
convex in its count, so the block is a bounded covering knapsack over *items* — a template's
running units and its new units — and a running unit is always taken before a new one of the
same template. HiGHS spends about a millisecond of fixed work per such run, more than the search
below needs for the block sizes a day sees; a search that grows past ``node_limit`` nodes
returns None and the caller runs HiGHS instead, so the answer is exact either way.

The search is the classic depth-first one (Horowitz and Sahni's order): items by cost per unit
of throughput, each item's count from the most useful down to none, a node cut when the
fractional (linear-relaxation) bound of the items left — exact for one row, computed from prefix
sums — cannot beat the incumbent by more than the relative ``gap``. The incumbent starts at the
warm start when it is feasible, as a MIP solver keeps its start until it finds a plan better by
more than the gap. The reported bound is the least of the incumbent and every cut node's bound,
so ``objective - bound <= gap * objective`` is proven, not assumed. Items of equal cost and
throughput are merged (identical templates in different zones would otherwise branch over every
split of the same total), and a merged item's units are handed to its templates in column order.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

NODE_LIMIT = 50_000  # ~1 us a node: past ~50 ms of search the block goes to HiGHS


@dataclass(frozen=True)
class Cover:
    """A finished search: counts per template column (None if no plan covers the demand), the
    plan's cost, and a proven lower bound on every plan's cost."""

    counts: tuple[int, ...] | None
    objective: float
    bound: float
    nodes: int


Item = tuple[float, float, bool]  # (cost per unit, throughput per unit, new units?)


def _check_costs(costs: list[float], extra: list[float]) -> None:
    """Refuse costs the search's order cannot handle: a running unit must never cost more than a
    new one of the same template, or taking running units first would not be optimal."""
    if any(c < 0 for c in costs) or any(e < c for c, e in zip(costs, extra, strict=True)):
        raise ValueError("cover: costs must be >= 0 and extra >= costs (a template's further "
                         "instances cost at least its running ones), got a cost below that")


def _merge_items(costs: list[float], extra: list[float], held: list[int], units: list[int],
                 widths: list[float]) -> dict[Item, list[tuple[int, int]]]:
    """Items -> [(column, units)] in column order. A template is split into its running units and
    its new ones (one item when they cost the same), and items of equal cost and throughput are
    merged, so identical templates in different zones do not branch over every split of a total."""
    merged: dict[Item, list[tuple[int, int]]] = {}
    for t in range(len(costs)):
        width = widths[t]
        if width <= 0 or units[t] <= 0:
            continue
        h = units[t] if extra[t] == costs[t] else min(held[t], units[t])
        if h > 0:
            merged.setdefault((costs[t], width, False), []).append((t, h))
        if units[t] > h:
            merged.setdefault((extra[t], width, True), []).append((t, units[t] - h))
    return merged


def _prefix_sums(c: list[float], w: list[float], u: list[int]) -> tuple[list[float], list[float]]:
    """(throughput, cost) of items ``..i`` taken whole: the linear bound of any suffix of items is
    then two subtractions and a bisection, not a loop."""
    m = len(c)
    cap_prefix = [0.0] * (m + 1)
    cost_prefix = [0.0] * (m + 1)
    for i in range(m):
        cap_prefix[i + 1] = cap_prefix[i] + w[i] * u[i]
        cost_prefix[i + 1] = cost_prefix[i] + c[i] * u[i]
    return cap_prefix, cost_prefix


def _plan_cost(costs: list[float], extra: list[float], held: list[int], x: list[int]) -> float:
    """A plan's own cost: each template's first ``held`` instances at ``costs``, the rest at ``extra``."""
    return sum(costs[t] * min(x[t], held[t]) + extra[t] * max(x[t] - held[t], 0) for t in range(len(costs)))


def _beat(cost: float, gap: float) -> float:
    """What a plan must cost to replace an incumbent of ``cost``."""
    return cost - gap * cost - 1e-12 * cost if cost < math.inf else math.inf


def _unmerge(item_counts: list[int], keys: list[Item], merged: dict[Item, list[tuple[int, int]]],
             n: int) -> list[int]:
    """Counts per template column from counts per item: a merged item's units go to its templates
    in column order, so the answer does not depend on how the search grouped them."""
    counts = [0] * n
    for i, key in enumerate(keys):
        left = item_counts[i]
        for t, q in merged[key]:
            take = min(q, left)
            counts[t] += take
            left -= take
    return counts


def cover(costs: list[float], extra: list[float], held: list[int], units: list[int],
          widths: list[float], demand: float, *, gap: float, start: list[int] | None = None,
          node_limit: int = NODE_LIMIT) -> Cover | None:
    """The cheapest counts per template covering ``demand`` (module docstring).

    ``costs[t]``: cost of one of the first ``held[t]`` instances of template ``t``; ``extra[t]``:
    cost of each further one (up to ``units[t]`` in all); ``widths[t]``: its throughput. ``start``:
    counts per template to keep unless something is better by more than ``gap``. None when the
    search passes ``node_limit`` nodes.

    The search stays one closure over local lists: it is the hot loop (a call per node), and
    the setup and the answer's unmerging around it are the helpers above."""
    n = len(costs)
    _check_costs(costs, extra)
    tol = 1e-9 * max(1.0, abs(demand))
    merged = _merge_items(costs, extra, held, units, widths)
    keys = sorted(merged, key=lambda cwn: (cwn[0] / cwn[1], -cwn[1], cwn[2]))
    c = [k[0] for k in keys]
    w = [k[1] for k in keys]
    u = [sum(q for _, q in merged[k]) for k in keys]
    m = len(keys)
    cap_prefix, cost_prefix = _prefix_sums(c, w, u)

    best = math.inf
    best_counts: list[int] | None = None  # None with a finite best: the start stands
    if (start is not None and all(0 <= start[t] <= units[t] for t in range(n))
            and sum(widths[t] * start[t] for t in range(n)) >= demand - tol):
        best = _plan_cost(costs, extra, held, start)
    limit = _beat(best, gap)
    cut_bound = math.inf  # least bound of a cut node or cost of a leaf not taken
    nodes = 0
    chosen = [0] * m

    def search(j: int, need: float, cost: float) -> bool:
        """False once the node limit is passed."""
        nonlocal best, best_counts, limit, cut_bound, nodes
        nodes += 1
        if nodes > node_limit:
            return False
        if need <= tol:
            if cost < limit:
                best, best_counts, limit = cost, list(chosen), _beat(cost, gap)
            else:
                cut_bound = min(cut_bound, cost)
            return True
        # the linear relaxation over items j..: fill by ratio, the last one fractionally
        target = cap_prefix[j] + need
        k = bisect_left(cap_prefix, target - tol, j + 1)
        if k > m:
            return True  # the items left cannot cover the need
        k -= 1
        part = min(max(need - (cap_prefix[k] - cap_prefix[j]), 0.0), w[k] * u[k])
        bound = cost + cost_prefix[k] - cost_prefix[j] + c[k] * part / w[k]
        if bound >= limit:
            cut_bound = min(cut_bound, bound)
            return True
        for q in range(min(u[j], math.ceil((need - tol) / w[j])), -1, -1):
            chosen[j] = q
            if not search(j + 1, need - q * w[j], cost + q * c[j]):
                return False
        chosen[j] = 0
        return True

    if not search(0, demand, 0.0):
        return None
    if best == math.inf:
        return Cover(None, math.inf, math.inf, nodes)
    if best_counts is None:
        assert start is not None
        counts = list(start)
    else:
        counts = _unmerge(best_counts, keys, merged, n)
    # a merged item's units may land on a template's running instances the search priced as
    # new: the plan's own cost is then lower, never higher, and the bound still holds
    objective = _plan_cost(costs, extra, held, counts)
    return Cover(tuple(counts), objective, min(objective, best, cut_bound), nodes)
