"""Exact throughput-optimal pipeline placement of one node multiset.

A placement of a multiset of nodes for a service: S pipeline stages, each a group of nodes that
are data-parallel copies (their throughputs add) holding a contiguous block of layers; the
blocks sum to the model's layers and every node is used. Each stage must finish a step within
budget/S, including the activation send to the next stage (all stages but the last). The
pipeline delivers the throughput of its slowest stage.

Exactness rests on one fact: a node profile is nonincreasing in the layers held (more layers,
slower steps and less KV memory). For a fixed partition of the nodes into groups (one of them
last), group g with profile T_g(1) >= T_g(2) >= ... can hold j layers at throughput >= tau iff
j <= l_g(tau) = #{j : T_g(j) >= tau}; a split of L layers at throughput tau exists iff every
l_g(tau) >= 1 and sum_g l_g(tau) >= L. Since sum_g l_g(tau) counts the values >= tau in the union
of the groups' profiles, the optimum is

    tau* = min(L-th largest value of the union of T_g(1..L),  min_g T_g(1)),

one ``np.partition`` per (partition, last group), vectorized over all partitions of a stage
count. Partitions are enumerated once per repetition pattern of the multiset (e.g. 2+1+1 nodes of
three configs), with symmetric duplicates removed. A table that breaks monotonicity (user
GPUs or factors could) goes through a slower exact path: bisection over the finite set of stage
throughputs, each step a subset-sum over the groups' feasible layer counts.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from atoll.solvers.perf import PerfFactors, RequestShape, load_factors, node_profile
from atoll.solvers.types import ModelSpec, NodeConfig, Phase, Stage

DEFAULT_SHAPE = RequestShape()


@dataclass(frozen=True)
class ProfileTable:
    """Node profiles of a set of configs for every stage count up to ``max_stages``.

    ``last[S-1]`` / ``send[S-1]``: arrays (configs x layers); entry [c, j-1] is the tokens/s of
    config c holding j layers within budget/S, without / with the activation send of a non-last
    stage. ``send[0]`` is unused (a single stage is last) and left as zeros.
    """

    configs: tuple[NodeConfig, ...]
    layers: int
    last: tuple[np.ndarray, ...]
    send: tuple[np.ndarray, ...]
    monotone: bool

    @property
    def max_stages(self) -> int:
        return len(self.last)


def profile_table(model: ModelSpec, configs: Sequence[NodeConfig], phase: Phase, budget_ms: float, *,
                  max_stages: int, shape: RequestShape = DEFAULT_SHAPE,
                  factors: PerfFactors | None = None, min_chunk_tokens: float = 0.0) -> ProfileTable:
    """``min_chunk_tokens``: a co-located replica's smallest prompt chunk (see
    :func:`atoll.solvers.perf.node_profile`); the same for every stage, since each chunk passes
    through all of them within the TPOT budget."""
    f = factors or load_factors()
    n_layers = model.layers
    stages = max(1, min(max_stages, n_layers))
    last: list[np.ndarray] = []
    send: list[np.ndarray] = []
    for s in range(1, stages + 1):
        for send_act, out in ((False, last), (True, send)):
            arr = np.zeros((len(configs), n_layers))
            if s > 1 or not send_act:
                for ci, cfg in enumerate(configs):
                    for j in range(1, n_layers + 1):
                        arr[ci, j - 1] = node_profile(model, cfg, j, phase, budget_ms / s, shape=shape,
                                                      factors=f, send_activations=send_act,
                                                      min_chunk_tokens=min_chunk_tokens)
                        if arr[ci, j - 1] == 0.0:
                            break  # zero stays zero: more layers, less memory and slower steps
            out.append(arr)
    monotone = all(bool(np.all(np.diff(a, axis=1) <= 0.0)) for a in (*last, *send))
    return ProfileTable(tuple(configs), n_layers, tuple(last), tuple(send), monotone)


@dataclass(frozen=True)
class Placement:
    """An exact optimum: throughput, and stages in pipeline order as (layers, config indices)."""

    throughput: float
    stages: tuple[tuple[int, tuple[int, ...]], ...]


def _set_partitions(n: int) -> list[list[int]]:
    """Every set partition of range(n) as a restricted-growth string (block id per element)."""
    out: list[list[int]] = []

    def grow(prefix: list[int], blocks: int) -> None:
        if len(prefix) == n:
            out.append(list(prefix))
            return
        for b in range(blocks + 1):
            prefix.append(b)
            grow(prefix, max(blocks, b + 1))
            prefix.pop()

    grow([], 0)
    return out


@cache
def _membership(n: int) -> np.ndarray:
    """Row m-1 is the 0/1 membership vector of node mask m (m = 1 .. 2^n-1)."""
    masks = np.arange(1, 1 << n)
    return ((masks[:, None] >> np.arange(n)[None, :]) & 1).astype(float)


@cache
def _combos(pattern: tuple[int, ...], stages: int) -> tuple[np.ndarray, np.ndarray]:
    """(non-last group mask rows [K, S-1], last group mask row [K]) for every distinct way to split
    nodes with repetition ``pattern`` (nodes of one config adjacent) into ``stages`` groups.

    Nodes of one config are interchangeable and non-last stages are interchangeable (only the
    last one skips the activation send), so a split is identified by the multiset of its non-last
    groups' config counts plus its last group's config counts.
    """
    n = sum(pattern)
    kind = [k for k, c in enumerate(pattern) for _ in range(c)]
    seen: set[tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]] = set()
    nonlast: list[list[int]] = []
    last: list[int] = []
    for rgs in _set_partitions(n):
        if max(rgs) + 1 != stages:
            continue
        masks = [0] * stages
        counts = [[0] * len(pattern) for _ in range(stages)]
        for node, b in enumerate(rgs):
            masks[b] |= 1 << node
            counts[b][kind[node]] += 1
        for li in range(stages):
            key = (tuple(sorted(tuple(counts[b]) for b in range(stages) if b != li)), tuple(counts[li]))
            if key in seen:
                continue
            seen.add(key)
            nonlast.append([masks[b] - 1 for b in range(stages) if b != li])
            last.append(masks[li] - 1)
    return np.array(nonlast, dtype=np.intp).reshape(len(last), stages - 1), np.array(last, dtype=np.intp)


def _split_layers(values: list[np.ndarray], n_layers: int) -> list[int]:
    """Layers per group maximizing the minimum of values[g][j-1] (each nonincreasing in j).

    Greedy water-filling is exact here: while layers remain, some group's next value is >= the
    optimum, and the greedy takes the largest next value. Ties go to the earliest group.
    """
    take = [1] * len(values)
    heap = [(-float(v[1]), g) for g, v in enumerate(values) if len(v) > 1]
    heapq.heapify(heap)
    for _ in range(n_layers - len(values)):
        _, g = heapq.heappop(heap)
        take[g] += 1
        if take[g] < len(values[g]):
            heapq.heappush(heap, (-float(values[g][take[g]]), g))
    return take


def _general_split(values: list[np.ndarray], n_layers: int) -> tuple[float, list[int]] | None:
    """Exact max-min split for profiles of any shape: bisection over the candidate throughputs,
    feasibility by subset-sum (bitsets) over each group's allowed layer counts."""
    full = (1 << (n_layers + 1)) - 1

    def reach(tau: float) -> list[int] | None:
        steps = [1]
        for v in values:
            allowed = [j for j in range(1, n_layers + 1) if v[j - 1] >= tau]
            nxt = 0
            for j in allowed:
                nxt |= steps[-1] << j
            steps.append(nxt & full)
        return steps if steps[-1] >> n_layers & 1 else None

    cands = sorted({float(x) for v in values for x in v if x > 0.0})
    lo, hi, best = 0, len(cands) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if reach(cands[mid]) is not None:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    if best is None:
        return None
    tau = cands[best]
    steps = reach(tau)
    assert steps is not None
    take, rest = [0] * len(values), n_layers
    for g in range(len(values) - 1, -1, -1):  # walk back through the reachable sums
        for j in range(1, rest + 1):
            if values[g][j - 1] >= tau and steps[g] >> (rest - j) & 1:
                take[g], rest = j, rest - j
                break
    return tau, take


def solve(table: ProfileTable, multiset: Sequence[int], *, one_node_per_stage: bool = False,
          last_configs: frozenset[int] | None = None) -> Placement:
    """Exact best placement of the nodes ``multiset`` (config indices into ``table``).

    ``one_node_per_stage`` restricts it to pipelines of single nodes (stock vLLM's shape, see
    :mod:`atoll.solvers.runtime`): only the stage count n is searched, where the only choices are
    which node is last and the layer split. ``last_configs`` (config indices) restricts which
    configs the last stage's nodes may be."""
    nodes = sorted(multiset)
    n, n_layers = len(nodes), table.layers
    if n == 0:
        raise ValueError("a placement needs at least one node")
    pattern = tuple(nodes.count(c) for c in sorted(set(nodes)))
    memb = _membership(n)
    best_tau, best = 0.0, None
    top = min(n, n_layers, table.max_stages)
    for s in range(n if one_node_per_stage else 1, top + 1):
        g_last = memb @ table.last[s - 1][nodes]
        g_send = memb @ table.send[s - 1][nodes]
        nonlast, last = _combos(pattern, s)
        if last_configs is not None:
            ok = np.array([all(nodes[i] in last_configs for i in range(n) if (m + 1) >> i & 1) for m in last],
                          dtype=bool)
            nonlast, last = nonlast[ok], last[ok]
            if not len(last):
                continue
        if table.monotone:
            vals = np.concatenate([g_send[nonlast].reshape(len(last), -1), g_last[last]], axis=1)
            cut = vals.shape[1] - n_layers
            tau = np.partition(vals, cut, axis=1)[:, cut]
            first = g_last[last, 0]
            if s > 1:
                first = np.minimum(first, g_send[nonlast, 0].min(axis=1))
            tau = np.minimum(tau, first)
            k = int(np.argmax(tau))
            if tau[k] > best_tau:
                groups = [*nonlast[k], last[k]]
                values = [g_send[m] for m in nonlast[k]] + [g_last[last[k]]]
                best_tau, best = float(tau[k]), (groups, _split_layers(values, n_layers))
        else:
            for k in range(len(last)):
                values = [g_send[m] for m in nonlast[k]] + [g_last[last[k]]]
                got = _general_split(values, n_layers)
                if got is not None and got[0] > best_tau:
                    best_tau, best = got[0], ([*nonlast[k], last[k]], got[1])
    if best is None:
        return Placement(0.0, ())
    groups, take = best
    s = len(groups)
    stages = []
    for mask_row, j in zip(groups, take, strict=True):
        members = tuple(nodes[i] for i in range(n) if (mask_row + 1) >> i & 1)
        stages.append((j, members))
    # Recomputed with an exactly rounded sum so equal placements compare equal bit for bit.
    thr = min(
        math.fsum(float((table.last if pos == s - 1 else table.send)[s - 1][c, j - 1]) for c in members)
        for pos, (j, members) in enumerate(stages)
    )
    return Placement(thr, tuple(stages))


def best_placement(model: ModelSpec, configs: Sequence[NodeConfig], phase: Phase, budget_ms: float, *,
                   shape: RequestShape = DEFAULT_SHAPE, factors: PerfFactors | None = None,
                   min_chunk_tokens: float = 0.0) -> tuple[float, tuple[Stage, ...]]:
    """Exact throughput-optimal placement of the multiset ``configs`` (every node used).

    Returns (tokens/s, stages in pipeline order); (0.0, ()) when no placement serves at all.
    """
    if not configs:
        raise ValueError("configs: a placement needs at least one node config")
    distinct = sorted({c.name: c for c in configs}.values(), key=lambda c: c.name)
    index = {c.name: i for i, c in enumerate(distinct)}
    table = profile_table(model, distinct, phase, budget_ms, max_stages=len(configs), shape=shape,
                          factors=factors, min_chunk_tokens=min_chunk_tokens)
    placed = solve(table, [index[c.name] for c in configs])
    return placed.throughput, to_stages(placed, distinct)


def to_stages(placed: Placement, configs: Sequence[NodeConfig]) -> tuple[Stage, ...]:
    return tuple(Stage(j, tuple(sorted(configs[c].name for c in members))) for j, members in placed.stages)
