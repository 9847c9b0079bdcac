"""The online allocation ILP (DESIGN.md §4): template instances per (template, region).

Sets: templates t (each of one service s(t) of model m(t), one region), node configs c.
Data: n_tc nodes of config c in t; p_t = sum_c n_tc x price(region, c) ($/h); theta_t tokens/s;
d_s demand; A_rc availability; r_t running instances; K start-up weight.

    x_t in Z>=0                       instances (variables only for re-optimized models)
    a_t >= x_t - r_t, a_t >= 0        instances added beyond the running ones
    sum_t n_tc x_t <= A_rc - F_rc     per (region, config); F = usage of the models held fixed
    cost mode:  sum_{t of s} theta_t x_t >= d_s
    minimize    sum_t p_t x_t + K sum_t p_t a_t

Goodput mode (scarcity) is lexicographic. Stage 1 maximizes sum_m f_m, 0 <= f_m <= 1, with
f_m d_s <= sum_{t of s} theta_t x_t for both services of model m: f_m is the share of model m's
requests served, since a request needs both its prefill and its decode. Every model weighs the
same, whatever its token volume. Stage 2 minimizes the cost objective with sum_m f_m >= F* - eps.

x_t <= u_t = min(ceil(d_s / theta_t), min_c floor(A_rc / n_tc)) loses no optimum: beyond
ceil(d_s / theta_t) instances t alone covers d_s, so dropping one keeps every constraint and
cannot raise the objective. Templates of services without demand stay at zero for the same
reason. Optional restriction: one GPU type per model (binary y_mg, x_t <= u_t y_m,g(t)).

Decomposition (cost mode without the one-type rule). The only rows that tie services together
are the availability rows a round builds (rows without room for a node only bound templates to
zero and get no terms). Group the services into connected components, two services joined when
templates of both have terms in one built row; with no row spanning two components the ILP is
a sum of independent ILPs, one per component (its templates, its a_t, its demand rows and the
rows it alone touches), and each is solved on its own. Each block stops at the same relative
gap g: z_b - L_b <= g z_b for its objective z_b and dual bound L_b, so summing (all z_b >= 0)
gives sum z_b - sum L_b <= g sum z_b: the combined plan is within g of sum L_b, a lower
bound on the joint optimum (the sum of the block optima), and sum L_b is the round's bound.
Adding the fixed models' constant to both sides keeps this; the solver's absolute gap (1e-6 in
HiGHS) adds up over blocks. Separate solves spare the solver
a search over the product of the blocks' trees; a round whose built rows join every service
stays one ILP, as does goodput mode (its share floor ties the models).
"""

from __future__ import annotations

import copy
import math
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pulp

from atoll.solvers.highs_warm import WarmHiGHS
from atoll.solvers.problem import (
    Allocation,
    AllocationProblem,
    AllocationResult,
    SolveStatus,
    gpu_type_of,
    model_of,
)

__all__ = ["Allocation", "AllocationProblem", "AllocationResult", "SolveStatus", "solve_allocation"]

SOLVERS = ("highs", "cbc")
_FEAS_TOL = 1e-6
_DECOMPOSE = True  # solve independent blocks of services apart (tests switch it off)
# HiGHS 1.15 runs the feasibility-jump heuristic at the root of every MIP and every sub-MIP: on
# these models ~10 ms a call for poor incumbents (the LP-based ones replace them). Off, 80
# re-optimizations of the extended scenario kept every objective and joint solves ran ~1.7x
# faster (median and p90); small per-service blocks would pay it ten times over their solve.
_HIGHS_OPTIONS: dict[str, object] = {"mip_heuristic_run_feasibility_jump": False}


class _Instance:
    """What one ILP round needs: free and fixed templates, the availability rows enforced in
    this round (``rows``), bounds, and the templates left after dominance pruning.

    Works on the problem's :class:`~atoll.solvers.problem.TemplateIndex` arrays: a round touches every
    template of a 1e5-template library, and per-template Python was most of the solve time."""

    def __init__(self, problem: AllocationProblem, rows: frozenset[tuple[str, str]] | None = None,
                 keep: frozenset[str] = frozenset()) -> None:
        self.problem = p = problem
        ix = p.index
        running = problem.running or Allocation()
        free_models = problem.free_models
        self.fixed: dict[str, int] = {}
        self.fixed_use: dict[tuple[str, str], int] = defaultdict(int)
        for key, n in running.counts:
            t = p.template(key)
            if t.service.model not in free_models:
                self.fixed[key] = n
                for c, k in t.nodes:
                    self.fixed_use[(t.region, c)] += k * n
        self.residual: dict[tuple[str, str], float] = {}
        self.overused: list[str] = []
        for rc in problem.prices:
            cap = problem.available(rc) - self.fixed_use.get(rc, 0)
            if cap < 0:
                self.overused.append(f"{rc[0]}/{rc[1]} (fixed models hold {self.fixed_use[rc]}, "
                                     f"available {problem.available(rc):g})")
            self.residual[rc] = max(cap, 0.0)
        # rows without room for one node always count: they only remove templates
        self.rows = frozenset(rc for rc, v in self.residual.items() if v < 1 or rows is None
                              or rc in rows)
        self.running = running
        self.services = sorted(s for s, d in problem.demand.items()
                               if d > 0 and model_of(s) in free_models)
        self.models = sorted({model_of(s) for s in self.services})
        self.bound: dict[str, int] = {}
        self.free: list[str] = []  # template keys that get a variable
        if not len(ix.keys):
            return
        # per service: demand (0 = no variable), per template: bound
        demand = np.array([problem.demand.get(s, 0.0) if model_of(s) in free_models else 0.0
                           for s in ix.services])
        d = demand[ix.service]
        free = d > 0
        if problem.one_gpu_type_per_model:
            free &= ~ix.multi_type
        resid = np.array([self.residual[rc] for rc in ix.rcs])
        enforced = np.array([rc in self.rows for rc in ix.rcs], dtype=bool)
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.ceil(np.where(free, d, 0.0) / ix.throughput - 1e-9)
        entry_cap = np.where(enforced[ix.rc], np.floor(resid[ix.rc] / ix.k), np.inf)
        u = np.minimum(u, np.minimum.reduceat(entry_cap, ix.ptr[:-1]))
        bound = np.maximum(u, 0.0)
        cand = np.flatnonzero(free & (bound > 0))
        self._bound_all = bound
        touches = np.add.reduceat(enforced[ix.rc].astype(np.int64), ix.ptr[:-1]) > 0
        pinned = {ix.position[k] for k in keep if k in ix.position}
        pinned |= {ix.position[k] for k, _ in running.counts}
        chosen = self._undominated(cand, touches, enforced, pinned)
        self.free = [ix.keys[i] for i in chosen]
        self.bound = {ix.keys[i]: int(bound[i]) for i in chosen}

    def _undominated(self, cand: np.ndarray, touches: np.ndarray, enforced: np.ndarray,
                     pinned: set[int]) -> list[int]:
        """Drop t when a t' of the same service (and GPU type, under the one-type rule) has
        cost <= and throughput >= and uses no node of an enforced row, or the same nodes of
        enforced rows as t. Moving an instance from t to t' then keeps every enforced row and
        demand row and cannot raise the objective (t has no running instance, so its added
        cost (1 + K) p_t is at least t's worst case (1 + K) p_t'). Running and warm-start
        templates are kept. Returns kept template positions in library order."""
        p = self.problem
        ix = p.index
        cost, thr = p.costs, ix.throughput
        kind = ix.kind if p.one_gpu_type_per_model else np.zeros_like(ix.kind)
        group = ix.service * ix.n_kinds + kind
        out: list[int] = []
        # templates that touch no enforced row: one Pareto front per (service, kind)
        plain = cand[~touches[cand]]
        order = plain[np.lexsort((plain, -thr[plain], cost[plain], group[plain]))]
        fronts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if len(order):
            g = group[order]
            cuts = np.flatnonzero(np.diff(g)) + 1
            for seg in np.split(order, cuts):
                t_seg = thr[seg]
                best_before = np.concatenate(([-np.inf], np.maximum.accumulate(t_seg)[:-1]))
                keep = t_seg > best_before
                out.extend(seg[keep].tolist())
                fronts[int(group[seg[0]])] = (cost[seg[keep]], t_seg[keep])  # cost and thr ascending
        # templates that touch an enforced row: grouped by that usage, also beaten by the front
        groups: dict[tuple[int, tuple[tuple[int, float], ...]], list[int]] = defaultdict(list)
        on = enforced.tolist()
        ptr, rcs, ks, gr = ix.ptr.tolist(), ix.rc_list, ix.k_list, group.tolist()
        for i in cand[touches[cand]].tolist():
            a, b = ptr[i], ptr[i + 1]
            usage = tuple((r, k) for r, k in zip(rcs[a:b], ks[a:b], strict=True) if on[r])
            groups[(gr[i], usage)].append(i)
        for (gid, _usage), members in groups.items():
            front_cost, front_thr = fronts.get(gid, (np.zeros(0), np.zeros(0)))
            members.sort(key=lambda i: (cost[i], -thr[i], i))
            best = -math.inf
            for i in members:
                j = int(np.searchsorted(front_cost, cost[i] + 1e-12, side="right"))
                dominated = thr[i] <= best or (j > 0 and front_thr[j - 1] >= thr[i])
                if not dominated:
                    out.append(i)
                best = max(best, thr[i])
        kept = set(out) | (pinned & set(cand.tolist()))
        return sorted(kept)


def _build(inst: _Instance, stage: str, floor_share: float | None = None,
           ) -> tuple[pulp.LpProblem, dict[str, pulp.LpVariable]]:
    """stage: "cost" (demand rows), "share" (goodput stage 1) or "cost_at_share" (stage 2)."""
    p = inst.problem
    sense = pulp.LpMaximize if stage == "share" else pulp.LpMinimize
    prob = pulp.LpProblem("allocation", sense)
    x = {k: prob.add_variable(f"x{i:06d}", 0, inst.bound[k], cat=pulp.LpInteger)
         for i, k in enumerate(inst.free)}
    by_rc: dict[tuple[str, str], list[tuple[pulp.LpVariable, float]]] = defaultdict(list)
    by_service: dict[str, list[tuple[pulp.LpVariable, float]]] = defaultdict(list)
    by_model_type: dict[tuple[str, str], list[str]] = defaultdict(list)
    objective: list[tuple[pulp.LpVariable, float]] = []
    for i, (key, var) in enumerate(x.items()):
        t = p.template(key)
        for c, k in t.nodes:
            if (t.region, c) in inst.rows:
                by_rc[(t.region, c)].append((var, float(k)))
        by_service[t.service.name].append((var, t.throughput))
        by_model_type[(t.service.model, gpu_type_of(t.nodes[0][0]))].append(key)
        cost = p.template_cost(key)
        r = inst.running[key]
        if r == 0:
            objective.append((var, cost * (1.0 + p.startup_weight)))
        else:
            objective.append((var, cost))
            if p.startup_weight > 0:
                add = prob.add_variable(f"a{i:06d}", 0, inst.bound[key])
                objective.append((add, cost * p.startup_weight))
                prob += pulp.LpAffineExpression([(add, 1.0), (var, -1.0)]) >= -r, f"add{i:06d}"
    for j, (rc, terms) in enumerate(sorted(by_rc.items())):
        prob += pulp.LpAffineExpression(terms) <= inst.residual[rc], f"avail{j:05d}"
    if p.one_gpu_type_per_model:
        n_rows = 0
        for j, m in enumerate(inst.models):
            types = sorted(g for (mm, g) in by_model_type if mm == m)
            y = {g: prob.add_variable(f"y{j:05d}_{i:02d}", cat=pulp.LpBinary) for i, g in enumerate(types)}
            if y:
                prob += pulp.lpSum(y.values()) == 1, f"onetype{j:05d}"
            for g, yv in y.items():
                for key in by_model_type[(m, g)]:
                    n_rows += 1
                    prob += (pulp.LpAffineExpression([(x[key], 1.0), (yv, -float(inst.bound[key]))])
                             <= 0, f"type{n_rows:06d}")
    if stage == "cost":
        for j, s in enumerate(inst.services):
            prob += pulp.LpAffineExpression(by_service[s]) >= p.demand[s], f"demand{j:05d}"
    else:
        f = {m: prob.add_variable(f"f{j:05d}", 0, 1) for j, m in enumerate(inst.models)}
        for j, s in enumerate(inst.services):
            prob += (pulp.LpAffineExpression([*by_service[s], (f[model_of(s)], -p.demand[s])]) >= 0,
                     f"share{j:05d}")
        if stage == "share":
            objective = [(v, 1.0) for v in f.values()]
        else:
            prob += pulp.lpSum(f.values()) >= floor_share, "share_floor"
    prob.setObjective(pulp.LpAffineExpression(objective))
    return prob, x


def _start_values(inst: _Instance, prob: pulp.LpProblem, x: Mapping[str, pulp.LpVariable],
                  start: Allocation) -> dict[str, float]:
    """A full MIP start from an allocation: x clipped to its bound, a and f implied by x."""
    p = inst.problem
    values: dict[str, float] = {}
    cap: dict[str, float] = defaultdict(float)
    for i, (key, var) in enumerate(x.items()):
        v = min(start[key], inst.bound[key])
        values[var.name] = v
        values[f"a{i:06d}"] = max(0, v - inst.running[key])
        cap[p.template(key).service.name] += v * p.template(key).throughput
    for j, m in enumerate(inst.models):
        values[f"f{j:05d}"] = min([1.0] + [cap[s] / p.demand[s] for s in inst.services
                                           if model_of(s) == m])
    names = {v.name for v in prob.variables()}
    return {k: v for k, v in values.items() if k in names}


class _Run:
    def __init__(self, prob: pulp.LpProblem, solver: str, time_limit: float | None, gap: float,
                 start: Mapping[str, float] | None) -> None:
        t0 = time.perf_counter()
        self.bound: float | None = None
        self.start_status = None
        if solver == "highs":
            backend = WarmHiGHS(start=start, msg=False, timeLimit=time_limit, gapRel=gap,
                                **_HIGHS_OPTIONS)
            prob.solve(backend)
            info = prob.solverModel.getInfo()
            self.bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else None
            self.start_status = backend.start_status
            self.solve_seconds = backend.run_seconds
            self.model_seconds = backend.model_seconds
            self.stop = str(prob.solverModel.getModelStatus()).rsplit(".", 1)[-1]
        else:
            if start:
                for v in prob.variables():
                    if v.name in start:
                        v.setInitialValue(start[v.name])
            prob.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, gapRel=gap,
                                         warmStart=bool(start)))
            self.solve_seconds = time.perf_counter() - t0
            self.model_seconds = 0.0
            self.stop = pulp.LpStatus[prob.status]
        self.sol_status = prob.sol_status


def _status_of(run: _Run) -> SolveStatus:
    if run.sol_status == pulp.LpSolutionOptimal:
        return SolveStatus.OPTIMAL
    if run.sol_status == pulp.LpSolutionIntegerFeasible:
        return SolveStatus.FEASIBLE_TIME_LIMIT
    if run.sol_status == pulp.LpSolutionInfeasible:
        return SolveStatus.INFEASIBLE
    return SolveStatus.ERROR


def _extract(inst: _Instance, x: Mapping[str, pulp.LpVariable]) -> Allocation | str:
    counts = dict(inst.fixed)
    for key, var in x.items():
        v = var.varValue
        if v is None or abs(v - round(v)) > 1e-5 or v < -1e-6:
            return f"solver returned a non-integer value {v!r} for {key}"
        if round(v):
            counts[key] = int(round(v))
    return Allocation.of(counts)


def _blocks(inst: _Instance) -> list[_Instance]:
    """``inst`` split into the connected components of its services (two services joined when
    templates of both have terms in one availability row the round builds; see the module
    docstring), in the order of their first service. Each block is a shallow copy restricted to
    its services, models and templates, without the fixed models (the caller adds them back).
    A single component comes back as ``[inst]``, and so does an instance with a service left
    without templates (its demand row alone is infeasible; the joint ILP reports it)."""
    p = inst.problem
    parent = {s: s for s in inst.services}

    def find(s: str) -> str:
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    owner: dict[tuple[str, str], str] = {}  # built row -> a service with a term in it
    service_of: dict[str, str] = {}
    for key in inst.free:
        t = p.template(key)
        s = service_of[key] = t.service.name
        for c, _k in t.nodes:
            rc = (t.region, c)
            if rc in inst.rows:
                a, b = find(owner.setdefault(rc, s)), find(s)
                if a != b:
                    parent[b] = a
    if len(set(service_of.values())) < len(inst.services):
        return [inst]
    groups: dict[str, list[str]] = defaultdict(list)
    for s in inst.services:
        groups[find(s)].append(s)
    if len(groups) < 2:
        return [inst]
    blocks = []
    for services in groups.values():
        members = set(services)
        block = copy.copy(inst)
        block.services = services
        block.models = sorted({model_of(s) for s in services})
        block.free = [k for k in inst.free if service_of[k] in members]
        block.fixed = {}
        blocks.append(block)
    return blocks


def _combined_start_status(statuses: list[object]) -> object:
    """One start status for blocks solved apart: the first block's, unless a later block's start
    was not accepted (``warm_start_accepted`` then says no)."""
    if not statuses:
        return None
    return next((s for s in statuses if not str(s).endswith("kOk")), statuses[0])


def max_capacity_alone(problem: AllocationProblem, service: str,
                       residual: Mapping[tuple[str, str], float]) -> float:
    """Most tokens/s ``service`` can get on its own within ``residual`` availability (exact)."""
    prob = pulp.LpProblem("alone", pulp.LpMaximize)
    terms = []
    by_rc: dict[tuple[str, str], list[tuple[pulp.LpVariable, float]]] = defaultdict(list)
    for i, t in enumerate(problem.templates_of(service)):
        ub = min([int(residual.get((t.region, c), 0) // k) for c, k in t.nodes])
        if ub <= 0:
            continue
        v = prob.add_variable(f"x{i:06d}", 0, ub, cat=pulp.LpInteger)
        terms.append((v, t.throughput))
        for c, k in t.nodes:
            by_rc[(t.region, c)].append((v, float(k)))
    if not terms:
        return 0.0
    for j, (rc, row) in enumerate(sorted(by_rc.items())):
        prob += pulp.LpAffineExpression(row) <= residual[rc], f"avail{j:05d}"
    prob.setObjective(pulp.LpAffineExpression(terms))
    prob.solve(WarmHiGHS(msg=False, timeLimit=30.0))
    return float(pulp.value(prob.objective) or 0.0)


def _diagnose(inst: _Instance) -> str:
    p = inst.problem
    short = []
    for s in inst.services:
        cap = max_capacity_alone(p, s, inst.residual)
        if cap < p.demand[s] * (1 - _FEAS_TOL):
            short.append(f"{s} (demand {p.demand[s]:.6g} tokens/s, at most {cap:.6g} alone)")
    what = ("cannot be met even alone within availability: " + "; ".join(short) if short else
            "can each be met alone but not together: they compete for the same node configs")
    return (f"demand is infeasible in cost mode; services {what}. "
            "Use mode='goodput' to serve as much as possible")


@dataclass
class _Round:
    """The outcome of solving one round (one set of enforced rows), all stages."""

    status: SolveStatus
    allocation: Allocation | None = None
    bound: float | None = None
    message: str = ""
    complete: bool = True  # every stage solved (goodput stage 2 may fail and keep stage 1)


def _violated_rows(inst: _Instance, allocation: Allocation) -> set[tuple[str, str]]:
    p = inst.problem
    use: dict[tuple[str, str], int] = defaultdict(int)
    for key, n in allocation.counts:
        t = p.template(key)
        for c, k in t.nodes:
            use[(t.region, c)] += k * n
    return {rc for rc, u in use.items() if u > p.available(rc) + 1e-9}


class _Solver:
    """Runs the stages of one round and keeps the time and start bookkeeping across rounds."""

    def __init__(self, problem: AllocationProblem, solver: str, warm_start: Allocation | None) -> None:
        self.problem, self.solver, self.warm_start = problem, solver, warm_start
        self.build = self.solve = 0.0
        self.start_status: object = None
        self.deadline = None if problem.time_limit is None else time.perf_counter() + problem.time_limit

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(self.deadline - time.perf_counter(), 0.05)

    def _stage(self, inst: _Instance, stage: str, floor_share: float | None,
               start_alloc: Allocation | None,
               ) -> tuple[_Run, pulp.LpProblem, dict[str, pulp.LpVariable], bool]:
        """Build and solve one stage of ``inst``; returns the run, the model, x and whether a
        start was handed to the solver."""
        tb = time.perf_counter()
        prob, x = _build(inst, stage, floor_share)
        start = _start_values(inst, prob, x, start_alloc) if start_alloc is not None else None
        self.build += time.perf_counter() - tb
        run = _Run(prob, self.solver, self.remaining(), self.problem.gap, start)
        self.build += run.model_seconds
        self.solve += run.solve_seconds
        return run, prob, x, start is not None

    def round(self, inst: _Instance) -> _Round:
        if _DECOMPOSE and self.problem.mode == "cost" and not self.problem.one_gpu_type_per_model:
            blocks = _blocks(inst)
            if len(blocks) > 1:
                return self._round_blocks(inst, blocks)
        stages = ["cost"] if self.problem.mode == "cost" else ["share", "cost_at_share"]
        statuses: list[SolveStatus] = []
        floor_share: float | None = None
        start_alloc = self.warm_start
        last: tuple[_Run, dict[str, pulp.LpVariable]] | None = None
        for stage in stages:
            run, prob, x, started = self._stage(inst, stage, floor_share, start_alloc)
            if self.start_status is None and started:
                self.start_status = run.start_status
            status = _status_of(run)
            if status in (SolveStatus.INFEASIBLE, SolveStatus.ERROR):
                if last is not None:  # stage 2 failed: keep the stage-1 plan
                    break
                return _Round(status, message=_failure(run, status))
            statuses.append(status)
            last = (run, x)
            if stage == "share":
                floor_share = (pulp.value(prob.objective) or 0.0) - _FEAS_TOL * max(1, len(inst.models))
                extracted = _extract(inst, x)
                start_alloc = extracted if isinstance(extracted, Allocation) else None
        if last is None:  # unreachable: the loop returns before leaving it empty
            return _Round(SolveStatus.ERROR, message="no stage was solved")
        run, x = last
        allocation = _extract(inst, x)
        if isinstance(allocation, str):
            return _Round(SolveStatus.ERROR, message=allocation)
        complete = len(statuses) == len(stages)
        final = (SolveStatus.OPTIMAL if complete and all(s is SolveStatus.OPTIMAL for s in statuses)
                 else SolveStatus.FEASIBLE_TIME_LIMIT)
        bound = None
        if run.bound is not None and stages[len(statuses) - 1] != "share":
            bound = run.bound + self.problem.objective_constant(inst.fixed)
        return _Round(final, allocation, bound, "" if complete else
                      "goodput stage 2 failed; returning the stage-1 plan", complete)

    def _round_blocks(self, inst: _Instance, blocks: list[_Instance]) -> _Round:
        """A cost-mode round solved block by block (see the module docstring): optimal only if
        every block is, infeasible or failed if any block is; the dual bound is the sum of the
        blocks' bounds plus the fixed models' cost."""
        counts = dict(inst.fixed)
        bound: float | None = self.problem.objective_constant(inst.fixed)
        statuses: list[SolveStatus] = []
        starts: list[object] = []
        failed: _Round | None = None
        for block in blocks:
            run, _prob, x, started = self._stage(block, "cost", None, self.warm_start)
            if started:
                starts.append(run.start_status)
            status = _status_of(run)
            if status in (SolveStatus.INFEASIBLE, SolveStatus.ERROR):
                failed = _Round(status, message=_failure(run, status))
                break
            part = _extract(block, x)
            if isinstance(part, str):
                failed = _Round(SolveStatus.ERROR, message=part)
                break
            counts.update(part.counts)
            statuses.append(status)
            bound = None if bound is None or run.bound is None else bound + run.bound
        if self.start_status is None and starts:
            self.start_status = _combined_start_status(starts)
        if failed is not None:
            return failed
        final = (SolveStatus.OPTIMAL if all(s is SolveStatus.OPTIMAL for s in statuses)
                 else SolveStatus.FEASIBLE_TIME_LIMIT)
        return _Round(final, Allocation.of(counts), bound)


def _failure(run: _Run, status: SolveStatus) -> str:
    if status is SolveStatus.INFEASIBLE:
        return "infeasible"
    if run.stop in ("kTimeLimit", "Not Solved"):
        return "time limit reached before any feasible allocation was found"
    return f"solver stopped: {run.stop}"


MAX_ROUNDS = 12


def solve_allocation(problem: AllocationProblem, *, warm_start: Allocation | None = None,
                     solver: str = "highs") -> AllocationResult:
    """Solve the allocation ILP exactly (to ``problem.gap``); see the module docstring.

    Availability rows are generated lazily: a round enforces only the rows found violated so
    far (plus rows without room for a node) and prunes templates dominated under them; when a
    round's optimum satisfies every row it is optimal for the full problem too (a relaxation's
    optimum that is feasible is optimal). After MAX_ROUNDS rounds every row is enforced.
    """
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; valid solvers: {', '.join(SOLVERS)}")
    t0 = time.perf_counter()
    runner = _Solver(problem, solver, warm_start)

    def result(status: SolveStatus, allocation: Allocation | None, message: str = "",
               bound: float | None = None) -> AllocationResult:
        start = runner.start_status
        return AllocationResult.from_allocation(
            problem, status, allocation, message=message, bound=bound,
            build_seconds=runner.build, solve_seconds=runner.solve, solver=solver,
            warm_start_accepted=None if start is None else str(start).endswith("kOk"))

    try:
        keep = frozenset(k for k, _ in warm_start.counts) if warm_start is not None else frozenset()
        inst = _Instance(problem, frozenset(), keep)
        runner.build += time.perf_counter() - t0
        if inst.overused:
            return result(SolveStatus.INFEASIBLE, None, "models held fixed exceed availability at "
                          + "; ".join(inst.overused) + "; re-optimize them too")
        served_by = {problem.template(k).service.name for k in inst.free}
        if problem.mode == "cost" and any(s not in served_by for s in inst.services):
            return result(SolveStatus.INFEASIBLE, None, _diagnose(inst))
        rows: set[tuple[str, str]] = set()
        for round_no in range(MAX_ROUNDS + 1):
            if round_no:
                tb = time.perf_counter()
                inst = _Instance(problem, None if round_no == MAX_ROUNDS else frozenset(rows), keep)
                runner.build += time.perf_counter() - tb
            if not inst.free:  # nothing to decide: every free service is without demand
                return result(SolveStatus.OPTIMAL, Allocation.of(inst.fixed),
                              bound=problem.objective_constant(inst.fixed))
            out = runner.round(inst)
            if out.allocation is None:
                msg = _diagnose(inst) if out.status is SolveStatus.INFEASIBLE and problem.mode == "cost" \
                    else out.message
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
