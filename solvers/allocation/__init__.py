"""The online allocation ILP: template instances per (template, region) that meet each service's
demand at least cost within the availability, or serve the most when they cannot (goodput mode).
The guide: docs/guide/allocation.md.

One concept per module:

- :mod:`.reduction` — one round's instance: fixed models, residual availability, variable
  bounds and dominance pruning of templates;
- :mod:`.model` — the ILP as a PuLP model with readable variable names, its MIP start, the plan
  read back;
- :mod:`.highs` — the solver backend: HiGHS with a warm start and a bulk build, CBC, statuses;
- :mod:`.direct` — the cost stage built straight into HiGHS's arrays (the simulator's path);
- :mod:`.knapsack` — the exact search that answers a block of one demand row without HiGHS;
- :mod:`.blocks` — decomposition of a cost-mode round into independent blocks of services;
- :mod:`.diagnosis` — why a cost-mode problem is infeasible;
- :mod:`.solve` — row generation over rounds and :func:`solve_allocation`;
- :mod:`.evaluate` — any plan checked and scored against a problem without a solver.

The problem, plan and result types live in :mod:`atoll.solvers.problem` and are re-exported here.
"""

from atoll.solvers.allocation.diagnosis import max_capacity_alone
from atoll.solvers.allocation.direct import SOLVER_VERSION
from atoll.solvers.allocation.evaluate import PlanEvaluation, evaluate_plan
from atoll.solvers.allocation.highs import WarmHiGHS
from atoll.solvers.allocation.solve import MAX_ROUNDS, SOLVERS, solve_allocation
from atoll.solvers.problem import Allocation, AllocationProblem, AllocationResult, SolveStatus

__all__ = [
    "MAX_ROUNDS",
    "SOLVERS",
    "SOLVER_VERSION",
    "Allocation",
    "AllocationProblem",
    "AllocationResult",
    "PlanEvaluation",
    "SolveStatus",
    "WarmHiGHS",
    "evaluate_plan",
    "max_capacity_alone",
    "solve_allocation",
]
