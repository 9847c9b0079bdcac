"""The fleet file: one YAML naming a user's models, GPUs, regions and prices, availability,
workloads and cluster settings. Every command takes it (``--fleet FILE``).

.. code-block:: yaml

    name: acme                      # DNS-style name; becomes the scenario name
    runtime: vllm                   # vllm (default) or any, see atoll.solvers.runtime
    slices: true                    # vllm's default: several vLLM pods per node, each on g of its
                                    # G GPUs, TP x PP inside a node; plans buy whole nodes.
                                    # false: every stage owns whole nodes
    models:
      - Phi-4-14B                   # a catalog model, by name or alias
      - name: Acme-8B               # or a full definition (fields of ModelSpec) with its SLO
        layers: 32
        hidden: 4096
        heads: 32
        kv_heads: 8
        head_dim: 128
        params_b: 8.0
        active_params_b: 8.0
        bytes_per_param: 2
        slo: {ttft_ms: 800, tpot_ms: 40}
    gpus:                           # optional: GPU types the catalog lacks (fields of GpuType)
      - {name: MI300X, memory_gb: 192, hbm_bandwidth_gbs: 5300, bf16_tflops: 1307, link_gbs: 448}
    regions:
      - name: aws:us-east-2
        catalog: true               # the catalog's offers and prices in this region ...
        gpu_types: [L4, L40S]       # ... of these GPU types (default: all it sells)
        market: spot                # on-demand (default), spot or hedged: the tier it buys at
      - name: lab:rack-1            # or your own offers, $/node-hour
        market: hedged
        offers:
          - {config: 8xMI300X, on_demand: 28.0, spot: 11.0}
    availability:                   # optional; default: ample (1000 nodes of every offer)
      static:                       # nodes you can get, per region/config; cells left out get none
        aws:us-east-2/4xL4: 6       # (a spot pool on a bundled trace: the nodes the trace scales)
      markets:                      # optional, per pool: overrides its region's market
        aws:us-east-2/4xL4: on-demand
      ondemand_quota:               # hedged pools: on-demand nodes beside the spot pool (default 1000)
        lab:rack-1/8xMI300X: 2
      traces:                       # a spot or hedged pool's spot capacity over time, a CSV:
        lab:rack-1/8xMI300X: pools/mi300x.csv   # "time_s,nodes" (from time_s, seconds from the
                                    # workloads' start, that many nodes until the next row) or a
                                    # preemption log "time_s,event,nodes" (event: capacity sets the
                                    # count, preempt takes nodes away, restore gives them back)
    workloads:                      # one per model, mapped by name
      Phi-4-14B: {source: "csv:requests.csv#phi-4", scale: 1.0}
      Acme-8B: {source: "servegen:m-small", mean_rate: 5.0}
    kubernetes:                     # the Kubernetes sinks (atoll.control.k8s.render.K8sOptions)
      namespace: llm
      image: vllm/vllm-openai:v0.33.0   # the vLLM whose flags atoll checks (default)
      model_sources: {Acme-8B: acme/8b}
      kube_version: "1.33"          # check objects against this API server version's schemas
      node_labels:                  # per cloud prefix: eks (aws default), gke (gcp), gfd, or your labels
        lab: {gpu_key: example.com/gpu, capacity_key: example.com/tier,
              capacity_values: {on-demand: reserved, spot: preemptible}}
    min_instances: {default: 1, Acme-8B: {prefill: 1, decode: 2}}   # the live controller's floor
    removal_weight: 0.25            # optional: each instance a re-plan removes costs R x its $/h (churn)
    pd: {default: auto, Acme-8B: disaggregated}   # how a model is served: auto (the ILP chooses),
                                    # aggregated (one replica serves prefill and decode together,
                                    # vLLM's default) or disaggregated (a replica per phase); or
                                    # one word for every model. Default: auto
    request_shapes: [code, conv]    # optional: each model's mean input and output tokens from these
                                    # Azure LLM 2023 traces (code, conv), dealt to the models in turn
                                    # (model 0 the first, model 1 the second, ...). Default
                                    # (workloads): each workload's own request-weighted means
    scarce_headroom: 0.25           # optional: availability 'scarce' caps each pool at ceil((1 + h) x
                                    # the nodes the cheapest plan of the even mix uses). Default 0.25

The market says what a drop in a trace means and the tier a pool bills at: a spot pool is
billed at its spot price and a drop preempts the spot instances above it; a hedged pool has both
tiers, the spot one on the trace and an on-demand quota that never moves; an on-demand pool bills
on-demand and has a static cap (a trace on it is an error). A spot or hedged pool without a trace
of its own follows the bundled spot trace of its region (catalog regions only).

Workload scaling is explicit: ``scale: X`` multiplies the request rate, ``mean_rate: R`` scales
it to R requests/s on average, neither keeps it as recorded. Relative paths are relative to the
fleet file. Every error names the file, the entry and the field.

**The bundled scenarios are fleet files** (``core``, ``extended``, ``fleet20`` under
``atoll/solvers/data/fleets``), read two ways: ``--fleet NAME`` reads one as the fleet it
describes, ``--scenario NAME`` as the scenario (:func:`atoll.solvers.scenarios.scenario_from_fleet`):
its models, regions, GPU types (in the order the regions' ``gpu_types`` name them), request shapes
(``request_shapes``: the Azure means), the workloads' one ``mean_rate`` (req/s per model in the even
mix), ``scarce_headroom``, runtime, ``n_max``, ``rho``, ``slices`` and ``pd``; a scenario's market
and demand are each command's settings (``--availability``, ``--workload``), so the regions'
markets and the workloads' sources are the fleet reading's only.

This module only parses and validates (the bottom layer imports nothing above it); loading the
workloads and putting the fleet to work is :mod:`atoll.envs.fleet_file`.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import yaml

from atoll.solvers.catalog import Catalog, load_catalog
from atoll.solvers.errors import InputError, UnknownNameError
from atoll.solvers.models import get_model
from atoll.solvers.runtime import DEPLOY_RUNTIME, RUNTIMES
from atoll.solvers.types import DEFAULT_PD, NODE_GPU_COUNTS, PD_MODES, GpuType, ModelSpec, Offer, Slo

_T = TypeVar("_T")
MARKETS: tuple[str, ...] = ("on-demand", "spot", "hedged")
TOP_KEYS = ("name", "runtime", "slices", "models", "gpus", "regions", "availability", "workloads",
            "kubernetes", "n_max", "rho", "min_instances", "removal_weight", "pd", "request_shapes",
            "scarce_headroom")
PHASE_NAMES = ("prefill", "decode")
AVAILABILITY_KEYS = ("static", "markets", "ondemand_quota", "traces")
# the Azure LLM inference 2023 traces whose mean request lengths a fleet (every bundled scenario)
# may plan with (``request_shapes``), by name, and their files under the shared data folder
AZURE_TRACES: Mapping[str, str] = {"code": "AzureLLMInferenceTrace_code.csv",
                                   "conv": "AzureLLMInferenceTrace_conv.csv"}
WORKLOAD_SHAPES = "workloads"  # request_shapes' default: each workload's own means
SCARCE_HEADROOM = 0.25  # scarce_headroom's default
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_CONFIG = re.compile(r"([1-9][0-9]*)x(.+)")


class FleetFileError(InputError):
    """A fleet file that cannot be used; the message names the file, the entry, the field."""


# What a fleet may run under (the simulator's availability kinds, atoll.envs.config, which this
# bottom layer does not import): its pools in a market, each billed at the tier that serves it
# (``market``: each pool in its file's market; ``spot`` / ``hedged``: every pool in that one), or
# static caps with every pool on-demand (``ample``: the file's caps; ``scarce``: just above the
# cheapest plan), billed at one price list.
MARKET_CHOICES: tuple[str, ...] = ("market", "spot", "hedged")
STATIC_CHOICES: tuple[str, ...] = ("ample", "scarce")
PRICE_LISTS: tuple[str, ...] = ("on-demand", "spot")


class MarketChoiceError(FleetFileError):
    """A price list asked for with a market kind (:meth:`FleetSpec.market_choice`): a market bills
    each pool at the tier that serves it, so the prices would be dropped. ``str()`` names the
    settings as a fleet's configuration does (``availability``, ``prices``); :meth:`said` in a
    caller's own words (the CLI's ``--availability``, ``--prices``)."""

    def __init__(self, message: str, *, availability: str | None = None, prices: str = "",
                 summary: str = "") -> None:
        super().__init__(message)
        self.availability = availability  # as asked; None: not given (the file's market)
        self.prices = prices
        self.summary = summary  # the file's markets, FleetSpec.market_summary

    @classmethod
    def of(cls, path: Path, availability: str | None, prices: str, summary: str) -> MarketChoiceError:
        """The refusal of ``prices`` under ``availability`` (None: the file's market) in the fleet
        file ``path`` whose markets are ``summary``."""
        return cls(f"{path}: {_refusal(availability, prices, summary)}", availability=availability,
                   prices=prices, summary=summary)

    def said(self, availability: str = "availability", prices: str = "prices") -> str:
        """The refusal and its fix, naming the two settings ``availability`` and ``prices``."""
        return _refusal(self.availability, self.prices, self.summary, availability, prices)


def _refusal(asked: str | None, prices: str, summary: str, availability_name: str = "availability",
             prices_name: str = "prices") -> str:
    """Why ``prices`` do not apply under the market kind ``asked`` (None: the file's market), and the fix."""
    a, p = availability_name, prices_name
    if asked in (None, "market"):
        return (f"{p} {prices}: the fleet file's market bills each pool at its own tier ({summary}); "
                f"drop {p}, or override the market with {a} ample|scarce|spot|hedged")
    return (f"{p} {prices} does not apply to {a} {asked} (each pool bills at the tier that serves it); "
            f"drop {p}, or use {a} ample or scarce")


@dataclass(frozen=True)
class MarketChoice:
    """What a fleet runs under (:meth:`FleetSpec.market_choice`): ``availability`` one of
    :data:`MARKET_CHOICES` (each pool billed at the tier that serves it; ``prices`` None) or of
    :data:`STATIC_CHOICES` (every pool on-demand at static caps, billed at ``prices``; None: the
    availability's own, on-demand)."""

    availability: str
    prices: str | None = None

    @property
    def market(self) -> str | None:
        """The market kind the pools are in, None under static caps."""
        return self.availability if self.availability in MARKET_CHOICES else None

    @property
    def overrides(self) -> bool:
        """Whether it overrides the fleet file's own market per pool."""
        return self.availability != "market"


@dataclass(frozen=True)
class PoolTrace:
    """Nodes a pool offers over time: ``nodes[i]`` from ``times_s[i]`` (seconds from the start of
    the workloads) until the next time; the first time is 0, the last count holds to the end."""

    times_s: tuple[float, ...]
    nodes: tuple[int, ...]
    source: str

    def at(self, seconds: float) -> int:
        return self.nodes[max(0, bisect.bisect_right(self.times_s, seconds) - 1)]


def _pool_trace(path: Path, where: str, file: Path) -> PoolTrace:
    """Read a pool's CSV: levels (header ``time_s,nodes``; times from 0, increasing; whole nodes
    >= 0) or a preemption log (header ``time_s,event,nodes``, see :func:`_event_trace`)."""
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise _fail(path, where, f"trace file {file} is not UTF-8 text (byte {exc.start}); give a CSV with "
                                 f"columns time_s,nodes") from None
    except OSError as exc:
        raise _fail(path, where, f"trace file {file} cannot be read ({exc.strerror or exc}); give a CSV "
                                 f"with columns time_s,nodes") from None
    header = [c.strip() for c in lines[0].split(",")] if lines else []
    if header == ["time_s", "event", "nodes"]:
        return _event_trace(path, where, file, lines)
    if header != ["time_s", "nodes"]:
        raise _fail(path, where, f"{file}: line 1 must be the header 'time_s,nodes' (nodes from each time) "
                                 f"or 'time_s,event,nodes' (a preemption log)")
    times: list[float] = []
    nodes: list[int] = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.split(",")
        try:
            t, k = float(cols[0]), float(cols[1])
        except (ValueError, IndexError):
            raise _fail(path, where, f"{file}: line {n} {line!r} must be two numbers "
                                     f"'time_s,nodes'") from None
        if not (math.isfinite(t) and t >= 0) or (times and t <= times[-1]):
            raise _fail(path, where, f"{file}: line {n}: time_s {t:g} must be >= 0 and increasing")
        if not (math.isfinite(k) and k >= 0 and k.is_integer()):
            raise _fail(path, where, f"{file}: line {n}: nodes {cols[1].strip()!r} must be a whole "
                                     f"number >= 0")
        times.append(t)
        nodes.append(int(k))
    if not times or times[0] != 0:
        raise _fail(path, where, f"{file}: the first row must be at time_s 0")
    return PoolTrace(tuple(times), tuple(nodes), str(file))


TRACE_EVENTS = ("capacity", "preempt", "restore")


def _event_trace(path: Path, where: str, file: Path, lines: list[str]) -> PoolTrace:
    """A preemption log: rows ``time_s,event,nodes`` in time order (rows of one time apply in
    file order); ``capacity`` sets the pool's nodes (the first row must be one, at time_s 0),
    ``preempt`` takes ``nodes`` away, ``restore`` gives them back. A log that takes more nodes
    than the pool holds, an unknown event or a time out of order names its line."""
    level: int | None = None
    points: dict[float, int] = {}
    last = -math.inf
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != 3:
            raise _fail(path, where, f"{file}: line {n} {line!r} must be three fields 'time_s,event,nodes'")
        try:
            t, k = float(cols[0]), float(cols[2])
        except ValueError:
            raise _fail(path, where, f"{file}: line {n} {line!r}: time_s and nodes must be numbers") from None
        event = cols[1]
        if event not in TRACE_EVENTS:
            raise _fail(path, where, f"{file}: line {n}: unknown event {event!r}; valid: "
                                     f"{', '.join(TRACE_EVENTS)}")
        if not (math.isfinite(t) and t >= 0) or t < last:
            raise _fail(path, where, f"{file}: line {n}: time_s {cols[0]} must be >= 0 and in time order")
        if not (math.isfinite(k) and k >= 0 and k.is_integer()):
            raise _fail(path, where, f"{file}: line {n}: nodes {cols[2]!r} must be a whole number >= 0")
        if level is None:
            if event != "capacity" or t != 0:
                raise _fail(path, where, f"{file}: line {n}: the first row must be '0,capacity,N' (the "
                                         f"pool's nodes at the start)")
            level = 0
        if event == "capacity":
            level = int(k)
        elif event == "preempt":
            if k > level:
                raise _fail(path, where, f"{file}: line {n}: preempts {int(k)} node(s) at time_s {t:g} but "
                                         f"the pool holds {level}; a log that loses nodes it never had "
                                         f"is misread or incomplete")
            level -= int(k)
        else:
            level += int(k)
        last = t
        points[t] = level
    if level is None:
        raise _fail(path, where, f"{file}: no rows; give at least '0,capacity,N'")
    times = tuple(sorted(points))
    return PoolTrace(times, tuple(points[t] for t in times), str(file))


GAP_MODES = ("exclude", "zero")


@dataclass(frozen=True)
class WorkloadSpec:
    """One model's demand: a workload name (``servegen:...``, ``azure:...``, ``csv:PATH#NAME``)
    and its explicit scaling (``scale`` factor or ``mean_rate`` req/s; at most one). ``gaps``
    says how a request log's gaps (hours with no rows: a collector down) enter its mean rate, the
    one ``mean_rate`` scales from and the demand ``solve`` plans for: left out (``exclude``) or
    counted as zero demand (``zero``)."""

    model: str
    source: str
    scale: float | None = None
    mean_rate: float | None = None
    gaps: str = "exclude"

    def __post_init__(self) -> None:
        if self.gaps not in GAP_MODES:
            raise ValueError(f"WorkloadSpec {self.model!r}: field 'gaps' must be one of "
                             f"{', '.join(GAP_MODES)}, got {self.gaps!r}")


@dataclass(frozen=True)
class FleetSpec:
    """A parsed, validated fleet file. ``offers`` are every (region, config) the fleet may use
    with its prices; ``availability`` None means ample."""

    path: Path
    name: str
    runtime: str
    models: tuple[ModelSpec, ...]
    user_models: tuple[ModelSpec, ...]
    gpus: tuple[GpuType, ...]
    offers: tuple[Offer, ...]
    availability: Mapping[tuple[str, str], int] | None
    workloads: tuple[WorkloadSpec, ...]
    kubernetes: Mapping[str, Any]
    n_max: int = 6
    rho: float = 12.0
    pool_traces: tuple[tuple[tuple[str, str], PoolTrace], ...] = ()
    # model -> the live controller's floor of (prefill, decode) instances (``min_instances``)
    min_instances: Mapping[str, tuple[int, int]] | None = None
    # stages may use g of a node's G GPUs (vllm only): the library holds slices, plans buy whole
    # nodes and carry their packing
    slices: bool = False
    # every offered (region, config) -> its market (on-demand, spot or hedged)
    markets: Mapping[tuple[str, str], str] | None = None
    # hedged pools -> on-demand nodes beside the spot pool (pools left out: ample)
    ondemand_quota: Mapping[tuple[str, str], int] | None = None
    # (region, GPU type) a region's gpu_types asked for that its catalog offers do not sell
    unsold: tuple[tuple[str, str], ...] = ()
    # each running instance a re-plan removes costs R x its $/h (``removal_weight``; None: not given)
    removal_weight: float | None = None
    # how models are served (``pd``): the default mode and the models that differ from it
    pd: str = DEFAULT_PD
    model_pd: tuple[tuple[str, str], ...] = ()
    # ``request_shapes``: the Azure traces whose means are the models' request shapes, dealt in
    # turn; () takes each workload's own means
    request_traces: tuple[str, ...] = ()
    scarce_headroom: float = SCARCE_HEADROOM
    # the GPU types the regions' ``gpu_types`` lists name, in file order (first mention)
    listed_gpu_types: tuple[str, ...] = ()

    def market_of(self, cell: tuple[str, str]) -> str:
        return (self.markets or {}).get(cell, "on-demand")

    @property
    def market_summary(self) -> str:
        """The markets of the fleet's pools in words: one name, or 'mixed (...)'."""
        kinds = sorted({self.market_of((o.region, o.config)) for o in self.offers})
        return kinds[0] if len(kinds) == 1 else f"mixed ({', '.join(kinds)})"

    def market_choice(self, availability: str | None = None, prices: str | None = None, *,
                      prices_pick_market: bool = False) -> MarketChoice:
        """The one rule of which market this fleet's pools run in and which price list applies,
        for a requested ``availability`` and ``prices`` (None: not given); the simulator's
        configuration, the CLI and the live controller all ask it.

        - nothing: each pool in its file's market (``market``);
        - a market kind (``market``, ``spot``, ``hedged``): that, each pool billed at the tier
          that serves it; a price list with it is refused (:class:`MarketChoiceError`);
        - ``ample`` or ``scarce``: static caps, every pool on-demand, billed at ``prices``;
        - a price list alone is refused too (the file's market bills each pool at its tier),
          unless ``prices_pick_market`` (the live controller, which takes no availability): then
          ``spot`` puts every pool in the spot market and ``on-demand`` plans every pool
          on-demand at its static cap (``ample``).

        An availability or price list that names no kind is a :class:`FleetFileError`."""
        if availability is not None and availability not in MARKET_CHOICES + STATIC_CHOICES:
            raise FleetFileError(f"{self.path}: availability {_show(availability)} is not a kind; valid: "
                                 f"{', '.join(MARKET_CHOICES + STATIC_CHOICES)} (market: each pool in the "
                                 f"file's own market)")
        if prices is not None and prices not in PRICE_LISTS:
            raise FleetFileError(f"{self.path}: prices {_show(prices)} is not a price list; valid: "
                                 f"{', '.join(PRICE_LISTS)}")
        if availability is None and prices is not None and prices_pick_market:
            return MarketChoice("spot") if prices == "spot" else MarketChoice("ample", prices)
        asked = availability or "market"
        if asked in MARKET_CHOICES and prices is not None:
            raise MarketChoiceError.of(self.path, availability, prices, self.market_summary)
        return MarketChoice(asked, prices)

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    @property
    def regions(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(o.region for o in self.offers))

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(_CONFIG.fullmatch(o.config).group(2) for o in self.offers))  # type: ignore[union-attr]


def _fail(path: Path, where: str, msg: str) -> FleetFileError:
    return FleetFileError(f"{path}: {where}: {msg}")


def _show(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a message quotes what the file said, not all of it)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _unknown(keys: Any, allowed: set[str]) -> list[Any]:
    """The keys not in ``allowed``, sorted (keys of any type: YAML allows numbers, null, dates)."""
    return sorted(set(keys) - allowed, key=lambda k: (not isinstance(k, str), str(k)))


def _number(path: Path, where: str, field_: str, value: Any, *, integer: bool = False,
            minimum: float = 0.0, strict: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, int | float)
    try:
        ok = ok and math.isfinite(value)  # an integer too large for a float overflows
    except OverflowError:
        ok = False
    if ok and integer:
        ok = float(value).is_integer()
    if not ok or value < minimum or (strict and value <= minimum):
        kind = "a whole number" if integer else "a number"
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise _fail(path, where, f"field '{field_}' must be {kind} {bound}, got {_show(value)}")
    return float(value)


def _mapping(path: Path, where: str, value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, where, f"must be a mapping ({what}), got {type(value).__name__}")
    return value


def _list(path: Path, where: str, value: Any, what: str) -> list[Any]:
    """An optional list: absent or null is empty; anything else but a list is an error."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(path, where, f"must be a list ({what}), got {type(value).__name__}")
    return value


def _build(cls: type, entry: dict[str, Any], path: Path, where: str) -> Any:
    bad_keys = [k for k in entry if not isinstance(k, str)]
    if bad_keys:
        raise _fail(path, where, f"field names must be text, got {_show(bad_keys[0])} "
                                 f"({type(bad_keys[0]).__name__})")
    kwargs = dict(entry)
    if cls is ModelSpec:
        slo = kwargs.pop("slo", None)
        if not isinstance(slo, dict) or set(slo) != {"ttft_ms", "tpot_ms"}:
            raise _fail(path, where, "field 'slo' must be a mapping with ttft_ms and tpot_ms (milliseconds)")
        aliases = kwargs.get("aliases", [])
        if isinstance(aliases, str):  # `aliases: acme` is one alias, not four one-letter ones
            aliases = [aliases]
        if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
            raise _fail(path, where, f"field 'aliases' must be a name or a list of names, "
                                     f"got {_show(aliases)}")
        kwargs["aliases"] = tuple(aliases)
    allowed = {f.name for f in fields(cls)}
    required = sorted(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
                      and f.name != "slo")
    missing = [n for n in required if n not in kwargs]
    if missing:
        raise _fail(path, where, f"missing field(s) {missing}")
    extra = _unknown(kwargs, allowed)
    if extra:
        raise _fail(path, where, f"unknown field(s) {extra}; valid: {sorted(allowed)}")
    try:
        if cls is ModelSpec:
            kwargs["slo"] = Slo(**slo)
        return cls(**kwargs)
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise _fail(path, where, str(exc)) from exc


def _models(path: Path, raw: Any) -> tuple[list[ModelSpec], list[ModelSpec]]:
    if not isinstance(raw, list) or not raw:
        raise _fail(path, "models", "must be a non-empty list of catalog names or model definitions")
    out: list[ModelSpec] = []
    user: list[ModelSpec] = []
    for i, entry in enumerate(raw):
        where = f"models[{i}]"
        if isinstance(entry, str):
            try:
                out.append(get_model(entry))
            except UnknownNameError as exc:
                raise _fail(path, where, f"{exc.args[0]}; or give a full definition with an slo") from None
        elif isinstance(entry, dict):
            where = f"models[{i}] ({_show(entry.get('name', '?'))})"
            model = _build(ModelSpec, entry, path, where)
            out.append(model)
            user.append(model)
        else:
            raise _fail(path, where, f"must be a model name or a mapping, got {_show(entry)}")
    names = [m.name for m in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _fail(path, "models", f"lists {dup[0]!r} twice")
    seen: dict[str, int] = {}  # a name or alias (any case) -> the entry it belongs to
    for i, m in enumerate(out):
        for n in (m.name, *m.aliases):
            first = seen.setdefault(n.lower(), i)
            if first != i:
                raise _fail(path, f"models[{i}] ({m.name!r})", f"the name {n!r} is already used by "
                                                               f"models[{first}] ({out[first].name!r}); "
                                                               f"give each model its own names")
    return out, user


def _market(path: Path, where: str, value: Any) -> str:
    if value not in MARKETS:
        raise _fail(path, where, f"field 'market' must be one of {', '.join(MARKETS)}, got {_show(value)}")
    return str(value)


def _region_entry(path: Path, i: int, entry: Any, markets: Mapping[str, str]
                  ) -> tuple[str, str, dict[str, Any]]:
    """(name, where, the entry) of ``regions[i]``: a mapping of known fields whose name looks like
    'cloud:region' and was not given before (``markets`` holds the regions read so far)."""
    where = f"regions[{i}]"
    region = _mapping(path, where, entry, "name, catalog/gpu_types or offers")
    name = region.get("name")
    if not isinstance(name, str) or ":" not in name:
        raise _fail(path, where, f"field 'name' must look like 'cloud:region' (e.g. aws:us-east-2), "
                                 f"got {_show(name)}")
    where = f"regions[{i}] ({_show(name)})"
    extra = _unknown(region, {"name", "catalog", "gpu_types", "offers", "market"})
    if extra:
        raise _fail(path, where, f"unknown field(s) {extra}; valid: catalog, gpu_types, market, name, "
                                 f"offers")
    if name in markets:
        raise _fail(path, where, f"region {name!r} is listed twice; give each region once")
    return name, where, region


def _check_region_flags(path: Path, where: str, region: Mapping[str, Any]) -> None:
    """'catalog' is true or false, and 'gpu_types' (which picks among the catalog's offers) comes
    with 'catalog: true'."""
    if not isinstance(region.get("catalog", False), bool):
        raise _fail(path, where, f"field 'catalog' must be true or false, got {_show(region['catalog'])}")
    if "gpu_types" in region and not region.get("catalog"):
        raise _fail(path, where, "field 'gpu_types' picks the catalog's offers; it needs 'catalog: true'")


def _catalog_offers(path: Path, where: str, name: str, wanted: Any, catalog: Catalog
                    ) -> tuple[list[Offer], list[tuple[str, str]]]:
    """(the catalog's offers in region ``name`` of the GPU types ``wanted`` (None: all it sells),
    (region, GPU type) asked for but not sold there). A region the catalog lacks, an unknown GPU
    type or nothing sold at all is an error; a type sold elsewhere but not here is reported."""
    if name not in catalog.regions:
        raise _fail(path, where, f"field 'name': the catalog has no region {name!r}; valid: "
                                 f"{', '.join(catalog.regions)} (or give 'offers')")
    if wanted is not None and not (isinstance(wanted, list) and all(isinstance(g, str) for g in wanted)):
        raise _fail(path, where, f"field 'gpu_types' must be a list of GPU names, got {_show(wanted)}")
    for g in wanted or ():
        if g not in catalog.gpus:
            raise _fail(path, where, f"field 'gpu_types': unknown GPU type {g!r}; valid: "
                                     f"{', '.join(catalog.gpus)}")
    sold = [o for c, o in sorted(catalog.offers_in(name).items())
            if wanted is None or _CONFIG.fullmatch(c).group(2) in wanted]  # type: ignore[union-attr]
    if not sold:
        raise _fail(path, where, f"the catalog sells none of {wanted} in {name}")
    have = {_CONFIG.fullmatch(o.config).group(2) for o in sold}  # type: ignore[union-attr]
    return sold, [(name, g) for g in wanted or () if g not in have]


def _own_offer(path: Path, w: str, name: str, entry: Any, gpus: Mapping[str, GpuType]) -> Offer:
    """One of a region's own offers (``w`` names it): a '<count>x<GPU>' config of a known GPU type
    and its on-demand and optional spot price ($/node-hour)."""
    o = _mapping(path, w, entry, "config, on_demand, spot")
    extra = _unknown(o, {"config", "on_demand", "spot"})
    if extra:
        raise _fail(path, w, f"unknown field(s) {extra}; valid: config, on_demand, spot")
    cfg = o.get("config")
    m = _CONFIG.fullmatch(cfg) if isinstance(cfg, str) else None
    if not m or m.group(1) not in {str(n) for n in NODE_GPU_COUNTS}:
        raise _fail(path, w, f"field 'config' must be '<count>x<GPU>' with count in "
                             f"{NODE_GPU_COUNTS}, "
                             f"got {_show(cfg)}")
    if m.group(2) not in gpus:
        raise _fail(path, w, f"field 'config': unknown GPU type {_show(m.group(2))}; add it under "
                             f"'gpus' or use one of {', '.join(gpus)}")
    if "on_demand" not in o:
        raise _fail(path, w, "missing field 'on_demand' ($/node-hour)")
    od = _number(path, w, "on_demand", o["on_demand"], strict=True)
    spot = None if o.get("spot") is None else _number(path, w, "spot", o["spot"], strict=True)
    if spot is not None and spot > od:
        # a spot price above on-demand makes every spot plan look dear and hedging
        # pointless; it is nearly always the two columns swapped or a typo
        raise _fail(path, w, f"field 'spot' ({spot:g} $/node-hour) is above 'on_demand' ({od:g}); "
                             f"spot capacity is sold below on-demand: are the two swapped?")
    return Offer(name, str(cfg), od, spot, "fleet-file")


def _offers(path: Path, raw: Any, gpus: Mapping[str, GpuType]
            ) -> tuple[list[Offer], dict[str, str], list[tuple[str, str]]]:
    """(offers, each region's market, (region, GPU type) asked for but not sold there)."""
    if not isinstance(raw, list) or not raw:
        raise _fail(path, "regions", "must be a non-empty list of regions (name + catalog: true or offers)")
    catalog = load_catalog()
    out: list[Offer] = []
    markets: dict[str, str] = {}
    unsold: list[tuple[str, str]] = []
    for i, entry in enumerate(raw):
        name, where, region = _region_entry(path, i, entry, markets)
        markets[name] = _market(path, where, region.get("market", "on-demand"))
        _check_region_flags(path, where, region)
        own = _list(path, f"{where} field 'offers'", region.get("offers"), "config, on_demand, spot")
        if region.get("catalog"):
            sold, missing = _catalog_offers(path, where, name, region.get("gpu_types"), catalog)
            unsold += missing
            out.extend(sold)
        out.extend(_own_offer(path, f"{where} offers[{j}]", name, o, gpus) for j, o in enumerate(own))
        if not region.get("catalog") and not own:
            raise _fail(path, where, "needs 'catalog: true' or a list of 'offers'")
    cells = [(o.region, o.config) for o in out]
    dup = sorted({c for c in cells if cells.count(c) > 1})
    if dup:
        raise _fail(path, "regions", f"offers {dup[0][0]}/{dup[0][1]} twice")
    return out, markets, unsold


def _cell(path: Path, where: str, key: Any, cells: set[tuple[str, str]]) -> tuple[str, str]:
    region, sep, cfg = str(key).rpartition("/")
    if not sep or (region, cfg) not in cells:
        valid = ", ".join(f"{r}/{c}" for r, c in sorted(cells))
        raise _fail(path, where, f"{_show(key)} is not an offered region/config; valid: {valid}")
    return region, cfg


class DuplicateKeyError(ValueError):
    """A mapping of the fleet file gives one key twice."""


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error: YAML keeps the
    last value and drops the first without a word, and either may be the one the user meant.
    Keys merged in with ``<<`` may be overridden, as YAML intends."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class says so
                    break
                if first is None:
                    seen[key] = line
                else:
                    raise DuplicateKeyError(f"line {line}: key {_show(key)} is given twice in one mapping "
                                            f"(first at line {first}); YAML would keep only the last value "
                                            f"— remove or merge one of them")
        return super().construct_mapping(node, deep=deep)


BUNDLED_DIR = Path(__file__).resolve().parent / "data" / "fleets"


def bundled_fleets() -> dict[str, Path]:
    """The fleet files shipped with the package, by name: the bundled scenarios
    (:data:`atoll.solvers.scenarios.SCENARIOS` reads them)."""
    return {p.stem: p for p in sorted(BUNDLED_DIR.glob("*.yaml"))}


def resolve_fleet(path_or_name: Path | str) -> Path:
    """A fleet file path, or the name of a bundled one (``core``, ``extended``, ``fleet20``)."""
    path = Path(path_or_name)
    if not path.exists() and str(path_or_name) in bundled_fleets():
        return bundled_fleets()[str(path_or_name)]
    return path


def _read_document(path: Path) -> dict[Any, Any]:
    """The fleet file's top-level mapping, every key known. A missing, unreadable, non-UTF-8 or
    non-YAML file, and a key given twice, is a :class:`FleetFileError` naming the file."""
    if path.is_dir():
        raise FleetFileError(f"{path}: is a folder; pass the path of a fleet YAML file")
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise FleetFileError(f"{path}: file not found; pass the path of a fleet YAML file or a bundled "
                             f"fleet's name ({', '.join(bundled_fleets())})") from None
    except UnicodeDecodeError as exc:
        raise FleetFileError(f"{path}: not a text file (byte {exc.start} is not UTF-8); pass a fleet YAML "
                             f"file") from None
    except OSError as exc:
        raise FleetFileError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as exc:
        raise FleetFileError(f"{path}: {exc}") from None
    except (yaml.YAMLError, RecursionError, ValueError, ArithmeticError) as exc:
        # PyYAML raises ValueError for timestamps such as 2024-13-01, RecursionError when nested too deep
        raise FleetFileError(f"{path}: cannot be read as YAML ({exc or type(exc).__name__})") from exc
    doc = _mapping(path, "top level", doc, f"keys {', '.join(TOP_KEYS)}")
    extra = _unknown(doc, set(TOP_KEYS))
    if extra:
        raise _fail(path, "top level", f"unknown key {_show(extra[0])}; valid keys: {', '.join(TOP_KEYS)}")
    return doc


def _identity(path: Path, doc: Mapping[Any, Any]) -> tuple[str, str, bool]:
    """(name, runtime, slices): a DNS-style name, a known runtime, and slices only on vllm."""
    name = doc.get("name")
    if not isinstance(name, str) or len(name) > 40 or not _NAME.fullmatch(name):
        raise _fail(path, "name", f"must be lowercase letters, digits and '-' (<= 40), got {_show(name)}")
    runtime = doc.get("runtime", DEPLOY_RUNTIME)
    if runtime not in RUNTIMES:
        raise _fail(path, "runtime", f"must be one of {', '.join(RUNTIMES)}, got {_show(runtime)}")
    # a Kubernetes pod asks for GPUs, it does not own a node: vllm fleets pack pods by default
    slices = doc.get("slices", runtime == "vllm")
    if not isinstance(slices, bool):
        raise _fail(path, "slices", f"must be true or false, got {_show(slices)}")
    if slices and runtime != "vllm":
        # slices are vLLM pods on g of a node's GPUs; the research runtime keeps Coral's whole nodes
        raise _fail(path, "slices", f"field 'slices: true' needs 'runtime: vllm', got runtime {runtime!r}; "
                                    f"set runtime: vllm or drop slices")
    return name, runtime, slices


def _gpu_types(path: Path, raw: Any) -> tuple[dict[str, GpuType], list[GpuType]]:
    """(every GPU type the fleet may name: the catalog's and its own, the fleet's own in file
    order). An own type's name is given once; it may replace a catalog type of that name."""
    gpus = dict(load_catalog().gpus)
    user_gpus: list[GpuType] = []
    for i, entry in enumerate(_list(path, "gpus", raw, "GPU types the catalog lacks")):
        where = f"gpus[{i}]"
        g = _build(GpuType, _mapping(path, where, entry, "fields of a GPU type"), path,
                   f"{where} ({_show(entry.get('name', '?'))})")
        first = next((j for j, u in enumerate(user_gpus) if u.name.lower() == g.name.lower()), None)
        if first is not None:
            raise _fail(path, f"{where} ({g.name!r})", f"the name {g.name!r} is already used by "
                                                       f"gpus[{first}]; give each GPU type its own name")
        user_gpus.append(g)
        gpus[g.name] = g
    return gpus, user_gpus


@dataclass
class _Availability:
    """The availability section read: static caps (None: ample), each pool's market after the
    section's overrides, hedged pools' on-demand quotas and the pools on a trace."""

    caps: dict[tuple[str, str], int] | None
    markets: dict[tuple[str, str], str]
    quota: dict[tuple[str, str], int]
    traces: list[tuple[tuple[str, str], PoolTrace]]


def _availability(path: Path, raw: Any, cells: set[tuple[str, str]],
                  markets: Mapping[tuple[str, str], str]) -> _Availability:
    """``availability``: markets first (a quota or a trace is judged by its pool's market), then
    static caps, on-demand quotas and traces, each naming an offered pool."""
    out = _Availability(None, dict(markets), {}, [])
    if raw is None:
        return out
    av = _mapping(path, "availability", raw, "static, markets, ondemand_quota, traces")
    extra = _unknown(av, set(AVAILABILITY_KEYS))
    if extra:
        raise _fail(path, "availability", f"unknown key {_show(extra[0])}; valid: "
                                          f"{', '.join(AVAILABILITY_KEYS)}")
    for key, value in _mapping(path, "availability.markets", av.get("markets") or {},
                               "region/config: market").items():
        where = f"availability.markets[{_show(key)}]"
        out.markets[_cell(path, where, key, cells)] = _market(path, where, value)
    out.caps = {}
    static = _mapping(path, "availability.static", av.get("static") or {}, "region/config: nodes")
    for key, n in static.items():
        where = f"availability.static[{_show(key)}]"
        out.caps[_cell(path, where, key, cells)] = int(_number(path, where, "nodes", n, integer=True))
    for key, n in _mapping(path, "availability.ondemand_quota", av.get("ondemand_quota") or {},
                           "region/config: nodes").items():
        where = f"availability.ondemand_quota[{_show(key)}]"
        cell = _cell(path, where, key, cells)
        if out.markets[cell] != "hedged":
            raise _fail(path, where, f"an on-demand quota sits beside a spot pool: pool {key} is in the "
                                     f"{out.markets[cell]} market; set its market to hedged or drop the "
                                     f"quota")
        out.quota[cell] = int(_number(path, where, "nodes", n, integer=True))
    traces = _mapping(path, "availability.traces", av.get("traces") or {}, "region/config: CSV file")
    for key, file in traces.items():
        where = f"availability.traces[{_show(key)}]"
        cell = _cell(path, where, key, cells)
        _check_trace(path, where, key, file, cell, out)
        out.traces.append((cell, _pool_trace(path, where, path.parent / file)))
    return out


def _check_trace(path: Path, where: str, key: Any, file: Any, cell: tuple[str, str],
                 read: _Availability) -> None:
    """A trace moves a spot pool without a static count, and names a CSV file."""
    if read.caps is not None and cell in read.caps:
        raise _fail(path, where, "this pool also has a static count; give one or the other")
    if read.markets[cell] == "on-demand":
        raise _fail(path, where, f"a trace moves a spot pool (a drop preempts its spot instances) "
                                 f"and pool {key} is in the on-demand market; set 'market: spot' "
                                 f"or 'market: hedged' on region {cell[0]} (or under "
                                 f"availability.markets), or give the pool a static count")
    if not isinstance(file, str) or not file.strip() or "\x00" in file:
        raise _fail(path, where, f"must be the path of a CSV file (time_s,nodes or "
                                 f"time_s,event,nodes), got {_show(file)}")


def _check_spot_prices(path: Path, offers: list[Offer], markets: Mapping[tuple[str, str], str]) -> None:
    """A pool in a spot or hedged market bills its spot tier: its offer needs a spot price."""
    no_spot = sorted(f"{o.region}/{o.config}" for o in offers
                     if markets[(o.region, o.config)] != "on-demand" and o.spot_per_hour is None)
    if no_spot:
        raise _fail(path, "regions", f"pool(s) {', '.join(no_spot[:4])} are in a spot or hedged market but "
                                     f"have no spot price; give the offer a 'spot' price or set the market "
                                     f"to on-demand")


def _workload(path: Path, where: str, model: str, entry: Any) -> WorkloadSpec:
    """One model's workload entry: a source (a csv: path made absolute, relative to the fleet
    file), at most one of scale and mean_rate, and how a log's gaps count."""
    entry = _mapping(path, where, entry, "source and optional scale or mean_rate")
    extra = _unknown(entry, {"source", "scale", "mean_rate", "gaps"})
    if extra:
        raise _fail(path, where, f"unknown field(s) {extra}; valid: gaps, mean_rate, scale, source")
    gaps = entry.get("gaps", "exclude")
    if gaps not in GAP_MODES:
        raise _fail(path, where, f"field 'gaps' must be 'exclude' (hours without rows left out of the "
                                 f"mean rate) or 'zero' (counted as no demand), got {_show(gaps)}")
    source = entry.get("source")
    if not isinstance(source, str) or ":" not in source or "\x00" in source:
        raise _fail(path, where, f"field 'source' must be a workload such as 'csv:requests.csv#model', "
                                 f"'servegen:m-large' or 'azure:code', got {_show(source)}")
    if source.startswith("csv:"):
        file, sep, sub = source[4:].partition("#")
        source = f"csv:{(path.parent / file).resolve()}{sep}{sub}"
    if "scale" in entry and "mean_rate" in entry:
        raise _fail(path, where, "give at most one of 'scale' and 'mean_rate'")
    scale = None if "scale" not in entry else _number(path, where, "scale", entry["scale"], strict=True)
    rate = None if "mean_rate" not in entry else _number(path, where, "mean_rate", entry["mean_rate"],
                                                         strict=True)
    return WorkloadSpec(model, source, scale, rate, gaps)


def _workloads(path: Path, raw: Any, names: list[str], by_name: Mapping[str, str]) -> list[WorkloadSpec]:
    """``workloads``: one per model, keyed by its name or an alias (any case)."""
    workloads = []
    raw_w = _mapping(path, "workloads", raw, "model name: {source, scale | mean_rate}")
    keys: dict[str, Any] = {}  # model -> the workloads key naming it
    for key, entry in raw_w.items():
        where = f"workloads[{_show(key)}]"
        model = by_name.get(str(key).lower())
        if model is None:
            raise _fail(path, where, f"names no model of this fleet; models: {', '.join(names)}")
        if model in keys:
            raise _fail(path, where, f"model {model!r} already has a workload (under {_show(keys[model])}); "
                                     f"give one per model")
        keys[model] = key
        workloads.append(_workload(path, where, model, entry))
    missing = [n for n in names if n not in {w.model for w in workloads}]
    if missing:
        raise _fail(path, "workloads", f"no workload for model {missing[0]!r}; give one per model")
    return workloads


def load_fleet(path: Path | str) -> FleetSpec:
    """Parse and validate a fleet file (see the module docstring); a bare bundled name
    (``core``, ``extended``, ``fleet20``) loads the shipped file. Sections are read in a fixed order, so the
    first error a broken file reports does not depend on how its keys are ordered."""
    path = resolve_fleet(path)
    doc = _read_document(path)
    name, runtime, slices = _identity(path, doc)
    gpus, user_gpus = _gpu_types(path, doc.get("gpus"))
    models, user_models = _models(path, doc.get("models"))
    offers, region_markets, unsold = _offers(path, doc.get("regions"), gpus)
    cells = {(o.region, o.config) for o in offers}
    av = _availability(path, doc.get("availability"), cells,
                       {(o.region, o.config): region_markets[o.region] for o in offers})
    _check_spot_prices(path, offers, av.markets)
    names = [m.name for m in models]
    by_name = {n.lower(): m.name for m in models for n in (m.name, *m.aliases)}  # unique: see _models
    workloads = _workloads(path, doc.get("workloads"), names, by_name)
    kube = _mapping(path, "kubernetes", doc.get("kubernetes") or {}, "K8sOptions fields")
    n_max = int(_number(path, "n_max", "n_max", doc.get("n_max", 6), integer=True, minimum=1))
    rho = _number(path, "rho", "rho", doc.get("rho", 12.0), strict=True)
    floors = _min_instances(path, doc.get("min_instances", 1), names, by_name)
    removal = doc.get("removal_weight")
    removal_weight = None if removal is None else _number(path, "removal_weight", "removal_weight", removal)
    pd, model_pd = _pd_modes(path, doc.get("pd", DEFAULT_PD), names, by_name)
    traces = _request_shapes(path, doc.get("request_shapes", WORKLOAD_SHAPES))
    headroom = _number(path, "scarce_headroom", "scarce_headroom",
                       doc.get("scarce_headroom", SCARCE_HEADROOM))
    # regions and their gpu_types are checked by _offers above
    listed = tuple(dict.fromkeys(g for region in doc["regions"] for g in region.get("gpu_types") or ()))
    return FleetSpec(path, name, runtime, tuple(models), tuple(user_models), tuple(user_gpus), tuple(offers),
                     av.caps, tuple(workloads), dict(kube), n_max, rho, tuple(av.traces), floors,
                     slices, av.markets, av.quota, tuple(unsold), removal_weight, pd, model_pd,
                     traces, headroom, listed)


def _request_shapes(path: Path, raw: Any) -> tuple[str, ...]:
    """``request_shapes``: ``workloads`` (each workload's own means: ()) or a non-empty list of
    Azure LLM 2023 trace names, dealt to the models in turn."""
    if raw == WORKLOAD_SHAPES:
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if not (isinstance(raw, list) and raw and all(isinstance(t, str) and t in AZURE_TRACES for t in raw)):
        raise _fail(path, "request_shapes", f"must be '{WORKLOAD_SHAPES}' (each workload's own mean request "
                                            f"lengths) or a list of Azure LLM 2023 traces from "
                                            f"{', '.join(AZURE_TRACES)}, dealt to the models in turn "
                                            f"(e.g. [code, conv]), got {_show(raw)}")
    return tuple(raw)


def _pd_modes(path: Path, raw: Any, names: list[str], by_name: Mapping[str, str]
              ) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``pd``: one serving mode for every model, or a mapping of model names (and ``default``) to
    modes; (the default mode, the models whose mode differs from it)."""

    def mode(where: str, value: Any) -> str:
        if value not in PD_MODES:
            raise _fail(path, where, f"must be one of {', '.join(PD_MODES)} (auto: the ILP chooses per model "
                                     f"between a replica per phase and one serving both), got {_show(value)}")
        return str(value)

    default, out = _per_model(path, "pd", raw, DEFAULT_PD, mode, names, by_name)
    return default, tuple((n, out[n]) for n in names if out[n] != default)


def _per_model(path: Path, field_: str, raw: Any, fallback: Any, parse: Callable[[str, Any], _T],
               names: list[str], by_name: Mapping[str, str]) -> tuple[_T, dict[str, _T]]:
    """A setting given once for every model, or as a mapping of model names (any case, aliases
    too) and ``default`` (else ``fallback``) to values, each read by ``parse(where, value)``:
    (the default, the value of every model)."""
    if not isinstance(raw, dict):
        value = parse(field_, raw)
        return value, dict.fromkeys(names, value)
    default = parse(f"{field_}[default]", raw.get("default", fallback))
    out = dict.fromkeys(names, default)
    for key, value in raw.items():
        if key == "default":
            continue
        model = by_name.get(str(key).lower())
        if model is None:
            raise _fail(path, f"{field_}[{_show(key)}]",
                        f"names no model of this fleet; models: {', '.join(names)} (or 'default')")
        out[model] = parse(f"{field_}[{_show(key)}]", value)
    return default, out


def _min_instances(path: Path, raw: Any, names: list[str], by_name: Mapping[str, str]
                   ) -> dict[str, tuple[int, int]]:
    """``min_instances``: one count for every model and phase, or a mapping of model names (and
    ``default``) to a count or ``{prefill: N, decode: N}``; the default default is 1, since a
    model planned to zero has no server left to report that its traffic came back."""

    def count(where: str, value: Any) -> tuple[int, int]:
        if isinstance(value, dict):
            extra = _unknown(value, set(PHASE_NAMES))
            if extra:
                raise _fail(path, where, f"unknown phase {_show(extra[0])}; valid: prefill, decode")
            return (int(_number(path, where, "prefill", value.get("prefill", 1), integer=True)),
                    int(_number(path, where, "decode", value.get("decode", 1), integer=True)))
        n = int(_number(path, where, "min_instances", value, integer=True))
        return n, n

    return _per_model(path, "min_instances", raw, 1, count, names, by_name)[1]
