"""FleetEnv: the heterogeneous multi-LLM fleet as a gymnasium environment."""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from atoll.envs.availability import SpotAvailability, StaticAvailability, load_spot_trace
from atoll.envs.config import FleetConfig
from atoll.envs.demand import DemandBook, build_book, workload_series
from atoll.envs.fleet import FleetState, StartupTimes
from atoll.envs.observation import Signals, build_observation, observation_space
from atoll.envs.planner import PlanOutcome, Replanner
from atoll.solvers.catalog import load_catalog
from atoll.solvers.models import get_model
from atoll.solvers.paths import shared_data_dir
from atoll.solvers.problem import AllocationProblem, gpu_type_of
from atoll.solvers.scenarios import (
    SCENARIOS,
    ample_availability,
    model_shapes,
    scarce_availability,
    scenario_prices,
    scenario_templates,
)
from atoll.solvers.types import Template

Cell = tuple[str, str]
INITIAL_PLANS = ("forecast", "peak")
PLANNING = ("forecast", "oracle")
UNSERVED_WINDOW = 3


@lru_cache(maxsize=4)
def _library(scenario: str) -> tuple[Template, ...]:
    return scenario_templates(SCENARIOS[scenario])


_REPLANNERS: dict[tuple[object, ...], Replanner] = {}


def _replanner(base: AllocationProblem, ident: tuple[object, ...], config: FleetConfig) -> Replanner:
    """One memo per (library, prices, start-up weight, settings), shared by every env of a process:
    vectorized training envs and an evaluation's policies then reuse each other's solves."""
    key = (*ident, config.demand_round, config.memoize, config.solver_time_limit, config.solver_gap)
    if key not in _REPLANNERS:
        _REPLANNERS[key] = Replanner(base, demand_round=config.demand_round, memoize=config.memoize)
    return _REPLANNERS[key]


class FleetEnv(gym.Env[np.ndarray, np.ndarray]):
    """A fleet serving M models (each a prefill and a decode service) on heterogeneous GPU nodes.

    **Time.** One step is one decision epoch of ``step_s`` seconds (default 300). An episode is
    ``episode_steps`` steps (default 288 = one day) starting at midnight of a day drawn uniformly
    from ``config.days`` with ``self.np_random`` (or ``reset(options={"day": d})``).

    **Action** ``MultiBinary(M)``: bit m = 1 re-optimizes model m now; all zeros holds the plan.
    A re-optimization solves the exact allocation ILP for the chosen models with the others held
    at their planned counts, warm-started from the running plan, for the planning demand: per
    service the largest ``planning_quantile`` forecast over the next ``look_ahead_s`` (made from
    the demand seen so far), within the availability at that moment (minus draining nodes), with
    start-up weight K = the median template start-up / ``step_s``. Cost mode first; goodput mode
    (serve the most, then cheapest) when the demand cannot be met; the plan is held when no plan
    is found. Added instances serve after their start-up (node boot 180 s + loading the weights
    of the stage a node holds at 1 GB/s, slowest node); instances removed stop serving at once
    and are billed for ``drain_s`` more (those still starting are cancelled first, unbilled).

    **Observation** ``Box(float32)``, every entry in [0, 1] except time of day in [-1, 1]; the
    table with units is ``atoll.envs.observation.MODEL_FEATURES`` / ``FLEET_FEATURES``: per model,
    demand / ready capacity, forecast mean and upper over the look-ahead / planned capacity
    (ratios capped at 4 and divided by 4), starting share, steps since its last
    re-optimization, recent unserved share, cost share, preempted flag; then availability
    headroom per GPU type; then sin and cos of the time of day and the cost rate relative to
    the initial plan's.

    **Dynamics of a step** (t -> t + 1): apply the action; serve the step's true demand: per
    service served = min(demand, ready capacity), where an instance that becomes ready during
    the step counts for the part of the step it is ready; a model's requests meet the SLO in
    the share min over its phases of served / demand (a request needs both); bill every
    running, starting and draining node at the config's price; advance time; if availability
    at t + 1 is below the nodes held, preempt instances at once (starting first; order drawn
    from ``self.np_random``).

    **Reward** = -scale x (cost $ + unserved_usd_per_mtok x unserved Mtok + reopt_usd x bits
    set), with goodput tokens = share x (prefill + decode tokens) per model and unserved tokens
    = demand tokens - goodput tokens.

    **Start state**: a plan solved for all models (for the forecast at the first step, or with
    ``options={"initial_plan": "peak"}`` for the previous day's peak demand), already
    running. ``options={"planning": "oracle"}`` plans re-optimizations for the true demand over
    the look-ahead instead of the forecast (the hindsight reference).

    **Termination**: never (the fleet has no terminal state). **Truncation**: after
    ``episode_steps`` steps.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, config: FleetConfig | None = None, **overrides: Any) -> None:
        config = config or FleetConfig()
        if overrides:
            config = FleetConfig(**{**config.__dict__, **overrides})
        self.config = c = config
        spec = SCENARIOS[c.scenario]
        self.models: tuple[str, ...] = c.models or spec.models
        unknown = [m for m in self.models if m not in spec.models and c.templates is None]
        if unknown:
            raise ValueError(f"FleetConfig: models {unknown} are not in scenario {c.scenario!r} "
                             f"({', '.join(spec.models)}); pass templates for them")
        for name in self.models:
            get_model(name)
        self._shape = np.array([[s.input_tokens, s.output_tokens] for s in model_shapes(spec, self.models)])
        templates = c.templates if c.templates is not None else _library(c.scenario)
        templates = tuple(t for t in templates if t.service.model in self.models)
        prices = scenario_prices(spec, spot=c.price_kind == "spot")
        self._prices = prices
        catalog = load_catalog()
        self._startup = StartupTimes({name: catalog.config(name) for _, name in prices})
        median_startup = self._startup.median(templates)
        if c.look_ahead_s < median_startup:
            raise ValueError(f"FleetConfig: field 'look_ahead_s' ({c.look_ahead_s:g} s) must cover the "
                             f"median start-up time ({median_startup:.0f} s)")
        k = c.startup_weight if c.startup_weight is not None else median_startup / c.step_s
        base = AllocationProblem(templates, {}, None, prices, startup_weight=k,
                                 time_limit=c.solver_time_limit, gap=c.solver_gap)
        ident = (c.scenario, id(templates) if c.templates is not None else "library", c.price_kind, k,
                 self.models)
        self._replanner = _replanner(base, ident, c)
        self._base = base
        if c.availability == "ample":
            self._availability: StaticAvailability | SpotAvailability = StaticAvailability(
                ample_availability(spec))
        elif c.availability == "scarce":
            self._availability = StaticAvailability(scarce_availability(spec, templates))
        else:
            data = shared_data_dir()
            self._availability = SpotAvailability(ample_availability(spec),
                                                  {r: load_spot_trace(data, r) for r in spec.regions})
        self.gpu_types: tuple[str, ...] = tuple(dict.fromkeys(gpu_type_of(cfg) for _, cfg in prices))
        self._cells_by_type = {g: [cell for cell in prices if gpu_type_of(cell[1]) == g]
                               for g in self.gpu_types}
        series = c.demand if c.demand is not None else workload_series(c.workload, self.models,
                                                                       spec.req_per_s, c.step_s)
        self.book: DemandBook = build_book(self.models, series, forecaster=c.forecaster,
                                           horizon=c.look_ahead_steps, quantile=c.planning_quantile)
        if abs(self.book.step_s - c.step_s) > 1e-9:
            raise ValueError(f"FleetConfig: demand step {self.book.step_s:g} s differs from "
                             f"step_s {c.step_s:g} s")
        self.book.check_days(*c.days)
        m = len(self.models)
        self.action_space = spaces.MultiBinary(m)
        self.observation_space = box = observation_space(m, len(self.gpu_types))
        self._obs_space_low = box.low
        self._model_index = {name: i for i, name in enumerate(self.models)}
        self._key_info: dict[str, tuple[int, int, float, float]] = {}
        self.state = FleetState()

    # ----- helpers ------------------------------------------------------------------------
    def _info_of(self, key: str) -> tuple[int, int, float, float]:
        """(model index, phase index, throughput tokens/s, $/h) of a template key."""
        if key not in self._key_info:
            t = self._base.template(key)
            phase = 0 if t.service.phase.value == "prefill" else 1
            self._key_info[key] = (self._model_index[t.service.model], phase, t.throughput,
                                   self._base.template_cost(key))
        return self._key_info[key]

    def _tokens(self, rates: np.ndarray) -> np.ndarray:
        return rates[:, None] * self._shape

    def _planning_demand(self, g: int, how: str) -> np.ndarray:
        h = self.book.horizon
        if how == "oracle":
            rates = self.book.rates[:, g: g + h].max(axis=1)
        elif how == "peak":
            rates = self.book.day_peak[:, g // self.book.steps_per_day]
        else:
            rates = self.book.upper[:, g, :].max(axis=1)
        return self._tokens(np.nan_to_num(rates, nan=0.0))

    def _capacity(self, step_s: float) -> tuple[np.ndarray, np.ndarray]:
        """(ready-for-the-step capacity, planned capacity) per model and phase, tokens/s."""
        m = len(self.models)
        ready = np.zeros((m, 2))
        planned = np.zeros((m, 2))
        for key, n in self.state.running.items():
            if n:
                mi, ph, thr, _ = self._info_of(key)
                ready[mi, ph] += n * thr
                planned[mi, ph] += n * thr
        for key, entries in self.state.starting.items():
            for count, left in entries:
                mi, ph, thr, _ = self._info_of(key)
                planned[mi, ph] += count * thr
                if left < step_s:
                    ready[mi, ph] += count * thr * (step_s - left) / step_s
        return ready, planned

    def _cost(self, seconds: float) -> np.ndarray:
        """$ per model for holding the fleet ``seconds`` from now (drains end when they end)."""
        cost = np.zeros(len(self.models))
        for bucket in (self.state.running, self.state.starting):
            for key, v in bucket.items():
                n = v if isinstance(v, int) else sum(e[0] for e in v)
                if n:
                    mi, _, _, per_h = self._info_of(key)
                    cost[mi] += n * per_h * seconds / 3600.0
        for key, entries in self.state.draining.items():
            for count, left in entries:
                mi, _, _, per_h = self._info_of(key)
                cost[mi] += count * per_h * min(left, seconds) / 3600.0
        return cost

    def _draining_by_cell(self) -> dict[Cell, int]:
        """Nodes still held by draining instances (the solver may not hand them out yet)."""
        use: dict[Cell, int] = defaultdict(int)
        for key, entries in self.state.draining.items():
            n = sum(int(e[0]) for e in entries)
            if n:
                t = self._base.template(key)
                for cfg, k in t.nodes:
                    use[(t.region, cfg)] += n * k
        return use

    def _apply(self, outcome: PlanOutcome) -> None:
        if outcome.allocation is None:
            return
        keys = set(outcome.allocation.as_dict()) - set(self._startup.seconds)
        for key in keys:
            self._startup.of(self._base.template(key))
        self.state.apply_plan(outcome.allocation, self._startup.seconds, self.config.drain_s)

    def _replan(self, models: frozenset[str], demand: np.ndarray) -> PlanOutcome:
        svc = {}
        for i, m in enumerate(self.models):
            svc[f"{m}/prefill"] = float(demand[i, 0])
            svc[f"{m}/decode"] = float(demand[i, 1])
        drain = self._draining_by_cell()
        avail = {cell: max(0, n - drain.get(cell, 0)) for cell, n in self._cap.items()}
        return self._replanner.plan(models, svc, avail, self.state.planned())

    def _observe(self) -> np.ndarray:
        g = self._g
        ready, planned = self._capacity(0.0)
        self._ready_now = ready
        fmean = self._tokens(np.nan_to_num(self.book.mean[:, g, :].max(axis=1)))
        fupper = self._tokens(np.nan_to_num(self.book.upper[:, g, :].max(axis=1)))
        held = self.state.nodes_held(self._base.index.by_key)
        headroom = np.zeros(len(self.gpu_types))
        for j, gt in enumerate(self.gpu_types):
            cap = sum(self._cap.get(cell, 0) for cell in self._cells_by_type[gt])
            use = sum(held.get(cell, 0) for cell in self._cells_by_type[gt])
            headroom[j] = (cap - use) / cap if cap > 0 else 0.0
        total = self._last_cost.sum()
        signals = Signals(
            demand=self._tokens(self.book.rates[:, g - 1]), forecast_mean=fmean, forecast_upper=fupper,
            ready_capacity=ready, planned_capacity=planned, since_reopt=self._since.copy(),
            unserved_share=self._unserved.mean(axis=0),
            cost_share=self._last_cost / total if total > 0 else np.zeros(len(self.models)),
            preempted=self._preempted.astype(float), headroom=headroom,
            seconds_of_day=(g % self.book.steps_per_day) * self.config.step_s,
            cost_rate_ratio=(total * 3600.0 / self.config.step_s) / self._cost_scale)
        return build_observation(signals)

    # ----- gymnasium API ------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        first, last = self.config.days
        day = options.pop("day", None)
        if day is None:
            day = int(self.np_random.integers(first, last + 1))
        self.book.check_days(int(day), int(day))
        initial = options.pop("initial_plan", "forecast")
        self._planning = options.pop("planning", "forecast")
        if initial not in INITIAL_PLANS or self._planning not in PLANNING or options:
            raise ValueError(f"reset options: initial_plan in {INITIAL_PLANS}, planning in {PLANNING}, "
                             f"day in {first}-{last}; got initial_plan={initial!r}, "
                             f"planning={self._planning!r}, unknown keys {sorted(options)}")
        self.day = int(day)
        self._g0 = self._g = (self.day - 1) * self.book.steps_per_day
        self._t = 0
        self._availability.reset(self.np_random)
        self._cap = self._availability.capacity(self._g * self.config.step_s)
        self.state = FleetState()
        m = len(self.models)
        demand = self._planning_demand(self._g, "peak" if initial == "peak" else self._planning)
        outcome = self._replan(frozenset(self.models), demand)
        if outcome.allocation is not None:
            self.state.running = {k: n for k, n in outcome.allocation.counts if n}
        self._since = np.zeros(m, dtype=int)
        self._unserved = np.zeros((UNSERVED_WINDOW, m))
        self._preempted = np.zeros(m, dtype=bool)
        self._last_cost = self._cost(self.config.step_s)
        self._cost_scale = max(self._last_cost.sum() * 3600.0 / self.config.step_s, 1e-9)
        obs = self._observe()
        info = {"step": 0, "day": self.day, "seconds": self._g * self.config.step_s,
                "initial_plan": {"status": outcome.status.value, "mode": outcome.mode,
                                 "instances": outcome.allocation.total_instances if outcome.allocation else 0,
                                 "solver_seconds": outcome.solver_seconds}}
        return obs, info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not hasattr(self, "_g"):
            raise RuntimeError("FleetEnv.step called before reset()")
        a = np.asarray(action)
        m = len(self.models)
        if a.shape != (m,) or not np.all((a == 0) | (a == 1)):
            raise ValueError(f"action must be MultiBinary({m}): {m} values of 0 or 1, one per model "
                             f"({', '.join(self.models)}); got {action!r}")
        c, g, dt = self.config, self._g, self.config.step_s
        chosen = frozenset(self.models[i] for i in np.flatnonzero(a))
        outcome = None
        if chosen:
            outcome = self._replan(chosen, self._planning_demand(g, self._planning))
            self._apply(outcome)
        self._since += 1
        for name in chosen:
            self._since[self._model_index[name]] = 0
        # serve
        ready, _ = self._capacity(dt)
        rates = self.book.rates[:, g]
        demand = self._tokens(rates)
        served = np.minimum(demand, ready)
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(demand > 0, served / np.where(demand > 0, demand, 1.0), 1.0)
        share = frac.min(axis=1)
        demand_tok = demand.sum(axis=1) * dt
        goodput_tok = share * demand_tok
        unserved_tok = demand_tok - goodput_tok
        cost = self._cost(dt)
        # time passes; availability moves; preemption at the boundary
        self.state.advance(dt)
        self._g, self._t = g + 1, self._t + 1
        self._cap = self._availability.capacity(self._g * dt)
        held_keys = set(self.state.running) | set(self.state.starting) | set(self.state.draining)
        lost = self.state.preempt(self._cap, {k: self._base.template(k) for k in held_keys}, self.np_random)
        lost_by_model = np.zeros(m, dtype=int)
        for key, n in lost.items():
            lost_by_model[self._info_of(key)[0]] += n
        self._preempted = lost_by_model > 0
        self._unserved = np.roll(self._unserved, 1, axis=0)
        self._unserved[0] = np.where(demand_tok > 0,
                                     unserved_tok / np.where(demand_tok > 0, demand_tok, 1.0), 0.0)
        self._last_cost = cost
        w = c.reward
        reward = -w.scale * (cost.sum() + w.unserved_usd_per_mtok * unserved_tok.sum() / 1e6
                             + w.reopt_usd * len(chosen))
        solver_s = outcome.solver_seconds if outcome is not None else 0.0
        at_end = self._g >= self.book.rates.shape[1]  # the trace ran out: no forecast to observe
        truncated = self._t >= c.episode_steps or at_end
        obs = self._obs_space_low.copy() if at_end else self._observe()
        info = self._step_info(rates, demand, ready, demand_tok, goodput_tok, unserved_tok, share, cost,
                               chosen, outcome, solver_s, lost_by_model)
        return obs, float(reward), False, bool(truncated), info

    def _step_info(self, rates: np.ndarray, demand: np.ndarray, ready: np.ndarray, demand_tok: np.ndarray,
                   goodput_tok: np.ndarray, unserved_tok: np.ndarray, share: np.ndarray, cost: np.ndarray,
                   chosen: frozenset[str], outcome: PlanOutcome | None, solver_s: float,
                   lost: np.ndarray) -> dict[str, Any]:
        dt = self.config.step_s
        per_model: dict[str, dict[str, float]] = {}
        for i, name in enumerate(self.models):
            per_model[name] = {
                "cost_usd": float(cost[i]), "demand_tokens": float(demand_tok[i]),
                "goodput_tokens": float(goodput_tok[i]), "unserved_tokens": float(unserved_tok[i]),
                "requests": float(rates[i] * dt), "slo_attainment": float(share[i]),
                "reoptimizations": int(name in chosen),
                "solver_seconds": solver_s if name in chosen else 0.0,
                "preemptions": int(lost[i]),
                "demand_prefill": float(demand[i, 0]), "demand_decode": float(demand[i, 1]),
                "ready_prefill": float(ready[i, 0]), "ready_decode": float(ready[i, 1]),
            }
        requests = float((rates * dt).sum())
        total = {
            "cost_usd": float(cost.sum()), "demand_tokens": float(demand_tok.sum()),
            "goodput_tokens": float(goodput_tok.sum()), "unserved_tokens": float(unserved_tok.sum()),
            "requests": requests,
            "slo_attainment": float((share * rates * dt).sum() / requests) if requests > 0 else 1.0,
            "reoptimizations": len(chosen), "solves": int(outcome is not None),
            "solver_seconds": solver_s, "preemptions": int(lost.sum()),
        }
        info: dict[str, Any] = {"step": self._t, "day": self.day, "seconds": self._g * dt,
                                "total": total, "models": per_model}
        if outcome is not None:
            # whether the memo answered is left out: info must not depend on what ran before
            info["solve"] = {"status": outcome.status.value, "mode": outcome.mode, "message": outcome.message}
        return info
