"""FleetEnv's typed configuration."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from atoll.envs.actions import ACTION_KINDS, DEFAULT_ACTION_LEVELS, ActionCodec, risk_menu
from atoll.envs.capacity_error import CapacityError
from atoll.envs.vocabulary import DEFAULT_LEVEL
from atoll.forecast.forecasters import QUANTILES
from atoll.forecast.planning import DEFAULT_FORECASTER
from atoll.forecast.registry import FORECASTERS
from atoll.forecast.workloads import DemandSeries
from atoll.solvers.errors import InputError
from atoll.solvers.problem import Risk
from atoll.solvers.runtime import DEFAULT_RUNTIME, check_runtime
from atoll.solvers.scenarios import SCENARIOS, ScenarioSpec
from atoll.solvers.types import PD_MODES, Template
from atoll.solvers.validation import (
    check_choice,
    check_day_range,
    check_flag,
    check_fraction,
    check_integer,
    check_number,
)

AVAILABILITY_KINDS: tuple[str, ...] = ("ample", "scarce", "spot", "hedged", "market")
# the kinds a fleet file's pools take as markets (``market``: each pool's own from the file;
# ``spot`` / ``hedged``: every pool in that market), see atoll.envs.availability
MARKET_KINDS: tuple[str, ...] = ("spot", "hedged", "market")
QUOTA_LEVELS: tuple[str, ...] = ("scarce", "ample")
PRICE_KINDS: tuple[str, ...] = ("on-demand", "spot")
TRANSITIONS: tuple[str, ...] = ("make-before-break", "break-before-make")
RESAMPLES: tuple[str, ...] = ("sampled", "hold")
SLO_MODELS: tuple[str, ...] = ("fluid", "latency")
OBSERVATIONS: tuple[str, ...] = ("v1", "v2", "v3")
# what a cluster charges for a re-plan (the ``atoll/Fleet-v3`` world; the first of each is the
# world of the earlier ids)
STARTUPS: tuple[str, ...] = ("fixed", "sampled")
PREEMPTIONS: tuple[str, ...] = ("independent", "zone")
ACQUISITIONS: tuple[str, ...] = ("seen", "trace")
SCALE_DOWNS: tuple[str, ...] = ("drain", "lose")
# HiGHS nodes per run before a re-plan keeps its best plan. Above every run of the bundled
# scenarios' spot days but fleet20's (extended's charged day: at most 2,653 nodes; fleet20's: two
# runs past 20 s of wall clock, one of them at 23,252 nodes), so those days are unchanged; a hard
# fleet20 re-plan now stops where the count says, not where the machine's load says
SOLVER_NODE_LIMIT = 5_000

_OWNER = "FleetConfig"
# FleetConfig's fields that take one of a few values (the optional ones may also be None); the
# registries themselves, not copies: a forecaster registered later (peak:learned) is valid
_CHOICES: tuple[tuple[str, Collection[object]], ...] = (
    ("startup", STARTUPS), ("preemption", PREEMPTIONS), ("spot_acquisition", ACQUISITIONS),
    ("scale_down", SCALE_DOWNS), ("forecaster", FORECASTERS), ("planning_quantile", QUANTILES),
    ("availability", AVAILABILITY_KINDS), ("prices", PRICE_KINDS), ("ondemand_quota", QUOTA_LEVELS),
    ("resample", RESAMPLES), ("transition", TRANSITIONS), ("pd", PD_MODES), ("action", ACTION_KINDS),
    ("slo_model", SLO_MODELS), ("observation", OBSERVATIONS),
)
_OPTIONAL = ("prices", "pd")


@dataclass(frozen=True)
class RewardWeights:
    """reward = -scale x (node cost $ + unserved_usd_per_mtok x unserved Mtok + reopt_usd x models
    re-optimized). ``unserved_usd_per_mtok`` is the value of demand lost (not served within SLO);
    about 10x what serving a token costs in the default scenarios, so losing demand is never
    the cheap way out."""

    unserved_usd_per_mtok: float = 2.0
    reopt_usd: float = 0.02
    scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("unserved_usd_per_mtok", "reopt_usd", "scale"):
            check_number("RewardWeights", name, getattr(self, name), allow_zero=True)


@dataclass(frozen=True)
class FleetConfig:
    """Everything a FleetEnv run depends on (see FleetEnv's docstring for the semantics).

    ``scenario`` names a bundled scenario, or the fleet file's scenario given as ``fleet`` (the
    value :func:`atoll.envs.fleet_file.read_fleet` returns as ``Fleet.scenario``: its models,
    catalog, markets and library settings travel with the config, to worker processes too).
    ``days`` is the inclusive 1-based range episodes are drawn from; ``models``, ``templates``
    and ``demand`` (one series per model) override the scenario's (tests and user fleets).
    ``request_shapes`` (input, output tokens per request, one pair per model) overrides the
    scenario's shapes; ``runtime`` picks the scenario's template library (``any``: the research
    runtime; ``vllm``: what vLLM can run, as the controller deploys). ``prices`` None means spot
    prices with spot availability, on-demand otherwise. ``transition``: ``make-before-break``
    (replaced instances serve until their replacement is ready) or ``break-before-make``
    (removed instances stop serving at once). ``pd``: how every model is served (``auto``,
    ``aggregated``, ``disaggregated``; None: the scenario's own, a fleet file's per-model modes
    included). ``resample`` and
    ``demand_seed`` (the ``servegen`` workload): ``sampled`` draws every step's requests from the
    clients' arrival processes with a generator seeded by ``demand_seed``; ``hold`` repeats each
    600 s window's rate in every step it covers. ``availability="hedged"``: every
    (region, config) offers a spot pool that follows the spot traces (as ``spot``) and an
    on-demand pool with its own quota (``ondemand_quota``: the ``scarce`` or ``ample`` level) at
    on-demand prices; the ILP picks the tier per instance and preemption hits spot only.
    ``availability="market"`` (a fleet file's scenario only): each pool in the market its file
    says, billed at that tier (prices then follow the pools and ``prices`` must be None); a fleet
    file's scenario under ``spot`` or ``hedged`` puts every pool in that market, its own traces
    and on-demand quotas kept (``ondemand_quota`` applies to the bundled scenarios only;
    :func:`atoll.envs.availability.market_availability`).
    ``action``: ``reopt`` (``atoll/Fleet-v1``: per model hold, grow or full at one of the planning
    levels — ``planning_quantile`` then ``action_levels``, see :mod:`atoll.envs.actions`) or
    ``binary`` (``atoll/Fleet-v0``: MultiBinary, re-plan fully at ``planning_quantile``).
    ``capacity_error`` (:mod:`atoll.envs.capacity_error`): how the true throughput of
    each template family differs from the performance model — ``0`` the exact world,
    ``"calibration"`` the calibration's held-out spread, a sigma, ``"stress:S"``, ``"scale:F"``
    or ``"file:PATH"``; drawn at reset from the env's generator. ``correction``: the planner
    solves with capacities corrected online from the servers' signals
    (:mod:`atoll.envs.correction`); off, it plans on the performance model's capacities.
    ``slo_model``: ``fluid`` (a request meets the SLO when its share of capacity is there:
    served / demand) or ``latency`` (the queueing approximation of :mod:`atoll.envs.latency`:
    late requests within capacity count as missed). ``observation``: ``v1`` (the 12 M + G + 4
    features) or ``v2`` (plus latency, queue and correction per model, ``atoll/Fleet-v2``) or
    ``v3`` (plus the observations of risk, ``atoll/Fleet-v3``).
    ``solver_gap``: re-optimizations stop at a proven relative gap of 0.1% by default — far below
    the forecast error, and it cuts the worst solve times of the extended scenario severalfold.
    ``solver_node_limit``: HiGHS branch-and-bound nodes per run before a re-plan keeps its best
    plan (counted as a time-limited solve); a count, not seconds, so where a hard re-plan stops
    does not depend on the machine or its load and a simulation stays a function of its seed.
    ``solver_time_limit`` (s) stays as the outer bound of a re-plan, set well past what the node
    limit takes (a node costs 1-8 ms on the blocks measured), so it only stops a runaway; None:
    no node limit.
    ``risk``: the :class:`~atoll.solvers.problem.Risk` every re-plan takes for every model
    (headroom, spread over spot pools, on-demand floor; rows of the same exact ILP); neutral by
    default, which is the plain ILP. ``risk_menu``: the presets a ``risk`` action chooses among
    (:mod:`atoll.envs.actions`; ``risk`` stays preset 0); empty, the market's menu
    (``RISK_MENUS``) — a per-model rule that names its own risks sets it. ``removal_weight`` R:
    each running instance a re-plan removes
    costs R x its $/h in the re-plan's objective (the ILP's price of churn, beside the start-up
    weight for additions); 0 by default.

    What a cluster charges for a re-plan (each first value is the world of ``atoll/Fleet-v0`` to
    ``-v2``; ``atoll/Fleet-v3`` sets the second of the first three):

    ``startup``: ``fixed`` (node boot 180 s + the weights of the stage a node holds at 1 GB/s,
    the same every time) or ``sampled`` (per instance, drawn from the env's generator, by model
    size and cache state: a new node's provisioning 1-10 min, the serving image pulled, weights
    from object storage, a cold torch.compile and CUDA graph capture; or a free node of the
    (region, config) a scale-down left in the warm pool for the Cluster Autoscaler's 10-minute
    ``--scale-down-unneeded-time``, held and billed meanwhile: no boot, image present, weights
    and compile cache local when it served the same model; figures and their public sources in
    :mod:`atoll.envs.fleet`). ``preemption``: ``independent`` (every (region, config) reads
    its region's spot trace at its own seeded offset) or ``zone`` (the configs of one GPU type
    in one region share one offset, so they are interrupted together: SpotHedge/SkyServe,
    EuroSys'25, find co-interruptions of one instance type in one zone within 3 minutes in over
    92% of cases; :mod:`atoll.envs.availability`). ``spot_acquisition``: ``seen`` (the planner
    sees each spot pool's current trace count and every requested node arrives) or ``trace``
    (clouds publish no spot capacity: the planner sees each spot pool's offered nodes, and a
    requested node arrives only when the trace has it at that moment; the rest of the request
    fails, and the pool is believed full at what it holds for ``ACQUIRE_BACKOFF_S`` — the
    Cluster Autoscaler's ``--initial-node-group-backoff-duration``, 5 minutes, doubling up to its
    30-minute maximum for failures in a row — after a failure or a preemption; a refused request
    is re-planned at once without the pool, up to 3 times, as Karpenter falls back to other
    instance types within one provisioning round). ``scale_down``: ``drain`` (a removed instance
    finishes its in-flight requests within the grace period ``drain_s``, billed) or ``lose`` (it
    stops at once, unbilled, and its in-flight requests — by Little's law its share of the
    model's request rate x a request's duration at the SLO budgets — are lost).
    """

    scenario: str = "core"
    fleet: ScenarioSpec | None = None
    workload: str = "servegen"
    days: tuple[int, int] = (4, 10)
    step_s: float = 300.0
    episode_steps: int = 288
    drain_s: float = 60.0
    forecaster: str = DEFAULT_FORECASTER  # peak:auto
    planning_quantile: float = DEFAULT_LEVEL
    look_ahead_s: float = 900.0
    availability: str = "spot"
    prices: str | None = None
    reward: RewardWeights = field(default_factory=RewardWeights)
    startup_weight: float | None = None
    demand_round: float = 0.02
    memoize: bool = True
    solver_time_limit: float = 120.0
    solver_gap: float = 1e-3
    solver_node_limit: int | None = SOLVER_NODE_LIMIT
    models: tuple[str, ...] | None = None
    templates: tuple[Template, ...] | None = None
    demand: tuple[DemandSeries, ...] | None = None
    request_shapes: tuple[tuple[float, float], ...] | None = None
    runtime: str = DEFAULT_RUNTIME
    transition: str = "make-before-break"
    resample: str = "sampled"
    ondemand_quota: str = "scarce"
    demand_seed: int = 0
    action: str = "reopt"
    action_levels: tuple[float, ...] = DEFAULT_ACTION_LEVELS
    capacity_error: float | str = 0.0
    correction: bool = False
    slo_model: str = "fluid"
    observation: str = "v1"
    risk: Risk = Risk()
    risk_menu: tuple[Risk, ...] = ()
    removal_weight: float = 0.0
    startup: str = "fixed"
    preemption: str = "independent"
    spot_acquisition: str = "seen"
    scale_down: str = "drain"
    pd: str | None = None

    def __post_init__(self) -> None:
        self._check_fleet()
        for name, valid in _CHOICES:
            check_choice(_OWNER, name, getattr(self, name), valid, allow_none=name in _OPTIONAL)
        self._check_numbers()
        check_day_range(_OWNER, "days", self.days)
        self._check_risk()
        self._check_market()
        self._check_request_shapes()
        self._check_action_levels()
        self._check_world()

    def _check_fleet(self) -> None:
        """``fleet`` is a fleet file's scenario that ``scenario`` names, or ``scenario`` a bundled one."""
        if self.fleet is not None and not isinstance(self.fleet, ScenarioSpec):
            raise InputError(f"{_OWNER}: field 'fleet' must be a fleet file's ScenarioSpec (Fleet.scenario) "
                             f"or None, got {type(self.fleet).__name__}")
        if self.fleet is not None and self.fleet.name != self.scenario:
            raise InputError(f"{_OWNER}: field 'scenario' {self.scenario!r} must name the fleet given as "
                             f"'fleet' ({self.fleet.name!r})")
        if self.fleet is None and self.scenario not in SCENARIOS:
            raise InputError(f"{_OWNER}: field 'scenario' must be one of {', '.join(SCENARIOS)} (or a fleet "
                             f"file's, given as 'fleet'), got {self.scenario!r}")

    def _check_numbers(self) -> None:
        """Durations, counts, weights and fractions in their ranges."""
        for name in ("step_s", "look_ahead_s", "solver_time_limit"):
            check_number(_OWNER, name, getattr(self, name))
        check_number(_OWNER, "drain_s", self.drain_s, allow_zero=True)
        check_number(_OWNER, "removal_weight", self.removal_weight, allow_zero=True)
        if self.startup_weight is not None:
            check_number(_OWNER, "startup_weight", self.startup_weight, allow_zero=True)
        check_integer(_OWNER, "episode_steps", self.episode_steps, minimum=1)
        check_integer(_OWNER, "demand_seed", self.demand_seed, minimum=0)
        check_fraction(_OWNER, "solver_gap", self.solver_gap, high_open=True)
        if self.solver_node_limit is not None:
            check_integer(_OWNER, "solver_node_limit", self.solver_node_limit)
        check_fraction(_OWNER, "demand_round", self.demand_round, high_open=True)

    def _check_risk(self) -> None:
        """``risk`` is a Risk, ``risk_menu`` a tuple of distinct ones."""
        if not isinstance(self.risk, Risk):
            raise InputError(f"{_OWNER}: field 'risk' must be a Risk (e.g. Risk.parse('h0.85,s0.5')), "
                             f"got {self.risk!r}")
        if not isinstance(self.risk_menu, tuple) or not all(isinstance(r, Risk) for r in self.risk_menu) \
                or len(set(self.risk_menu)) != len(self.risk_menu):
            raise InputError(f"{_OWNER}: field 'risk_menu' must be a tuple of distinct Risk presets "
                             f"(empty: the market's menu), got {self.risk_menu!r}")

    def _check_market(self) -> None:
        """``availability="market"`` needs a fleet file's markets, and bills each pool at its tier."""
        if self.availability != "market":
            return
        if not self.scenario_spec.markets:
            raise InputError(f"{_OWNER}: field 'availability' 'market' is a fleet file's own market per "
                             f"pool and scenario {self.scenario!r} has none; use one of ample, scarce, "
                             f"spot, hedged")
        if self.prices is not None:
            raise InputError(f"{_OWNER}: field 'prices' must be None with availability 'market' (each pool "
                             f"bills at its market's tier), got {self.prices!r}")

    def _check_request_shapes(self) -> None:
        if self.request_shapes is not None and not all(
                len(pair) == 2 and all(isinstance(v, int | float) and math.isfinite(v) and v > 0
                                       for v in pair) for pair in self.request_shapes):
            raise InputError(f"{_OWNER}: field 'request_shapes' must hold (input, output) token pairs > 0, "
                             f"got {self.request_shapes!r}")

    def _check_action_levels(self) -> None:
        levels = tuple(self.action_levels)
        distinct = len(set(levels)) == len(levels)
        if not levels or any(q not in QUANTILES or q < 0.5 for q in levels) or not distinct:
            raise InputError(f"{_OWNER}: field 'action_levels' must be distinct planning levels from "
                             f"{[q for q in QUANTILES if q >= 0.5]}, got {self.action_levels!r}")

    def _check_world(self) -> None:
        """The runtime's library exists, the capacity-error spec parses, ``correction`` is a bool."""
        try:
            check_runtime(self.runtime)
        except (KeyError, ValueError) as exc:
            raise InputError(f"{_OWNER}: field 'runtime': {exc}") from exc
        try:
            CapacityError.parse(self.capacity_error)
        except InputError as exc:
            raise InputError(f"{_OWNER}: field 'capacity_error': {exc}") from exc
        check_flag(_OWNER, "correction", self.correction)

    @property
    def scenario_spec(self) -> ScenarioSpec:
        """The fleet file's scenario, or the bundled one ``scenario`` names; with ``pd``, serving
        every model that way."""
        spec = self.fleet if self.fleet is not None else SCENARIOS[self.scenario]
        return spec if self.pd is None else replace(spec, pd=self.pd, model_pd=())

    @property
    def look_ahead_steps(self) -> int:
        return max(1, math.ceil(self.look_ahead_s / self.step_s - 1e-9))

    @property
    def capacity_error_spec(self) -> CapacityError:
        return CapacityError.parse(self.capacity_error)

    @property
    def closed_loop(self) -> bool:
        """Whether a step computes the servers' signals (latency, queues) at all: the world differs
        from the model, the planner corrects, the SLO is latency-based or a policy observes them."""
        return (not self.capacity_error_spec.exact or self.correction or self.slo_model == "latency"
                or self.observation in ("v2", "v3"))

    @property
    def action_codec(self) -> ActionCodec:
        """The codes of this configuration's action: its planning level and risk first, then the
        other action levels and (``action="risk"``) the risk menu's other presets."""
        menu = risk_menu(self.availability, self.risk_menu) if self.action == "risk" else ()
        return ActionCodec.for_config(self.planning_quantile, self.action_levels, self.risk, menu)

    @property
    def price_kind(self) -> str:
        """``on-demand`` or ``spot`` (every node at that price), or ``market`` (each pool at its
        own market's tier)."""
        if self.prices is not None:
            return self.prices
        if self.availability == "market":
            return "market"
        return "spot" if self.availability == "spot" else "on-demand"
