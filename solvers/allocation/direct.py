"""The cost stage of a round built straight into HiGHS's arrays, without PuLP.

The simulator and the controller solve thousands of small cost-mode blocks a day; building each
through PuLP (one Python object per variable and term, a name per column, a sort by name) cost
several times what HiGHS spends solving them. This builder writes the same model as
:func:`atoll.solvers.allocation.model.build_model` for stage ``cost`` — the same columns in the
same order (PuLP orders them by name: every ``added`` column, then every ``inst`` column), the
same rows in the same order (start-up rows, availability rows by (region, config), demand rows),
the same costs and bounds — so HiGHS sees the identical model and returns the identical plan. It
covers whole-node libraries without the one-type rule or a removal price, risk included (a
headroom is a larger demand, spread and on-demand floor rows follow the demand rows, as
:func:`~atoll.solvers.allocation.model.risk_rows` adds them); every other round goes
through PuLP (:mod:`~atoll.solvers.allocation.model`), which stays the readable statement of the
ILP and the oracle this builder is tested against.

A block with one demand row and no availability row — most of a simulated day's — is answered
by the exact search of :mod:`~atoll.solvers.allocation.knapsack` instead of HiGHS, with HiGHS
as its fallback past the search's node limit (``engine`` says which answered).

Runs are checked as :mod:`~atoll.solvers.allocation.highs` checks PuLP's: the returned point's
own cost against HiGHS's objective and dual bound, repeated with presolve off, then cold.

Two reuses, because a block this small costs HiGHS about a millisecond of fixed work per run and
a simulated day runs thousands: one ``Highs`` object per thread is cleared and refilled rather
than constructed, its options reset to the same values every run; and a run whose answer passed
its checks is remembered under its exact arrays (costs, bounds, rows, start, gap), so the same
block asked again — a service whose rounded demand and running plan did not move — returns the
same answer without a solve (a pure function of the key, so a simulation stays deterministic;
the answer reports the seconds its solve took, so totals do not depend on what ran before). Runs
under a time limit that did not prove their answer are not remembered; a run stopped by its node
limit is (where a count stops does not depend on the machine).
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import highspy
import numpy as np
import pulp

from atoll.solvers.allocation.highs import HIGHS_OPTIONS, HighsOption, doubt, proven, repeats, run_checked
from atoll.solvers.allocation.knapsack import cover
from atoll.solvers.allocation.reduction import RoundInstance
from atoll.solvers.problem import Allocation, is_spot_region, model_of

# Bump when the plan a solve returns may change for the same problem (it keys cached rule grids).
# 2: blocks of one demand row answered by the covering search; its choice among plans of equal
# cost, or within the gap of the start, is not HiGHS's, so trajectories of a simulation move.
# 3: the simulator's re-plans stop at a node limit (FleetConfig.solver_node_limit) before their
# time limit: a run past 5,000 nodes keeps its incumbent where it used to run on to the clock.
SOLVER_VERSION = 3
_INF = highspy.kHighsInf
_MEMO_SIZE = 4096  # answers kept per process (a few hundred bytes each)


@dataclass(frozen=True)
class _Answer:
    """A checked run's outcome (:class:`DirectRun`'s fields that rounds read)."""

    sol_status: int
    stop: str
    bound: float | None
    reported_objective: float | None
    x: np.ndarray | None
    start_status: highspy.HighsStatus | None
    solve_seconds: float
    guard_reasons: tuple[str, ...]


# a one-row block as the covering search takes it: costs, extra costs, held, bounds, widths, demand
_Cover = tuple[list[float], list[float], list[int], list[int], list[float], float]

_ANSWERS: OrderedDict[bytes, _Answer] = OrderedDict()
_ANSWERS_LOCK = threading.Lock()
_LOCAL = threading.local()


def _solver() -> highspy.Highs:
    """This thread's HiGHS object, cleared (see the module docstring)."""
    h: highspy.Highs | None = getattr(_LOCAL, "highs", None)
    if h is None:
        h = _LOCAL.highs = highspy.Highs()
    else:
        h.clearModel()
        h.resetOptions()
    return h


def supports(inst: RoundInstance, stage: str, solver: str) -> bool:
    """Whether this builder states the round's model exactly (else PuLP builds it)."""
    p = inst.problem
    return (stage == "cost" and solver == "highs" and p.per_model_rule is None
            and not p.index.sliced_rcs and p.removal_weight == 0)


class DirectRun:
    """One cost-stage solve built as arrays: the interface of
    :class:`~atoll.solvers.allocation.highs.SolverRun` that rounds read (``sol_status``,
    ``proven``, ``bound``, ``stop``, ``start_status``, timings, ``guard_resolves``) and the
    instances per template key (``values``)."""

    def __init__(self, inst: RoundInstance, start: Allocation | None, time_limit: float | None,
                 gap: float, node_limit: int | None = None) -> None:
        t0 = time.perf_counter()
        self.gap = gap
        self.node_limit = node_limit
        self.start_status: highspy.HighsStatus | None = None
        self.bound: float | None = None
        self.reported_objective: float | None = None
        self.solve_seconds = 0.0
        self.engine = "highs"  # or "search" (the covering search), "memo" (a remembered answer)
        self._build(inst)
        self._start = self._start_vector(inst, start) if start is not None else None
        self.model_seconds = time.perf_counter() - t0

        def attempt(use_start: bool, extra: Mapping[str, HighsOption]) -> str | None:
            self._run(self._start if use_start else None, time_limit, extra)
            return doubt(self.column_objective, self.reported_objective, self.bound, self.sol_status, gap)

        warm = self._start is not None
        key = self._key(time_limit)
        with _ANSWERS_LOCK:
            known = _ANSWERS.get(key)
            if known is not None:
                _ANSWERS.move_to_end(key)
        if known is not None:
            self.engine = "memo"
            self._recall(known)
        elif self._covered():
            self.engine = "search"
            self.guard_reasons = []
            self._remember(key)
        else:
            self.guard_reasons = run_checked(attempt, warm)
            if time_limit is None or self.proven or self.stop == "kSolutionLimit":
                self._remember(key)  # a node limit stops where the count says: the same answer again
        self.guard_resolves = repeats(self.guard_reasons, warm)

    # ---- the model ----

    def _build(self, inst: RoundInstance) -> None:
        p = inst.problem
        ix = p.index
        k = p.startup_weight
        free = inst.free
        n = len(free)
        # the block's columns as rows of the library's index: costs, demand rows and node entries
        # are gathered from its arrays, not from a template object per column (7,500 blocks a
        # fleet20 day); every value and every row's term order are the per-template loop's
        pos = inst.free_pos
        running = inst.running.counts_of(free)
        self._running = np.asarray(running, dtype=np.float64)
        cost = p.costs[pos]
        new = self._running == 0
        x_cost = np.where(new, cost * (1.0 + k), cost)
        added: list[int] = np.flatnonzero(~new).tolist() if k > 0 else []  # column of each added one
        n_add = len(added)
        self.n_added = n_add
        self._added = added
        self.keys = free
        bound_list = [inst.bound[key] for key in free]
        bounds = np.asarray(bound_list, dtype=np.float64)
        a_cost = cost[added] * k
        self.costs = np.concatenate([a_cost, x_cost])
        self.upper = np.concatenate([bounds[added] if n_add else np.zeros(0), bounds])
        starts: list[int] = []
        index: list[int] = []
        value: list[float] = []
        lower: list[float] = []
        upper: list[float] = []

        def row(terms: list[tuple[int, float]], lo: float, hi: float) -> None:
            starts.append(len(index))
            for col, coef in terms:
                index.append(col)
                value.append(coef)
            lower.append(lo)
            upper.append(hi)

        for j, i in enumerate(added):  # a_t - x_t >= -r_t
            row([(j, 1.0), (n_add + i, -1.0)], -float(running[i]), _INF)
        by_rc: dict[tuple[str, str], list[tuple[int, float]]] = {}
        if inst.rows and n:
            rcs = ix.rcs
            rc_ids, cols, uses = inst.built_entries(pos)
            for r, col, use in zip(rc_ids.tolist(), (cols + n_add).tolist(), uses.tolist(), strict=True):
                by_rc.setdefault(rcs[r], []).append((col, use))
        by_service: dict[str, list[tuple[int, float]]] = {}
        names = ix.services
        own = zip(ix.cover1[pos].tolist(), ix.throughput[pos].tolist(), strict=True)
        for col, (sid, thr) in enumerate(own):
            by_service.setdefault(names[sid], []).append((n_add + col, thr))
        if ix.any_colocated:
            second = ix.cover2[pos]
            for col in np.flatnonzero(second >= 0).tolist():
                by_service.setdefault(names[int(second[col])], []).append(
                    (n_add + col, float(ix.throughput2[pos[col]])))
            for terms in by_service.values():
                terms.sort()  # in column order, as one pass over the templates' covers gives them
        regions = [p.template(key).region for key in free] if p.risk else []  # for the risk rows
        risk = self._risk_rows(inst, by_service, regions, n_add) if p.risk else []
        self._knapsack: _Cover | None = None
        one_row = not by_rc and not risk and len(inst.services) == 1
        if one_row and k >= 0 and (x_cost >= 0).all() and all(float(b).is_integer() for b in bound_list):
            service = inst.services[0]
            widths = [0.0] * n
            for col, coef in by_service.get(service, []):
                widths[col - n_add] = coef
            held = [int(r) for r in running] if k > 0 else [0] * n
            x_list = x_cost.tolist()
            extra = [x if h == 0 else x * (1.0 + k) for x, h in zip(x_list, held, strict=True)]
            self._knapsack = (x_list, extra, held, [int(b) for b in bound_list], widths,
                              float(inst.target(service)))
        for rc in sorted(by_rc):
            row(by_rc[rc], -_INF, inst.residual[rc])
        for s in inst.services:
            row(by_service.get(s, []), inst.target(s), _INF)
        for terms, lo in risk:
            row(terms, lo, _INF)
        self._rows = (np.asarray(starts, dtype=np.int32), np.asarray(index, dtype=np.int32),
                      np.asarray(value, dtype=np.float64), np.asarray(lower), np.asarray(upper))

    @staticmethod
    def _risk_rows(inst: RoundInstance, by_service: dict[str, list[tuple[int, float]]], regions: list[str],
                   n_add: int) -> list[tuple[list[tuple[int, float]], float]]:
        """The spread and on-demand floor rows (terms, lower bound) in
        :func:`~atoll.solvers.allocation.model.risk_rows`'s order and arithmetic."""
        p = inst.problem
        held: dict[str, list[tuple[str, float]]] = {}
        for key, n in inst.floor.items():
            t = p.template(key)
            for s, thr in t.covers:
                held.setdefault(s, []).append((t.region, n * thr))
        pools = set(regions) | {r for hs in held.values() for r, _ in hs}
        spot = sorted(z for z in pools if is_spot_region(z))
        out: list[tuple[list[tuple[int, float]], float]] = []
        for s in inst.services:
            risk = p.risk_of(model_of(s))
            rows: list[tuple[float, frozenset[str]]] = []
            if risk.spread < 1:
                rows += [(1 - risk.spread, frozenset(pools - {z})) for z in spot]
            if risk.ondemand_floor > 0:
                rows.append((risk.ondemand_floor, frozenset(r for r in pools if not is_spot_region(r))))
            need = p.planning_demand(s)
            for coef, counted in rows:
                terms = [(col, th) for col, th in by_service.get(s, []) if regions[col - n_add] in counted]
                const = sum(h for r, h in held.get(s, []) if r in counted)
                out.append((terms, coef * need - const))
        return out

    def _key(self, time_limit: float | None) -> bytes:
        h = hashlib.blake2b(digest_size=20)
        starts, index, value, lower, upper = self._rows
        for part in (self.costs, self.upper, starts, index, value, lower, upper):
            h.update(np.ascontiguousarray(part).tobytes())
            h.update(b"|")
        h.update(b"start" + (self._start.tobytes() if self._start is not None else b"-"))
        h.update(repr((self.n_added, self.gap, time_limit is None, self.node_limit)).encode())
        return h.digest()

    def _remember(self, key: bytes) -> None:
        if self._x is not None:
            self._x.flags.writeable = False  # shared by every recall of the answer
        answer = _Answer(self.sol_status, self.stop, self.bound, self.reported_objective, self._x,
                         self.start_status, self.solve_seconds, tuple(self.guard_reasons))
        with _ANSWERS_LOCK:
            _ANSWERS[key] = answer
            while len(_ANSWERS) > _MEMO_SIZE:
                _ANSWERS.popitem(last=False)

    def _recall(self, known: _Answer) -> None:
        self.sol_status, self.stop, self.bound = known.sol_status, known.stop, known.bound
        self.reported_objective, self._x = known.reported_objective, known.x
        self.start_status, self.solve_seconds = known.start_status, known.solve_seconds
        self.guard_reasons = list(known.guard_reasons)

    def _start_vector(self, inst: RoundInstance, start: Allocation) -> np.ndarray:
        """The start as a full column vector, as :func:`~atoll.solvers.allocation.model.start_values`
        gives it: x clipped to its bound (less a grow model's floor), a = max(0, x - r)."""
        held = np.asarray(start.counts_of(self.keys), dtype=np.float64)
        if inst.floor:
            held -= np.asarray([inst.floor.get(key, 0) for key in self.keys], dtype=np.float64)
        # integers as floats: the same values as min(max(start - floor, 0), bound) key by key
        x = np.minimum(np.maximum(held, 0.0), self.upper[self.n_added:])
        a = np.maximum(0.0, x[self._added] - self._running[self._added])
        return np.concatenate([a, x])

    def _highs(self, time_limit: float | None, extra: Mapping[str, HighsOption]) -> highspy.Highs:
        h = _solver()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("mip_rel_gap", self.gap)
        if time_limit is not None:
            h.setOptionValue("time_limit", float(time_limit))
        if self.node_limit is not None:
            h.setOptionValue("mip_max_nodes", int(self.node_limit))
        for key, val in {**HIGHS_OPTIONS, **extra}.items():
            h.setOptionValue(key, val)
        n = len(self.costs)
        h.addCols(n, self.costs, np.zeros(n), self.upper, 0, np.zeros(n, dtype=np.int32),
                  np.zeros(0, dtype=np.int32), np.zeros(0))
        ints = np.arange(self.n_added, n, dtype=np.int32)
        if len(ints):
            h.changeColsIntegrality(len(ints), ints, np.ones(len(ints), dtype=np.uint8))
        starts, index, value, lower, upper = self._rows
        if len(starts):
            h.addRows(len(starts), lower, upper, len(index), starts, index, value)
        return h

    # ---- a block with one demand row: the exact search of atoll.solvers.allocation.knapsack ----

    def _covered(self) -> bool:
        """Answer the block by :func:`~atoll.solvers.allocation.knapsack.cover` when it has one
        demand row and no availability row; False (HiGHS runs) otherwise or past its node limit."""
        if self._knapsack is None:
            return False
        costs, extra, held, units, widths, demand = self._knapsack
        n_add = self.n_added
        start = None if self._start is None else np.rint(self._start[n_add:]).astype(np.int64).tolist()
        t0 = time.perf_counter()
        found = cover(costs, extra, held, units, widths, demand, gap=self.gap, start=start)
        if found is None:
            return False
        self.solve_seconds = time.perf_counter() - t0
        if start is not None:
            self.start_status = highspy.HighsStatus.kOk
        if found.counts is None:
            self.sol_status, self.stop, self.bound, self.reported_objective = (
                pulp.LpSolutionInfeasible, "kInfeasible", None, None)
            self._x = None
            return True
        x = np.asarray(found.counts, dtype=np.float64)
        a = np.maximum(0.0, x[self._added] - np.asarray(held, dtype=np.float64)[self._added])
        self._x = np.concatenate([a, x])
        self.sol_status, self.stop = pulp.LpSolutionOptimal, "kOptimal"
        self.bound, self.reported_objective = found.bound, found.objective
        return True

    # ---- one run and its checks ----

    def _run(self, start: np.ndarray | None, time_limit: float | None,
             extra: Mapping[str, HighsOption]) -> None:
        h = self._highs(time_limit, extra)
        if start is not None:
            status = h.setSolution(len(start), np.arange(len(start), dtype=np.int32), start)
            if self.start_status is None:
                self.start_status = status
        t0 = time.perf_counter()
        h.run()
        self.solve_seconds += time.perf_counter() - t0
        info = h.getInfo()
        model_status = h.getModelStatus()
        self.stop = str(model_status).rsplit(".", 1)[-1]
        self.bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else None
        reported = info.objective_function_value
        self.reported_objective = reported if math.isfinite(reported) else None
        if model_status == highspy.HighsModelStatus.kOptimal:
            self.sol_status = pulp.LpSolutionOptimal
        elif model_status == highspy.HighsModelStatus.kInfeasible:
            self.sol_status = pulp.LpSolutionInfeasible
        elif info.primal_solution_status == 2:  # kSolutionStatusFeasible: stopped with an incumbent
            self.sol_status = pulp.LpSolutionIntegerFeasible
        else:
            self.sol_status = pulp.LpSolutionNoSolutionFound
        self._x = np.asarray(h.getSolution().col_value) if self.has_point else None

    @property
    def has_point(self) -> bool:
        return self.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)

    @property
    def column_objective(self) -> float | None:
        return None if self._x is None else float(self.costs @ self._x)

    @property
    def proven(self) -> bool:
        return proven(self.column_objective, self.bound, self.sol_status, self.gap)

    def values(self) -> dict[str, float | None]:
        """Instances per template key (beyond a grow model's floor), None without a point."""
        if self._x is None:
            return dict.fromkeys(self.keys)
        x = self._x[self.n_added:]
        return {key: float(x[i]) for i, key in enumerate(self.keys)}
