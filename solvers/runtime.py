"""What a serving runtime can run: the template shapes each runtime supports.

``any`` is the research system's own runtime: a template may have several data-parallel nodes in
a stage and a different tensor-parallel size (GPUs per node) in each stage.

``vllm`` is stock vLLM (``vllm serve``): one worker group per pipeline stage and one
``--tensor-parallel-size`` for the whole engine, so a template it can run has

- exactly one node per pipeline stage (``--pipeline-parallel-size`` = nodes),
- the same GPU count on every node (``--tensor-parallel-size`` = GPUs per node),
- a tensor-parallel size vLLM's attention layers accept: it divides the attention heads, and
  either divides the KV heads or is a multiple of them (vLLM replicates KV heads then),
- at most as many stages as the model has layers.

Any contiguous layer split is fine (``VLLM_PP_LAYER_PARTITION``), and GPU types may differ
between stages. A data-parallel copy of a whole model is simply another instance of a
one-stage template, so nothing is lost by excluding data parallelism inside a template.
"""

from __future__ import annotations

from collections.abc import Sequence

from atoll.solvers.errors import UnknownNameError
from atoll.solvers.types import ModelSpec, NodeConfig, Template

RUNTIMES: tuple[str, ...] = ("vllm", "any")
DEFAULT_RUNTIME = "any"  # the bundled research scenarios; fleet files and the controller default to vllm
DEPLOY_RUNTIME = "vllm"


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
    return (len(counts) == 1 and len(configs) <= model.layers
            and tp_problem(model, next(iter(counts))) is None)


def template_problem(runtime: str, model: ModelSpec, template: Template) -> str | None:
    """Why ``runtime`` cannot run ``template``, or None when it can."""
    check_runtime(runtime)
    if runtime == "any":
        return None
    crowded = [s for s in template.stages if len(s.nodes) != 1]
    if crowded:
        return (f"template {template.key}: a stage has {len(crowded[0].nodes)} data-parallel nodes; vLLM "
                f"runs one node per pipeline stage")
    gpus = sorted({int(c.split("x", 1)[0]) for c, _ in template.nodes})
    if len(gpus) != 1:
        return (f"template {template.key}: stages have different GPU counts {gpus}; vLLM uses one "
                f"tensor-parallel size for every stage")
    why = tp_problem(model, gpus[0])
    return None if why is None else f"template {template.key}: {why}"
