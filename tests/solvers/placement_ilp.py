"""The placement ILP of the Coral paper: the tests' independent oracle for :mod:`atoll.solvers.placement`.

For each stage count S (the per-stage budget budget/S fixes the node profiles p_S):

    x[i,s] in {0,1}   node i serves stage s              sum_s x[i,s] = 1,  sum_i x[i,s] >= 1
    y[s,j] in {0,1}   stage s holds j layers             sum_j y[s,j] = 1,  sum_s,j j*y[s,j] = L
    z[i,s,j] = x[i,s]*y[s,j], linearized                 z <= y,  z >= x + y - 1,  sum_j z[i,s,j] = x[i,s]
    T <= sum_i,j p_S(i, j, last = s == S-1) * z[i,s,j]   for every stage s
    maximize T

and the answer is the best S. It is far slower than the combinatorial solver, which is why the
library does not use it; the tests use it as a cross-check.
HiGHS (through PuLP) is the default solver and CBC the alternative.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pulp

from atoll.solvers.allocation.highs import WarmHiGHS
from atoll.solvers.perf import PerfFactors, RequestShape
from atoll.solvers.placement import DEFAULT_SHAPE, Placement, ProfileTable, profile_table, to_stages
from atoll.solvers.types import ModelSpec, NodeConfig, Phase, Stage

SOLVERS = ("highs", "cbc")


def _solver(name: str, time_limit: float | None) -> pulp.LpSolver:
    # A zero relative gap: the oracle must prove optimality, not stop within 0.01 %.
    if name == "highs":
        return WarmHiGHS(msg=False, gapRel=0.0, timeLimit=time_limit)  # the process's HiGHS options
    if name == "cbc":
        return pulp.PULP_CBC_CMD(msg=False, gapRel=0.0, timeLimit=time_limit)
    raise ValueError(f"solver {name!r} is not supported; valid solvers: {', '.join(SOLVERS)}")


def _solve_stages(table: ProfileTable, nodes: Sequence[int], stages: int, solver: str,
                  time_limit: float | None) -> Placement | None:
    n, n_layers = len(nodes), table.layers
    rng_n, rng_s = range(n), range(stages)
    rng_j = range(1, n_layers - stages + 2)  # every other stage holds >= 1 layer

    def prof(i: int, s: int, j: int) -> float:
        arr = table.last if s == stages - 1 else table.send
        return float(arr[stages - 1][nodes[i], j - 1])

    prob = pulp.LpProblem("coral_placement", pulp.LpMaximize)
    x = {(i, s): prob.add_variable(f"x_{i}_{s}", cat=pulp.LpBinary) for i in rng_n for s in rng_s}
    y = {(s, j): prob.add_variable(f"y_{s}_{j}", cat=pulp.LpBinary) for s in rng_s for j in rng_j}
    z = {(i, s, j): prob.add_variable(f"z_{i}_{s}_{j}", 0, 1) for i in rng_n for s in rng_s for j in rng_j}
    top = max(float(table.last[stages - 1].max()), float(table.send[stages - 1].max()), 1.0)
    t = prob.add_variable("T", 0, top * n)
    prob += t
    for i in rng_n:
        prob += pulp.lpSum(x[i, s] for s in rng_s) == 1
    for s in rng_s:
        prob += pulp.lpSum(x[i, s] for i in rng_n) >= 1
        prob += pulp.lpSum(y[s, j] for j in rng_j) == 1
    prob += pulp.lpSum(j * y[s, j] for s in rng_s for j in rng_j) == n_layers
    for (i, s, j), v in z.items():
        prob += v <= y[s, j]
        prob += v >= x[i, s] + y[s, j] - 1
    # Summing z = x*y over j (one layer count per stage) gives x: implied by the products, but
    # the LP relaxation of the plain big-M rows is weak, and this makes the oracle ~10x faster.
    for i in rng_n:
        for s in rng_s:
            prob += pulp.lpSum(z[i, s, j] for j in rng_j) == x[i, s]
    # Symmetry: non-last stages may be permuted (order them by layers) and nodes of one config
    # swapped (order them by stage); both together keep an optimum.
    for s in range(stages - 2):
        prob += (pulp.lpSum(j * y[s, j] for j in rng_j) <= pulp.lpSum(j * y[s + 1, j] for j in rng_j))
    for i in range(n - 1):
        if nodes[i] == nodes[i + 1]:
            prob += pulp.lpSum(s * x[i, s] for s in rng_s) <= pulp.lpSum(s * x[i + 1, s] for s in rng_s)
    for s in rng_s:
        prob += t <= pulp.lpSum(prof(i, s, j) * z[i, s, j] for i in rng_n for j in rng_j)
    prob.solve(_solver(solver, time_limit))
    status = pulp.LpStatus[prob.status]
    if status != "Optimal" or prob.sol_status != pulp.LpSolutionOptimal:
        if status == "Infeasible":
            return None
        raise RuntimeError(f"placement ILP (S={stages}, {solver}) ended with status {status!r}")
    placed = []
    for s in rng_s:
        j = next(j for j in rng_j if (y[s, j].value() or 0.0) > 0.5)
        placed.append((j, tuple(nodes[i] for i in rng_n if (x[i, s].value() or 0.0) > 0.5)))
    # The objective is only as exact as the solver's tolerances; recompute it from the profiles.
    thr = min(math.fsum(prof(i, s, j) for i in rng_n if (x[i, s].value() or 0.0) > 0.5)
              for s, (j, _) in enumerate(placed))
    return Placement(thr, tuple(placed))


def solve_placement(model: ModelSpec, configs: Sequence[NodeConfig], phase: Phase, budget_ms: float, *,
                    shape: RequestShape = DEFAULT_SHAPE, factors: PerfFactors | None = None,
                    solver: str = "highs", time_limit: float | None = None,
                    ) -> tuple[float, tuple[Stage, ...]]:
    """Same contract as :func:`atoll.solvers.placement.best_placement`, solved as ILPs (one per S)."""
    if not configs:
        raise ValueError("configs: a placement needs at least one node config")
    if solver not in SOLVERS:
        raise ValueError(f"solver {solver!r} is not supported; valid solvers: {', '.join(SOLVERS)}")
    distinct = sorted({c.name: c for c in configs}.values(), key=lambda c: c.name)
    index = {c.name: i for i, c in enumerate(distinct)}
    nodes = sorted(index[c.name] for c in configs)
    table = profile_table(model, distinct, phase, budget_ms, max_stages=len(nodes), shape=shape,
                          factors=factors)
    best: Placement | None = None
    for stages in range(1, min(len(nodes), model.layers) + 1):
        got = _solve_stages(table, nodes, stages, solver, time_limit)
        if got is not None and got.throughput > 0 and (best is None or got.throughput > best.throughput):
            best = got
    if best is None:
        return 0.0, ()
    return best.throughput, to_stages(best, distinct)
