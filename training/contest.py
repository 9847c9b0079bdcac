"""The contest (DESIGN §7): the rule family tuned on validation days, then learned policies against
its frontier on test days.

1. Every rule of the grid (``atoll.envs.policies.rule_grid``) runs on the validation days for
   the validation seeds; its point is its mean (cost, SLO attainment) there.
2. The frontier = the non-dominated rules on those points (``atoll.training.frontier``), and the
   best rule = the grid's least effective cost there. Nothing of the test days is read.
3. The frontier rules, the best rule, the learned policies and hindsight run on the test days
   for the seeds; each learned policy gets the headline ratios per seed (against the same
   seed's rule points) and their mean and std.

Every policy meets the same demand (one FleetConfig) and, for seed s, the same env seeds
(``seed_value(s) + i`` on its i-th day), hence the same spot offsets and preemption draws.

Rules run in worker processes (``workers``, 2 by default: both cores of the target machine);
each worker keeps its envs and the process-wide re-planner memo between jobs, and jobs are
ordered by planning level so a worker's consecutive rules share solves. Learned policies run in
the calling process meanwhile (their torch models stay out of the workers).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import multiprocessing
import pickle
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atoll.envs.config import FleetConfig
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import FIXED_INTERVALS, PLANNING_LEVELS, THRESHOLD_BANDS, Policy, rule_grid
from atoll.envs.rollout import Episode, run_policy
from atoll.solvers.errors import InputError
from atoll.training.evaluate import PolicyResult, env_at_level, resolve_policy, seed_value
from atoll.training.frontier import (
    Headline,
    Point,
    best_rule,
    headline,
    mean_points,
    seed_point,
    select_frontier,
)

HEADLINE_KEYS: tuple[str, ...] = ("frontier_cost_ratio", "effective_cost_ratio", "usd_per_mtok",
                                  "slo_attainment", "reoptimizations", "solver_seconds", "cost_usd")


@dataclass(frozen=True)
class ContestSettings:
    """``validation_days`` pick the frontier, ``test_days`` report (inclusive ranges, disjoint);
    ``seeds`` evaluation seeds on the test days, ``validation_seeds`` on the validation days
    (None: as many); ``levels``/``intervals``/``bands`` the rule grid; ``lost_usd_per_mtok`` the
    price of a million tokens not served within SLO in the effective cost (None: the reward's
    ``unserved_usd_per_mtok``); ``workers`` rule processes (1: run in this process)."""

    validation_days: tuple[int, int] = (8, 10)
    test_days: tuple[int, int] = (11, 14)
    seeds: int = 3
    validation_seeds: int | None = None
    levels: tuple[float, ...] = PLANNING_LEVELS
    intervals: tuple[int, ...] = FIXED_INTERVALS
    bands: tuple[tuple[float, float], ...] = THRESHOLD_BANDS
    lost_usd_per_mtok: float | None = None
    workers: int = 2

    def __post_init__(self) -> None:
        owner = "ContestSettings"
        for name in ("validation_days", "test_days"):
            a, b = getattr(self, name)
            if not 1 <= a <= b:
                raise InputError(f"{owner}: field {name!r} must be (first, last) with 1 <= first <= last, "
                                 f"got {(a, b)!r}")
        v, t = self.validation_days, self.test_days
        if not (v[1] < t[0] or t[1] < v[0]):
            raise InputError(f"{owner}: validation days {v[0]}-{v[1]} overlap test days {t[0]}-{t[1]}; "
                             f"choose rules on other days than those they are tested on")
        if self.seeds < 1 or (self.validation_seeds is not None and self.validation_seeds < 1):
            raise InputError(f"{owner}: fields 'seeds' and 'validation_seeds' must be >= 1, "
                             f"got {self.seeds!r} and {self.validation_seeds!r}")
        if self.workers < 1:
            raise InputError(f"{owner}: field 'workers' must be >= 1, got {self.workers!r}")
        if self.lost_usd_per_mtok is not None and not (math.isfinite(self.lost_usd_per_mtok)
                                                       and self.lost_usd_per_mtok >= 0):
            raise InputError(f"{owner}: field 'lost_usd_per_mtok' must be finite and >= 0 or None, "
                             f"got {self.lost_usd_per_mtok!r}")
        rule_grid(self.levels, self.intervals, self.bands)  # validates the levels

    @property
    def grid(self) -> list[str]:
        return rule_grid(self.levels, self.intervals, self.bands)

    def lost_price(self, config: FleetConfig) -> float:
        if self.lost_usd_per_mtok is None:
            return config.reward.unserved_usd_per_mtok
        return self.lost_usd_per_mtok


@dataclass
class ContestResult:
    config: FleetConfig
    settings: ContestSettings
    validation: dict[str, list[dict[str, float]]]  # rule -> per-seed totals on validation days
    frontier: list[str]  # chosen on validation days, by SLO attainment
    best_rule: str  # least effective cost on validation days
    test: list[PolicyResult]  # frontier (+ best) rules, learned policies, hindsight
    learned: list[str]
    headlines: dict[str, dict[str, Any]] = field(default_factory=dict)
    grid_seconds: float = 0.0
    test_seconds: float = 0.0
    # learned spec -> its validation-day score (validation_scorer) and figures: what may crown it
    learned_validation: dict[str, dict[str, float]] = field(default_factory=dict)

    def result(self, name: str) -> PolicyResult:
        return next(r for r in self.test if r.name == name)

    def validation_points(self) -> list[Point]:
        return mean_points(self.validation)


# ----- worker side ------------------------------------------------------------------------------
_ENVS: dict[str, tuple[FleetEnv, dict[float, FleetEnv]]] = {}


def _env(config: FleetConfig) -> tuple[FleetEnv, dict[float, FleetEnv]]:
    key = hashlib.sha256(pickle.dumps(config)).hexdigest()
    if key not in _ENVS:
        _ENVS.clear()
        _ENVS[key] = (FleetEnv(config), {})
    return _ENVS[key]


def run_rule(config: FleetConfig, spec: str, days: tuple[int, ...], seed: int, keep_steps: bool
             ) -> Episode | dict[str, float]:
    """One rule over ``days`` for evaluation seed ``seed``: the Episode, or only its totals."""
    env, levels = _env(config)
    policy = resolve_policy(spec, len(env.models))
    episode = run_policy(env_at_level(env, policy, levels), policy, days=days, seed=seed_value(seed))
    episode.policy = spec
    return episode if keep_steps else episode.totals()


def _run_rules(config: FleetConfig, specs: Sequence[str], days: Sequence[int], seeds: int,
               workers: int, keep_steps: bool, tick: Callable[[int], None] | None,
               meanwhile: Callable[[], None] | None = None) -> dict[str, list[Any]]:
    """Every (rule, seed) pair, in worker processes; ``meanwhile`` runs here while they work."""
    days_t = tuple(int(d) for d in days)
    steps = len(days_t) * config.episode_steps
    level = {s: resolve_policy(s, 1).planning_quantile or config.planning_quantile for s in specs}
    jobs = sorted(((s, k) for s in specs for k in range(seeds)), key=lambda j: (level[j[0]], j[1]))
    out: dict[str, list[Any]] = {s: [None] * seeds for s in specs}
    if workers == 1:
        if meanwhile is not None:
            meanwhile()
        for s, k in jobs:
            out[s][k] = run_rule(config, s, days_t, k, keep_steps)
            if tick is not None:
                tick(steps)
        return out
    # spawn, not fork: the parent may hold torch and MLflow threads, which fork copies badly
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures: dict[Future[Any], tuple[str, int]] = {
            pool.submit(run_rule, config, s, days_t, k, keep_steps): (s, k) for s, k in jobs}
        if meanwhile is not None:
            meanwhile()
        for fut, (s, k) in futures.items():
            out[s][k] = fut.result()
            if tick is not None:
                tick(steps)
    return out


# ----- the contest ------------------------------------------------------------------------------
Totals = dict[str, list[dict[str, float]]]  # rule -> per-seed totals


def _contest_env(config: FleetConfig, st: ContestSettings) -> tuple[FleetConfig, FleetEnv]:
    """The config over the validation and test days, and its env — built here first so bad days
    fail early and the forecast caches the workers read exist for every planning level."""
    first = min(st.validation_days[0], st.test_days[0])
    last = max(st.validation_days[1], st.test_days[1])
    config = dataclasses.replace(config, days=(first, last))
    base = FleetEnv(config)
    for q in st.levels:
        env_at_level(base, resolve_policy(f"fixed:1@{q:g}", 1), {})
    return config, base


def validation_grid(config: FleetConfig, settings: ContestSettings | None = None, *,
                    tick: Callable[[int], None] | None = None) -> tuple[Totals, float]:
    """The rule grid on the validation days: rule -> per-seed totals, and the wall seconds."""
    st = settings or ContestSettings()
    config, _ = _contest_env(config, st)
    vdays = list(range(st.validation_days[0], st.validation_days[1] + 1))
    t0 = time.perf_counter()
    validation = _run_rules(config, st.grid, vdays, st.validation_seeds or st.seeds, st.workers, False, tick)
    return validation, time.perf_counter() - t0


REFERENCE_RULE = "fixed:1@0.9"  # SLO attainment the learned policy must not fall below (issue 15)


class ValidationScorer:
    """A score of a policy on the validation days, lower is better, for early stopping and the
    ``champion`` alias: its ``frontier_cost_ratio`` against the validation frontier (seed 0 of
    the validation grid, the same seed it runs with), plus 10 x the SLO-attainment points it
    falls below ``fixed:1@0.9`` there (the reliability the headline requires). Only validation
    days are read. ``last`` holds the figures behind the latest score; :meth:`run` gives a
    policy's validation-day totals (a rule with ``@q`` at its own level)."""

    def __init__(self, config: FleetConfig, validation: Totals, settings: ContestSettings | None = None
                 ) -> None:
        st = settings or ContestSettings()
        points = mean_points(validation)
        self.lost = st.lost_price(config)
        best = best_rule(points, self.lost).name
        self.days = list(range(st.validation_days[0], st.validation_days[1] + 1))
        self.env = FleetEnv(dataclasses.replace(config, days=(min(self.days), max(self.days))))
        self.reference = validation.get(REFERENCE_RULE, [{}])[0].get("slo_attainment", 0.0)
        self.line = [seed_point(p.name, validation[p.name][0]) for p in select_frontier(points)]
        self.best_point = seed_point(best, validation[best][0])
        self.last: dict[str, float] = {}
        self._levels: dict[float, FleetEnv] = {}

    def run(self, policy: Policy) -> dict[str, float]:
        env = env_at_level(self.env, policy, self._levels)
        return run_policy(env, policy, days=self.days, seed=seed_value(0)).totals()

    def __call__(self, policy: Policy) -> float:
        totals = self.run(policy)
        h = headline(seed_point(policy.name, totals), self.line, self.best_point, self.lost)
        shortfall = max(0.0, self.reference - totals["slo_attainment"])
        self.last = {"frontier_cost_ratio": h.frontier_cost_ratio,
                     "effective_cost_ratio": h.effective_cost_ratio,
                     "slo_attainment": totals["slo_attainment"], "reference_slo": self.reference,
                     "cost_usd": totals["cost_usd"]}
        return h.frontier_cost_ratio + 10.0 * shortfall


def validation_scorer(config: FleetConfig, validation: Totals,
                      settings: ContestSettings | None = None) -> ValidationScorer:
    """The :class:`ValidationScorer` of ``config`` against the grid's ``validation`` totals."""
    return ValidationScorer(config, validation, settings)


def run_contest(config: FleetConfig, learned: Sequence[str], settings: ContestSettings | None = None, *,
                tick: Callable[[int], None] | None = None,
                validation: dict[str, list[dict[str, float]]] | None = None,
                references: Sequence[str] = ()) -> ContestResult:
    """Choose the frontier on the validation days, evaluate it with ``learned`` (``learned:<uri>``
    specs) and hindsight on the test days, and compute each learned policy's headline; each
    learned policy is also scored on the validation days (``learned_validation``).
    ``validation``: the grid's validation totals when already run (:func:`validation_grid`);
    ``references``: rules outside the family (e.g. a learned policy's bootstrap rule) also run
    on the test days and reported, never part of the frontier."""
    st = settings or ContestSettings()
    config, base = _contest_env(config, st)
    tdays = list(range(st.test_days[0], st.test_days[1] + 1))
    grid_seconds = 0.0
    if validation is None:
        validation, grid_seconds = validation_grid(config, st, tick=tick)
    points = mean_points(validation)
    frontier = [p.name for p in select_frontier(points)]
    lost = st.lost_price(config)
    best = best_rule(points, lost).name
    rules = [*frontier, *([best] if best not in frontier else []), "hindsight",
             *[r for r in references if r not in frontier and r != best]]
    learned_results: list[PolicyResult] = []
    learned_validation: dict[str, dict[str, float]] = {}
    scorer = validation_scorer(config, validation, st) if learned else None

    def run_learned() -> None:
        for spec in learned:
            policy = resolve_policy(spec, len(base.models))
            assert scorer is not None
            value = scorer(policy)
            learned_validation[spec] = {"score": value, **scorer.last}
            eps = [run_policy(base, policy, days=tdays, seed=seed_value(k), tick=tick)
                   for k in range(st.seeds)]
            for e in eps:
                e.policy = spec
            learned_results.append(PolicyResult(spec, eps))

    t0 = time.perf_counter()
    test_eps = _run_rules(config, rules, tdays, st.seeds, st.workers, True, tick, meanwhile=run_learned)
    test_seconds = time.perf_counter() - t0
    test = [PolicyResult(s, test_eps[s]) for s in rules] + learned_results
    result = ContestResult(config, st, validation, frontier, best, test, list(learned),
                           grid_seconds=grid_seconds, test_seconds=test_seconds,
                           learned_validation=learned_validation)
    result.headlines = {spec: learned_headline(result, spec) for spec in learned}
    return result


def learned_headline(result: ContestResult, spec: str) -> dict[str, Any]:
    """The headline of one learned policy: per seed (against that seed's rule points) and the mean
    and std over seeds of each figure; where its SLO lies against the frontier, per seed."""
    lost = result.settings.lost_price(result.config)
    mine = result.result(spec).per_seed()
    front = [result.result(r).per_seed() for r in result.frontier]
    best = result.result(result.best_rule).per_seed()
    per_seed: list[Headline] = []
    for k, totals in enumerate(mine):
        line = [seed_point(name, rows[k]) for name, rows in zip(result.frontier, front, strict=True)]
        per_seed.append(headline(seed_point(spec, totals), line, seed_point(result.best_rule, best[k]), lost))
    figures: dict[str, Any] = {}
    for key in HEADLINE_KEYS:
        values = np.array([getattr(h, key) if key.endswith("_ratio") else t[key]
                           for h, t in zip(per_seed, mine, strict=True)], dtype=float)
        figures[key] = {"mean": float(values.mean()), "std": float(values.std())}
    figures["frontier_position"] = [h.frontier_position for h in per_seed]
    figures["frontier_between"] = [list(h.frontier_between) for h in per_seed]
    figures["best_rule"] = result.best_rule
    figures["lost_usd_per_mtok"] = lost
    return figures


def frontier_note(figures: dict[str, Any]) -> str:
    """A sentence on where the policy's SLO lies against the frontier (empty when inside)."""
    pos = figures["frontier_position"]
    above, below = pos.count("above"), pos.count("below")
    notes = []
    if above:
        notes.append(f"in {above} of {len(pos)} seed(s) its SLO attainment is above every frontier rule's: "
                     f"compared with the most reliable rule")
    if below:
        notes.append(f"in {below} of {len(pos)} seed(s) its SLO attainment is below every frontier rule's: "
                     f"compared with the least reliable rule")
    return "; ".join(notes)
