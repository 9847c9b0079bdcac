"""What a serving runtime can run: the template shapes each runtime supports.

``any`` is the research system's own runtime: a template may have several data-parallel nodes in
a stage and a different tensor-parallel size (GPUs per node) in each stage.

``vllm`` is stock vLLM (``vllm serve``): one worker group per pipeline stage and one
``--tensor-parallel-size`` for the whole engine, so a template it can run has

- exactly one node per pipeline stage (``--pipeline-parallel-size`` = nodes),
- at most two node configs, and when two, one node of the first stage's config and every other
  stage on the other one: a multi-node instance is one LeaderWorkerSet group (one leader pod
  template, one worker pod template), and vLLM's Ray executor puts the driver's node (the
  leader, where ``vllm serve`` runs) at pipeline rank 0 and orders the other nodes by IP, so
  only the first stage can differ from the rest,
- the same GPU count on every node (``--tensor-parallel-size`` = GPUs per node),
- a tensor-parallel size vLLM's attention layers accept: it divides the attention heads, and
  either divides the KV heads or is a multiple of them (vLLM replicates KV heads then),
- at most as many stages as the model has layers.

Any contiguous layer split is fine (``VLLM_PP_LAYER_PARTITION``), and GPU types may differ
between stages. A data-parallel copy of a whole model is simply another instance of a
one-stage template, so nothing is lost by excluding data parallelism inside a template.

**Slices** (a library built with ``slices=True``, ``vllm`` only): a stage may use g of
the G GPUs of one node (g a power of two below G, a pod asking ``nvidia.com/gpu: g``), written
"g/GxTYPE" (:class:`~atoll.solvers.types.NodeConfig`). Every rule above reads the slice as a
g-GPU node: one slice per stage, one tensor-parallel size g on every stage (a slice's g, not its
node's G), KV-head divisibility of g, at most two slice configs with the odd one leading. An
engine's p stages of g GPUs may share one node (TP x PP inside a node, p x g <= G) or not: which
slices share which node is the packing (:mod:`atoll.solvers.packing`), not the template. The
memory-ratio cut (``rho``) judges a slice's memory, so Phi-4 on 8xH100 nodes is served by 1- or
2-GPU slices instead of being dropped with the whole node. ``any`` never gets slices: it keeps
Coral's whole-node semantics, so the paper's decomposition stays reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence

from atoll.solvers.errors import UnknownNameError
from atoll.solvers.types import NODE_GPU_COUNTS, ModelSpec, NodeConfig, Template, gpus_of

RUNTIMES: tuple[str, ...] = ("vllm", "any")
DEFAULT_RUNTIME = "any"  # the bundled research scenarios; fleet files and the controller default to vllm
DEPLOY_RUNTIME = "vllm"


# Bump when a runtime's rules change what a build produces (it is part of every cache key).
_RULES_VERSION = {"any": "", "vllm": "2"}


def runtime_tag(name: str) -> str:
    """The runtime as it enters template cache keys: its name and the version of its rules."""
    version = _RULES_VERSION[check_runtime(name)]
    return f"{name}-{version}" if version else name


def slices_default(runtime: str, own_runtime: str | None = None, own_slices: bool = False) -> bool:
    """Whether a library for ``runtime`` uses slices when no flag says: the fleet's own choice when
    it plans with its own runtime, else yes under ``vllm`` (a Kubernetes pod asks for GPUs, it does
    not own a node) and never under ``any`` (Coral's whole nodes)."""
    if own_runtime == runtime:
        return own_slices
    return runtime == "vllm"


def check_runtime(name: str) -> str:
    if name not in RUNTIMES:
        raise UnknownNameError(f"unknown runtime {name!r}; valid runtimes: {', '.join(RUNTIMES)}")
    return name


def tp_problem(model: ModelSpec, tp: int) -> str | None:
    """Why vLLM cannot shard ``model`` ``tp`` ways, or None when it can."""
    if model.heads % tp:
        return f"tensor-parallel size {tp} does not divide the {model.heads} attention heads of {model.name}"
    if model.kv_heads % tp and tp % model.kv_heads:
        return (f"tensor-parallel size {tp} neither divides nor is a multiple of the {model.kv_heads} "
                f"KV heads of {model.name}")
    return None


def multiset_ok(runtime: str, model: ModelSpec, configs: Sequence[NodeConfig]) -> bool:
    """Whether ``runtime`` can serve ``model`` on these nodes as one instance (each node one stage)."""
    if runtime == "any":
        return True
    counts = {c.count for c in configs}
    names = [c.name for c in configs]
    kinds = sorted(names.count(n) for n in set(names))
    return (len(counts) == 1 and len(configs) <= model.layers and (len(kinds) == 1 or kinds[0] == 1)
            and len(kinds) <= 2 and tp_problem(model, next(iter(counts))) is None)


def with_slices(configs: Sequence[NodeConfig]) -> tuple[NodeConfig, ...]:
    """``configs`` (whole nodes) and every slice of them a stage may use: g GPUs of a G-GPU node
    for each g in NODE_GPU_COUNTS below G (all powers of two, so they pack exactly)."""
    out = list(configs)
    for c in configs:
        if c.node_gpus:
            raise ValueError(f"with_slices: {c.name} is already a slice")
        out.extend(NodeConfig(c.gpu, g, c.count) for g in NODE_GPU_COUNTS if g < c.count)
    return tuple(out)


def vllm_multisets(configs: Sequence[NodeConfig], n_max: int) -> list[tuple[int, ...]]:
    """Sorted index tuples of every multiset of at most ``n_max`` entries of ``configs`` whose
    shape the vllm rules accept, ignoring the model: one GPU count, and one config or one node of
    a lead config with the rest of one worker config. Listed directly (O(configs^2 x n_max))
    instead of filtering all multisets: with slices a region offers ~45 configs, and there are
    ~1.6e7 multisets of 6 of them."""
    out: set[tuple[int, ...]] = set()
    by_gpus: dict[int, list[int]] = {}
    for i, c in enumerate(configs):
        by_gpus.setdefault(c.count, []).append(i)
    for group in by_gpus.values():
        for w in group:
            for n in range(1, n_max + 1):
                out.add((w,) * n)
                if n >= 2:
                    for lead in group:
                        if lead != w:
                            out.add(tuple(sorted((lead, *(w,) * (n - 1)))))
    return sorted(out, key=lambda ms: (len(ms), ms))


def vllm_last_configs(configs: Sequence[str]) -> frozenset[str] | None:
    """Configs the last stage may have under ``vllm`` for this node multiset (None: any). With
    one node of config L and k >= 2 of W, L leads (first stage) and W ends the pipeline."""
    kinds = {n: list(configs).count(n) for n in set(configs)}
    if len(kinds) == 2 and max(kinds.values()) >= 2:
        return frozenset(n for n, k in kinds.items() if k >= 2)
    return None


def leader_first(template: Template) -> Template:
    """The same template with its stages reordered so the single-node config leads (the
    LeaderWorkerSet leader); only non-last stages move, and they are interchangeable (each sends
    its activations within the same per-stage budget), so the throughput is unchanged."""
    stages = list(template.stages)
    if len(stages) < 3:
        return template
    configs = [s.nodes[0] for s in stages]
    lone = [i for i, c in enumerate(configs[:-1]) if configs.count(c) == 1]
    if not lone or lone[0] == 0:
        return template
    i = lone[0]
    order = [stages[i], *stages[:i], *stages[i + 1:]]
    return Template(template.service, template.region, template.nodes, tuple(order), template.throughput,
                    template.decode_throughput)


def template_problem(runtime: str, model: ModelSpec, template: Template) -> str | None:
    """Why ``runtime`` cannot run ``template``, or None when it can."""
    check_runtime(runtime)
    if runtime == "any":
        return None
    crowded = [s for s in template.stages if len(s.nodes) != 1]
    if crowded:
        return (f"template {template.key}: a stage has {len(crowded[0].nodes)} data-parallel nodes; vLLM "
                f"runs one node per pipeline stage")
    workers = {s.nodes[0] for s in template.stages[1:]}
    if len(workers) > 1:
        return (f"template {template.key}: stages after the first use {len(workers)} node configs "
                f"{sorted(workers)}; a LeaderWorkerSet has one worker pod template")
    gpus = sorted({gpus_of(c) for c, _ in template.nodes})
    if len(gpus) != 1:
        return (f"template {template.key}: stages have different GPU counts {gpus}; vLLM uses one "
                f"tensor-parallel size for every stage")
    why = tp_problem(model, gpus[0])
    return None if why is None else f"template {template.key}: {why}"
