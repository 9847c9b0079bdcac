"""Pruning never removes a model's last templates while an offered config can
hold it, and a model nothing can serve is named with the reason."""

from __future__ import annotations

from atoll.solvers.catalog import load_catalog
from atoll.solvers.perf import RequestShape
from atoll.solvers.servable import why_unservable
from atoll.solvers.templates import enumerate_multisets
from atoll.solvers.types import GpuType, ModelSpec, NodeConfig, Phase, Slo

SHAPE = RequestShape(1000.0, 200.0)
MI300X = GpuType("MI300X", 192, 5300, 1307, 448)


def _model(params_b: float, heads: int, kv_heads: int, layers: int = 24, hidden: int = 896) -> ModelSpec:
    return ModelSpec("Tiny", layers, hidden, heads, kv_heads, 64, params_b, params_b, 2, Slo(800, 40))


def test_a_small_model_on_large_nodes_keeps_its_minimal_templates() -> None:
    eight_h100 = load_catalog().config("8xH100")
    m8 = ModelSpec("Acme-8B", 32, 4096, 32, 8, 128, 8.0, 8.0, 2, Slo(800, 40))
    # 8xH100 holds 640 GB, far above rho x 16 GB: the memory cut alone would leave nothing
    got = enumerate_multisets(m8, [eight_h100], n_max=6, rho=12.0, shape=SHAPE, runtime="vllm")
    assert got == [(0,)]  # the one node, not 2..6 of them
    small = _model(0.5, heads=16, kv_heads=2)
    got = enumerate_multisets(small, [NodeConfig(MI300X, 8)], n_max=6, rho=12.0, shape=SHAPE, runtime="vllm")
    assert got == [(0,)]
    # where a multiset under the cut exists, the cut still trims the rest
    l4 = load_catalog().config("1xL4")
    got = enumerate_multisets(m8, [l4, eight_h100], n_max=2, rho=12.0, shape=SHAPE, runtime="vllm")
    assert got and all(0 in ms and 1 not in ms for ms in got)


def test_the_reason_names_heads_weights_or_slo() -> None:
    qwen05 = _model(0.49, heads=14, kv_heads=2)
    why = why_unservable(qwen05, [NodeConfig(MI300X, 8)], 6, SHAPE, "vllm", [Phase.PREFILL])
    assert "heads do not split" in why and "14 attention heads" in why and "runtime: any" in why
    huge = ModelSpec("Huge", 80, 8192, 64, 8, 128, 2000.0, 2000.0, 2, Slo(800, 40))
    why = why_unservable(huge, [load_catalog().config("1xL4")], 6, SHAPE, "vllm", [Phase.DECODE])
    assert "no offered config holds its weights" in why and "n_max=6" in why
