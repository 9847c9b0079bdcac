"""The contest's second reference: a rule per model, found by coordinate descent.

One ``fixed:K@q`` for every model is a poor fit when the models differ (extended, 20 models): a
model with a flat day wants a long interval, a spiky one a short interval and a high level. The
per-model reference gives each model its own ``(K, q)``, so a learned policy's win over "one
rule" can be told apart from a win over "the right rule per model".

**The table.** Every rule of the grid runs on the validation days with each model's own sums
recorded (:func:`atoll.training.contest.run_rule`): cost, requests, requests that met the SLO
and tokens lost. For the fixed rules that is a table *option (K, q) -> one cell per model*. An
assignment's point is read off it by summing its models' cells — the models are assumed not to
interact (they share GPU pools and the spot market, so the point is an estimate; a uniform
assignment's estimate is exactly that rule's measured point).

**Coordinate descent** (:func:`coordinate_descent`): from a start assignment, each model's option
in turn is replaced by the one that minimizes the objective with the other models held, a few
passes, until a pass changes nothing. Two objectives:

- at an SLO target: least cost with the aggregate SLO attainment >= target (lexicographic:
  shortfall first, then cost) — not separable across models, hence the passes. One target per
  one-rule frontier rule kept (:func:`frontier_targets`), each started from that rule, so every
  per-model point is at least as good as its rule on the table; together with the one-rule
  frontier they make the *per-model frontier*, chosen on the validation days only.
- effective cost (node $ + lost tokens x a price): the *best per-model assignment*, the second
  reference of ``effective_cost_ratio``.

**The policy.** :class:`PerModelRule` (spec ``per-model:K1@q1,K2@q2,...``, one entry per model in
the fleet's order) re-plans model i fully at level q_i every K_i steps; it runs on the env
configured at the assignment's most common level with every level of the assignment among its
action levels, so a uniform assignment is exactly ``fixed:K@q``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atoll.envs.actions import ActionCodec
from atoll.envs.vocabulary import (
    PER_MODEL_USAGE,
    PLANNING_LEVELS,
    Entry,
    PolicySpec,
)
from atoll.solvers.errors import InputError
from atoll.solvers.problem import NEUTRAL_RISK, Risk
from atoll.solvers.validation import check_number

# (K steps, planning level q) of a fixed:K@q rule, or (K, q, risk) of fixed:K@q+RISK
Option = Entry
MODEL_KEYS: tuple[str, ...] = ("cost_usd", "requests", "met_requests", "unserved_tokens")


def model_key(i: int, key: str) -> str:
    """The totals key of model ``i``'s sum ``key`` (``model/<i>/<key>``)."""
    return f"model/{i}/{key}"


def fixed_option(spec: PolicySpec) -> Option | None:
    """(K, q) of ``fixed:K@q``, (K, q, risk) of ``fixed:K@q+RISK``; None for any other spec (a
    threshold rule, a rule without a level)."""
    if spec.kind != "fixed" or spec.every is None or spec.level is None:
        return None
    return (spec.every, spec.level) if spec.risk is None else (spec.every, spec.level, spec.risk)


def option_spec(option: Option) -> PolicySpec:
    """The ``fixed:K@q[+RISK]`` rule of an option."""
    risk = option[2] if len(option) == 3 else None
    return PolicySpec("fixed", every=option[0], level=option[1], risk=risk)


def option_name(option: Option) -> str:
    return str(option_spec(option))


@dataclass(frozen=True)
class ModelCell:
    """One model's sums under one option on the validation days (means over seeds)."""

    cost_usd: float
    requests: float
    met_requests: float
    unserved_tokens: float

    def __post_init__(self) -> None:
        for name in MODEL_KEYS:
            check_number("ModelCell", name, getattr(self, name), allow_zero=True)
        if self.met_requests > self.requests * (1 + 1e-9) + 1e-9:
            raise InputError(f"ModelCell: field 'met_requests' ({self.met_requests!r}) exceeds 'requests' "
                             f"({self.requests!r}); the SLO share of a model is at most 1")


Table = Mapping[Option, Sequence[ModelCell]]


def model_table(validation: Mapping[str, Sequence[Mapping[str, float]]], n_models: int,
                rules: Sequence[PolicySpec]) -> dict[Option, list[ModelCell]]:
    """The per-model table of the fixed rules among ``rules`` (the grid) from their per-seed
    validation totals, keyed by ``str(rule)`` (which :func:`atoll.training.contest.run_rule` gives
    ``model/<i>/...`` sums): means over seeds. A rule without totals is left out; totals without
    per-model sums (e.g. a cached grid from before) are an InputError."""
    table: dict[Option, list[ModelCell]] = {}
    for rule in rules:
        option = fixed_option(rule)
        rows = validation.get(str(rule))
        if option is None or rows is None:
            continue
        missing = [model_key(i, k) for i in range(n_models) for k in MODEL_KEYS
                   if model_key(i, k) not in rows[0]]
        if missing:
            raise InputError(f"validation totals of {str(rule)!r} have no per-model sums ({missing[0]} ...): "
                             f"run the grid again with this version (atoll.training.contest.validation_grid)")
        table[option] = [ModelCell(*(float(np.mean([r[model_key(i, k)] for r in rows])) for k in MODEL_KEYS))
                         for i in range(n_models)]
    return table


@dataclass(frozen=True)
class Assignment:
    """One option per model and its point on the table."""

    options: tuple[Option, ...]
    cost_usd: float
    slo_attainment: float
    unserved_tokens: float

    @property
    def uniform(self) -> bool:
        return len(set(self.options)) == 1

    @property
    def policy(self) -> PolicySpec:
        """``fixed:K@q`` when every model has the same option (that rule), else ``per-model:...``."""
        if self.uniform:
            return option_spec(self.options[0])
        return PolicySpec("per-model", entries=tuple(self.options))

    @property
    def spec(self) -> str:
        """The name of :attr:`policy` (``str(policy)``)."""
        return str(self.policy)

    def effective_cost(self, lost_usd_per_mtok: float) -> float:
        return self.cost_usd + lost_usd_per_mtok * self.unserved_tokens / 1e6


def assignment_spec(options: Sequence[Option]) -> str:
    return str(PolicySpec("per-model", entries=tuple(options)))


def evaluate(table: Table, options: Sequence[Option]) -> Assignment:
    """An assignment's point: its models' cells summed (SLO = met / requested)."""
    n = len(options)
    cells = []
    for i, option in enumerate(options):
        if option not in table:
            raise InputError(f"option {option_name(option)} of model {i} is not in the table; options: "
                             f"{', '.join(option_name(o) for o in table)}")
        row = table[option]
        if len(row) != n:
            raise InputError(f"table row {option_name(option)} has {len(row)} models, the assignment {n}")
        cells.append(row[i])
    requests = sum(c.requests for c in cells)
    met = sum(c.met_requests for c in cells)
    return Assignment(tuple(options), sum(c.cost_usd for c in cells), met / requests if requests > 0 else 1.0,
                      sum(c.unserved_tokens for c in cells))


Objective = Callable[[Assignment], tuple[float, ...]]


SLO_TOLERANCE = 1e-9  # a table's sums and a rule's own totals may differ in the last bits


def slo_objective(target: float) -> Objective:
    """Least cost at SLO attainment >= ``target`` (shortfall first, then cost); a shortfall within
    :data:`SLO_TOLERANCE` is none, so rounding never buys SLO at a cost."""
    return lambda a: (max(0.0, target - a.slo_attainment - SLO_TOLERANCE), a.cost_usd)


def effective_objective(lost_usd_per_mtok: float) -> Objective:
    """Least node $ + lost tokens x ``lost_usd_per_mtok`` per million."""
    return lambda a: (a.effective_cost(lost_usd_per_mtok),)


@dataclass(frozen=True)
class Descent:
    """A coordinate descent's answer and how it got there (``passes`` run, ``moves`` made)."""

    assignment: Assignment
    passes: int
    moves: int
    history: tuple[tuple[float, ...], ...] = field(default=())


def coordinate_descent(table: Table, start: Sequence[Option], objective: Objective, *, passes: int = 3
                       ) -> Descent:
    """Each model's option in turn replaced by the table's best with the others held (ties keep
    the current option), for at most ``passes`` passes, stopping after a pass without a move."""
    if passes < 1:
        raise InputError(f"coordinate_descent: field 'passes' must be >= 1, got {passes!r}")
    if not table:
        raise InputError("coordinate_descent: the table is empty; run fixed:K@q rules on the validation days")
    current = list(start)
    best = evaluate(table, current)
    history = [objective(best)]
    moves = done = 0
    options = sorted(table)
    for pass_no in range(1, passes + 1):
        done = pass_no
        moved = False
        for i in range(len(current)):
            for option in options:
                if option == current[i]:
                    continue
                trial = evaluate(table, [*current[:i], option, *current[i + 1:]])
                if objective(trial) < objective(best):
                    best, current[i], moved = trial, option, True
                    moves += 1
            history.append(objective(best))
        if not moved:
            break
    return Descent(best, done, moves, tuple(history))


def frontier_targets(frontier: Sequence[tuple[PolicySpec, float]], count: int
                     ) -> list[tuple[PolicySpec, float]]:
    """Up to ``count`` of the one-rule frontier's (fixed rule, SLO attainment), evenly spread over
    it by SLO (its ends included): where the per-model frontier is sought."""
    fixed = sorted(((n, s) for n, s in frontier if fixed_option(n) is not None), key=lambda p: p[1])
    if count < 1 or not fixed:
        return []
    if len(fixed) <= count:
        return fixed
    picks = sorted({round(j * (len(fixed) - 1) / (count - 1)) for j in range(count)}) if count > 1 else [
        len(fixed) - 1]
    return [fixed[j] for j in picks]


@dataclass(frozen=True)
class PerModelReference:
    """The per-model reference chosen on the validation days: ``frontier`` assignments (one per
    SLO target, each from its frontier rule), ``best`` (least effective cost) and the descents'
    statistics."""

    frontier: tuple[Assignment, ...]
    best: Assignment
    targets: tuple[tuple[PolicySpec, float], ...]
    passes: int
    moves: int

    def document(self) -> dict[str, Any]:
        def point(a: Assignment) -> dict[str, Any]:
            return {"spec": a.spec, "cost_usd": a.cost_usd, "slo_attainment": a.slo_attainment,
                    "unserved_tokens": a.unserved_tokens}

        return {"frontier": [point(a) for a in self.frontier], "best": point(self.best),
                "targets": [{"rule": str(n), "slo_attainment": s} for n, s in self.targets],
                "passes": self.passes, "moves": self.moves}


def per_model_reference(table: Table, n_models: int, frontier: Sequence[tuple[PolicySpec, float]],
                        best_rule: PolicySpec, lost_usd_per_mtok: float, *, targets: int = 3, passes: int = 3
                        ) -> PerModelReference:
    """Coordinate descent at up to ``targets`` SLO targets of the one-rule ``frontier`` ((rule, SLO)
    on the validation days), each started from that rule, and on effective cost started from the
    best rule (or the table's cheapest uniform option on effective cost when the best rule is not
    a fixed rule)."""
    if not table:
        raise InputError("per_model_reference: the table is empty; the grid needs fixed:K@q rules")
    chosen = frontier_targets(frontier, targets)
    found: list[Assignment] = []
    total_passes = total_moves = 0
    for rule, slo in chosen:
        option = fixed_option(rule)
        assert option is not None  # frontier_targets keeps fixed rules only
        d = coordinate_descent(table, [option] * n_models, slo_objective(slo), passes=passes)
        found.append(d.assignment)
        total_passes, total_moves = total_passes + d.passes, total_moves + d.moves
    start = fixed_option(best_rule)
    if start is None or start not in table:
        start = min(table, key=lambda o: evaluate(table, [o] * n_models).effective_cost(lost_usd_per_mtok))
    d = coordinate_descent(table, [start] * n_models, effective_objective(lost_usd_per_mtok), passes=passes)
    unique: dict[str, Assignment] = {}
    for a in found:
        unique.setdefault(a.spec, a)
    return PerModelReference(tuple(unique.values()), d.assignment, tuple(chosen),
                             total_passes + d.passes, total_moves + d.moves)


@dataclass
class PerModelRule:
    """Re-plan model i fully at level ``levels[i]`` every ``every[i]`` steps (step 0 holds, as
    ``fixed:K`` does), taking risk ``risks[i]`` when given (empty: the environment's configured
    risk for every model). ``planning_quantile`` is the assignment's most common level (ties: the
    highest), the level its env is configured at; ``action_levels`` every level it uses. With
    risks, ``risk`` is the most common one (ties: the greatest), the risk its env is configured
    at (so the first plan takes it, as the rule's does), and ``risk_presets`` every risk it uses:
    its env's ``risk`` action menu. A uniform assignment is exactly ``fixed:K@q[+RISK]``."""

    every: tuple[int, ...]
    levels: tuple[float, ...]
    risks: tuple[Risk, ...] = ()
    name: str = ""
    planning_quantile: float | None = None
    risk: Risk | None = field(init=False, default=None)
    _codes: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.every or len(self.every) != len(self.levels):
            raise InputError(f"PerModelRule: fields 'every' ({len(self.every)}) and 'levels' "
                             f"({len(self.levels)}) must give one entry per model")
        if self.risks and (len(self.risks) != len(self.every)
                           or not all(isinstance(r, Risk) for r in self.risks)):
            raise InputError(f"PerModelRule: field 'risks' must give one Risk per model "
                             f"({len(self.every)}) or none, got {self.risks!r}")
        bad = [k for k in self.every if not (isinstance(k, int) and k >= 1)]
        if bad:
            raise InputError(f"PerModelRule: field 'every' must hold intervals >= 1 step, got {bad[0]!r}")
        wrong = [q for q in self.levels if q not in PLANNING_LEVELS]
        if wrong:
            raise InputError(f"PerModelRule: field 'levels': {wrong[0]!r} is not a planning level; use "
                             f"{', '.join(f'{q:g}' for q in PLANNING_LEVELS)}")
        counts = Counter(self.levels)
        self.planning_quantile = max(counts, key=lambda q: (counts[q], q))
        if self.risks:
            by_risk = Counter(self.risks)
            self.risk = max(by_risk, key=lambda r: (by_risk[r], r))
        risks = self.risks or (NEUTRAL_RISK,) * len(self.every)
        entries: list[Option] = [(k, q) if r.neutral else (k, q, r)
                                 for k, q, r in zip(self.every, self.levels, risks, strict=True)]
        self.name = self.name or assignment_spec(entries)
        codec = ActionCodec.for_config(self.planning_quantile, self.action_levels,
                                       self.risk or NEUTRAL_RISK, self.risk_presets)
        self._codes = np.array([codec.encode("full", q, self.risks[i] if self.risks else None)
                                for i, q in enumerate(self.levels)], dtype=np.int8)

    @property
    def action_levels(self) -> tuple[float, ...]:
        return tuple(sorted(set(self.levels)))

    @property
    def risk_presets(self) -> tuple[Risk, ...]:
        """Every risk the assignment uses, its configured one first (empty without risks)."""
        if self.risk is None:
            return ()
        return (self.risk, *sorted(set(self.risks) - {self.risk}))

    @classmethod
    def parse(cls, spec: PolicySpec, n_models: int) -> PerModelRule:
        """The rule of a ``per-model:K1@q1[+RISK1],K2@q2[+RISK2],...``
        :class:`~atoll.envs.vocabulary.PolicySpec` with one entry per model."""
        if not spec.is_per_model:
            raise InputError(f"policy {str(spec)!r} is not a per-model assignment; use {PER_MODEL_USAGE}")
        if len(spec.entries) != n_models:
            raise InputError(f"policy {str(spec)!r} gives {len(spec.entries)} K@q entries for {n_models} "
                             f"models; use {PER_MODEL_USAGE}")
        every = tuple(e[0] for e in spec.entries)
        levels = tuple(e[1] for e in spec.entries)
        return cls(every, levels, spec.entry_risks or (), name=str(spec))

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        step = int(info.get("step", 0))
        due = np.array([step > 0 and step % k == 0 for k in self.every])
        return np.where(due, self._codes, 0).astype(np.int8)

    def reset_options(self) -> dict[str, Any]:
        return {}
