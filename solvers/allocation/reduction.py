"""One round's instance of the allocation ILP, reduced: which templates get a variable and how
large it may be.

Models outside the re-optimized subset are held at their running counts (``fixed``) and their
nodes leave the availability (``residual``). A ``grow`` model's running instances are a floor:
with x_t = r_t + y_t, y_t >= 0, its variables are the instances y_t *added* (each pays the
start-up weight, as any instance beyond the running ones does), its running nodes leave the
availability and its running capacity (``held``) is subtracted from its demand — the same ILP
as x_t >= r_t, with the floor's cost a constant. Templates of services without demand get no
variable. x_t <= u_t = min(ceil(d_s / theta_t), min_c floor(A_rc / n_tc)) (with a removal price,
max(that, r_t) before the availability cap: keeping what runs may pay) loses no optimum:
beyond ceil(d_s / theta_t) instances t alone covers d_s, so dropping one keeps every constraint
and cannot raise the objective. Dominated templates are dropped too (see
:func:`_front`; memoized across rounds in :func:`_reduced`). ``rows`` are the availability
rows the round enforces (row generation in :mod:`atoll.solvers.allocation.solve`); rows
without room for one node always count, since they only remove templates.
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict, defaultdict
from dataclasses import dataclass

import numpy as np

from atoll.solvers.problem import Allocation, AllocationProblem, TemplateIndex, model_of


class RoundInstance:
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
        self.floor: dict[str, int] = {}  # grow models' running instances, kept
        self.held: dict[str, float] = defaultdict(float)  # service -> tokens/s of the floor
        self.fixed_use: dict[tuple[str, str], float] = defaultdict(float)  # slices as fractions
        for key, n in running.counts:
            t = p.template(key)
            if t.service.model not in free_models or t.service.model in problem.grow:
                if t.service.model in problem.grow:
                    self.floor[key] = n
                    for s, thr in t.covers:
                        self.held[s] += n * thr
                else:
                    self.fixed[key] = n
                for c, k in t.node_use:
                    self.fixed_use[(t.region, c)] += k * n
        self.residual: dict[tuple[str, str], float] = {}
        self.overused: list[str] = []
        sliced = ix.sliced_rcs
        for rc in problem.prices:
            held = self.fixed_use.get(rc, 0)
            # held slices occupy whole nodes: their packing needs ceil(held) of them
            cap = problem.available(rc) - (math.ceil(held - 1e-9) if rc in sliced else held)
            if cap < 0:
                self.overused.append(f"{rc[0]}/{rc[1]} (held instances use {self.fixed_use[rc]}, "
                                     f"available {problem.available(rc):g})")
            # a sliced row's residual is in node shares: the node variable carries the held use
            self.residual[rc] = max(cap, 0.0) if rc not in sliced else max(
                problem.available(rc) - held, 0.0)
        # rows without room for one node always count: they only remove templates. Rows of
        # sliced nodes always count too: they carry the node variables that price the packing.
        self.rows = frozenset(rc for rc, v in self.residual.items() if v < 1 or rows is None
                              or rc in rows or rc in sliced)
        # the floor's instances are constants: the grow models' variables start from none running
        self.running = Allocation.of({k: n for k, n in running.counts if k not in self.floor}) \
            if self.floor else running
        cost_mode = problem.mode == "cost"
        self.services = sorted(s for s, d in problem.demand.items()
                               if model_of(s) in free_models
                               and (self.target(s) > 0 if cost_mode else d > 0))
        self.models = sorted({model_of(s) for s in self.services})
        self.bound: dict[str, int] = {}
        self.free: list[str] = []  # template keys that get a variable
        if not len(ix.keys):
            return
        # per service: demand (0 = no variable), per template: bound
        demand = np.array([max(self.target(s), 0.0) if model_of(s) in free_models else 0.0
                           for s in ix.services])
        resid = np.array([self.residual[rc] for rc in ix.rcs])
        enforced = np.array([rc in self.rows for rc in ix.rcs], dtype=bool)
        pinned = {ix.position[k] for k in keep if k in ix.position}
        pinned |= {ix.position[k] for k, _ in self.running.counts}
        rule = problem.per_model_rule
        if problem.removal_weight == 0 and rule is None and not ix.sliced_rcs:
            reduced = _reduced(problem, demand, enforced, resid, pinned)
        else:
            reduced = None
        chosen, bound = reduced if reduced is not None else self._reduce(demand, enforced, resid, pinned)
        self.free = [ix.keys[i] for i in chosen]
        # the free templates' index positions (column i is free[i]) and, per (region, config) id,
        # whether this round builds its row: the array build and the block split read these
        # (split_blocks sets a block's own free_pos beside its free)
        self.free_pos = np.asarray(chosen, dtype=np.intp)
        self.enforced_rc = enforced
        self.bound = {ix.keys[i]: int(b) for i, b in zip(chosen, bound.tolist(), strict=True)}
        if problem.removal_weight > 0:  # a kept template's service joins, demand or none
            extra = {s for k in self.free for s, _ in p.template(k).covers} - set(self.services)
            if extra:
                self.services = sorted(set(self.services) | extra)
                self.models = sorted({model_of(s) for s in self.services})

    def _reduce(self, demand: np.ndarray, enforced: np.ndarray, resid: np.ndarray,
                pinned: set[int]) -> tuple[list[int], np.ndarray]:
        """The kept template positions and their bounds, over the whole library (every rule,
        removal price and sliced library; :func:`_reduced` is the memoized common case)."""
        p = self.problem
        ix = p.index
        rule = p.per_model_rule
        free, need = _needed(ix, demand)
        # with a removal price a running instance may be worth keeping beyond what demand needs:
        # its template is a variable whatever its demand, bounded by its running count at least
        keepable = np.zeros(len(ix.keys))
        if p.removal_weight > 0:
            for key, n in self.running.counts:
                if model_of(p.template(key).service.name) in p.free_models:
                    keepable[ix.position[key]] = n
            free |= keepable > 0
        if rule is not None:
            free &= ~(ix.multi_config if rule == "config" else ix.multi_type)
        u = np.ceil(np.where(free, need, 0.0) - 1e-9)
        u = np.maximum(u, keepable)
        cap, touches = _caps(ix, enforced, resid)
        bound = np.maximum(np.minimum(u, cap), 0.0)
        cand = np.flatnonzero(free & (bound > 0))
        if ix.sliced_rcs and rule is None:
            # the model over slice kinds (atoll.solvers.allocation.kinds) folds the templates of
            # one engine shape into one column: it needs every member, and prunes by folding
            chosen = cand.tolist()
        elif ix.sliced_rcs:
            chosen = self._undominated_sliced(cand, enforced, pinned)
        else:
            chosen = _undominated(p, cand, touches, enforced, pinned)
        return chosen, bound[chosen]

    def target(self, service: str) -> float:
        """Demand the round's variables must cover: the service's planning demand (its demand over
        the model's headroom) minus its floor's capacity (tokens/s; <= 0 when the kept instances
        already cover it)."""
        return self.problem.planning_demand(service) - self.held.get(service, 0.0)

    def built_entries(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row's (region, config) id, column, nodes used) of each node entry of the templates at
        index positions ``pos`` (column i is ``pos[i]``) in a row this round builds, in column
        order and each template's entry order: what a pass over their ``node_use`` gives."""
        ix = self.problem.index
        one = ix.one_entry_rc
        if one is not None:  # one (region, config) per template: the common library
            rc = one[pos]
            keep = self.enforced_rc[rc]
            return rc[keep], np.flatnonzero(keep), ix.k[ix.ptr[pos[keep]]]
        first = ix.ptr[pos]
        count = ix.ptr[pos + 1] - first
        entry = np.repeat(first - np.cumsum(count) + count, count) + np.arange(int(count.sum()))
        cols = np.repeat(np.arange(len(pos)), count)
        rc = ix.rc[entry]
        keep = self.enforced_rc[rc]
        return rc[keep], cols[keep], ix.k[entry][keep]

    def constants(self) -> dict[str, int]:
        """Instances that are not variables: the fixed models' and the grow models' floors."""
        return {**self.fixed, **self.floor}

    def _undominated_sliced(self, cand: np.ndarray, enforced: np.ndarray, pinned: set[int]) -> list[int]:
        """Dominance when some rows are sliced (nodes bought as integer variables, idle GPUs
        paid): drop t when a t' of the same service (and kind, under the per-model rules) has
        throughput >=, uses no more of any enforced row (sliced rows are always enforced), and
        costs no more outside the sliced rows (ns). Moving an instance from t to t' keeps every
        row with the same node variables y; the idle share grows by what t' uses less, so the
        objective changes by (1 + K)(ns_t' - ns_t) + K price (k_t' - k_t) <= 0 (t has no running
        instance). Of equal templates the first is kept. Pairwise per service, on numpy: a
        service has at most a few thousand candidates."""
        p = self.problem
        ix = p.index
        thr = ix.throughput
        price = np.asarray([p.prices[rc] for rc in ix.rcs], dtype=np.float64)
        on_sliced = ix.sliced[ix.rc]
        ns = p.costs - np.bincount(ix.entry_template, weights=np.where(on_sliced, ix.k * price[ix.rc], 0.0),
                                   minlength=len(ix.keys))
        rows = np.flatnonzero(enforced)
        col = np.full(len(ix.rcs), -1, dtype=np.int64)
        col[rows] = np.arange(len(rows))
        use = np.zeros((len(ix.keys), max(len(rows), 1)))
        ent = np.flatnonzero(enforced[ix.rc])
        np.add.at(use, (ix.entry_template[ent], col[ix.rc[ent]]), ix.k[ent])
        group = _groups(p)
        out: list[int] = []
        eps = 1e-9
        for gid in np.unique(group[cand]).tolist():
            mem = cand[group[cand] == gid]
            t, c, u = thr[mem], ns[mem], use[mem]
            keep = np.ones(len(mem), dtype=bool)
            for a in range(len(mem)):
                # a is beaten by b: thr_b >= thr_a, ns_b <= ns_a, use_b <= use_a, and b strictly
                # better somewhere or earlier (of equal templates the first stays)
                geq = (t >= t[a] - eps) & (c <= c[a] + eps) & np.all(u <= u[a] + eps, axis=1)
                strict = (t > t[a] + eps) | (c < c[a] - eps) | np.any(u < u[a] - eps, axis=1)
                beats = geq & (strict | (np.arange(len(mem)) < a))
                beats[a] = False
                if beats.any():
                    keep[a] = False
            out.extend(mem[keep].tolist())
        return sorted(set(out) | (pinned & set(cand.tolist())))


def _needed(ix: TemplateIndex, demand: np.ndarray,
            at: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per template (of positions ``at``, default all): whether a demand row it serves has demand,
    and the instances of it alone that cover every row it serves (before rounding up), from the
    demand per index service. A co-located template serves two rows (``cover1``, ``cover2``)."""
    sel = slice(None) if at is None else at
    thr = ix.throughput[sel]
    d1 = demand[ix.cover1[sel]]
    free = d1 > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        need = d1 / thr
    if ix.any_colocated:
        c2, co = ix.cover2[sel], ix.colocated[sel]
        d2 = np.where(co, demand[np.maximum(c2, 0)], 0.0)
        need = np.maximum(need, np.where(co, d2 / np.where(co, ix.throughput2[sel], 1.0), 0.0))
        free = free | (d2 > 0)
    return free, need


def _groups(p: AllocationProblem) -> np.ndarray:
    """Per template, the group within which dominance compares: its service (and GPU type or
    config, under the one-type or one-config rule), and its region (pool and tier) for a model
    with a :class:`~atoll.solvers.problem.Risk`, whose rows tell regions apart."""
    ix = p.index
    rule = p.per_model_rule
    if rule == "config":
        kind, n_kinds = ix.config_kind, ix.n_configs
    elif rule == "gpu_type":
        kind, n_kinds = ix.kind, ix.n_kinds
    else:
        kind, n_kinds = np.zeros_like(ix.kind), 1
    group = ix.service * n_kinds + kind
    if not p.risk:
        return group
    # from the index's arrays: a template's region is its first entry's (one region each)
    regions = {r: i for i, r in enumerate(sorted({r for r, _ in ix.rcs}))}
    region_of_rc = np.asarray([regions[r] for r, _ in ix.rcs], dtype=np.int64)
    risky = np.asarray([model_of(s) in p.risk for s in ix.services], dtype=bool)[ix.service]
    region = np.where(risky, region_of_rc[ix.rc[ix.ptr[:-1]]], -1)
    return group * (len(regions) + 1) + region + 1


def _undominated(p: AllocationProblem, cand: np.ndarray, touches: np.ndarray, enforced: np.ndarray,
                 pinned: set[int]) -> list[int]:
    """The kept positions of ``cand`` in library order: :func:`_front`'s and the pinned ones."""
    return sorted(set(_front(p, cand, touches, enforced)) | (pinned & set(cand.tolist())))


def _front(p: AllocationProblem, cand: np.ndarray, touches: np.ndarray, enforced: np.ndarray,
           ranked: np.ndarray | None = None) -> list[int]:
    """Drop t when a t' of the same service (and GPU type or config, under the one-type or
    one-config rule) has
    cost <= and throughput >= and uses no node of an enforced row, or the same nodes of
    enforced rows as t (a t on a sliced row only the latter: see the loop).
    Moving an instance from t to t' then keeps every enforced row and
    demand row and cannot raise the objective (t has no running instance, so its added
    cost (1 + K) p_t is at least t's worst case (1 + K) p_t'). Running and warm-start
    templates are kept by the caller (:func:`_undominated`). Returns the undominated positions.
    ``ranked``: every template sorted by (group, cost, -throughput, position), when the caller
    keeps it (:func:`_ranking`)."""
    ix = p.index
    cost, thr = p.costs, ix.throughput
    group = _groups(p)
    out: list[int] = []
    # templates that touch no enforced row: one Pareto front per (service, kind)
    plain = cand[~touches[cand]]
    if ranked is None:
        order = plain[np.lexsort((plain, -thr[plain], cost[plain], group[plain]))]
    else:  # the same order: the ranking restricted to the plain candidates
        mask = np.zeros(len(thr), dtype=bool)
        mask[plain] = True
        order = ranked[mask[ranked]]
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
    touching = cand[touches[cand]]
    rcs, ks = ix.rc_list, ix.k_list
    starts, ends = ix.ptr[touching].tolist(), ix.ptr[touching + 1].tolist()
    for i, a, b, g in zip(touching.tolist(), starts, ends, group[touching].tolist(), strict=True):
        usage = tuple((r, k) for r, k in zip(rcs[a:b], ks[a:b], strict=True) if on[r])
        groups[(g, usage)].append(i)
    sliced = ix.sliced.tolist()
    for (gid, used), members in groups.items():
        front_cost, front_thr = fronts.get(gid, (np.zeros(0), np.zeros(0)))
        if any(sliced[r] for r, _ in used):
            # moving an instance off a sliced row need not save its share: the node it sat on
            # may stay bought (nodes are integers). Only same-usage templates compare.
            front_cost, front_thr = np.zeros(0), np.zeros(0)
        members.sort(key=lambda i: (cost[i], -thr[i], i))
        best = -math.inf
        for i in members:
            j = int(np.searchsorted(front_cost, cost[i] + 1e-12, side="right"))
            dominated = thr[i] <= best or (j > 0 and front_thr[j - 1] >= thr[i])
            if not dominated:
                out.append(i)
            best = max(best, thr[i])
    return out


@dataclass(frozen=True)
class _Pruned:
    """What dominance kept of one library under one (prices, enforced rows and their residuals,
    services with demand, risky models): the undominated positions before pinning, and per
    template its availability cap min_c floor(A_rc / n_tc) (inf off the enforced rows)."""

    front: tuple[int, ...]
    cap: np.ndarray  # float32: whole numbers or inf, exact


_PRUNED: weakref.WeakKeyDictionary[TemplateIndex, OrderedDict[tuple[object, ...], _Pruned]] = \
    weakref.WeakKeyDictionary()
_PRUNED_SIZE = 64  # entries per library (~0.4 MB each on a 1e5-template library)
_THR_MAX: weakref.WeakKeyDictionary[TemplateIndex, np.ndarray] = weakref.WeakKeyDictionary()
_BY_RC: weakref.WeakKeyDictionary[TemplateIndex, list[tuple[np.ndarray, np.ndarray]]] = \
    weakref.WeakKeyDictionary()
_RANKED: weakref.WeakKeyDictionary[TemplateIndex, dict[tuple[object, ...], np.ndarray]] = \
    weakref.WeakKeyDictionary()
_RUNS: weakref.WeakKeyDictionary[TemplateIndex, dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]]] = \
    weakref.WeakKeyDictionary()


def _entries_by_rc(ix: TemplateIndex) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per (region, config) id: the templates that use it and how many nodes each (shared by a
    capacity correction's index with the index it was scaled from: the rows are the same)."""
    ix = ix._rescaled_from or ix
    got = _BY_RC.get(ix)
    if got is None:
        order = np.argsort(ix.rc, kind="stable")
        cuts = np.searchsorted(ix.rc[order], np.arange(len(ix.rcs) + 1))
        got = _BY_RC[ix] = [(ix.entry_template[order[a:b]], ix.k[order[a:b]])
                            for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    return got


def _caps(ix: TemplateIndex, enforced: np.ndarray, resid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per template, min over the enforced rows it uses of floor(A_rc / n_tc) (inf when it uses
    none), and whether it uses any: from the enforced rows' own entries (a template has one entry
    per row it uses), not a pass over every entry of the library."""
    by_rc = _entries_by_rc(ix)
    cap = np.full(len(ix.keys), np.inf)
    touches = np.zeros(len(ix.keys), dtype=bool)
    for r in np.flatnonzero(enforced).tolist():
        at, k = by_rc[r]
        touches[at] = True
        cap[at] = np.minimum(cap[at], np.floor(resid[r] / k))
    return cap, touches


def _ranking(p: AllocationProblem, prices: tuple[float, ...], risky: tuple[str, ...]) -> np.ndarray:
    """Every template by (dominance group, cost, -throughput, position) under ``prices``."""
    memo = _RANKED.setdefault(p.index, {})
    got = memo.get((prices, risky))
    if got is None:
        ix = p.index
        near = ix.near[0]() if ix.near is not None else None
        earlier = _RANKED.get(near, {}).get((prices, risky)) if near is not None else None
        groups = _groups(p)
        if earlier is not None and ix.near is not None:
            runs = _runs(ix, (prices, risky, p.per_model_rule), earlier, p.costs, groups)
            got = _reranked(earlier, ix.near[1], ix, runs)
        else:
            pos = np.arange(len(ix.keys))
            got = np.lexsort((pos, -ix.throughput, p.costs, groups))
        if len(memo) >= 8:
            memo.pop(next(iter(memo)))
        memo[(prices, risky)] = got
    return got


def _runs(ix: TemplateIndex, key: tuple[object, ...], ranking: np.ndarray, costs: np.ndarray,
          groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per template, the first and past-the-last slot of its run in ``ranking``: the templates of
    its (dominance group, cost). A capacity correction moves throughputs only, so the runs and
    their slots are the same in every ranking of the indexes scaled from one library under one
    price list and rule: kept per that library and ``key``, computed once."""
    root = ix._rescaled_from or ix
    memo = _RUNS.setdefault(root, {})
    got = memo.get(key)
    if got is None:
        g, c = groups[ranking], costs[ranking]
        n = len(ranking)
        slot = np.arange(n)
        new = np.ones(n, dtype=bool)
        new[1:] = (g[1:] != g[:-1]) | (c[1:] != c[:-1])
        first = np.maximum.accumulate(np.where(new, slot, 0))
        heads = np.flatnonzero(new)
        past = np.append(heads[1:], n)[np.cumsum(new) - 1]
        start, end = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        start[ranking], end[ranking] = first, past
        if len(memo) >= 8:
            memo.pop(next(iter(memo)))
        got = memo[key] = (start, end)
    return got


def _reranked(earlier: np.ndarray, changed: np.ndarray, ix: TemplateIndex,
              runs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The ranking of :func:`_ranking` from the ranking of the index ``ix`` was rescaled from
    where only the templates ``changed`` moved their throughput. The order is by (group, cost)
    first and a template's cost does not move, so only the runs of equal (group, cost) holding a
    changed template are sorted again, each within its own slots (``runs``: :func:`_runs`). The
    key (group, cost, -throughput, position) is a total order, so the result is the one a full
    sort gives."""
    got = earlier.copy()
    if not len(changed):
        return got
    start, end = runs
    starts, at = np.unique(start[changed], return_index=True)
    ends = end[changed][at]
    # every moved run's slots at once, then one sort with the run first, so each run's templates
    # land back in its own slots
    lengths = ends - starts
    slots = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
    span = earlier[slots]
    got[slots] = span[np.lexsort((span, -ix.throughput[span], start[span]))]
    return got


def _reduced(p: AllocationProblem, demand: np.ndarray, enforced: np.ndarray, resid: np.ndarray,
             pinned: set[int]) -> tuple[list[int], np.ndarray] | None:
    """:meth:`RoundInstance._reduce` without a removal price, per-model rule or slices, with the
    dominance pass memoized. Why it may be: which templates are candidates and which of them
    dominance keeps depend on the demand only through which services have any (every template of
    a service with demand gets a bound >= 1), not on how much; so a re-plan that only moves
    demand reuses the pruning and computes bounds for the few hundred kept templates. None when a
    service's demand is so small that some template's bound rounds to 0 (the caller computes)."""
    ix = p.index
    thr_max = _THR_MAX.get(ix)
    if thr_max is None:
        thr_max = _THR_MAX[ix] = np.zeros(len(ix.services))
        np.maximum.at(thr_max, ix.cover1, ix.throughput)
        co = ix.colocated
        np.maximum.at(thr_max, ix.cover2[co], ix.throughput2[co])
    positive = demand > 0
    if np.any(positive & (demand <= 4e-9 * thr_max)):
        return None
    memo = _PRUNED.setdefault(ix, OrderedDict())
    # whole nodes: floor(A / n) = floor(floor(A) / n), so only the whole part of a residual counts
    key = (tuple(p.prices[rc] for rc in ix.rcs), enforced.tobytes(), np.floor(resid[enforced]).tobytes(),
           positive.tobytes(), tuple(sorted(p.risk)) if p.risk else ())
    hit = memo.get(key)
    if hit is None:
        free, _ = _needed(ix, demand)
        cap, touches = _caps(ix, enforced, resid)
        cand = np.flatnonzero(free & (cap >= 1))
        front = _front(p, cand, touches, enforced, ranked=_ranking(p, key[0], key[4]))
        hit = memo[key] = _Pruned(tuple(sorted(front)), cap.astype(np.float32))
        while len(memo) > _PRUNED_SIZE:
            memo.popitem(last=False)
    memo.move_to_end(key)
    if pinned:
        at = np.asarray(sorted(pinned), dtype=np.int64)
        served, _ = _needed(ix, demand, at)
        extra = {i for i, ok in zip(at.tolist(), served.tolist(), strict=True) if ok and hit.cap[i] >= 1}
    else:
        extra = set()
    chosen = sorted(set(hit.front) | extra) if extra else list(hit.front)
    at = np.asarray(chosen, dtype=np.int64)
    _, need = _needed(ix, demand, at)
    u = np.ceil(need - 1e-9)
    return chosen, np.maximum(np.minimum(u, hit.cap[at]), 0.0)
