"""Re-optimization as the fleet does it: the exact allocation ILP for the chosen models (others
fixed), warm-started from the running plan, with a goodput fallback and memoized results.

A re-optimization first solves in cost mode (meet the planning demand at least cost). When that
is infeasible — the availability cannot carry the demand — it solves in goodput mode (serve as
much as possible, then at least cost). When neither yields a plan (error, or a time limit
without an incumbent) the fleet holds its plan.

Memoization: the planning demand is rounded *up* to a geometric grid (``demand_round``, 2% by
default), and results are kept under (models, rounded demand of their services, running plan,
availability). Rounding up only adds capacity, and it lets training revisit a state without
solving again. A memo hit reports the solver seconds the original solve took, so totals do not
depend on what was solved before.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace

from atoll.envs.vocabulary import Pool
from atoll.solvers.allocation import solve_allocation
from atoll.solvers.problem import Allocation, AllocationProblem, Risk, SolveStatus, model_of

_SOLVED = (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE_TIME_LIMIT, SolveStatus.FEASIBLE)


@dataclass(frozen=True)
class PlanOutcome:
    """What a re-optimization produced. ``allocation`` is None when the fleet must hold."""

    allocation: Allocation | None
    status: SolveStatus
    mode: str  # "cost", "goodput" or "hold"
    solver_seconds: float
    cached: bool
    message: str = ""
    gap: float = math.nan  # proven relative gap of the plan (NaN: goodput stage 1 only, or no plan)
    guard_resolves: int = 0  # solver runs repeated because an answer failed its checks


def round_up(value: float, step: float) -> float:
    """The smallest point of the grid (1 + step)^k, k integer, at or above ``value`` (0 stays 0)."""
    if value <= 0 or step <= 0:
        return max(value, 0.0)
    base = math.log1p(step)
    k = math.ceil(math.log(value) / base - 1e-12)
    return math.exp(k * base)


class Replanner:
    """Solves re-optimizations against a base problem (templates, prices, start-up weight)."""

    def __init__(self, base: AllocationProblem, *, demand_round: float = 0.02, memoize: bool = True,
                 max_entries: int = 200_000) -> None:
        if not 0 <= demand_round < 1:
            raise ValueError(f"Replanner: field 'demand_round' must be in [0, 1), got {demand_round!r}")
        self.base = base
        self.demand_round = demand_round
        self.memoize = memoize
        self.max_entries = max_entries
        self._memo: OrderedDict[tuple[object, ...], PlanOutcome] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def plan(self, models: frozenset[str], demand: Mapping[str, float], availability: Mapping[Pool, int],
             running: Allocation, grow: frozenset[str] = frozenset(),
             risk: Mapping[str, Risk] | None = None, diagnose: bool = True) -> PlanOutcome:
        """Re-optimize ``models`` for ``demand`` (tokens/s per service) within ``availability``;
        the ``grow`` models keep their running instances (a subset of ``models``); ``risk``
        (model -> Risk) overrides the base problem's risk of those models. ``diagnose``: an
        infeasible cost-mode solve's message names the services short of capacity (False: it
        only says so, at no extra solve; the outcome is the same either way)."""
        rounded = {s: round_up(d, self.demand_round) for s, d in demand.items() if model_of(s) in models}
        grow = frozenset(grow) & frozenset(models)
        key: tuple[object, ...] = (tuple(sorted(models)), tuple(sorted(grow)), tuple(sorted(rounded.items())),
                                   running.counts, tuple(sorted(availability.items())))
        if risk:
            key += (tuple(sorted((m, r.label()) for m, r in risk.items())),)
        if not diagnose:  # the same plan, a shorter message
            key += ("undiagnosed",)
        if self.memoize:
            hit = self._memo.get(key)
            if hit is not None:
                self._memo.move_to_end(key)
                self.hits += 1
                return replace(hit, cached=True)
        self.misses += 1
        outcome = self._solve(models, rounded, availability, running, grow, risk, diagnose)
        if self.memoize:
            self._memo[key] = outcome
            if len(self._memo) > self.max_entries:
                self._memo.popitem(last=False)
        return outcome

    def _solve(self, models: frozenset[str], demand: Mapping[str, float],
               availability: Mapping[Pool, int], running: Allocation,
               grow: frozenset[str] = frozenset(), risk: Mapping[str, Risk] | None = None,
               diagnose: bool = True) -> PlanOutcome:
        extra = {"risk": {**(self.base.risk or {}), **risk}} if risk else {}
        problem = self.base.with_changes(demand=demand, availability=availability, running=running,
                                         reoptimize=models, mode="cost", grow=grow, **extra)
        res = solve_allocation(problem, warm_start=running, diagnose=diagnose)
        seconds = res.build_seconds + res.solve_seconds
        guarded = res.guard_resolves
        if res.allocation is not None and res.status in _SOLVED:
            return PlanOutcome(res.allocation, res.status, "cost", seconds, False, res.message, res.gap,
                               guarded)
        first = f"cost mode {res.status.value}: {res.message}"
        if res.status is SolveStatus.INFEASIBLE:
            res = solve_allocation(problem.with_changes(mode="goodput"), warm_start=running)
            seconds += res.build_seconds + res.solve_seconds
            guarded += res.guard_resolves
            if res.allocation is not None and res.status in _SOLVED:
                return PlanOutcome(res.allocation, res.status, "goodput", seconds, False, first, res.gap,
                                   guarded)
        return PlanOutcome(None, res.status, "hold", seconds, False,
                           f"{first}; goodput mode {res.status.value}: {res.message}",
                           guard_resolves=guarded)
