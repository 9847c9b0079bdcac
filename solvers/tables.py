"""Plain-data views of the catalog and of node profiles (what ``atoll catalog`` and
``atoll perf table`` print)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from atoll.solvers.catalog import DEFAULT_REGIONS, Catalog
from atoll.solvers.perf import (
    PerfFactors,
    RequestShape,
    load_factors,
    max_layers_that_fit,
    node_profile,
    unvalidated,
)
from atoll.solvers.types import ModelSpec, NodeConfig, Phase


def catalog_document(catalog: Catalog, regions: Sequence[str] = DEFAULT_REGIONS) -> dict[str, Any]:
    gpus = [
        {"name": g.name, "memory_gb": g.memory_gb, "hbm_bandwidth_gbs": g.hbm_bandwidth_gbs,
         "bf16_tflops": g.bf16_tflops, "link_gbs": g.link_gbs}
        for g in catalog.gpus.values()
    ]
    offers = [
        {"region": o.region, "config": o.config, "instance": o.instance,
         "on_demand_per_hour": o.on_demand_per_hour, "spot_per_hour": o.spot_per_hour,
         "spot_estimated": o.spot_estimated}
        for r in regions for o in sorted(catalog.offers_in(r).values(), key=lambda o: o.config)
    ]
    return {"gpus": gpus, "regions": list(regions), "offers": offers,
            "sources": dict(catalog.sources), "notes": list(catalog.notes)}


def perf_rows(models: Iterable[ModelSpec], configs: Iterable[NodeConfig], *,
              shape: RequestShape | None = None,
              factors: PerfFactors | None = None) -> list[dict[str, Any]]:
    """Per (model, config): whole-model node profiles at the model's SLOs, and the most layers
    the node can hold (the building block of pipeline templates)."""
    f = factors or load_factors()
    shape = shape or RequestShape()
    rows = []
    for m in models:
        for c in configs:
            fit = max_layers_that_fit(m, c, shape)
            rows.append({
                "model": m.name, "config": c.name, "max_layers": fit, "layers": m.layers,
                "prefill_tokens_per_s": node_profile(m, c, m.layers, Phase.PREFILL, m.slo.ttft_ms,
                                                     shape=shape, factors=f),
                "decode_tokens_per_s": node_profile(m, c, m.layers, Phase.DECODE, m.slo.tpot_ms,
                                                    shape=shape, factors=f),
                "ttft_ms": m.slo.ttft_ms, "tpot_ms": m.slo.tpot_ms,
                "unvalidated": unvalidated(m, c),
            })
    return rows
