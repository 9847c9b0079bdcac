"""The contest: the rule family tuned on validation days, then learned policies against
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
import multiprocessing
import pickle
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from atoll.envs.config import FleetConfig
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import FIXED_INTERVALS, THRESHOLD_BANDS, Policy, rule_grid, rule_specs
from atoll.envs.rollout import Episode, run_policy
from atoll.envs.vocabulary import DEFAULT_LEVEL, PLANNING_LEVELS, PolicySpec
from atoll.solvers.errors import InputError
from atoll.solvers.files import atomic_write_bytes
from atoll.solvers.ray_tasks import completed
from atoll.solvers.validation import check_day_range, check_integer, check_number
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
from atoll.training.per_model import (
    MODEL_KEYS,
    PerModelReference,
    fixed_option,
    model_key,
    model_table,
    per_model_reference,
)
from atoll.training.registry import FleetSpaces

HEADLINE_KEYS: tuple[str, ...] = ("frontier_cost_ratio", "effective_cost_ratio", "usd_per_mtok",
                                  "slo_attainment", "reoptimizations", "solver_seconds", "cost_usd")


@dataclass(frozen=True)
class ContestSettings:
    """``validation_days`` pick the frontier, ``test_days`` report (inclusive ranges, disjoint);
    ``seeds`` evaluation seeds on the test days, ``validation_seeds`` on the validation days
    (None: as many); ``levels``/``intervals``/``bands`` the rule grid, crossed with the risk menu
    ``risks`` (risk labels, ``neutral`` the rule without a ``+RISK``); ``lost_usd_per_mtok`` the
    price of a million tokens not served within SLO in the effective cost (None: the reward's
    ``unserved_usd_per_mtok``); ``workers`` rule processes (1: run in this process);
    ``hindsight`` runs the hindsight reference on the test days too (it re-solves every step: the
    costliest policy on a large fleet); ``per_model_targets`` SLO targets of the per-model
    reference (:mod:`atoll.training.per_model`; 0: only its least-effective-cost assignment),
    ``per_model_passes`` its coordinate-descent passes; ``ray_address`` runs the rules as Ray
    tasks on that cluster (``auto``, ``ray://host:10001``; None: the process pool)."""

    validation_days: tuple[int, int] = (8, 10)
    test_days: tuple[int, int] = (11, 14)
    seeds: int = 3
    validation_seeds: int | None = None
    levels: tuple[float, ...] = PLANNING_LEVELS
    intervals: tuple[int, ...] = FIXED_INTERVALS
    bands: tuple[tuple[float, float], ...] = THRESHOLD_BANDS
    lost_usd_per_mtok: float | None = None
    workers: int = 2
    hindsight: bool = True
    per_model_targets: int = 3
    per_model_passes: int = 3
    ray_address: str | None = None
    risks: tuple[str, ...] = ("neutral",)

    def __post_init__(self) -> None:
        owner = "ContestSettings"
        for name in ("validation_days", "test_days"):
            check_day_range(owner, name, getattr(self, name))
        v, t = self.validation_days, self.test_days
        if not (v[1] < t[0] or t[1] < v[0]):
            raise InputError(f"{owner}: validation days {v[0]}-{v[1]} overlap test days {t[0]}-{t[1]}; "
                             f"choose rules on other days than those they are tested on")
        for name in ("seeds", "workers", "per_model_passes"):
            check_integer(owner, name, getattr(self, name))
        if self.validation_seeds is not None:
            check_integer(owner, "validation_seeds", self.validation_seeds)
        check_integer(owner, "per_model_targets", self.per_model_targets, minimum=0)
        if self.ray_address is not None and not self.ray_address.strip():
            raise InputError(f"{owner}: field 'ray_address' must be 'auto', a cluster address or None, "
                             f"got {self.ray_address!r}")
        if self.lost_usd_per_mtok is not None:
            check_number(owner, "lost_usd_per_mtok", self.lost_usd_per_mtok, allow_zero=True)
        rule_grid(self.levels, self.intervals, self.bands, self.risks)  # validates the levels and risks

    @property
    def grid(self) -> list[str]:
        """The rule grid's names (``str`` of :attr:`rules`, in its order): what results are keyed by."""
        return rule_grid(self.levels, self.intervals, self.bands, self.risks)

    @property
    def rules(self) -> list[PolicySpec]:
        """The rule grid (``atoll.envs.policies.rule_specs``)."""
        return rule_specs(self.levels, self.intervals, self.bands, self.risks)

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
    learned: list[str]  # their names (str(spec))
    headlines: dict[str, dict[str, Any]] = field(default_factory=dict)
    grid_seconds: float = 0.0
    test_seconds: float = 0.0
    # learned spec -> its validation-day score (validation_scorer) and figures: what may crown it
    learned_validation: dict[str, dict[str, float]] = field(default_factory=dict)
    # the per-model reference (atoll.training.per_model), chosen on the validation days: its
    # frontier (one-rule frontier rules and per-model assignments, by SLO) and its best (least
    # effective cost); None without fixed rules in the grid
    per_model: PerModelReference | None = None
    per_model_frontier: list[str] = field(default_factory=list)
    per_model_best: str | None = None
    per_model_points: dict[str, Point] = field(default_factory=dict)  # their validation points
    # every policy named above (validation, test, frontiers, learned), by its name (str(spec))
    specs: dict[str, PolicySpec] = field(default_factory=dict)

    def result(self, name: str) -> PolicyResult:
        return next(r for r in self.test if r.name == name)

    def validation_points(self) -> list[Point]:
        return mean_points(self.validation)


# ----- worker side ------------------------------------------------------------------------------
_ENVS: dict[str, tuple[FleetEnv, dict[Any, FleetEnv]]] = {}


def _env(config: FleetConfig) -> tuple[FleetEnv, dict[Any, FleetEnv]]:
    key = hashlib.sha256(pickle.dumps(config)).hexdigest()
    if key not in _ENVS:
        _ENVS.clear()
        _ENVS[key] = (FleetEnv(config), {})
    return _ENVS[key]


class _ModelSums:
    """The env, stepped as usual, with each model's sums (:data:`atoll.training.per_model.MODEL_KEYS`)
    added up from the steps' ``info["models"]`` (what the per-model reference is built from)."""

    def __init__(self, env: FleetEnv) -> None:
        self.env = env
        self.sums = np.zeros((len(env.models), len(MODEL_KEYS)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, term, trunc, info = self.env.step(action)
        for i, name in enumerate(self.env.models):
            m = info["models"][name]
            self.sums[i] += (m["cost_usd"], m["requests"], m["slo_attainment"] * m["requests"],
                             m["unserved_tokens"])
        return obs, reward, term, trunc, info

    def totals(self) -> dict[str, float]:
        return {model_key(i, k): float(self.sums[i, j]) for i in range(len(self.sums))
                for j, k in enumerate(MODEL_KEYS)}


def run_rule(config: FleetConfig, spec: PolicySpec, days: tuple[int, ...], seed: int, keep_steps: bool
             ) -> Episode | dict[str, float]:
    """One rule over ``days`` for evaluation seed ``seed``: the Episode, or only its totals (with
    each model's sums, ``model/<i>/<key>``, for the per-model reference)."""
    env, levels = _env(config)
    policy = resolve_policy(spec, len(env.models))
    at = env_at_level(env, policy, levels)
    if keep_steps:
        episode = run_policy(at, policy, days=days, seed=seed_value(seed))
        episode.policy = str(spec)
        return episode
    recorder = _ModelSums(at)
    episode = run_policy(cast(FleetEnv, recorder), policy, days=days, seed=seed_value(seed))
    return {**episode.totals(), **recorder.totals()}


def _level(spec: PolicySpec, default: float) -> float:
    """The level a rule's env plans at (the order jobs are given to workers in)."""
    return spec.planning_level(default)


def run_rules(config: FleetConfig, specs: Sequence[PolicySpec], days: Sequence[int], seeds: int,
              workers: int, keep_steps: bool, tick: Callable[[int], None] | None,
              meanwhile: Callable[[], None] | None = None,
              ray_address: str | None = None) -> dict[str, list[Any]]:
    """Every (rule, seed) pair, in worker processes (or as Ray tasks on ``ray_address``);
    ``meanwhile`` runs here while they work. Keyed by each rule's name (``str(spec)``)."""
    days_t = tuple(int(d) for d in days)
    steps = len(days_t) * config.episode_steps
    level = {str(s): _level(s, config.planning_quantile) for s in specs}
    jobs = sorted(((s, k) for s in specs for k in range(seeds)), key=lambda j: (level[str(j[0])], j[1]))
    out: dict[str, list[Any]] = {str(s): [None] * seeds for s in specs}
    if ray_address is not None:
        for (s, k), value in _ray_jobs(config, jobs, days_t, keep_steps, ray_address, meanwhile):
            out[str(s)][k] = value
            if tick is not None:
                tick(steps)
        return out
    if workers == 1:
        if meanwhile is not None:
            meanwhile()
        for s, k in jobs:
            out[str(s)][k] = run_rule(config, s, days_t, k, keep_steps)
            if tick is not None:
                tick(steps)
        return out
    # spawn, not fork: the parent may hold torch and MLflow threads, which fork copies badly
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures: dict[Future[Any], tuple[PolicySpec, int]] = {
            pool.submit(run_rule, config, s, days_t, k, keep_steps): (s, k) for s, k in jobs}
        if meanwhile is not None:
            meanwhile()
        for fut, (s, k) in futures.items():
            out[str(s)][k] = fut.result()
            if tick is not None:
                tick(steps)
    return out


def _ray_jobs(config: FleetConfig, jobs: Sequence[tuple[PolicySpec, int]], days: tuple[int, ...],
              keep_steps: bool, address: str, meanwhile: Callable[[], None] | None
              ) -> Iterator[tuple[tuple[PolicySpec, int], Any]]:
    """The (rule, seed) jobs as Ray tasks on the cluster at ``address`` (``auto``: the running
    local or configured one; Ray is initialized here when it is not yet, and shut down after).
    Each Ray worker keeps its envs between tasks as a pool worker does. The cluster's workers
    need atoll installed (``atoll[ray]``)."""
    try:
        import ray
    except ImportError as exc:
        raise InputError(f"ray_address {address!r} needs Ray, an optional extra: pip install 'atoll[ray]' "
                         f"(or run without --ray: the process pool)") from exc
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise InputError(f"ray_address {address!r}: no Ray cluster there ({exc}); start one with "
                             f"`ray start --head`, give its address, or run without --ray") from exc
    try:
        remote = ray.remote(run_rule)
        ref = ray.put(config)
        pending = {remote.remote(ref, s, days, k, keep_steps): (s, k) for s, k in jobs}
        if meanwhile is not None:
            meanwhile()
        yield from completed(pending)
    finally:
        if started:
            ray.shutdown()


# ----- the contest ------------------------------------------------------------------------------
Totals = dict[str, list[dict[str, float]]]  # rule -> per-seed totals


def contest_env(config: FleetConfig, st: ContestSettings) -> tuple[FleetConfig, FleetEnv]:
    """The config over the validation and test days, and its env — built here first so bad days
    fail early and the forecast caches the workers read exist for every planning level."""
    first = min(st.validation_days[0], st.test_days[0])
    last = max(st.validation_days[1], st.test_days[1])
    config = dataclasses.replace(config, days=(first, last))
    base = FleetEnv(config)
    for q in st.levels:
        env_at_level(base, resolve_policy(PolicySpec("fixed", every=1, level=q), 1), {})
    return config, base


def cached_validation_grid(config: FleetConfig, settings: ContestSettings,
                           note: Callable[[str], None] | None = None) -> tuple[Totals, float, Path]:
    """:func:`validation_grid`, read from the cache folder when the same grid ran before (keyed by
    the config without its action space, the grid, the days, the seeds and the solver version:
    the rules emit hold / full at their own level and risk only, so the action's levels and risk
    menu do not change their totals); returns the totals, the seconds the grid took, the file."""
    from atoll.envs.actions import DEFAULT_ACTION_LEVELS
    from atoll.solvers.allocation.direct import SOLVER_VERSION
    from atoll.solvers.paths import cache_root

    plain = dataclasses.replace(config, action_levels=DEFAULT_ACTION_LEVELS, action="reopt")
    key = (plain, settings.grid, settings.validation_days, settings.validation_seeds or settings.seeds,
           SOLVER_VERSION)
    digest = hashlib.sha256(pickle.dumps(key)).hexdigest()[:20]
    cached = cache_root() / "contest" / f"validation-{digest}.pkl"
    if cached.exists():
        validation, grid_s = pickle.loads(cached.read_bytes())
        if note is not None:
            note(f"validation grid read from {cached} (it took {grid_s:.0f} s)")
        return validation, grid_s, cached
    validation, grid_s = validation_grid(plain, settings)
    cached.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(cached, pickle.dumps((validation, grid_s)))
    if note is not None:
        note(f"validation grid of {len(validation)} rules in {grid_s:.0f} s")
    return validation, grid_s, cached


def validation_grid(config: FleetConfig, settings: ContestSettings | None = None, *,
                    tick: Callable[[int], None] | None = None) -> tuple[Totals, float]:
    """The rule grid on the validation days: rule -> per-seed totals, and the wall seconds."""
    st = settings or ContestSettings()
    config, _ = contest_env(config, st)
    vdays = list(range(st.validation_days[0], st.validation_days[1] + 1))
    t0 = time.perf_counter()
    validation = run_rules(config, st.rules, vdays, st.validation_seeds or st.seeds, st.workers, False, tick,
                           ray_address=st.ray_address)
    return validation, time.perf_counter() - t0


# SLO attainment the learned policy must not fall below: re-plan every step at the default level
REFERENCE = PolicySpec("fixed", every=1, level=DEFAULT_LEVEL)
REFERENCE_RULE = str(REFERENCE)
HINDSIGHT = PolicySpec("hindsight")


def reference_rule(grid: Sequence[PolicySpec]) -> PolicySpec | None:
    """The rule whose validation SLO a learned policy must not fall below: ``fixed:1@0.9``, or
    when a smaller grid lacks it the grid's ``fixed:K@0.9`` with the least K (None: neither)."""
    if REFERENCE in grid:
        return REFERENCE
    at = [r for r in grid  # a rule of the configured risk (no +RISK of its own)
          if (option := fixed_option(r)) is not None and option[1] == DEFAULT_LEVEL and len(option) == 2]
    return min(at, key=lambda r: (r.every or 0, str(r))) if at else None


def policy_index(settings: ContestSettings, per_model: PerModelChoice | None = None, *extra: PolicySpec
                 ) -> dict[str, PolicySpec]:
    """The policies a contest's results name, by name (``str(spec)``, what results are keyed by):
    the grid's rules, the per-model reference's assignments and ``extra`` (hindsight, references,
    learned policies) — how names chosen on the results are run again without parsing them."""
    specs = [*settings.rules, *extra]
    if per_model is not None:
        specs += [a.policy for a in (*per_model[0].frontier, per_model[0].best)]
    return {str(s): s for s in specs}


def _grid_specs(validation: Totals, st: ContestSettings) -> dict[str, PolicySpec]:
    """The grid's rules by name; an InputError when the totals hold a name the grid lacks (totals
    of another grid than the settings')."""
    index = {str(s): s for s in st.rules}
    strange = [name for name in validation if name not in index]
    if strange:
        raise InputError(f"validation totals of {strange[0]!r}: not a rule of the settings' grid; give the "
                         f"totals of this grid (validation_grid with the same settings)")
    return index


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
        index = _grid_specs(validation, st)
        ref = reference_rule([index[name] for name in validation])
        self.reference = validation[str(ref)][0]["slo_attainment"] if ref is not None else 0.0
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


# the per-model reference, its frontier, its best and their validation points
PerModelChoice = tuple[PerModelReference, list[str], str, dict[str, Point]]


def choose_per_model(validation: Totals, n_models: int, frontier: Sequence[str], best: str,
                     st: ContestSettings, lost: float) -> PerModelChoice | None:
    """The per-model reference from the validation totals (nothing of the test days): the
    assignments of :func:`atoll.training.per_model.per_model_reference`; the per-model frontier =
    the non-dominated points among the one-rule frontier and those assignments (their points read
    off the table); the per-model best = the least effective cost among them, the best rule and
    the effective-cost descent's answer. None when the grid has no fixed rule, or its totals have no
    per-model sums (a grid cached before they were recorded)."""
    if not any(model_key(0, "cost_usd") in rows[0] for rows in validation.values()):
        return None  # totals of a grid run before the per-model sums (a cache): no per-model reference
    index = _grid_specs(validation, st)
    table = model_table(validation, n_models, [index[name] for name in validation])
    if not table:
        return None
    points = {p.name: p for p in mean_points(validation)}
    ref = per_model_reference(table, n_models, [(index[n], points[n].slo_attainment) for n in frontier],
                              index[best], lost, targets=st.per_model_targets, passes=st.per_model_passes)
    candidates = {n: points[n] for n in frontier}
    for a in (*ref.frontier, ref.best):
        if a.spec not in candidates:  # a uniform assignment is its rule: its measured point
            candidates[a.spec] = points.get(a.spec) or Point(a.spec, a.cost_usd, a.slo_attainment,
                                                             a.unserved_tokens)
    chosen = [p.name for p in select_frontier(list(candidates.values()))]
    pool = [*candidates.values(), points[best]]
    best_pm = min(pool, key=lambda p: p.effective_cost(lost)).name
    return ref, chosen, best_pm, {n: candidates.get(n) or points[n] for n in (*chosen, best_pm)}


def validation_choices(validation: Totals, n_models: int, st: ContestSettings, lost: float
                       ) -> tuple[list[str], str, PerModelChoice | None]:
    """What the validation totals choose: the one-rule frontier (by SLO), the best rule (least
    effective cost at ``lost`` $/Mtok) and the per-model reference (:func:`choose_per_model`), by
    name. The totals must be of the settings' grid (an InputError names a rule it lacks)."""
    _grid_specs(validation, st)
    points = mean_points(validation)
    frontier = [p.name for p in select_frontier(points)]
    best = best_rule(points, lost).name
    return frontier, best, choose_per_model(validation, n_models, frontier, best, st, lost)


def per_model_best(config: FleetConfig, validation: Totals, n_models: int,
                   settings: ContestSettings | None = None) -> str:
    """The per-model reference's best assignment (least effective cost; the best rule when no
    assignment beats it) chosen on the validation totals alone: a learned policy's teacher that
    reads nothing of the test days. An InputError when the totals have no per-model sums."""
    st = settings or ContestSettings()
    _, _, chosen = validation_choices(validation, n_models, st, st.lost_price(config))
    if chosen is None:
        raise InputError("per_model_best: the validation totals have no per-model sums (a grid cached "
                         "before they were recorded, or no fixed:K@q rule); run the grid again")
    return chosen[2]


def run_contest(config: FleetConfig, learned: Sequence[PolicySpec], settings: ContestSettings | None = None,
                *, tick: Callable[[int], None] | None = None,
                validation: dict[str, list[dict[str, float]]] | None = None,
                references: Sequence[PolicySpec] = ()) -> ContestResult:
    """Choose the frontier on the validation days, evaluate it with ``learned`` (``learned:<uri>``
    specs) and hindsight on the test days, and compute each learned policy's headline; each
    learned policy is also scored on the validation days (``learned_validation``).
    ``validation``: the grid's validation totals when already run (:func:`validation_grid`);
    ``references``: rules outside the family (e.g. a learned policy's bootstrap rule) also run
    on the test days and reported, never part of the frontier. Beside the one-rule frontier, the
    per-model reference (:func:`choose_per_model`) runs on the test days, and each headline has
    its ratios against it too (``per_model_frontier_cost_ratio``, ``per_model_effective_cost_ratio``).
    Results are keyed by each policy's name (``str(spec)``); ``specs`` holds the policies by name."""
    st = settings or ContestSettings()
    config, base = contest_env(config, st)
    tdays = list(range(st.test_days[0], st.test_days[1] + 1))
    grid_seconds = 0.0
    if validation is None:
        validation, grid_seconds = validation_grid(config, st, tick=tick)
    lost = st.lost_price(config)
    frontier, best, per_model = validation_choices(validation, len(base.models), st, lost)
    index = policy_index(st, per_model, HINDSIGHT, *references, *learned)
    pm_rules = [] if per_model is None else [*per_model[1], per_model[2]]
    rules = list(dict.fromkeys([*frontier, best, *([str(HINDSIGHT)] if st.hindsight else []), *pm_rules]))
    rules += [r for r in dict.fromkeys(str(s) for s in references) if r not in rules]
    learned_results: list[PolicyResult] = []
    learned_validation: dict[str, dict[str, float]] = {}
    scorer = validation_scorer(config, validation, st) if learned else None
    spaces = FleetSpaces.of_env(base)

    def run_learned() -> None:
        for spec in learned:
            name = str(spec)
            policy = resolve_policy(spec, len(base.models), fleet=spaces)
            assert scorer is not None
            value = scorer(policy)
            learned_validation[name] = {"score": value, **scorer.last}
            eps = [run_policy(base, policy, days=tdays, seed=seed_value(k), tick=tick)
                   for k in range(st.seeds)]
            for e in eps:
                e.policy = name
            learned_results.append(PolicyResult(name, eps))

    t0 = time.perf_counter()
    test_eps = run_rules(config, [index[r] for r in rules], tdays, st.seeds, st.workers, True, tick,
                         meanwhile=run_learned, ray_address=st.ray_address)
    test_seconds = time.perf_counter() - t0
    test = [PolicyResult(s, test_eps[s]) for s in rules] + learned_results
    result = ContestResult(config, st, validation, frontier, best, test, [str(s) for s in learned],
                           grid_seconds=grid_seconds, test_seconds=test_seconds,
                           learned_validation=learned_validation, specs=index)
    if per_model is not None:
        result.per_model, result.per_model_frontier, result.per_model_best, pm_points = per_model
        result.per_model_points = pm_points
    result.headlines = {str(spec): learned_headline(result, spec) for spec in learned}
    return result


def _ratios(result: ContestResult, spec: PolicySpec, frontier: Sequence[str], best: str) -> list[Headline]:
    """Per seed: ``spec``'s headline against the test-day points (that seed's) of ``frontier`` and
    ``best`` (their names)."""
    lost = result.settings.lost_price(result.config)
    name = str(spec)
    mine = result.result(name).per_seed()
    front = [result.result(r).per_seed() for r in frontier]
    best_rows = result.result(best).per_seed()
    out: list[Headline] = []
    for k, totals in enumerate(mine):
        line = [seed_point(rule, rows[k]) for rule, rows in zip(frontier, front, strict=True)]
        out.append(headline(seed_point(name, totals), line, seed_point(best, best_rows[k]), lost))
    return out


def learned_headline(result: ContestResult, spec: PolicySpec) -> dict[str, Any]:
    """The headline of one learned policy: per seed (against that seed's rule points) and the mean
    and std over seeds of each figure; where its SLO lies against the frontier, per seed; the
    same two ratios against the per-model reference (``per_model_*``) when there is one."""
    lost = result.settings.lost_price(result.config)
    mine = result.result(str(spec)).per_seed()
    per_seed = _ratios(result, spec, result.frontier, result.best_rule)
    figures: dict[str, Any] = {}
    for key in HEADLINE_KEYS:
        values = np.array([getattr(h, key) if key.endswith("_ratio") else t[key]
                           for h, t in zip(per_seed, mine, strict=True)], dtype=float)
        figures[key] = {"mean": float(values.mean()), "std": float(values.std())}
        if key.endswith("_ratio"):  # paired per seed: the 95% interval a contest is read by
            figures[key]["interval95"] = _interval(values)
    figures["frontier_position"] = [h.frontier_position for h in per_seed]
    figures["frontier_between"] = [list(h.frontier_between) for h in per_seed]
    figures["best_rule"] = result.best_rule
    figures["lost_usd_per_mtok"] = lost
    if result.per_model_frontier and result.per_model_best is not None:
        pm = _ratios(result, spec, result.per_model_frontier, result.per_model_best)
        for key in ("frontier_cost_ratio", "effective_cost_ratio"):
            values = np.array([getattr(h, key) for h in pm], dtype=float)
            figures[f"per_model_{key}"] = {"mean": float(values.mean()), "std": float(values.std()),
                                           "interval95": _interval(values)}
        figures["per_model_frontier_position"] = [h.frontier_position for h in pm]
        figures["per_model_best"] = result.per_model_best
    return figures


def _interval(ratios: np.ndarray) -> dict[str, Any]:
    """The 95% t interval of per-seed ratios (:func:`atoll.training.lever_oracle.mean_interval`):
    low, high, seeds and whether it holds 1 (a tie)."""
    from atoll.training.lever_oracle import mean_interval

    got = mean_interval(ratios)
    return {k: got[k] for k in ("low", "high", "seeds", "tie", "per_seed")}


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
