"""Domain types shared by every layer (frozen dataclasses, validated on construction).

They live in ``solvers/`` because it is the bottom layer: everything above imports them from
here, nothing here imports from above.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass, field

from atoll.solvers.validation import check_integer, check_number

NODE_GPU_COUNTS: tuple[int, ...] = (1, 2, 4, 8)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
# A pool: (region, node config), the unit availability, prices and markets are given for (the
# region may carry a price tier, atoll.solvers.tiers).
Pool = tuple[str, str]


class Phase(enum.StrEnum):
    """Serving phase; with disaggregated serving each phase is its own service.

    ``COLOCATED`` is not a phase of a request but a way to serve both: one replica runs a model's
    prefill and decode together (chunked prefill mixes prompt chunks into decode batches, vLLM's
    default). Its templates cover the model's two demand rows at once (:attr:`Template.covers`);
    demand is only ever given for :data:`PHASES`.
    """

    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"


# the phases that carry demand (each a service with its own demand row and SLO budget)
PHASES: tuple[Phase, Phase] = (Phase.PREFILL, Phase.DECODE)
# how a model is served: both phases apart, together on one replica, or whichever is cheaper
PD_MODES: tuple[str, ...] = ("auto", "aggregated", "disaggregated")
# the ILP chooses per model: co-located columns compete with a replica per phase (their capacity is
# the separate-pass upper bound, atoll.solvers.perf.mixed_step_seconds, so a co-located plan is
# chosen only where it wins without the shared weight pass no bundled data measures)
DEFAULT_PD = "auto"


def pd_phases(pd: str) -> tuple[Phase, ...]:
    """The template phases a library builds for serving mode ``pd`` (see :data:`PD_MODES`)."""
    if pd == "disaggregated":
        return PHASES
    if pd == "aggregated":
        return (Phase.COLOCATED,)
    if pd == "auto":
        return (*PHASES, Phase.COLOCATED)
    raise ValueError(f"pd mode {pd!r} is not one of {', '.join(PD_MODES)} (auto lets the ILP choose per "
                     f"model between a replica per phase and one replica serving both)")


@dataclass(frozen=True)
class GpuType:
    """One GPU card.

    memory_gb: HBM/GDDR per GPU (GB, 1e9 bytes); hbm_bandwidth_gbs: memory bandwidth per GPU
    (GB/s); bf16_tflops: dense 16-bit tensor throughput per GPU (TFLOPS; fp16 for cards without
    bf16); link_gbs: intra-node GPU-to-GPU bandwidth per direction (GB/s).
    """

    name: str
    memory_gb: float
    hbm_bandwidth_gbs: float
    bf16_tflops: float
    link_gbs: float
    family: str = ""

    def __post_init__(self) -> None:
        owner = f"GpuType {self.name!r}"
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"{owner}: field 'name' must be letters, digits, '.', '_' or '-'")
        for f in ("memory_gb", "hbm_bandwidth_gbs", "bf16_tflops", "link_gbs"):
            check_number(owner, f, getattr(self, f))


@dataclass(frozen=True)
class NodeConfig:
    """A node: ``count`` GPUs of one type, written like "2xH100"; or a *slice* of a node:
    ``count`` of the ``node_gpus`` GPUs of one node, written like "2/8xH100".

    A slice performs as a ``count``-GPU node of the same type (same cards, same intra-node
    link), so the performance model reads ``count`` and ``gpu`` only; what differs is what is
    bought: a slice is ``count / node_gpus`` of a node, and several slices share one node.
    ``node_gpus`` = 0 (or equal to ``count``) is a whole node.
    """

    gpu: GpuType
    count: int
    node_gpus: int = 0

    def __post_init__(self) -> None:
        check_integer(f"NodeConfig {self.gpu.name}", "count", self.count)
        if self.count not in NODE_GPU_COUNTS:
            raise ValueError(
                f"NodeConfig {self.gpu.name}: field 'count' must be one of {NODE_GPU_COUNTS}, "
                f"got {self.count}"
            )
        check_integer(f"NodeConfig {self.gpu.name}", "node_gpus", self.node_gpus, minimum=0)
        if self.node_gpus == self.count:
            object.__setattr__(self, "node_gpus", 0)
        elif self.node_gpus and (self.node_gpus not in NODE_GPU_COUNTS or self.node_gpus < self.count):
            # powers of two only: then first-fit decreasing packs any slices whose GPUs sum to at
            # most k nodes' into k nodes, which makes the ILP's node count exact (solvers/packing)
            raise ValueError(
                f"NodeConfig {self.gpu.name}: field 'node_gpus' must be one of {NODE_GPU_COUNTS} and "
                f">= count ({self.count}), got {self.node_gpus}"
            )

    @property
    def name(self) -> str:
        if self.node_gpus:
            return f"{self.count}/{self.node_gpus}x{self.gpu.name}"
        return f"{self.count}x{self.gpu.name}"

    @property
    def node(self) -> NodeConfig:
        """The node this config is bought as (itself for a whole node)."""
        return NodeConfig(self.gpu, self.node_gpus) if self.node_gpus else self

    @property
    def memory_gb(self) -> float:
        return self.gpu.memory_gb * self.count


_CONFIG_NAME = re.compile(r"(\d+)(?:/(\d+))?x(.+)")


@functools.lru_cache(maxsize=4096)
def parse_config_name(name: str) -> tuple[int, int, str]:
    """"2/8xH100" -> (2, 8, "H100"); "8xH100" -> (8, 8, "H100"): the GPUs used, the GPUs of the
    node bought, and the GPU type. Raises ValueError for other text."""
    m = _CONFIG_NAME.fullmatch(name)
    if m is None:
        raise ValueError(f"node config {name!r} must look like '<count>x<GPU>' or "
                         f"'<count>/<node GPUs>x<GPU>' (a slice), e.g. '4xL40S' or '2/8xH100'")
    g = int(m.group(1))
    return g, int(m.group(2) or g), m.group(3)


def node_config_of(name: str) -> str:
    """The node config a config name is bought as: "2/8xH100" -> "8xH100", "4xL4" -> "4xL4"."""
    g, n, gpu = parse_config_name(name)
    return name if g == n else f"{n}x{gpu}"


def gpus_of(name: str) -> int:
    """GPUs one stage on this config uses (its tensor-parallel size under vLLM): "2/8xH100" -> 2."""
    return parse_config_name(name)[0]


def node_share(name: str) -> float:
    """The fraction of a node one stage on this config uses: "2/8xH100" -> 0.25, "4xL4" -> 1."""
    g, n, _ = parse_config_name(name)
    return 1.0 if g == n else g / n


@dataclass(frozen=True)
class Offer:
    """A node config sold in a region, with on-demand and spot prices ($/node-hour)."""

    region: str
    config: str
    on_demand_per_hour: float
    spot_per_hour: float | None
    instance: str
    spot_estimated: bool = False

    def __post_init__(self) -> None:
        owner = f"Offer {self.region}/{self.config}"
        check_number(owner, "on_demand_per_hour", self.on_demand_per_hour)
        if self.spot_per_hour is not None:
            check_number(owner, "spot_per_hour", self.spot_per_hour)

    def price(self, *, spot: bool = False) -> float:
        if spot and self.spot_per_hour is not None:
            return self.spot_per_hour
        return self.on_demand_per_hour


@dataclass(frozen=True)
class Slo:
    """Latency budgets: prefill time-to-first-token and decode time-per-output-token (ms)."""

    ttft_ms: float
    tpot_ms: float

    def __post_init__(self) -> None:
        check_number("Slo", "ttft_ms", self.ttft_ms)
        check_number("Slo", "tpot_ms", self.tpot_ms)

    def budget_ms(self, phase: Phase) -> float:
        """A step's budget: TTFT for prefill; TPOT for decode and for a co-located replica, whose
        every step carries decode tokens (its TTFT is a constraint on the chunk size instead)."""
        return self.ttft_ms if phase is Phase.PREFILL else self.tpot_ms


# serving: the six evaluation models; calibration: the public profiles' models; variant: a
# serving model's architecture under another name (a fine-tune), for fleets of many models
MODEL_ROLES: tuple[str, ...] = ("serving", "calibration", "variant")


@dataclass(frozen=True)
class ModelSpec:
    """An LLM's public architecture facts and its SLO.

    params_b / active_params_b: total and per-token active parameters (billions); for MoE models
    memory holds every expert while compute and weight traffic follow the active parameters.
    bytes_per_param: average stored bytes per weight (2 for bf16; ~0.5-0.6 for MXFP4 experts).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    params_b: float
    active_params_b: float
    bytes_per_param: float
    slo: Slo
    experts: int = 1
    active_experts: int = 1
    vocab: int = 32000
    precision: str = "bf16"
    role: str = "serving"
    aliases: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        owner = f"ModelSpec {self.name!r}"
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"{owner}: field 'name' must be a non-empty string")
        for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "experts", "active_experts",
                  "vocab"):
            check_integer(owner, f, getattr(self, f))
        for f in ("params_b", "active_params_b", "bytes_per_param"):
            check_number(owner, f, getattr(self, f))
        if self.active_params_b > self.params_b:
            raise ValueError(
                f"{owner}: field 'active_params_b' ({self.active_params_b}) exceeds 'params_b' "
                f"({self.params_b})"
            )
        if self.heads % self.kv_heads:
            raise ValueError(
                f"{owner}: field 'kv_heads' ({self.kv_heads}) must divide 'heads' ({self.heads})"
            )
        if self.active_experts > self.experts:
            raise ValueError(f"{owner}: field 'active_experts' exceeds 'experts'")
        if self.role not in MODEL_ROLES:
            raise ValueError(f"{owner}: field 'role' must be one of {', '.join(MODEL_ROLES)}, "
                             f"got {self.role!r}")

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.bytes_per_param

    @property
    def layer_weight_bytes(self) -> float:
        """Bytes held per transformer layer (embeddings spread evenly: a <2% simplification)."""
        return self.weight_bytes / self.layers

    @property
    def layer_active_params(self) -> float:
        return self.active_params_b * 1e9 / self.layers

    @property
    def kv_bytes_per_token_layer(self) -> float:
        # K and V, 16-bit cache
        return 2.0 * self.kv_heads * self.head_dim * 2.0


@dataclass(frozen=True)
class Service:
    """The unit that has a demand and an SLO: (model, phase)."""

    model: str
    phase: Phase

    @functools.cached_property
    def name(self) -> str:
        # cached: a re-plan reads the names of thousands of templates' services
        return f"{self.model}/{self.phase.value}"


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: a contiguous block of ``layers`` layers served by ``nodes``
    (config names), which are data-parallel copies whose throughputs add."""

    layers: int
    nodes: tuple[str, ...]

    def __post_init__(self) -> None:
        check_integer("Stage", "layers", self.layers)
        if not self.nodes:
            raise ValueError("Stage: field 'nodes' must name at least one node config")

    @classmethod
    def trusted(cls, layers: int, nodes: tuple[str, ...]) -> Stage:
        """Construct without re-validating: only for data that passed ``__post_init__`` before
        and comes back checksummed (the template cache), where validation dominated load time."""
        stage = object.__new__(cls)
        object.__setattr__(stage, "layers", layers)
        object.__setattr__(stage, "nodes", nodes)
        return stage


@dataclass(frozen=True)
class Template:
    """A serving template: a multiset of node configs in one region with its best pipeline
    placement and the SLO throughput (tokens/s of its service) one instance delivers.

    ``nodes`` is the multiset as sorted (config name, count) pairs; ``stages`` are in pipeline
    order and their layers sum to the model's layers.

    A co-located template (service phase ``COLOCATED``) serves both phases of its model:
    ``throughput`` is the prompt tokens/s and ``decode_throughput`` the generated tokens/s it
    serves together, at its library's request shape (0 for a one-phase template).
    """

    service: Service
    region: str
    nodes: tuple[tuple[str, int], ...]
    stages: tuple[Stage, ...]
    throughput: float
    decode_throughput: float = 0.0

    def __post_init__(self) -> None:
        check_number(f"Template {self.service.name}", "throughput", self.throughput)
        if self.service.phase is Phase.COLOCATED:
            check_number(f"Template {self.service.name}", "decode_throughput", self.decode_throughput)
        elif self.decode_throughput != 0.0:
            raise ValueError(f"Template {self.service.name}: field 'decode_throughput' is for co-located "
                             f"templates only, got {self.decode_throughput!r}")
        if list(self.nodes) != sorted(self.nodes):
            raise ValueError(f"Template {self.service.name}: field 'nodes' must be sorted")
        stage_nodes = sorted(n for s in self.stages for n in s.nodes)
        multiset = sorted(c for c, k in self.nodes for _ in range(k))
        if stage_nodes != multiset:
            raise ValueError(
                f"Template {self.service.name}: stages use {stage_nodes}, nodes say {multiset}"
            )

    @classmethod
    def trusted(cls, service: Service, region: str, nodes: tuple[tuple[str, int], ...],
                stages: tuple[Stage, ...], throughput: float, decode_throughput: float = 0.0) -> Template:
        """Construct without re-validating (see :meth:`Stage.trusted`): a 1e5-template library
        spends most of its cache load in ``__post_init__`` otherwise."""
        t = object.__new__(cls)
        object.__setattr__(t, "service", service)
        object.__setattr__(t, "region", region)
        object.__setattr__(t, "nodes", nodes)
        object.__setattr__(t, "stages", stages)
        object.__setattr__(t, "throughput", throughput)
        object.__setattr__(t, "decode_throughput", decode_throughput)
        return t

    def scaled(self, factor: float) -> Template:
        """This template serving ``factor`` x its throughput (both phases' for a co-located one)."""
        return Template.trusted(self.service, self.region, self.nodes, self.stages, self.throughput * factor,
                                self.decode_throughput * factor)

    @property
    def colocated(self) -> bool:
        return self.service.phase is Phase.COLOCATED

    @functools.cached_property
    def covers(self) -> tuple[tuple[str, float], ...]:
        """(service name, tokens/s one instance gives it) for each demand row it serves: its own
        service, or a co-located template's model's prefill and decode services."""
        if self.service.phase is not Phase.COLOCATED:
            return ((self.service.name, self.throughput),)
        m = self.service.model
        return ((Service(m, Phase.PREFILL).name, self.throughput),
                (Service(m, Phase.DECODE).name, self.decode_throughput))

    @property
    def node_count(self) -> int:
        """Stages' nodes or slices (a slice counts as one)."""
        return sum(k for _, k in self.nodes)

    @functools.cached_property
    def node_use(self) -> tuple[tuple[str, float], ...]:
        """(node config, nodes one instance uses) pairs, sorted: whole nodes count 1 each
        (integers, exactly ``nodes``), a slice counts its share of a node ("2/8xH100" 0.25 of an
        "8xH100"). What availability, prices and the ILP's node rows see."""
        if not any("/" in c for c, _ in self.nodes):
            return self.nodes
        use: dict[str, float] = {}
        for c, k in self.nodes:
            node = node_config_of(c)
            use[node] = use.get(node, 0) + k * node_share(c)
        return tuple(sorted(use.items()))

    @functools.cached_property
    def has_slices(self) -> bool:
        return any("/" in c for c, _ in self.nodes)

    @functools.cached_property
    def key(self) -> str:
        """Stable identifier: service, region and node multiset (and the layer split)."""
        mix = "+".join(f"{k}*{c}" for c, k in self.nodes)
        split = "|".join(f"{s.layers}:{','.join(s.nodes)}" for s in self.stages)
        return f"{self.service.name}@{self.region}[{mix}]({split})"
