"""Node profiles: the SLO throughput of one node holding j layers of a model.

A roofline per decode/prefill step, for a node of ``n`` GPUs running tensor parallel over all n:

    compute_s = FLOPs / (n * peak_flops * eta_c[gpu])
    memory_s  = bytes / (n * hbm_bandwidth * eta_m[gpu])
    step_s    = max(compute_s, memory_s) + j * t_layer + j * 2 * allreduce_s     (allreduce if n > 1)

FLOPs per layer: 2 x active params x tokens (dense math) + attention (2·T·L·d for causal prefill
of T tokens of prompts of length L; 4·b·c·d for decode of b sequences at context c).
Bytes per layer: weights touched (dense: all; MoE: shared part + the experts the batch routes to,
expected 1-(1-k/E)^tokens of them) + the KV cache read (decode) or written (prefill).
All-reduce: two per layer (attention and MLP), a ring over n GPUs moving 2(n-1)/n x the
activation bytes at ``link_gbs x eta_link`` plus a fixed latency.
Decode at tensor parallelism n > 1 adds a synchronization term (:func:`decode_sync_seconds`),
fitted to Splitwise's per-token times at TP 2/4/8 alone: measured TP8 decode is no faster than
TP4, where bandwidth alone says 2x.
Memory: weights of the j layers plus the KV cache of the batch must fit in
``n x memory x MEM_UTILIZATION`` minus a per-GPU reserve; otherwise the profile is 0.

The profile is the best tokens/s over batch sizes whose step fits the latency budget: decode
batches b sequences (throughput b / step), prefill batches k whole prompts (k·L / step). The
smallest useful batch is one sequence (decode) or one whole prompt (prefill).

The efficiency factors ``eta_c, eta_m`` per GPU, ``t_layer``, ``eta_link`` and the all-reduce
latency are fitted to measured public profiles by :mod:`atoll.solvers.calibrate`; GPUs with no
measurements borrow the factors of their architecture sibling (:data:`SIBLING`). A GPU with
neither (a user's own card, e.g. MI300X) borrows the ``default`` entry when the factors have one
(the uncalibrated priors do) and otherwise the **median of the fitted GPUs' factors**
(:meth:`PerfFactors.borrowed`), since the calibration writes per-GPU factors only.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from atoll.solvers.errors import InputError
from atoll.solvers.paths import perf_factors_path
from atoll.solvers.types import ModelSpec, NodeConfig, Phase, gpus_of

MEM_UTILIZATION = 0.90  # vLLM's default gpu_memory_utilization
RESERVE_GB_PER_GPU = 1.0  # CUDA context, activations, fragmentation
ACT_BYTES = 2.0  # 16-bit activations
# Pipeline stages on different nodes pass activations over the network. 25 Gbit/s is the
# bandwidth of the smaller instances of every family we price (g5/g6/g6e.xlarge..4xlarge are
# "up to 25 Gbit/s"); larger nodes have more, so this is conservative.
INTER_NODE_GBS = 25.0 / 8.0
INTER_NODE_LATENCY_MS = 0.1

# GPUs without measured profiles take the factors of the nearest measured relative. The chosen
# relative is named in the calibration report; the leave-one-GPU-out error says how far to trust it.
SIBLING: dict[str, str] = {
    "A100-40GB": "A100", "A100-80GB": "A100",  # same chip, one set of factors
    "L40S": "L4",  # Ada, GDDR6, PCIe
    "A10G": "L4",  # GDDR6 PCIe inference card (Ampere GA102)
    "H200": "H100",  # same Hopper die, more and faster HBM
    "T4": "T4", "L4": "L4", "V100": "V100", "H100": "H100",
}


@dataclass(frozen=True)
class RequestShape:
    """Mean request lengths the profile is computed for (tokens)."""

    input_tokens: float = 1024.0
    output_tokens: float = 256.0

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 1):
                raise InputError(f"RequestShape: field '{name}' must be >= 1, got {v!r}")

    @property
    def mean_context(self) -> float:
        """Average KV context of a decode step over a request's output."""
        return self.input_tokens + self.output_tokens / 2.0

    @property
    def max_context(self) -> float:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class PerfFactors:
    """Fitted efficiency factors (see module docstring)."""

    eta_c: Mapping[str, float] = field(default_factory=lambda: {"default": 0.6})
    eta_m: Mapping[str, float] = field(default_factory=lambda: {"default": 0.8})
    t_layer_ms: float = 0.02
    eta_link: float = 0.7
    allreduce_latency_us: float = 10.0
    # decode at TP n > 1 (see decode_sync_seconds); 0 = the model before the term existed
    decode_hop_us: float = 0.0
    decode_skew: float = 0.0

    def key(self, gpu: str) -> str:
        k = SIBLING.get(gpu, gpu)
        return k if k in self.eta_c else "default"

    def borrowed(self, gpu: str) -> bool:
        """True when ``gpu`` has no fitted factors of its own or of a sibling."""
        return SIBLING.get(gpu, gpu) not in self.eta_c

    def compute_eff(self, gpu: str) -> float:
        k = self.key(gpu)
        return self.eta_c[k] if k in self.eta_c else statistics.median(self.eta_c.values())

    def memory_eff(self, gpu: str) -> float:
        k = self.key(gpu)
        return self.eta_m[k] if k in self.eta_m else statistics.median(self.eta_m.values())

    def to_json(self) -> dict[str, object]:
        return {"eta_c": dict(self.eta_c), "eta_m": dict(self.eta_m), "t_layer_ms": self.t_layer_ms,
                "eta_link": self.eta_link, "allreduce_latency_us": self.allreduce_latency_us,
                "decode_hop_us": self.decode_hop_us, "decode_skew": self.decode_skew}

    @staticmethod
    def from_json(data: Mapping[str, object]) -> PerfFactors:
        return PerfFactors(
            eta_c=dict(data["eta_c"]),  # type: ignore[call-overload]
            eta_m=dict(data["eta_m"]),  # type: ignore[call-overload]
            t_layer_ms=float(data["t_layer_ms"]),  # type: ignore[arg-type]
            eta_link=float(data["eta_link"]),  # type: ignore[arg-type]
            allreduce_latency_us=float(data["allreduce_latency_us"]),  # type: ignore[arg-type]
            # factors written before the decode terms existed have neither
            decode_hop_us=float(data.get("decode_hop_us", 0.0)),  # type: ignore[arg-type]
            decode_skew=float(data.get("decode_skew", 0.0)),  # type: ignore[arg-type]
        )


def load_factors(path: Path | None = None) -> PerfFactors:
    """The factors in ``path``; by default the user's calibration when ``atoll perf calibrate``
    wrote one, else the package's table (:func:`atoll.solvers.paths.perf_factors_path`); the
    documented priors if neither exists. A file rewritten in place is read again."""
    p = Path(path) if path is not None else perf_factors_path()
    try:
        st = p.stat()
    except FileNotFoundError:
        return PerfFactors()
    return _read_factors(str(p), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=4)
def _read_factors(path: str, mtime_ns: int, size: int) -> PerfFactors:
    return PerfFactors.from_json(json.loads(Path(path).read_text())["factors"])


def _moe_touched_fraction(model: ModelSpec, tokens: float) -> float:
    """Share of a layer's weights a step touches when it routes ``tokens`` tokens."""
    if model.experts <= 1:
        return 1.0
    k_over_e = model.active_experts / model.experts
    # total = dense + experts; active = dense + k/E * experts
    expert = (model.params_b - model.active_params_b) / (1.0 - k_over_e)
    dense = model.params_b - expert
    touched = 1.0 - (1.0 - k_over_e) ** max(tokens, 1.0)
    return (dense + expert * touched) / model.params_b


def _allreduce_s(config: NodeConfig, msg_bytes: float, factors: PerfFactors) -> float:
    n = config.count
    if n == 1:
        return 0.0
    bw = config.gpu.link_gbs * 1e9 * factors.eta_link
    return 2.0 * (n - 1) / n * msg_bytes / bw + factors.allreduce_latency_us * 1e-6


def step_terms(model: ModelSpec, layers: int, phase: Phase, *, tokens: float,
               context: float) -> tuple[float, float, float]:
    """(FLOPs, HBM bytes, all-reduce message bytes) of one step; shared with the calibration fit.

    Prefill: ``tokens`` prompt tokens in prompts of length ``context``. Decode: ``tokens``
    sequences (one new token each) at KV context ``context``.
    """
    d_attn = model.heads * model.head_dim
    dense_flops = 2.0 * model.layer_active_params * tokens
    if phase is Phase.PREFILL:
        attn_flops = 2.0 * tokens * context * d_attn
        kv_bytes = tokens * model.kv_bytes_per_token_layer
    else:
        attn_flops = 4.0 * tokens * context * d_attn
        kv_bytes = tokens * context * model.kv_bytes_per_token_layer
    weight_bytes = model.layer_weight_bytes * _moe_touched_fraction(model, tokens)
    return (layers * (dense_flops + attn_flops), layers * (weight_bytes + kv_bytes),
            tokens * model.hidden * ACT_BYTES)


def step_seconds(model: ModelSpec, config: NodeConfig, layers: int, phase: Phase, *,
                 tokens: float, context: float, factors: PerfFactors) -> float:
    """Time of one forward step over ``layers`` layers (arguments as in :func:`step_terms`)."""
    gpu, n = config.gpu, config.count
    flops, nbytes, msg = step_terms(model, layers, phase, tokens=tokens, context=context)
    compute = flops / (n * gpu.bf16_tflops * 1e12 * factors.compute_eff(gpu.name))
    memory = nbytes / (n * gpu.hbm_bandwidth_gbs * 1e9 * factors.memory_eff(gpu.name))
    comm = layers * 2.0 * _allreduce_s(config, msg, factors)
    if phase is Phase.DECODE:
        comm += decode_sync_seconds(n, layers, memory * n, factors)
    return max(compute, memory) + layers * factors.t_layer_ms * 1e-3 + comm


# How a co-located step's two parts share the engine (:func:`mixed_step_seconds`):
# ``separate`` (the default: an upper bound) or ``shared`` (one weight pass for every token)
INTERFERENCE_MODELS = ("separate", "shared")
DEFAULT_INTERFERENCE = "separate"


def mixed_step_seconds(model: ModelSpec, config: NodeConfig, layers: int, *, sequences: float,
                       chunk_tokens: float, shape: RequestShape, factors: PerfFactors,
                       interference: str = DEFAULT_INTERFERENCE) -> float:
    """Time of one co-located step over ``layers`` layers: ``sequences`` decode sequences (one new
    token each, at the shape's mean context) and ``chunk_tokens`` prompt tokens of chunked prefill.

    The interference model, ``interference``:

    - ``shared`` (Sarathi-Serve's argument, the reason chunked prefill exists): the two parts
      share one pass over the weights, so the weight bytes are read once for all tokens (a MoE
      layer routes them together), while each part adds its own FLOPs and KV traffic (decode reads
      its sequences' caches; a chunk writes its tokens and reads, on average, half its prompt's
      cache so far). The step is the roofline max of the summed compute and memory, plus the
      per-layer overhead, the all-reduces of every token's activations, and decode's
      synchronization (the step is a decode step for the sequences in it). Vidur's linear-layer
      profiles show the band of tokens that ride along a decode step free is 3-5x narrower than
      this roofline lets it be (``benchmarks/colocated_capacity.py``), so it is optimistic there.
    - ``separate`` (the default): each part takes its own pass, as if the engine ran the decode
      batch and then the chunk: the decode step of the sequences plus the prefill step of the
      chunk, each as ``shared`` computes it alone. Every term is at least the shared pass's (the
      weights read twice, two per-layer overheads, two rounds of all-reduces), and a fused batch is
      no slower than its parts run apart, so it is an upper bound: what co-location saves under
      it (one engine instead of two at low load, the budget's slack at high load) does not rest on
      the free band no data here measures.

    With no chunk either is :func:`step_seconds`'s decode step; with no sequences, a prefill
    step's compute and traffic.
    """
    if interference not in INTERFERENCE_MODELS:
        raise ValueError(f"interference must be one of {', '.join(INTERFERENCE_MODELS)}, got "
                         f"{interference!r}")
    if interference == "separate" and sequences > 0 and chunk_tokens > 0:
        return (_shared_step(model, config, layers, sequences, 0.0, shape, factors)
                + _shared_step(model, config, layers, 0.0, chunk_tokens, shape, factors))
    return _shared_step(model, config, layers, sequences, chunk_tokens, shape, factors)


def _shared_step(model: ModelSpec, config: NodeConfig, layers: int, sequences: float, chunk_tokens: float,
                 shape: RequestShape, factors: PerfFactors) -> float:
    """:func:`mixed_step_seconds` with one weight pass for both parts (``shared``)."""
    gpu, n = config.gpu, config.count
    ctx, length = shape.mean_context, shape.input_tokens
    d_attn = model.heads * model.head_dim
    kv = model.kv_bytes_per_token_layer
    tokens = sequences + chunk_tokens
    flops = 2.0 * model.layer_active_params * tokens
    flops += 4.0 * sequences * ctx * d_attn + 2.0 * chunk_tokens * length * d_attn
    nbytes = model.layer_weight_bytes * _moe_touched_fraction(model, tokens)
    nbytes += sequences * ctx * kv + chunk_tokens * kv + (length / 2.0 if chunk_tokens > 0 else 0.0) * kv
    flops, nbytes = layers * flops, layers * nbytes
    compute = flops / (n * gpu.bf16_tflops * 1e12 * factors.compute_eff(gpu.name))
    memory = nbytes / (n * gpu.hbm_bandwidth_gbs * 1e9 * factors.memory_eff(gpu.name))
    comm = layers * 2.0 * _allreduce_s(config, tokens * model.hidden * ACT_BYTES, factors)
    if sequences > 0:
        comm += decode_sync_seconds(n, layers, memory * n, factors)
    return max(compute, memory) + layers * factors.t_layer_ms * 1e-3 + comm


def decode_sync_seconds(n: int, layers: int, stream_s: float, factors: PerfFactors) -> float:
    """Synchronization of a tensor-parallel decode step of ``layers`` layers on n GPUs (0 for
    one GPU); ``stream_s`` is the step's HBM stream time on one GPU (bytes / effective bandwidth).

    - ``decode_hop_us`` x (n - 1) per layer: decode all-reduces carry a few kilobytes, so they are
      bound by the hops of the ring (n - 1 per phase), not by bandwidth;
    - ``decode_skew`` x log2(n) x ``stream_s``: every all-reduce waits for the slowest GPU, and the
      wait grows with the depth of the reduction (log2 n) and with the length of the streams
      being waited on — an Amdahl-style share of the stream that does not parallelize.

    Both are fitted to Splitwise's per-token times (Llama-2-70B, A100/H100, TP 2/4/8) with every
    other factor held at its fit to all datasets (:func:`atoll.solvers.calibrate.fit`). No public
    profile covers MoE decode at TP 4/8: their numbers are flagged unvalidated."""
    if n <= 1:
        return 0.0
    return layers * (n - 1) * factors.decode_hop_us * 1e-6 + factors.decode_skew * math.log2(n) * stream_s


def activation_transfer_seconds(model: ModelSpec, tokens: float) -> float:
    """Time to send one step's activations (``tokens`` rows of the hidden state) to the next
    pipeline stage over the network."""
    return tokens * model.hidden * ACT_BYTES / (INTER_NODE_GBS * 1e9) + INTER_NODE_LATENCY_MS * 1e-3


def kv_capacity_tokens(model: ModelSpec, config: NodeConfig, layers: int) -> float:
    """Tokens of KV cache that fit beside the weights of ``layers`` layers (<= 0: no fit)."""
    usable = config.count * (config.gpu.memory_gb * MEM_UTILIZATION - RESERVE_GB_PER_GPU) * 1e9
    free = usable - layers * model.layer_weight_bytes
    return free / (layers * model.kv_bytes_per_token_layer)


def _largest_within(limit: int, fits: Callable[[int], bool]) -> int:
    """Largest integer k in [1, limit] with fits(k) true, given fits is monotone (true then false)."""
    if limit < 1 or not fits(1):
        return 0
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def node_profile(model: ModelSpec, config: NodeConfig, layers: int, phase: Phase,
                 budget_ms: float, *, shape: RequestShape = RequestShape(),
                 factors: PerfFactors | None = None, send_activations: bool = False,
                 min_chunk_tokens: float = 0.0) -> float:
    """Highest tokens/s one node sustains holding ``layers`` layers with each step <= budget_ms.

    Prefill tokens/s counts prompt tokens; decode tokens/s counts generated tokens. Returns 0
    when the layers plus the KV cache of the smallest useful batch do not fit, or when even that
    batch misses the budget. ``send_activations``: the node is a pipeline stage with a successor,
    and the step's activation transfer to it counts against the budget.

    Co-located (``Phase.COLOCATED``, budget = the TPOT share): the prompt tokens/s of a replica
    serving both phases in the shape's ratio. Every step carries b decode sequences and a prompt
    chunk of c = max(b x input / output, ``min_chunk_tokens``) tokens (the prefill the b sequences'
    requests bring, and at least the chunk that keeps TTFT within budget, see
    :attr:`atoll.solvers.templates.TemplateJob.min_chunk_tokens`); the largest b whose step
    (:func:`mixed_step_seconds`) fits the budget and whose KV cache (b full sequences and the
    chunk's prompts) fits gives b / (output x step) requests/s.
    """
    if not 1 <= layers <= model.layers:
        raise ValueError(f"layers must be in 1..{model.layers} for {model.name}, got {layers}")
    if not (math.isfinite(budget_ms) and budget_ms > 0):
        raise ValueError(f"budget_ms must be a positive number, got {budget_ms!r}")
    f = factors or load_factors()
    cap = kv_capacity_tokens(model, config, layers)
    budget_s = budget_ms * 1e-3
    if phase is Phase.PREFILL:
        length = shape.input_tokens
        max_k = int(min(cap / length, 4096))

        def prefill_s(k: int) -> float:
            t = step_seconds(model, config, layers, phase, tokens=k * length, context=length,
                             factors=f)
            return t + (activation_transfer_seconds(model, k * length) if send_activations else 0.0)

        k = _largest_within(max_k, lambda k: prefill_s(k) <= budget_s)
        return k * length / prefill_s(k) if k else 0.0
    if phase is Phase.COLOCATED:
        return _colocated_profile(model, config, layers, budget_s, cap, shape, f, send_activations,
                                  min_chunk_tokens)
    ctx = shape.mean_context
    max_b = int(min(cap / shape.max_context, 4096))

    def decode_s(b: int) -> float:
        t = step_seconds(model, config, layers, phase, tokens=b, context=ctx, factors=f)
        return t + (activation_transfer_seconds(model, b) if send_activations else 0.0)

    b = _largest_within(max_b, lambda b: decode_s(b) <= budget_s)
    return b / decode_s(b) if b else 0.0


def _colocated_profile(model: ModelSpec, config: NodeConfig, layers: int, budget_s: float, cap: float,
                       shape: RequestShape, f: PerfFactors, send_activations: bool,
                       min_chunk: float) -> float:
    """:func:`node_profile` of a co-located replica (see there): its prompt tokens/s."""
    ratio = shape.input_tokens / shape.output_tokens

    def chunk(b: int) -> float:
        return max(b * ratio, min_chunk)

    def step_s(b: int) -> float:
        t = mixed_step_seconds(model, config, layers, sequences=b, chunk_tokens=chunk(b), shape=shape,
                               factors=f)
        return t + (activation_transfer_seconds(model, b + chunk(b)) if send_activations else 0.0)

    def kv_fits(b: int) -> bool:  # b whole sequences, plus the prompts the chunk is filling
        return b * shape.max_context + math.ceil(chunk(b) / shape.input_tokens) * shape.input_tokens <= cap

    most = int(min(cap / shape.max_context, 4096))
    b = _largest_within(most, lambda b: kv_fits(b) and step_s(b) <= budget_s)
    return b / (shape.output_tokens * step_s(b)) * shape.input_tokens if b else 0.0


def max_layers_that_fit(model: ModelSpec, config: NodeConfig, shape: RequestShape) -> int:
    """Most layers a node holds with room for one full-length sequence of KV cache."""
    usable = config.count * (config.gpu.memory_gb * MEM_UTILIZATION - RESERVE_GB_PER_GPU) * 1e9
    per_layer = model.layer_weight_bytes + shape.max_context * model.kv_bytes_per_token_layer
    return max(0, min(model.layers, int(usable // per_layer)))


UNVALIDATED_NOTE = ("unvalidated: no public profile covers mixture-of-experts models at tensor "
                    "parallelism 4 or 8; the synchronization terms were fitted on a dense model")


def unvalidated(model: ModelSpec, config: NodeConfig) -> bool:
    """True for numbers no measurement backs: a mixture-of-experts model on a node of 4+ GPUs."""
    return model.experts > 1 and config.count >= 4


def template_unvalidated(model: ModelSpec, configs: Iterable[str]) -> bool:
    """:func:`unvalidated` for a template: any of its node configs ("4xH100", ...) has 4+ GPUs."""
    return model.experts > 1 and any(gpus_of(c) >= 4 for c in configs)
