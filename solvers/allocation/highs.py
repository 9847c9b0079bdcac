"""The solver backend: PuLP's HiGHS interface with a warm start and a bulk model build, one solve
of a built model (HiGHS or CBC) with its timings and dual bound, and the status it maps to.

PuLP 3.3's ``HiGHS`` class ignores ``warmStart`` and adds the model one column and one row at a
time. This subclass keeps PuLP's status mapping (``findSolutionValues`` sets ``prob.status`` and
``prob.sol_status``) but builds the matrix with one ``addCols``/``addRows`` call each and hands
the start to ``Highs.setSolution`` after the rows exist, right before ``run()``.

**A start HiGHS's presolve mistranslates.** HiGHS 1.16.0 (the newest release; 1.14.0 and 1.15.1
solve the same warm-started block correctly, so it is a regression) maps a MIP start into the
presolved space by dropping the columns presolve removed. When presolve fixes a column the start
uses (a dominated column of a one-row block, say) the start becomes "feasible in the reduced space"
with that space's objective, 0 when every kept column is 0 there;
HiGHS takes it as the incumbent, its dual bound meets it at once, and the run ends ``kOptimal``
with objective 0 while the returned point is the start itself, whose columns cost what they
cost. Nothing in HiGHS's own status tells the two apart, so every run is checked against its
columns: the objective of the returned point (from the model's own costs) must equal HiGHS's
objective value, and its gap to HiGHS's dual bound must be within the tolerance. A run that fails
either check is repeated with presolve off (the start then stays in the original space), then cold
(no start, presolve on); a run that still fails is reported as ``feasible``, never ``optimal``.
The repeats are counted (``SolverRun.guard_resolves``) and reach the result's metadata.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import highspy
import numpy as np
import pulp
from pulp import constants

from atoll.solvers.problem import SolveStatus, within_tolerance

# HiGHS 1.15 runs the feasibility-jump heuristic at the root of every MIP and every sub-MIP: on
# these models ~10 ms a call for poor incumbents (the LP-based ones replace them). Off, 80
# re-optimizations of the extended scenario kept every objective and joint solves ran ~1.7x
# faster (median and p90); small per-service blocks would pay it ten times over their solve.
#
# One thread: HiGHS's default starts a worker pool whose hand-offs cost more than these models'
# whole solve: on a 21-column one-row block, a median 0.9 ms a run with one thread against
# 28-42 ms with the default; the branch-and-bound itself is serial either way, and the
# simulator's parallelism is its worker processes, one solver each.
HighsOption = bool | int | float | str
HIGHS_OPTIONS: dict[str, HighsOption] = {"mip_heuristic_run_feasibility_jump": False, "threads": 1}


def _banner_to_stderr() -> None:
    """HiGHS prints its banner on file descriptor 1 the first time a process constructs a solver,
    whatever its options; that would corrupt any stdout document (``--json``, the benchmarks'
    JSON). Construct the first one here with fd 1 on the null device: later ones print nothing."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):
        highspy.Highs()
        return
    try:
        os.dup2(null, 1)
        highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


_banner_to_stderr()


class WarmHiGHS(pulp.HiGHS):
    """HiGHS through highspy with an optional MIP start (variable name -> value), always with
    :data:`HIGHS_OPTIONS` under the caller's options. Why always: HiGHS's thread pool is one per
    process, sized by the first run; a later run asking another size fails before it starts
    (status ``kNotset``), so every HiGHS of the process must ask the same."""

    def __init__(self, *, start: Mapping[str, float] | None = None, **kwargs: Any) -> None:
        super().__init__(**{**HIGHS_OPTIONS, **kwargs})
        self.start = dict(start) if start else None
        self.start_status: highspy.HighsStatus | None = None
        self.model_seconds = 0.0
        self.run_seconds = 0.0

    def buildSolverModel(self, lp: pulp.LpProblem) -> None:  # noqa: N802 (PuLP's name)
        t0 = time.perf_counter()
        h = lp.solverModel
        inf = highspy.kHighsInf
        variables = lp.variables()
        mult = -1.0 if lp.sense == constants.LpMaximize else 1.0
        n = len(variables)
        costs = np.empty(n)
        lower = np.empty(n)
        upper = np.empty(n)
        integer: list[int] = []
        for i, var in enumerate(variables):
            var.index = i
            costs[i] = mult * lp.objective.get(var, 0.0)
            lower[i] = -inf if var.lowBound is None else var.lowBound
            upper[i] = inf if var.upBound is None else var.upBound
            if var.cat == constants.LpInteger and self.mip:
                integer.append(i)
        h.addCols(n, costs, lower, upper, 0, np.zeros(n, dtype=np.int32),
                  np.zeros(0, dtype=np.int32), np.zeros(0))
        if integer:
            h.changeColsIntegrality(len(integer), np.asarray(integer, dtype=np.int32),
                                    np.full(len(integer), 1, dtype=np.uint8))
        constraints = list(lp._constraints.values())
        m = len(constraints)
        row_lower = np.empty(m)
        row_upper = np.empty(m)
        starts = np.empty(m, dtype=np.int32)
        index: list[int] = []
        value: list[float] = []
        for r, con in enumerate(constraints):
            con.index = r
            starts[r] = len(index)
            for var, coef in con.items():
                if coef != 0:
                    index.append(var.index)
                    value.append(coef)
            lb, ub = con.getLb(), con.getUb()
            row_lower[r] = -inf if lb is None else lb
            row_upper[r] = inf if ub is None else ub
        if m:
            h.addRows(m, row_lower, row_upper, len(index), starts,
                      np.asarray(index, dtype=np.int32), np.asarray(value, dtype=np.float64))
        self.model_seconds = time.perf_counter() - t0

    def findSolutionValues(self, lp: pulp.LpProblem) -> tuple[int, int]:  # noqa: N802 (PuLP's name)
        # PuLP's table misses some stop reasons (e.g. kSolutionLimit after a node limit); map
        # any stop with an incumbent to "integer feasible" and the rest to "no solution".
        try:
            return tuple(super().findSolutionValues(lp))
        except KeyError:
            info = lp.solverModel.getInfo()
            if info.primal_solution_status == 2:  # kSolutionStatusFeasible
                solution = lp.solverModel.getSolution()
                for var in lp.variables():
                    var.varValue = solution.col_value[var.index]
                return constants.LpStatusOptimal, constants.LpSolutionIntegerFeasible
            return constants.LpStatusNotSolved, constants.LpSolutionNoSolutionFound

    def callSolver(self, lp: pulp.LpProblem) -> None:  # noqa: N802 (PuLP's name)
        h = lp.solverModel
        if self.start:
            variables = lp.variables()
            idx = np.arange(len(variables), dtype=np.int32)
            vals = np.array([float(self.start.get(v.name, 0.0)) for v in variables])
            self.start_status = h.setSolution(len(variables), idx, vals)
        t0 = time.perf_counter()
        h.run()
        self.run_seconds = time.perf_counter() - t0


def doubt(own: float | None, reported: float | None, bound: float | None, sol_status: int, gap: float,
          minimize: bool = True) -> str | None:
    """Why a run's answer cannot be taken as labelled (module docstring), or None when it can:
    ``own`` is the returned point's objective from the model's own costs (None: no point),
    ``reported`` and ``bound`` HiGHS's objective and dual bound in the model's sense."""
    if own is None:
        return None  # infeasible, or stopped without an incumbent: nothing to check
    if reported is not None and abs(own - reported) > 1e-6 * max(1.0, abs(own)):
        return f"objective {reported:.6g} reported for a point whose columns cost {own:.6g}"
    if sol_status == pulp.LpSolutionOptimal and not proven(own, bound, sol_status, gap, minimize):
        return f"'optimal' at {own:.6g} with dual bound {bound:.6g} (gap above {gap:g})"
    return None


def proven(own: float | None, bound: float | None, sol_status: int, gap: float,
           minimize: bool = True) -> bool:
    """The point's own objective is within ``gap`` of the dual bound; without a bound (CBC
    through PuLP) the status is all there is to go on."""
    if own is None:
        return False
    if bound is None:
        return bool(sol_status == pulp.LpSolutionOptimal)
    return within_tolerance(own - bound if minimize else bound - own, own, gap)


def run_checked(attempt: Callable[[bool, Mapping[str, HighsOption]], str | None], warm: bool
                ) -> list[str]:
    """Run ``attempt(use_start, extra_options)``, which solves and returns its :func:`doubt`,
    until an answer can be taken: as given, then (a warm run only) with presolve off, then cold.
    Returns the doubts of the runs whose answer was not taken; when every run is doubted, the
    last run's answer stands, labelled by its own proof."""
    plan: list[tuple[bool, dict[str, HighsOption]]] = [(True, {})]
    if warm:
        plan += [(True, {"presolve": "off"}), (False, {})]
    reasons: list[str] = []
    for use_start, extra in plan:
        reason = attempt(use_start, extra)
        if reason is None:
            break
        reasons.append(reason)
    return reasons


def repeats(reasons: list[str], warm: bool) -> int:
    """HiGHS runs repeated by :func:`run_checked` for these doubts."""
    return min(len(reasons), 2 if warm else 0)


class SolverRun:
    """One solve of a built model: HiGHS (with an optional MIP start, variable name -> value) or
    CBC. Keeps PuLP's solution status, HiGHS's dual bound and stop reason, the start status, the
    seconds spent building the solver's model and running it, the objective of the returned point
    computed from the model's own costs (``column_objective``), and how many times the HiGHS run
    was repeated because its answer failed the checks in the module docstring."""

    def __init__(self, prob: pulp.LpProblem, solver: str, time_limit: float | None, gap: float,
                 start: Mapping[str, float] | None, node_limit: int | None = None) -> None:
        t0 = time.perf_counter()
        self.bound: float | None = None
        self.start_status: highspy.HighsStatus | None = None
        self.reported_objective: float | None = None
        self.guard_resolves = 0
        self.guard_reasons: list[str] = []
        self.gap = gap
        self.minimize = prob.sense != constants.LpMaximize
        self.solve_seconds = self.model_seconds = 0.0
        if solver == "highs":
            limits: dict[str, HighsOption] = {} if node_limit is None else {"mip_max_nodes": int(node_limit)}

            def attempt(use_start: bool, extra: Mapping[str, HighsOption]) -> str | None:
                self._run_highs(prob, start if use_start else None, time_limit, gap, {**limits, **extra})
                own = (pulp.value(prob.objective) or 0.0) if self.has_point else None
                return doubt(own, self.reported_objective, self.bound, self.sol_status, gap, self.minimize)

            self.guard_reasons = run_checked(attempt, warm=bool(start))
            self.guard_resolves = repeats(self.guard_reasons, warm=bool(start))
        else:
            if start:
                for v in prob.variables():
                    if v.name in start:
                        v.setInitialValue(start[v.name])
            prob.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, gapRel=gap,
                                         warmStart=bool(start), maxNodes=node_limit))
            self.solve_seconds = time.perf_counter() - t0
            self.stop = pulp.LpStatus[prob.status]
        self.sol_status = prob.sol_status
        self.column_objective = pulp.value(prob.objective) if self.has_point else None

    @property
    def has_point(self) -> bool:
        return self.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)

    def _run_highs(self, prob: pulp.LpProblem, start: Mapping[str, float] | None,
                   time_limit: float | None, gap: float, extra: Mapping[str, HighsOption]) -> None:
        backend = WarmHiGHS(start=start, msg=False, timeLimit=time_limit, gapRel=gap, **extra)
        prob.solve(backend)
        info = prob.solverModel.getInfo()
        # HiGHS minimizes: a maximization reaches it negated (buildSolverModel), so its objective
        # and dual bound come back negated too
        sign = 1.0 if self.minimize else -1.0
        bound, reported = info.mip_dual_bound, info.objective_function_value
        self.bound = sign * bound if math.isfinite(bound) else None
        self.reported_objective = sign * reported if math.isfinite(reported) else None
        if start and self.start_status is None:
            self.start_status = backend.start_status
        self.solve_seconds += backend.run_seconds
        self.model_seconds += backend.model_seconds
        self.stop = str(prob.solverModel.getModelStatus()).rsplit(".", 1)[-1]
        self.sol_status = prob.sol_status

    @property
    def proven(self) -> bool:
        """The returned point's own objective is within the tolerance of the dual bound (HiGHS);
        CBC gives no bound through PuLP and is trusted on its status."""
        return proven(self.column_objective, self.bound, self.sol_status, self.gap, self.minimize)


class Run(Protocol):
    """What a round reads of a solve, whoever built the model (PuLP or arrays)."""

    sol_status: int
    stop: str
    bound: float | None
    start_status: highspy.HighsStatus | None
    guard_resolves: int
    model_seconds: float
    solve_seconds: float

    @property
    def proven(self) -> bool: ...

    @property
    def column_objective(self) -> float | None: ...


def status_of(run: Run) -> SolveStatus:
    """``optimal`` only for a point proven within the gap by its own objective and the dual bound;
    an incumbent HiGHS called optimal that fails that proof is ``feasible``."""
    if run.sol_status == pulp.LpSolutionOptimal:
        return SolveStatus.OPTIMAL if run.proven else SolveStatus.FEASIBLE
    if run.sol_status == pulp.LpSolutionIntegerFeasible:
        return SolveStatus.FEASIBLE_TIME_LIMIT
    if run.sol_status == pulp.LpSolutionInfeasible:
        return SolveStatus.INFEASIBLE
    return SolveStatus.ERROR


def failure_message(run: Run, status: SolveStatus) -> str:
    if status is SolveStatus.INFEASIBLE:
        return "infeasible"
    if run.stop in ("kTimeLimit", "Not Solved"):
        return "time limit reached before any feasible allocation was found"
    return f"solver stopped: {run.stop}"
