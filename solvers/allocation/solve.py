"""Solving the allocation ILP: row generation over rounds, each round's stages, and the blocks a
cost-mode round splits into.

Availability rows are generated lazily: a round enforces only the rows found violated so far
(plus rows without room for a node) and prunes templates dominated under them; when a round's
optimum satisfies every row it is optimal for the full problem too (a relaxation's optimum that
is feasible is optimal). After MAX_ROUNDS rounds every row is enforced. The model of a round is
in :mod:`~atoll.solvers.allocation.model`, its reduction in
:mod:`~atoll.solvers.allocation.reduction`, the block argument in
:mod:`~atoll.solvers.allocation.blocks`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from atoll.solvers.allocation import direct, kinds
from atoll.solvers.allocation.blocks import combined_start_status, split_blocks
from atoll.solvers.allocation.diagnosis import FEAS_TOL, diagnose_infeasible
from atoll.solvers.allocation.direct import DirectRun
from atoll.solvers.allocation.highs import SolverRun, failure_message, status_of
from atoll.solvers.allocation.model import build_model, extract, start_values
from atoll.solvers.allocation.reduction import RoundInstance
from atoll.solvers.packing import pack_plan
from atoll.solvers.problem import Allocation, AllocationProblem, AllocationResult, SolveStatus

SOLVERS = ("highs", "cbc")
MAX_ROUNDS = 12


@dataclass
class _Stage:
    """One solved stage: the run, instances per template key, whether a start was given."""

    run: SolverRun | DirectRun
    values: Mapping[str, float | None]
    started: bool


@dataclass
class _Round:
    """The outcome of solving one round (one set of enforced rows), all stages."""

    status: SolveStatus
    allocation: Allocation | None = None
    bound: float | None = None
    message: str = ""
    complete: bool = True  # every stage solved (goodput stage 2 may fail and keep stage 1)


def combined_status(statuses: list[SolveStatus]) -> SolveStatus:
    """One status for solves that make one plan (stages, blocks): optimal only if every one is;
    a stop at a limit outranks an unproven ``optimal``."""
    if all(s is SolveStatus.OPTIMAL for s in statuses):
        return SolveStatus.OPTIMAL
    if any(s is SolveStatus.FEASIBLE_TIME_LIMIT for s in statuses):
        return SolveStatus.FEASIBLE_TIME_LIMIT
    return SolveStatus.FEASIBLE


def _violated_rows(inst: RoundInstance, allocation: Allocation) -> set[tuple[str, str]]:
    p = inst.problem
    use: dict[tuple[str, str], float] = defaultdict(float)
    for key, n in allocation.counts:
        t = p.template(key)
        for c, k in t.node_use:  # a sliced row's node variable keeps ceil(use) within availability
            use[(t.region, c)] += k * n
    return {rc for rc, u in use.items() if u > p.available(rc) + 1e-9}


class _Solver:
    """Runs the stages of one round and keeps the time and start bookkeeping across rounds."""

    def __init__(self, problem: AllocationProblem, solver: str, warm_start: Allocation | None,
                 decompose: bool) -> None:
        self.problem, self.solver, self.warm_start = problem, solver, warm_start
        self.decompose = decompose
        self.build = self.solve = 0.0
        self.start_status: object = None
        self.guard_resolves = 0  # HiGHS runs repeated by the checks of atoll.solvers.allocation.highs
        self.deadline = None if problem.time_limit is None else time.perf_counter() + problem.time_limit

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(self.deadline - time.perf_counter(), 0.05)

    def _stage(self, inst: RoundInstance, stage: str, floor_share: float | None,
               start_alloc: Allocation | None) -> _Stage:
        """Build and solve one stage of ``inst``: straight into HiGHS's arrays where
        :mod:`~atoll.solvers.allocation.direct` states the model, through PuLP otherwise."""
        tb = time.perf_counter()
        run: SolverRun | DirectRun
        if direct.supports(inst, stage, self.solver):
            run = DirectRun(inst, start_alloc, self.remaining(), self.problem.gap, self.problem.node_limit)
            self.build += run.model_seconds
            values = run.values()
            started = start_alloc is not None
        elif kinds.supports(inst):
            km = kinds.build_kind_model(inst, stage, floor_share)
            start = kinds.kind_start_values(inst, km, start_alloc) if start_alloc is not None else None
            self.build += time.perf_counter() - tb
            run = SolverRun(km.prob, self.solver, self.remaining(), self.problem.gap, start,
                            self.problem.node_limit)
            self.build += run.model_seconds
            values = km.values()
            started = start is not None
        else:
            model = build_model(inst, stage, floor_share)
            start = start_values(inst, model, start_alloc) if start_alloc is not None else None
            self.build += time.perf_counter() - tb
            run = SolverRun(model.prob, self.solver, self.remaining(), self.problem.gap, start,
                            self.problem.node_limit)
            self.build += run.model_seconds
            values = model.values()
            started = start is not None
        self.solve += run.solve_seconds
        self.guard_resolves += run.guard_resolves
        return _Stage(run, values, started)

    def round(self, inst: RoundInstance) -> _Round:
        if self.decompose and self.problem.mode == "cost" and self.problem.per_model_rule is None:
            blocks = split_blocks(inst)
            if len(blocks) > 1:
                return self._round_blocks(inst, blocks)
        stages = ["cost"] if self.problem.mode == "cost" else ["share", "cost_at_share"]
        statuses: list[SolveStatus] = []
        floor_share: float | None = None
        start_alloc = self.warm_start
        last: _Stage | None = None
        for stage in stages:
            out = self._stage(inst, stage, floor_share, start_alloc)
            run, started = out.run, out.started
            if self.start_status is None and started:
                self.start_status = run.start_status
            status = status_of(run)
            if status in (SolveStatus.INFEASIBLE, SolveStatus.ERROR):
                if last is not None:  # stage 2 failed: keep the stage-1 plan
                    break
                return _Round(status, message=failure_message(run, status))
            statuses.append(status)
            last = out
            if stage == "share":
                floor_share = (run.column_objective or 0.0) - FEAS_TOL * max(1, len(inst.models))
                extracted = extract(inst, out.values)
                start_alloc = extracted if isinstance(extracted, Allocation) else None
        if last is None:  # unreachable: the loop returns before leaving it empty
            return _Round(SolveStatus.ERROR, message="no stage was solved")
        run = last.run
        allocation = extract(inst, last.values)
        if isinstance(allocation, str):
            return _Round(SolveStatus.ERROR, message=allocation)
        complete = len(statuses) == len(stages)
        final = combined_status(statuses) if complete else SolveStatus.FEASIBLE_TIME_LIMIT
        bound = None
        if run.bound is not None and stages[len(statuses) - 1] != "share":
            bound = run.bound + self.problem.objective_constant(inst.constants())
        return _Round(final, allocation, bound, "" if complete else
                      "goodput stage 2 failed; returning the stage-1 plan", complete)

    def _round_blocks(self, inst: RoundInstance, blocks: list[RoundInstance]) -> _Round:
        """A cost-mode round solved block by block (see the module docstring): optimal only if
        every block is, infeasible or failed if any block is; the dual bound is the sum of the
        blocks' bounds plus the fixed models' cost."""
        counts = inst.constants()
        bound: float | None = self.problem.objective_constant(counts)
        statuses: list[SolveStatus] = []
        starts: list[object] = []
        failed: _Round | None = None
        for block in blocks:
            out = self._stage(block, "cost", None, self.warm_start)
            run = out.run
            if out.started:
                starts.append(run.start_status)
            status = status_of(run)
            if status in (SolveStatus.INFEASIBLE, SolveStatus.ERROR):
                failed = _Round(status, message=failure_message(run, status))
                break
            part = extract(block, out.values)
            if isinstance(part, str):
                failed = _Round(SolveStatus.ERROR, message=part)
                break
            for key, n in part.counts:
                counts[key] = counts.get(key, 0) + n
            statuses.append(status)
            bound = None if bound is None or run.bound is None else bound + run.bound
        if self.start_status is None and starts:
            self.start_status = combined_start_status(starts)
        if failed is not None:
            return failed
        return _Round(combined_status(statuses), Allocation.of(counts), bound)


def _whole_node_start(problem: AllocationProblem, solver: str, decompose: bool) -> Allocation | None:
    """A cold solve of a sliced library starts from its whole-node plan. Why: slices make the
    library ~6x larger and HiGHS, cold, can stop at the time limit with a plan worse than the
    whole-node templates alone give (200 models: 1.73x, ``benchmarks/slices.py``); every
    whole-node template is in the sliced library, so that plan is feasible there and the sliced
    optimum can only improve on it. Only for a plan from scratch (no running plan to start
    from); the sub-solve gets half the time limit."""
    if not problem.index.sliced_rcs or problem.running is not None or problem.reoptimize is not None:
        return None
    whole = tuple(t for t in problem.templates if not t.has_slices)
    if not whole or len(whole) == len(problem.templates):
        return None
    limit = None if problem.time_limit is None else problem.time_limit / 2
    try:
        sub = problem.with_changes(templates=whole, time_limit=limit)
    except ValueError:  # e.g. a per-model rule naming only sliced templates: start cold
        return None
    res = solve_allocation(sub, solver=solver, decompose=decompose)
    return res.allocation if res.allocation is not None and res.allocation.counts else None


UNDIAGNOSED = ("demand is infeasible in cost mode (not diagnosed; solve_allocation(..., diagnose=True) "
               "names the services short of capacity)")


def solve_allocation(problem: AllocationProblem, *, warm_start: Allocation | None = None,
                     solver: str = "highs", decompose: bool = True, diagnose: bool = True
                     ) -> AllocationResult:
    """Solve the allocation ILP exactly (to ``problem.gap``) by row generation (module
    docstring). ``decompose``: solve a cost-mode round's independent blocks of services apart
    (:mod:`~atoll.solvers.allocation.blocks`); False keeps every round one ILP. ``diagnose``: an
    infeasible cost-mode problem's message names the services short of capacity
    (:func:`~atoll.solvers.allocation.diagnosis.diagnose_infeasible`, one small ILP per service);
    False says only that it is infeasible, for a caller that falls back to goodput mode and reads
    no message (the simulator). Never raises for a failed solve: the result's status and message
    say what happened."""
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; valid solvers: {', '.join(SOLVERS)}")
    t0 = time.perf_counter()
    sub_seconds = 0.0
    if warm_start is None:
        tw = time.perf_counter()
        warm_start = _whole_node_start(problem, solver, decompose)
        sub_seconds = time.perf_counter() - tw
    runner = _Solver(problem, solver, warm_start, decompose)
    runner.solve += sub_seconds

    def result(status: SolveStatus, allocation: Allocation | None, message: str = "",
               bound: float | None = None) -> AllocationResult:
        start = runner.start_status
        out = AllocationResult.from_allocation(
            problem, status, allocation, message=message, bound=bound,
            build_seconds=runner.build, solve_seconds=runner.solve, solver=solver,
            warm_start_accepted=None if start is None else str(start).endswith("kOk"),
            guard_resolves=runner.guard_resolves)
        if allocation is not None and problem.index.sliced_rcs:
            out = replace(out, packing=pack_plan(problem, allocation))
        return out

    def why_infeasible(inst: RoundInstance) -> str:
        return diagnose_infeasible(inst) if diagnose else UNDIAGNOSED

    try:
        keep = frozenset(k for k, _ in warm_start.counts) if warm_start is not None else frozenset()
        inst = RoundInstance(problem, frozenset(), keep)
        runner.build += time.perf_counter() - t0
        if inst.overused:
            return result(SolveStatus.INFEASIBLE, None, "models held fixed exceed availability at "
                          + "; ".join(inst.overused) + "; re-optimize them too")
        ix = problem.index  # the demand rows the free templates serve, from the index's arrays
        pos = inst.free_pos
        rows_served = np.unique(np.concatenate([ix.cover1[pos], ix.cover2[pos]])).tolist()
        served_by = {ix.services[i] for i in rows_served if i >= 0}
        if problem.mode == "cost" and any(s not in served_by for s in inst.services):
            return result(SolveStatus.INFEASIBLE, None, why_infeasible(inst))
        rows: set[tuple[str, str]] = set()
        for round_no in range(MAX_ROUNDS + 1):
            if round_no:
                tb = time.perf_counter()
                inst = RoundInstance(problem, None if round_no == MAX_ROUNDS else frozenset(rows), keep)
                runner.build += time.perf_counter() - tb
            if not inst.free:  # nothing to decide: every free service is without demand
                return result(SolveStatus.OPTIMAL, Allocation.of(inst.constants()),
                              bound=problem.objective_constant(inst.constants()))
            out = runner.round(inst)
            if out.allocation is None:
                infeasible = out.status is SolveStatus.INFEASIBLE and problem.mode == "cost"
                msg = why_infeasible(inst) if infeasible else out.message
                return result(out.status, None, msg)
            violated = _violated_rows(inst, out.allocation)
            if not violated:
                return result(out.status, out.allocation, out.message, bound=out.bound)
            rows |= violated
            if runner.deadline is not None and time.perf_counter() >= runner.deadline:
                return result(SolveStatus.ERROR, None, "time limit reached before a plan within "
                              "availability was found")
        return result(SolveStatus.ERROR, None, "row generation did not converge")
    except Exception as exc:  # noqa: BLE001 — the contract: a status, never an exception
        return result(SolveStatus.ERROR, None, f"{type(exc).__name__}: {exc}")
