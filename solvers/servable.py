"""Which models a fleet cannot serve at all, and why: no offered node config holds the weights,
the heads do not split over the offered nodes' GPUs (vLLM's tensor parallelism), or no template
meets the SLO. A model without a template for one of its phases would be planned nothing and
simulated as served by nothing; commands say so before they work, naming the fix.
"""

from __future__ import annotations

from collections.abc import Sequence

from atoll.solvers.catalog import Catalog
from atoll.solvers.errors import InputError
from atoll.solvers.perf import RequestShape, max_layers_that_fit
from atoll.solvers.runtime import tp_problem
from atoll.solvers.scenarios import ScenarioSpec, request_shapes
from atoll.solvers.types import PHASES, ModelSpec, NodeConfig, Phase, Template


class UnservableError(InputError):
    """A model of the fleet has no serving template; the message names each and the reason."""


def _offered(scenario: ScenarioSpec, catalog: Catalog) -> list[NodeConfig]:
    names = sorted({c for r in scenario.regions for c in catalog.offers_in(r)})
    return [catalog.config(n) for n in names if catalog.config(n).gpu.name in scenario.gpu_types]


def why_unservable(model: ModelSpec, configs: Sequence[NodeConfig], n_max: int, shape: RequestShape,
                   runtime: str, phases: Sequence[Phase], slices: bool = True) -> str:
    """The reason ``model`` has no template for ``phases`` on ``configs``, with the fix (under vllm
    without ``slices``: slices first, since a replica on g of a node's GPUs is what most fixes need)."""
    whole = runtime == "vllm" and not slices and any(c.count > 1 for c in configs)
    hint = (" Or plan with slices (the vllm default: drop 'slices: false' from the fleet file or "
            "--no-slices): a replica may then use 1, 2 or 4 of a node's GPUs") if whole else ""
    if not configs:
        return "no node config is offered for its GPU types; add offers (regions:) in the fleet file"
    fit = {c.name: max_layers_that_fit(model, c, shape) for c in configs}
    largest = max(configs, key=lambda c: fit[c.name])
    need = (f"{model.weight_bytes / 1e9:.3g} GB of weights plus the KV cache of one "
            f"{shape.max_context:.0f}-token request")
    if n_max * fit[largest.name] < model.layers:
        return (f"no offered config holds its weights: it needs {need}; the roomiest offer "
                f"({largest.name}) holds {fit[largest.name]} of its {model.layers} layers and a "
                f"replica spans at most n_max={n_max} nodes. Offer nodes with more GPU memory or raise "
                f"n_max in the fleet file")
    if runtime == "vllm":
        counts = sorted({c.count for c in configs})
        ok = [k for k in counts if tp_problem(model, k) is None]
        if not ok:
            problems = "; ".join(str(tp_problem(model, k)) for k in counts)
            return (f"its heads do not split over the offered nodes (vLLM shards a replica "
                    f"tensor-parallel over all GPUs of a node): {problems}. Offer nodes whose GPU count "
                    f"divides its {model.heads} heads (e.g. 1- or 2-GPU nodes), or set runtime: any "
                    f"(the research runtime, not deployable with vLLM).{hint}")
        roomy = max((c for c in configs if c.count in ok), key=lambda c: fit[c.name])
        if n_max * fit[roomy.name] < model.layers:
            return (f"the offered nodes whose GPU count splits its heads ({', '.join(map(str, ok))} GPUs) "
                    f"cannot hold it ({need}; {roomy.name} holds {fit[roomy.name]} of {model.layers} "
                    f"layers, at most n_max={n_max} nodes). Offer larger nodes of those sizes.{hint}")
    budgets = ", ".join(f"{p.value} {model.slo.budget_ms(p):g} ms" for p in phases)
    return (f"no placement on the offered nodes meets its SLO ({budgets}). Offer faster GPUs or loosen "
            f"its slo in the fleet file.{hint}")


def unservable(scenario: ScenarioSpec, templates: Sequence[Template], runtime: str | None = None,
               catalog: Catalog | None = None, slices: bool | None = None) -> dict[str, str]:
    """Each model of ``scenario`` that lacks a template for a phase -> why (empty: all servable).
    ``slices``: whether the library had them (None: whether any template has a slice)."""
    have = {(t.service.model, t.service.phase) for t in templates}
    # a model is servable with both phases' templates, or with co-located ones (they serve both)
    missing = {m: [p for p in PHASES if (m, p) not in have] for m in scenario.models
               if (m, Phase.COLOCATED) not in have}
    missing = {m: ps for m, ps in missing.items() if ps}
    if not missing:
        return {}
    catalog = catalog or scenario.catalog
    configs = _offered(scenario, catalog)
    shapes = request_shapes(scenario)
    runtime = runtime or scenario.runtime
    sliced = any(t.has_slices for t in templates) if slices is None else slices
    return {m: why_unservable(scenario.model(m), configs, scenario.n_max, shapes[m], runtime, ps, sliced)
            for m, ps in missing.items()}


def unservable_message(reasons: dict[str, str]) -> str:
    return "; ".join(f"{m} cannot be served: {why}" for m, why in reasons.items())


def require_servable(scenario: ScenarioSpec, templates: Sequence[Template],
                     runtime: str | None = None) -> None:
    """An :class:`UnservableError` naming every model the fleet cannot serve, and why."""
    reasons = unservable(scenario, templates, runtime)
    if reasons:
        raise UnservableError(f"fleet {scenario.name!r}: {unservable_message(reasons)}")
