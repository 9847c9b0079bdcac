"""FleetEnv: the heterogeneous multi-LLM fleet as a gymnasium environment.

The env class holds the MDP (its docstring is the whole specification) and the order of a step;
the parts live beside it: the market and its acquisitions and preemptions
(:mod:`atoll.envs.acquisition`), the closed loop's servers (:mod:`atoll.envs.closed_loop`), what a
re-plan plans for (:mod:`atoll.envs.planning_demand`), the observation and its memory
(:mod:`atoll.envs.memory`) and a step's accounting (:mod:`atoll.envs.accounting`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from atoll.envs.accounting import Decision, serve, step_info, step_reward
from atoll.envs.acquisition import Availability, MarketView, build_availability
from atoll.envs.actions import ActionCodec, decode_action
from atoll.envs.availability import ACQUIRE_RETRIES
from atoll.envs.closed_loop import ServerLoop
from atoll.envs.config import FleetConfig
from atoll.envs.correction import CapacityCorrection
from atoll.envs.demand import DemandBook, build_book, workload_series
from atoll.envs.fleet import WARM_S, FleetState
from atoll.envs.fleet_model import FleetModel
from atoll.envs.memory import Memory, observe
from atoll.envs.observation import feature_names, observation_space
from atoll.envs.planner import PlanOutcome
from atoll.envs.planning_demand import INITIAL_PLANS, PLANNING, PlanningDemand, reset_options
from atoll.envs.servers import ServerReport
from atoll.envs.signals import UNSERVED_WINDOW
from atoll.envs.vocabulary import Pool, Reoptimization
from atoll.solvers.problem import Risk

__all__ = ["INITIAL_PLANS", "PLANNING", "UNSERVED_WINDOW", "FleetEnv"]

class FleetEnv(gym.Env[np.ndarray, np.ndarray]):
    """A fleet serving M models (each a prefill and a decode service) on heterogeneous GPU nodes.

    **Time.** One step is one decision epoch of ``step_s`` seconds (default 300). An episode is
    ``episode_steps`` steps (default 288 = one day) starting at midnight of a day drawn uniformly
    from ``config.days`` with ``self.np_random`` (or ``reset(options={"day": d})``).

    **Action** (``atoll/Fleet-v1``, ``action="reopt"``) ``MultiDiscrete([1 + 2 L] * M)``: per
    model which re-optimization it gets now (:mod:`atoll.envs.actions`): 0 ``hold``;
    1 + 2 j ``full`` (re-solve freely) and 2 + 2 j ``grow`` (re-solve keeping every instance it
    has planned: counts may only rise) for the planning level ``levels[j]``, where
    ``levels = (planning_quantile, *action_levels without it)`` — L = 3 by default (0.9, 0.7,
    0.95). Code 1 is ``full`` at ``planning_quantile``, so a 0/1 vector means the same as ``v0``'s
    bits. (``atoll/Fleet-v0``, ``action="binary"``: ``MultiBinary(M)``, bit 1 = code 1.)
    ``atoll/Fleet-v4`` (``action="risk"``): ``MultiDiscrete([1 + 2 L R] * M)``, where each
    ``full`` / ``grow`` also picks one of R risk presets — code 1 + 2 (r L + j) is ``full`` at
    ``levels[j]`` taking ``risks[r]``, 2 + 2 (r L + j) the same ``grow`` — with
    ``risks = (config.risk, *the market's menu without it)``: ``neutral``, ``h0.85``, ``h0.7``
    (R = 3, so 19 codes with L = 3), and under ``hedged`` ``h0.85,s0.5`` besides (R = 4; the
    choice of the menus: :mod:`atoll.envs.actions`). The preset is that model's
    :class:`~atoll.solvers.problem.Risk` in the re-plan's ILP (headroom: plan its services'
    demand / u; spread: the largest share one spot pool may carry; on-demand floor), the other
    re-optimized models taking theirs; preset 0 is the configured risk, so codes 0 .. 2 L mean
    what they mean in ``v1``.
    The models not on hold are re-optimized together in one exact allocation ILP, the others
    held at their planned counts, warm-started from the running plan, for the planning demand:
    per service the largest forecast at the model's chosen level over the next
    ``look_ahead_s`` (made from the demand seen so far), within the availability at that moment
    (minus the nodes of draining and replaced instances), with start-up weight K = the median
    template start-up / ``step_s``.
    Cost mode first; goodput mode (serve the most, then cheapest) when the demand cannot be met;
    the plan is held when no plan is found. Added instances serve after their start-up: with
    ``startup="fixed"`` node boot 180 s + loading the weights of the stage a node holds at
    1 GB/s, slowest node, the same every time; with ``startup="sampled"`` (``v3``) drawn per
    instance by model size and cache state — a new node (provisioning 1-10 min, image pull,
    weights from object storage, cold compile) or a free node a scale-down left in the warm
    pool for 10 minutes (held and billed meanwhile; no boot, no pull, local weights and compile
    cache when it served the same model) — from a generator seeded by ``self.np_random`` at reset
    (figures and sources: :mod:`atoll.envs.fleet`). The planner's start-up weight stays the fixed
    model's median. Removals cancel
    instances still starting first (unbilled); ``transition="make-before-break"`` (default): a
    running instance removed from a service to which the plan adds instances keeps serving and
    billing until the slowest of those additions is ready, then drains for ``drain_s``; a pure
    scale-down (and every removal under ``"break-before-make"``) stops serving at once and is
    billed for ``drain_s`` more. ``scale_down="lose"``: removed instances stop at once, unbilled,
    and lose their in-flight requests (Little's law: the stopped share of the model's capacity x
    its request rate x a request's duration at the SLO budgets), which miss the SLO.

    **Demand** (``workload="servegen"``): per step, sampled from the trace's per-client arrival
    processes (:mod:`atoll.envs.arrivals`) with the generator seeded by ``demand_seed``
    (``resample="hold"``: each 600 s window's rate repeated); forecasts are one causal pass per
    (trace, seed), cached; ``servegen-steady`` / ``servegen-bursty``: the same from the steady or
    the bursty half of each source's clients (:func:`atoll.forecast.workloads.split_clients`).
    **Market** ``availability``: ``ample`` / ``scarce`` (static caps),
    ``spot`` (every pool follows a spot trace), ``hedged`` (spot pools beside an on-demand quota
    at on-demand prices; the ILP picks the tier per instance). ``preemption="zone"`` (``v3``):
    the configs of one GPU type in one region read their trace at one offset and are
    interrupted together. ``spot_acquisition="trace"`` (``v3``): the planner and the policy see
    each spot pool at what it offers; a requested node arrives only when the trace has it at
    that moment, the rest of the request fails (unbilled; ``info["total"]["failed_acquisitions"]``)
    and the pool is seen full at what it holds for a back-off (5 min, doubling per failure in
    a row up to 30 min); the planner re-plans at once without it, up to 3 times in a decision
    (the refusal returns in seconds); a preemption starts the same back-off.

    **Observation** ``Box(float32)`` of ``12 M + G + 4`` values (M models, G GPU types of the
    scenario's prices; ``v2``: ``15 M + G + 4``; ``v3``: ``19 M + 3 G + 4``), built by
    :func:`atoll.envs.signals.fleet_signals` and
    :func:`atoll.envs.observation.build_observation` — the live controller builds its own with
    the same two functions. Ratios are capped at 4 and divided by 4.

    ==============  ==========================  =============================================  =====  ====
    index           name                        unit                                           min    max
    ==============  ==========================  =============================================  =====  ====
    12 m + 0        ``<model>/demand_ratio``    last step's demand / ready capacity (max       0      1
                                                over phases, tokens/s), / 4
    12 m + 1        ``forecast_mean_ratio``     forecast mean (req/s x request shape), max     0      1
                                                over phases and look-ahead / planned, / 4
    12 m + 2        ``forecast_upper_ratio``    same at the planning quantile                  0      1
    12 m + 3        ``starting_share``          capacity still starting / planned capacity     0      1
                                                (min over phases)
    12 m + 4        ``since_reopt``             steps since the model's last                   0      1
                                                re-optimization / 288, capped at 1
    12 m + 5        ``unserved_share``          share of its demand tokens not served within   0      1
                                                SLO, mean of the last 3 steps
    12 m + 6        ``cost_share``              its share of last step's billed cost           0      1
                                                (running, starting, draining nodes)
    12 m + 7        ``preempted``               1 if one of its instances was preempted at     0      1
                                                the last step boundary
    12 m + 8        ``forecast_trend``          (forecast mean at the look-ahead's last step   -1     1
                                                - at its first) / planned capacity, max over
                                                phases, / 4
    12 m + 9        ``interval_width``          (planning quantile - mean) / planned, max      0      1
                                                over phases and look-ahead, / 4
    12 m + 10       ``surplus``                 (planned - planning quantile) / planned, min   -1     1
                                                over phases (-1: no capacity for a demand)
    12 m + 11       ``since_preempt``           steps since one of its instances was           0      1
                                                preempted / 288, capped at 1 (1: none yet)
    12 M + g        ``headroom/<gpu type>``     (nodes offered - nodes held) / offered         0      1
    12 M + G + 0    ``time_sin``                sin(2 pi x seconds of day / 86400)             -1     1
    12 M + G + 1    ``time_cos``                cos(2 pi x seconds of day / 86400)             -1     1
    12 M + G + 2    ``cost_rate``               last step's $/h / the initial plan's, / 4      0      1
    12 M + G + 3    ``spare_ondemand``          ``hedged``: on-demand quota not held / quota   0      1
                                                (0 in the other markets)
    12 M + G + 4    ``<model>/latency_ratio``   ``v2`` only, 3 per model from here: last       0      1
    + 3 m + 0                                   step's mean latency (TTFT, inter-token) / its
                                                SLO budget, max over phases, capped at 2, / 2
    12 M + G + 4    ``waiting_share``           requests waiting / (waiting + running)         0      1
    + 3 m + 1
    12 M + G + 4    ``correction``              (planned capacity x learned factors) /         0      1
    + 3 m + 2                                   planned capacity, min over phases, - 0.5
    12 M + G + 4    ``<model>/queue_growth``    ``v3`` only, 4 per model from here: (requests  -1     1
    + 3 M + 4 m                                 waiting now - a step ago) / (waiting +
    + 0                                         running) now, clipped to [-1, 1]
    12 M + G + 4    ``latency_miss``            share of the last step's requests over a       0      1
    + 3 M + 4 m                                 latency budget (TTFT or inter-token)
    + 1
    12 M + G + 4    ``spread``                  largest share of its planned capacity on one   0      1
    + 3 M + 4 m                                 spot pool (a region's spot market), max over
    + 2                                         phases (0: nothing on spot)
    12 M + G + 4    ``ondemand_share``          share of its planned capacity on on-demand     0      1
    + 3 M + 4 m                                 nodes, min over phases
    + 3
    12 M + G + 4    ``preempted/<gpu type>``    ``v3`` only, 2 per GPU type from here: nodes   0      1
    + 7 M + 2 g                                 of the type preempted over the last 12 steps /
    + 0                                         (those + nodes held now)
    12 M + G + 4    ``refused/<gpu type>``      nodes of the type requested and refused (a     0      1
    + 7 M + 2 g                                 failed acquisition) over the last 12 steps /
    + 1                                         nodes requested
    ==============  ==========================  =============================================  =====  ====

    (``atoll.envs.observation.MODEL_FEATURES`` / ``FLEET_FEATURES`` hold the same table; a test
    keeps the two equal.)

    **Dynamics of a step** (t -> t + 1): apply the action; serve the step's true demand: per
    service served = min(demand, ready capacity), where an instance that becomes ready during
    the step counts for the part of the step it is ready; a model's requests meet the SLO in
    the share min over its phases of served / demand (a request needs both); bill every
    running, starting, replaced and draining node at the price of its (region, config, tier);
    advance time; if availability at t + 1 is below the nodes held, preempt instances at once
    (starting first; order drawn from ``self.np_random``) — on-demand quotas never drop, so
    under ``hedged`` only spot instances are preempted. ``info["total"]`` has the step's
    node-hours and on-demand node-hours.

    **The world and the servers** (``atoll/Fleet-v2``). ``capacity_error``: each template family's true
    throughput is the model's x a factor drawn at reset (:mod:`atoll.envs.capacity_error`; the
    draw and the servers' sampling noise come from two child seeds of ``self.np_random``, taken
    whatever the spec, so worlds of one seed meet the same availability and preemptions). Served
    tokens use the true capacity; the planner sees the model's capacity x what it has learned
    (``correction``: :mod:`atoll.envs.correction` fed by :func:`atoll.envs.servers.learn` from
    the step's served tokens, mean TTFT / inter-token latency and waiting requests — what vLLM
    exports, from the queueing approximation of :mod:`atoll.envs.latency`). ``slo_model=
    "latency"``: a model's SLO share is the share of its requests meeting both budgets in that
    approximation (at most the fluid served share, reported beside it as ``served_share``).
    ``info["correction"]`` holds the planner's factors, ``info["exposed_families"]`` the families
    that served; reset's ``info["capacity_error"]`` the true factors.

    **Reward** = -scale x (cost $ + unserved_usd_per_mtok x unserved Mtok + reopt_usd x bits
    set), with goodput tokens = share x (prefill + decode tokens) per model and unserved tokens
    = demand tokens - goodput tokens.

    **Start state**: a plan solved for all models (for the forecast at the first step, or with
    ``options={"initial_plan": "peak"}`` for the previous day's peak demand), already
    running. ``options={"planning": "oracle"}`` plans re-optimizations for the true demand over
    the look-ahead instead of the forecast (the hindsight reference); ``"oracle-rate"`` for the
    maximum over the look-ahead of the rate the demand is drawn from, never the sampled counts
    (:func:`atoll.envs.demand.underlying_rates`; the ``oracle-rate`` reference);
    ``"oracle-quantile"`` for the maximum over the look-ahead of each step's quantile, at the
    re-plan's level, of the demand as sampled anew from that rate
    (:func:`atoll.envs.demand.sampled_quantiles`; the ``oracle-quantile`` reference: the rule's
    margin on a perfect forecast of the rate and its noise).

    **Termination**: never (the fleet has no terminal state). **Truncation**: after
    ``episode_steps`` steps.

    **Version history** (newest first)

    * ``v4``: ``v3``'s world and observation; the action also chooses each re-optimized model's
      risk preset (``action="risk"``, ``MultiDiscrete([1 + 2 L R] * M)``). ``v0``-``v3`` keep
      their actions (one risk: the configured one for every model).
    * ``v3``: ``v2``'s closed loop in a world that charges what a cluster charges —
      ``startup="sampled"``, ``preemption="zone"``, ``spot_acquisition="trace"`` (each in
      FleetConfig's docstring with its public source; ``scale_down`` stays ``drain``) — and the
      observation of risk appended to ``v2``'s: ``queue_growth``, ``latency_miss``, ``spread``,
      ``ondemand_share`` per model, ``preempted`` and ``refused`` (failed acquisitions) per GPU type:
      ``19 M + 3 G + 4`` values. ``info`` gains ``failed_acquisitions``, ``lost_in_flight`` and
      ``free_nodes``. ``v0``-``v2`` keep their worlds (every new setting defaults to theirs).

    * ``v2``: the closed-loop world on ``v1``'s action — true capacities off the model
      (``capacity_error="calibration"``), SLO attainment from the latency model, online
      capacity correction; the observation appends the closed-loop block (``latency_ratio``,
      ``waiting_share``, ``correction`` per model): ``15 M + G + 4`` values.
    * ``v1``: ``MultiDiscrete([1 + 2 L] * M)`` action — per model hold, grow or full at one of
      the planning levels (code 1 = ``v0``'s bit 1); the observation gains ``forecast_trend``,
      ``interval_width``, ``surplus``, ``since_preempt`` per model and ``spare_ondemand``:
      ``12 M + G + 4`` values.
    * ``v0``: ``MultiBinary(M)`` action, a set bit re-optimizing the model fully at the
      configured planning quantile. Its world and observation were revised in place three times
      where Gymnasium's rule asks for a new id each time, so ``v0`` figures logged at different
      times are not comparable:

        - first release: ``8 M + G + 3`` observation values, the held 600 s window rate as
          demand, break-before-make transitions, ``ample``, ``scarce`` and ``spot`` markets;
        - revised in place: one observation path with the live controller
          (``fleet_signals``); ``since_reopt`` counts the step of the re-optimization itself
          (1 at t + 1 for a model re-optimized at t, where it read 0); draining nodes are
          billed until their drain ends (they were billed for the whole interval);
        - revised in place: demand sampled per step from the arrival processes,
          make-before-break transitions, the ``hedged`` market;
        - revised with ``v1``: ``v1``'s world and observation under the ``MultiBinary``
          action (``action="binary"``).
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, config: FleetConfig | None = None, **overrides: Any) -> None:
        config = config or FleetConfig()
        if overrides:
            config = FleetConfig(**{**config.__dict__, **overrides})
        self.config = c = config
        self.fleet = fleet = FleetModel.from_config(c)
        self.models: tuple[str, ...] = fleet.models
        if c.look_ahead_s < fleet.median_startup:
            raise ValueError(f"FleetConfig: field 'look_ahead_s' ({c.look_ahead_s:g} s) must cover the "
                             f"median start-up time ({fleet.median_startup:.0f} s)")
        self._availability: Availability = build_availability(c, fleet)
        self.gpu_types: tuple[str, ...] = fleet.gpu_types
        series = c.demand if c.demand is not None else workload_series(
            c.workload, self.models, c.scenario_spec.req_per_s, c.step_s, resample=c.resample,
            seed=c.demand_seed)
        self.codec: ActionCodec = c.action_codec
        self.book: DemandBook = build_book(self.models, series, forecaster=c.forecaster,
                                           horizon=c.look_ahead_steps, quantile=c.planning_quantile,
                                           levels=self.codec.levels)
        if abs(self.book.step_s - c.step_s) > 1e-9:
            raise ValueError(f"FleetConfig: demand step {self.book.step_s:g} s differs from "
                             f"step_s {c.step_s:g} s")
        self.book.check_days(*c.days)
        m = len(self.models)
        self.action_space: spaces.Space[np.ndarray] = (
            spaces.MultiBinary(m) if c.action == "binary" else self.codec.space(m))
        self._obs_closed, self._obs_risk = c.observation in ("v2", "v3"), c.observation == "v3"
        self.observation_space = box = observation_space(m, len(self.gpu_types), closed_loop=self._obs_closed,
                                                         risk=self._obs_risk)
        self._obs_space_low = box.low
        self.state = FleetState()
        self.planning_demand = PlanningDemand(c, fleet, self.book, self.codec)
        self.servers = ServerLoop(c, fleet)  # the true world, the servers' reports, the correction
        self._latency = self.servers.latency
        # what a cluster charges: the spot pools' offer, the pools believed full, the start-up generator
        self.market = MarketView(fleet, self._availability.offered() if c.spot_acquisition == "trace" else {})
        self._startup_rng: np.random.Generator | None = None

    # ----- helpers ------------------------------------------------------------------------
    @property
    def feature_names(self) -> list[str]:
        """Every observation entry's name, in order (:func:`atoll.envs.observation.feature_names`)."""
        return feature_names(self.models, self.gpu_types, closed_loop=self._obs_closed, risk=self._obs_risk)

    @property
    def correction(self) -> CapacityCorrection:
        """The planner's online capacity correction (``correction``; fresh at each reset)."""
        return self.servers.correction

    @property
    def truth(self) -> dict[str, float]:
        """The world's true capacity factors per family, drawn at reset (empty: the exact world)."""
        return self.servers.truth

    @property
    def last_report(self) -> ServerReport | None:
        """What the servers reported over the last step (None outside the closed loop)."""
        return self.servers.last_report

    @property
    def underlying_rates(self) -> np.ndarray:
        """[M, steps] the rate the demand is drawn from (computed on first use)."""
        return self.planning_demand.underlying_rates

    @property
    def rate_quantiles(self) -> dict[float, np.ndarray]:
        """{level: [M, steps]} the demand's own per-step quantiles (``oracle-quantile``)."""
        return self.planning_demand.rate_quantiles

    def decode(self, action: Any) -> list[Reoptimization]:
        """The re-optimization each model gets from ``action`` (either version's encoding)."""
        return decode_action(self.codec, action, self.models, binary=self.config.action == "binary")

    def _planning_caps(self) -> dict[Pool, int]:
        return self.market.planning_caps(self._cap, self.state, self._g * self.config.step_s)

    def _factors(self) -> dict[str, float] | None:
        """The capacity factors the planner has learned (None: it plans on the model's)."""
        return self.correction.planning_factors() if self.config.correction else None

    def _replan(self, models: frozenset[str], demand: np.ndarray,
                grow: frozenset[str] = frozenset(), caps: dict[Pool, int] | None = None,
                risk: dict[str, Risk] | None = None) -> PlanOutcome:
        caps = caps if caps is not None else self._planning_caps()
        # an infeasible re-plan falls back to goodput mode and nobody reads why: naming the
        # services short of capacity cost one small ILP per service, a third of a busy env's time
        return self.fleet.replan(self.state, models, demand, caps, grow=grow, factors=self._factors(),
                                 risk=risk, diagnose=False)

    def _apply(self, outcome: PlanOutcome) -> dict[str, int]:
        """Apply a plan; the instances whose spot nodes the market did not have (per key)."""
        rng = self.np_random if self.config.spot_acquisition == "trace" else None
        return self.market.apply(self.state, outcome, self._cap, self._g * self.config.step_s,
                                 self._startup_rng, rng)

    def _reoptimize(self, reopts: list[Reoptimization]) -> Decision:
        """Re-plan the models not on hold together; a refused request comes back within seconds
        (the cloud's insufficient-capacity error): the planner re-plans at once without the pools
        that refused, a few times."""
        chosen = frozenset(self.models[i] for i, r in enumerate(reopts) if r.kind != "hold")
        grow = frozenset(self.models[i] for i, r in enumerate(reopts) if r.kind == "grow")
        if not chosen:
            return Decision(reopts, chosen, grow, failed={})
        levels = [r.level if r.level is not None else self.codec.levels[0] for r in reopts]
        planning = self.planning_demand(self._g, self._planning, levels)
        # the risk presets the action chose (Fleet-v4); the others take the configured risk
        risk = {self.models[i]: r.risk for i, r in enumerate(reopts) if r.risk is not None} or None
        outcome = self._replan(chosen, planning, grow, risk=risk)
        failed, retry_s = self._apply(outcome), 0.0
        for _ in range(ACQUIRE_RETRIES):
            if not failed:
                break
            retry_s += outcome.solver_seconds
            outcome = self._replan(chosen, planning, grow, risk=risk)
            more = self._apply(outcome)
            failed = {k: failed.get(k, 0) + more.get(k, 0) for k in set(failed) | set(more)}
        return Decision(reopts, chosen, grow, outcome, outcome.solver_seconds + retry_s, failed)

    def _observe(self) -> np.ndarray:
        return observe(self.fleet, self.state, self._planning_caps(), self.book, self._g, self.memory,
                       self.servers, self.market, step_s=self.config.step_s, factors=self._factors(),
                       closed_loop=self._obs_closed, risk=self._obs_risk)

    # ----- gymnasium API ------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        c = self.config
        self.day, initial, self._planning = reset_options(options, self.book, c.days, self.np_random)
        self._g0 = self._g = (self.day - 1) * self.book.steps_per_day
        self._t = 0
        self._availability.reset(self.np_random)
        self._cap = self._availability.capacity(self._g * c.step_s)
        self.state = FleetState(warm_s=WARM_S if c.startup == "sampled" else 0.0)
        self.market.reset()
        self.servers.reset(self.np_random)
        # drawn after the worlds' seeds, so a world without sampled start-ups meets the same draws
        self._startup_rng = (np.random.default_rng(int(self.np_random.integers(0, 2**63 - 1)))
                             if c.startup == "sampled" else None)
        demand = self.planning_demand(self._g, "peak" if initial == "peak" else self._planning)
        # the episode starts from a fleet that holds what the market had
        outcome = self._replan(frozenset(self.models), demand, caps=self._cap)
        if outcome.allocation is not None:
            self.state.running = {k: n for k, n in outcome.allocation.counts if n}
        self.memory = Memory.start(len(self.models), self.fleet.cost(self.state, c.step_s), c.step_s)
        info = {"step": 0, "day": self.day, "seconds": self._g * c.step_s,
                "initial_plan": {"status": outcome.status.value, "mode": outcome.mode,
                                 "instances": outcome.allocation.total_instances if outcome.allocation else 0,
                                 "solver_seconds": outcome.solver_seconds}}
        if self.truth:
            info["capacity_error"] = {"spec": c.capacity_error_spec.label, "truth": dict(self.truth)}
        return self._observe(), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not hasattr(self, "_g"):
            raise RuntimeError("FleetEnv.step called before reset()")
        c, g, dt = self.config, self._g, self.config.step_s
        reopts = self.decode(action)
        self.market.roll()  # a new step in the risk windows
        decision = self._reoptimize(reopts)
        stopped, self.state.stopped = self.state.stopped, {}
        self.memory.reoptimized([self.fleet.model_index[name] for name in decision.chosen])
        # serve the step's true demand
        rates = self.book.rates[:, g]
        demand = self.fleet.tokens(rates)
        ready, report = self.servers.serve(self.state, demand, rates, dt)
        served = serve(c, self.fleet, rates, demand, ready, report, stopped)
        cost, node_hours = self.fleet.cost(self.state, dt), self.fleet.node_hours(self.state, dt)
        # time passes; availability moves; preemption at the boundary
        self.state.advance(dt, self.fleet.templates)
        self._g, self._t = g + 1, self._t + 1
        self._cap = self._availability.capacity(self._g * dt)
        held_keys = (set(self.state.running) | set(self.state.starting) | set(self.state.draining)
                     | set(self.state.replaced))
        lost = self.state.preempt(self._cap, {k: self.fleet.templates[k] for k in held_keys}, self.np_random)
        lost_by_model = self.market.preempted(lost, self._g * dt)
        self.memory.boundary(lost_by_model, served.unserved_share, cost)
        reward = step_reward(c.reward, cost, served.unserved_tok, len(decision.chosen))
        at_end = self._g >= self.book.rates.shape[1]  # the trace ran out: no forecast to observe
        truncated = self._t >= c.episode_steps or at_end
        obs = self._obs_space_low.copy() if at_end else self._observe()
        info = step_info(c, self.fleet, self.state, served, decision, cost, node_hours, lost_by_model,
                         self.servers, step=self._t, day=self.day, seconds=self._g * dt)
        return obs, reward, False, bool(truncated), info
