"""The sliced allocation ILP over slice *kinds*: one column per engine shape, not per placement.

A slice config "g/GxT" performs as a g-GPU node of type T whatever its node's G (the
performance model reads g and T only), so a sliced library holds many templates of one engine
that differ only in the node sizes their stages sit on ("1xL4", "1/4xL4", "1/8xL4"). Their
columns are identical but for the nodes they fill, which makes the ILP's relaxation degenerate
and its search slow. This module states the same ILP over *kinds* (region, T, g):

- a **group** is the templates of one service and region with one engine shape: n stages, a
  lead stage of kind a and n - 1 worker stages of kind b (the vllm runtime's rules: one GPU count
  on every stage, at most two configs with the odd one leading). Its members are every
  (lead config, worker config) of those kinds, all with the same throughput;
- a group's column counts its *new* instances. Its lead slice (and for n = 2 its one worker
  slice) is a slice of its kind, placed by integer variables z_{kappa,c} >= 0, the slices of
  kind kappa on config c, with sum_c z_{kappa,c} = sum_k m_{k,kappa} x_k. Workers of an engine
  with n >= 3 share one config (one worker pod template), so such a group has one column per
  worker config, the lead still free;
- running instances keep their own template's column, bounded by the running count (an added
  instance of that template is a new instance of its group at the same price), with the
  removal price of the plain model;
- node rows per sliced (region, config) read the slices placed there, y - idle - use = held;
  whole-node rows (never sliced) read them as nodes.

The objective is the plain model's: new instances at (1 + K) x their share of the node price,
kept ones at their share, idle GPUs at the node price. Every plan of one model maps to a plan of
the other at the same objective (a new instance of template t = its group's column with its
slices placed on t's configs; the other way, the placement gives each new instance a member), so
the optimum is the plain sliced ILP's, with a column count near the whole-node library's.
Groups whose members are not the full product of their kinds' configs, or differ in throughput,
keep per-template columns (exact either way). The per-model rules (one type or config per
model, the ladder's rungs) keep the plain model.

Variables ``kinst<i>_...`` (a group's column), ``place<j>_<kind>_<config>`` (z), rows
``kind<j>_...``; the rest is named as in :mod:`~atoll.solvers.allocation.model`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import pulp

from atoll.solvers.allocation.model import STAGES, finish_start, label, node_rows, risk_rows, service_rows
from atoll.solvers.allocation.reduction import RoundInstance
from atoll.solvers.problem import Allocation
from atoll.solvers.types import node_config_of, node_share, parse_config_name

Kind = tuple[str, str, int]  # (region, GPU type, GPUs per stage)


def kind_of(region: str, config: str) -> Kind:
    g, _, gpu = parse_config_name(config)
    return region, gpu, g


@dataclass(frozen=True)
class Group:
    """One engine shape of one service in one region; ``members`` maps (lead config, worker
    config) to the template key (for n = 2 with one kind, the pair in sorted order)."""

    service: str
    region: str
    lead: Kind
    worker: Kind | None
    n: int
    throughput: float
    members: Mapping[tuple[str, str | None], str]


def _shape(stage_configs: list[str]) -> tuple[str, str | None] | None:
    """(lead config, worker config) of a one-config-per-stage engine, canonical; None when the
    stages do not have the vllm shape (then the template keeps its own column)."""
    n = len(stage_configs)
    if n == 1:
        return stage_configs[0], None
    if n == 2:
        a, b = stage_configs
        return (a, b) if a <= b else (b, a)
    counts: dict[str, int] = defaultdict(int)
    for c in stage_configs:
        counts[c] += 1
    if len(counts) == 1:
        return stage_configs[0], stage_configs[0]
    if len(counts) == 2 and min(counts.values()) == 1:
        lone = next(c for c, k in counts.items() if k == 1)
        many = next(c for c, k in counts.items() if k > 1)
        return lone, many
    return None


def group_templates(inst: RoundInstance) -> tuple[list[Group], list[str]]:
    """The round's free templates as complete groups, and the keys left as their own columns."""
    p = inst.problem
    raw: dict[tuple[str, str, Kind, Kind | None, int], dict[tuple[str, str | None], str]] = defaultdict(dict)
    thr: dict[tuple[str, str, Kind, Kind | None, int], set[float]] = defaultdict(set)
    configs: dict[Kind, set[str]] = defaultdict(set)
    loose: list[str] = []
    for key in inst.free:
        t = p.template(key)
        stage_configs = [s.nodes[0] for s in t.stages]
        shape = _shape(stage_configs) if all(len(s.nodes) == 1 for s in t.stages) else None
        if shape is None:
            loose.append(key)
            continue
        lead, worker = shape
        a = kind_of(t.region, lead)
        b = None if worker is None else kind_of(t.region, worker)
        if len(stage_configs) == 2 and b is not None and worker is not None and b < a:  # unordered pair
            a, b, lead, worker = b, a, worker, lead
        sig = (t.service.name, t.region, a, b, len(stage_configs))
        if (lead, worker) in raw[sig]:  # two layer splits of one shape: keep both as columns
            loose.append(key)
            continue
        raw[sig][(lead, worker)] = key
        thr[sig].add(round(t.throughput, 9))
        configs[a].add(lead)
        if b is not None and worker is not None:
            configs[b].add(worker)
    groups: list[Group] = []
    for sig, members in raw.items():
        service, region, a, b, n = sig
        want = {(la, None) for la in configs[a]} if b is None else {
            (min(la, w), max(la, w)) if n == 2 and a == b else (la, w)
            for la in configs[a] for w in configs[b]}
        if len(thr[sig]) != 1 or set(members) != want:
            loose.extend(members.values())
            continue
        t0 = p.template(next(iter(members.values())))
        groups.append(Group(service, region, a, b, n, t0.throughput, dict(members)))
    loose.sort(key=lambda k: p.index.position[k])
    return groups, loose


def supports(inst: RoundInstance) -> bool:
    """Whether this module states ``inst``'s ILP: a sliced library without a per-model rule or
    co-located templates (those go through :mod:`~atoll.solvers.allocation.model`)."""
    ix = inst.problem.index
    return bool(ix.sliced_rcs) and inst.problem.per_model_rule is None and not ix.any_colocated


@dataclass
class _Column:
    var: pulp.LpVariable
    group: Group
    worker: str | None  # the shared worker config of an n >= 3 column


@dataclass
class KindModel:
    """A built round over kinds: the PuLP problem, the plain columns (template key -> x_t), the
    group columns and the placement variables."""

    prob: pulp.LpProblem
    count: dict[str, pulp.LpVariable]
    columns: list[_Column] = field(default_factory=list)
    place: dict[tuple[Kind, str], pulp.LpVariable] = field(default_factory=dict)
    removed: dict[str, pulp.LpVariable] = field(default_factory=dict)
    added: dict[str, pulp.LpVariable] = field(default_factory=dict)
    fraction: dict[str, pulp.LpVariable] = field(default_factory=dict)
    nodes: dict[tuple[str, str], tuple[pulp.LpVariable, pulp.LpVariable]] = field(default_factory=dict)

    def values(self) -> dict[str, float | None]:
        """Instances per template key as the last solve left them: the plain columns', and each
        group column's instances given members by the placement (a slot of kind kappa on config
        c per unit of z_{kappa,c})."""
        out: dict[str, float | None] = {k: v.varValue for k, v in self.count.items()}
        slots: dict[Kind, list[str]] = defaultdict(list)
        for (kind, c), var in self.place.items():
            v = var.varValue
            if v is None or abs(v - round(v)) > 1e-5 or v < -1e-6:
                return {**out, f"place {kind} on {c}": v}
            slots[kind].extend([c] * int(round(v)))
        for col in self.columns:
            v = col.var.varValue
            if v is None or abs(v - round(v)) > 1e-5 or v < -1e-6:
                return {**out, col.var.name: v}
            g = col.group
            for _ in range(int(round(v))):
                lead = slots[g.lead].pop() if slots[g.lead] else None
                worker = col.worker
                if g.n == 2 and g.worker is not None:
                    worker = slots[g.worker].pop() if slots[g.worker] else None
                if lead is None or (g.n > 1 and worker is None):
                    return {**out, f"placement of {col.var.name}": None}
                pair = (min(lead, worker), max(lead, worker)) if (
                    g.n == 2 and g.lead == g.worker and worker is not None) else (lead, worker)
                key = g.members[pair]
                out[key] = (out.get(key) or 0.0) + 1.0
        if any(slots.values()):
            return {**out, "placement": None}
        return out


Term = tuple[pulp.LpVariable, float]


@dataclass
class _Terms:
    """What the columns contribute to the rows and the objective, gathered column by column and
    written once every column exists (a row names all its columns at once)."""

    objective: list[Term] = field(default_factory=list)
    by_rc: dict[tuple[str, str], list[Term]] = field(default_factory=lambda: defaultdict(list))
    by_service: dict[str, list[Term]] = field(default_factory=lambda: defaultdict(list))
    by_region: dict[str, list[tuple[str, pulp.LpVariable, float]]] = field(
        default_factory=lambda: defaultdict(list))


def _plain_columns(inst: RoundInstance, km: KindModel, loose: list[str], grouped_keys: set[str],
                   terms: _Terms) -> None:
    """The per-template columns: templates no group takes, and the running instances of grouped
    ones (bounded by the running count: an added instance is a new one of its group), with the
    plain model's start-up and removal columns and rows."""
    p, prob, running = inst.problem, km.prob, inst.running
    K = p.startup_weight
    plain = loose + sorted((k for k in grouped_keys if running[k] > 0), key=lambda k: p.index.position[k])
    for i, key in enumerate(plain):
        t = p.template(key)
        r = running[key]
        capped = key in grouped_keys  # added instances of a grouped template are its group's
        bound = min(inst.bound[key], r) if capped else inst.bound[key]
        var = km.count[key] = prob.add_variable(f"inst{i:06d}_{label(key)}", 0, bound, cat=pulp.LpInteger)
        cost = p.template_cost(key)
        if r == 0:
            terms.objective.append((var, cost * (1.0 + K)))
        else:
            terms.objective.append((var, cost))
            if K > 0 and not capped:
                add = km.added[key] = prob.add_variable(f"added{i:06d}_{label(key)}", 0, inst.bound[key])
                terms.objective.append((add, cost * K))
                prob += (pulp.LpAffineExpression([(add, 1.0), (var, -1.0)]) >= -r,
                         f"startup{i:06d}_{label(key)}")
            if p.removal_weight > 0:
                rem = km.removed[key] = prob.add_variable(f"removed{i:06d}_{label(key)}", 0, r)
                terms.objective.append((rem, cost * p.removal_weight))
                prob += (pulp.LpAffineExpression([(rem, 1.0), (var, 1.0)]) >= r,
                         f"removal{i:06d}_{label(key)}")
        for c, k in t.node_use:
            terms.by_rc[(t.region, c)].append((var, float(k)))
        terms.by_service[t.service.name].append((var, t.throughput))
        terms.by_region[t.service.name].append((t.region, var, t.throughput))


def _group_columns(inst: RoundInstance, km: KindModel, groups: list[Group], terms: _Terms, pays: bool
                   ) -> tuple[dict[Kind, list[Term]], dict[Kind, set[str]]]:
    """Each group's columns of new instances (one, or one per shared worker config when n >= 3);
    (the free slices each column asks of each kind, the configs those slices may sit on), for
    :func:`_placement_rows`. A worker config fixed by the column is paid here, on its nodes."""
    p, prob = inst.problem, km.prob
    K = p.startup_weight
    free_slices: dict[Kind, list[Term]] = defaultdict(list)
    kind_configs: dict[Kind, set[str]] = defaultdict(set)
    for j, g in enumerate(groups):
        # each member's bound is min(ceil(demand / throughput), its pools' room): the group's new
        # instances need no more than the demand's share of it, nor more than all members' room
        bounds = [inst.bound[k] for k in g.members.values()]
        need = math.ceil(max(inst.target(g.service), 0.0) / g.throughput - 1e-9)
        bound = min(sum(bounds), max(need, *bounds))
        shared = sorted({w for _, w in g.members if w})
        workers: list[str | None] = [None] if g.n <= 2 else list(shared)
        for w in workers:
            name = f"kinst{j:06d}_{label(g.service)}_{label(g.region)}_{g.lead[1]}x{g.lead[2]}_n{g.n}" + (
                f"_{label(w)}" if w else "")
            var = prob.add_variable(name, 0, bound, cat=pulp.LpInteger)
            km.columns.append(_Column(var, g, w))
            free_slices[g.lead].append((var, 1.0))
            kind_configs[g.lead].update(la for la, _ in g.members)
            if g.n == 2 and g.worker is not None:
                free_slices[g.worker].append((var, 1.0))
                kind_configs[g.worker].update(x for pair in g.members for x in pair if x is not None
                                              and kind_of(g.region, x) == g.worker)
            if w is not None:  # n - 1 workers on w, a new instance's
                rc = (g.region, node_config_of(w))
                share = (g.n - 1) * node_share(w)
                terms.by_rc[rc].append((var, share))
                if pays:
                    terms.objective.append((var, (1.0 + K) * share * p.prices[rc]))
            terms.by_service[g.service].append((var, g.throughput))
            terms.by_region[g.service].append((g.region, var, g.throughput))
    return free_slices, kind_configs


def _placement_rows(inst: RoundInstance, km: KindModel, free_slices: Mapping[Kind, list[Term]],
                    kind_configs: Mapping[Kind, set[str]], terms: _Terms, pays: bool) -> None:
    """Per kind, the placement variables z (its slices on each config, paid as new slices of that
    config's nodes) and the row sum_c z = the slices the group columns ask of the kind."""
    p, prob = inst.problem, km.prob
    K = p.startup_weight
    for j, (kind, column_terms) in enumerate(sorted(free_slices.items())):
        places = []
        for c in sorted(kind_configs[kind]):
            z = km.place[(kind, c)] = prob.add_variable(f"place{j:05d}_{label(kind[0])}_{label(c)}", 0,
                                                        cat=pulp.LpInteger)
            places.append((z, 1.0))
            rc = (kind[0], node_config_of(c))
            terms.by_rc[rc].append((z, node_share(c)))
            if pays:
                terms.objective.append((z, (1.0 + K) * node_share(c) * p.prices[rc]))
        per_column: dict[pulp.LpVariable, float] = defaultdict(float)  # n = 2 of one kind: 2 slices
        for v, mult in column_terms:
            per_column[v] += mult
        prob += (pulp.LpAffineExpression([*places, *((v, -mult) for v, mult in per_column.items())]) == 0,
                 f"kind{j:05d}_{label(kind[0])}_{kind[1]}x{kind[2]}")


def build_kind_model(inst: RoundInstance, stage: str, floor_share: float | None = None) -> KindModel:
    """The round's ILP over kinds (module docstring); stages as in
    :func:`~atoll.solvers.allocation.model.build_model`. Columns are added in a fixed order
    (plain, group, placement) since the solver's path, and so a tie's answer, follows it."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; valid stages: {', '.join(STAGES)}")
    sense = pulp.LpMaximize if stage == "share" else pulp.LpMinimize
    prob = pulp.LpProblem("allocation", sense)
    groups, loose = group_templates(inst)
    km = KindModel(prob, {})
    pays = stage != "share"
    terms = _Terms()
    grouped_keys = {k for g in groups for k in g.members.values()}
    _plain_columns(inst, km, loose, grouped_keys, terms)
    free_slices, kind_configs = _group_columns(inst, km, groups, terms, pays)
    _placement_rows(inst, km, free_slices, kind_configs, terms, pays)
    objective = terms.objective
    objective += node_rows(inst, prob, terms.by_rc, km.nodes, pays)
    objective = service_rows(inst, prob, terms.by_service, km.fraction, stage, floor_share) or objective
    if inst.problem.risk:
        risk_rows(inst, prob, terms.by_region, km.fraction, stage)
    prob.setObjective(pulp.LpAffineExpression(objective))
    return km


def kind_start_values(inst: RoundInstance, km: KindModel, start: Allocation) -> dict[str, float]:
    """A full MIP start from an allocation of templates: running templates on their own columns up
    to their running count, every other instance on its group's column with its slices placed
    where the template has them; nodes as ceil(use), idle the rest."""
    p = inst.problem
    values = {v.name: 0.0 for v in (*km.count.values(), *(c.var for c in km.columns), *km.place.values())}
    column_of: dict[str, tuple[_Column, str, str | None]] = {}  # member key -> (column, lead, worker)
    for col in km.columns:
        for (lead, worker), key in col.group.members.items():
            if col.worker is None or col.worker == worker:
                column_of[key] = (col, lead, worker)
    cap: dict[str, float] = defaultdict(float)
    use: dict[tuple[str, str], float] = defaultdict(float)
    for key, n in start.counts:
        n -= inst.floor.get(key, 0)
        if n <= 0:
            continue
        t = p.template(key)
        if key in km.count:
            var = km.count[key]
            v = min(n, int(var.upBound if var.upBound is not None else n))
            values[var.name] = v
            n -= v
            for c, k in t.node_use:
                use[(t.region, c)] += k * v
            cap[t.service.name] += v * t.throughput
        if n <= 0 or key not in column_of:
            continue
        col, lead, worker = column_of[key]
        g = col.group
        values[col.var.name] += n
        values[km.place[(g.lead, lead)].name] += n
        if g.n == 2 and g.worker is not None and worker is not None:
            values[km.place[(g.worker, worker)].name] += n
        for c, k in t.node_use:
            use[(t.region, c)] += k * n
        cap[t.service.name] += n * t.throughput
    for key, var in km.count.items():
        r = inst.running[key]
        if key in km.added:
            values[km.added[key].name] = max(0.0, values[var.name] - r)
        if key in km.removed:
            values[km.removed[key].name] = max(0.0, r - values[var.name])
    finish_start(inst, values, cap, use, km.fraction, km.nodes)
    return values
