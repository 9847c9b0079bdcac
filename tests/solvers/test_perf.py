"""Performance model: hand-computed roofline, monotonicity, memory limits."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atoll.solvers.catalog import DEFAULT_GPU_TYPES, load_catalog
from atoll.solvers.models import DEFAULT_MODELS, get_model
from atoll.solvers.perf import (
    PerfFactors,
    RequestShape,
    kv_capacity_tokens,
    max_layers_that_fit,
    node_profile,
    step_seconds,
)
from atoll.solvers.types import PHASES, GpuType, ModelSpec, NodeConfig, Phase, Slo

TOY_GPU = GpuType("TOY", memory_gb=10.0, hbm_bandwidth_gbs=1000.0, bf16_tflops=100.0,
                  link_gbs=100.0)
# 10 layers of 0.1 B params (2e8 bytes each); KV: 2 x 8 heads x 128 x 2 bytes = 4096 B/token/layer
TOY_MODEL = ModelSpec(name="toy", layers=10, hidden=1024, heads=8, kv_heads=8, head_dim=128,
                      params_b=1.0, active_params_b=1.0, bytes_per_param=2.0, slo=Slo(100, 10))
HALF = PerfFactors(eta_c={"default": 0.5}, eta_m={"default": 0.5}, t_layer_ms=0.01,
                   eta_link=1.0, allreduce_latency_us=10.0)
CATALOG = load_catalog()


def test_decode_step_by_hand() -> None:
    cfg = NodeConfig(TOY_GPU, 1)
    # bytes = 10 x (2e8 weights + 100 ctx x 4096 KV) over 1000 GB/s x 0.5; compute is smaller
    expected = 10 * (2e8 + 100 * 4096) / 5e11 + 10 * 0.01e-3
    got = step_seconds(TOY_MODEL, cfg, 10, Phase.DECODE, tokens=1, context=100, factors=HALF)
    assert got == pytest.approx(expected, rel=1e-12)


def test_prefill_step_by_hand_is_compute_bound() -> None:
    cfg = NodeConfig(TOY_GPU, 1)
    tokens, length = 2048, 512
    flops = 10 * (2 * 1e8 * tokens + 2 * tokens * length * 1024)
    expected = flops / (100e12 * 0.5) + 10 * 0.01e-3
    got = step_seconds(TOY_MODEL, cfg, 10, Phase.PREFILL, tokens=tokens, context=length,
                       factors=HALF)
    assert got == pytest.approx(expected, rel=1e-12)


def test_tensor_parallel_pays_allreduce_by_hand() -> None:
    cfg = NodeConfig(TOY_GPU, 2)
    one = step_seconds(TOY_MODEL, NodeConfig(TOY_GPU, 1), 10, Phase.DECODE, tokens=4,
                       context=100, factors=HALF)
    two = step_seconds(TOY_MODEL, cfg, 10, Phase.DECODE, tokens=4, context=100, factors=HALF)
    roofline_two = (one - 10 * 0.01e-3) / 2
    # ring all-reduce of 4 x 1024 x 2 bytes, 2 per layer: 2(n-1)/n x msg / 100 GB/s + 10 us
    allreduce = 2 * (1 / 2) * 4 * 1024 * 2 / 100e9 + 10e-6
    assert two == pytest.approx(roofline_two + 10 * 0.01e-3 + 10 * 2 * allreduce, rel=1e-12)


def test_decode_profile_by_hand() -> None:
    cfg = NodeConfig(TOY_GPU, 1)
    shape = RequestShape(input_tokens=80, output_tokens=40)  # mean context 100
    # step(b) = 4e-3 + b x 8.192e-6 + 1e-4 <= 5e-3  ->  b <= 109.86  ->  b = 109 (memory allows 1220)
    step = 4e-3 + 109 * 8.192e-6 + 1e-4
    got = node_profile(TOY_MODEL, cfg, 10, Phase.DECODE, 5.0, shape=shape, factors=HALF)
    assert got == pytest.approx(109 / step, rel=1e-9)


def test_node_that_cannot_hold_layers_gives_zero() -> None:
    llama = get_model("Llama-3-70B")
    one_l4 = CATALOG.config("1xL4")
    assert max_layers_that_fit(llama, one_l4, RequestShape()) < llama.layers
    assert kv_capacity_tokens(llama, one_l4, llama.layers) < 0
    assert node_profile(llama, one_l4, llama.layers, Phase.DECODE, 1000.0) == 0.0
    assert node_profile(llama, one_l4, llama.layers, Phase.PREFILL, 10_000.0) == 0.0


def test_budget_too_small_gives_zero() -> None:
    phi = get_model("Phi-4-14B")
    assert node_profile(phi, CATALOG.config("8xH100"), phi.layers, Phase.DECODE, 0.01) == 0.0


def test_bad_arguments_are_named() -> None:
    phi = get_model("Phi-4-14B")
    with pytest.raises(ValueError, match="layers must be in 1..40"):
        node_profile(phi, CATALOG.config("1xH100"), 41, Phase.DECODE, 60)
    with pytest.raises(ValueError, match="budget_ms"):
        node_profile(phi, CATALOG.config("1xH100"), 40, Phase.DECODE, -1)
    with pytest.raises(ValueError, match="input_tokens"):
        RequestShape(input_tokens=0)


_models = st.sampled_from(DEFAULT_MODELS)
_configs = st.sampled_from([c.name for c in CATALOG.configs(DEFAULT_GPU_TYPES)])
_phases = st.sampled_from(list(PHASES))


@settings(max_examples=60, deadline=None)
@given(_models, _configs, _phases, st.integers(1, 94), st.integers(1, 94))
def test_more_layers_never_more_throughput(m: str, c: str, phase: Phase, a: int, b: int) -> None:
    model, cfg = get_model(m), CATALOG.config(c)
    lo, hi = sorted((min(a, model.layers), min(b, model.layers)))
    budget = model.slo.budget_ms(phase)
    assert node_profile(model, cfg, hi, phase, budget) <= node_profile(model, cfg, lo, phase, budget)


@settings(max_examples=60, deadline=None)
@given(_models, _configs, _phases, st.integers(1, 94), st.floats(1.0, 4000.0), st.floats(1.0, 3.0))
def test_larger_budget_never_less(m: str, c: str, phase: Phase, j: int, budget: float,
                                  scale: float) -> None:
    model, cfg = get_model(m), CATALOG.config(c)
    j = min(j, model.layers)
    assert node_profile(model, cfg, j, phase, budget * scale) >= node_profile(model, cfg, j, phase,
                                                                              budget)


@settings(max_examples=60, deadline=None)
@given(_models, _configs, st.integers(1, 94), st.floats(1.0, 4.0))
def test_more_bandwidth_never_less_decode(m: str, c: str, j: int, scale: float) -> None:
    model, cfg = get_model(m), CATALOG.config(c)
    j = min(j, model.layers)
    faster = NodeConfig(dataclasses.replace(cfg.gpu, hbm_bandwidth_gbs=cfg.gpu.hbm_bandwidth_gbs * scale),
                        cfg.count)
    budget = model.slo.tpot_ms
    assert node_profile(model, faster, j, Phase.DECODE, budget) >= node_profile(
        model, cfg, j, Phase.DECODE, budget)


def test_moe_reads_fewer_bytes_than_dense_twin() -> None:
    moe = get_model("GPT-OSS-120B")
    dense = dataclasses.replace(moe, name="dense-twin", active_params_b=moe.params_b, experts=1,
                                active_experts=1)
    cfg = CATALOG.config("1xH200")
    bare = dataclasses.replace(HALF, t_layer_ms=0.0)  # isolate the roofline term
    t_moe = step_seconds(moe, cfg, moe.layers, Phase.DECODE, tokens=1, context=1000, factors=bare)
    t_dense = step_seconds(dense, cfg, dense.layers, Phase.DECODE, tokens=1, context=1000,
                           factors=bare)
    # one token routes to 4 of 128 experts: ~5.1 B of 116.8 B parameters are read
    assert t_moe < t_dense / 10


def test_shipped_factors_are_fitted() -> None:
    from atoll.solvers.perf import load_factors

    f = load_factors()
    assert set(f.eta_c) >= {"T4", "L4", "V100", "A100", "H100"}
    assert all(0 < v <= 1 for v in [*f.eta_c.values(), *f.eta_m.values()])
    # GPUs without profiles borrow a sibling's factors rather than a default
    assert f.compute_eff("L40S") == f.eta_c["L4"] and f.compute_eff("H200") == f.eta_c["H100"]


def test_decode_sync_by_hand_and_only_for_tensor_parallel_decode() -> None:
    sync = dataclasses.replace(HALF, decode_hop_us=5.0, decode_skew=0.02)
    for n in (1, 2, 4, 8):
        cfg = NodeConfig(TOY_GPU, n)
        base = step_seconds(TOY_MODEL, cfg, 10, Phase.DECODE, tokens=4, context=100, factors=HALF)
        got = step_seconds(TOY_MODEL, cfg, 10, Phase.DECODE, tokens=4, context=100, factors=sync)
        stream = 10 * (2e8 + 4 * 100 * 4096) / 5e11  # one GPU's HBM stream time of the step
        extra = 0.0 if n == 1 else 10 * (n - 1) * 5e-6 + 0.02 * math.log2(n) * stream
        assert got - base == pytest.approx(extra, rel=1e-9, abs=1e-15)
        pre = [step_seconds(TOY_MODEL, cfg, 10, Phase.PREFILL, tokens=512, context=512, factors=f)
               for f in (HALF, sync)]
        assert pre[0] == pre[1]  # prefill is untouched


def test_shipped_decode_terms_make_tp8_no_faster_than_tp4_on_splitwise_setup() -> None:
    from atoll.solvers.perf import load_factors

    f = load_factors()
    assert f.decode_hop_us > 0 and f.decode_skew > 0
    llama = get_model("Llama-2-70B")
    t = {n: step_seconds(llama, CATALOG.config(f"{n}xH100"), llama.layers, Phase.DECODE, tokens=1,
                         context=600, factors=f) for n in (2, 4, 8)}
    assert t[4] < t[2] and t[8] >= 0.85 * t[4]  # Splitwise: TP8 decode ~ TP4 (30.6 vs 29.4 ms)


def test_old_factor_files_read_without_decode_terms() -> None:
    data = HALF.to_json()
    del data["decode_hop_us"], data["decode_skew"]
    f = PerfFactors.from_json(data)
    assert f.decode_hop_us == 0.0 and f.decode_skew == 0.0


def test_template_cache_key_follows_the_decode_terms() -> None:
    from atoll.solvers.templates import LibrarySpec

    spec = LibrarySpec(models=("Phi-4-14B",), regions=("aws:us-east-2",), gpu_types=("L4",), n_max=2)
    a = spec.jobs(factors=HALF)[0].key
    b = spec.jobs(factors=dataclasses.replace(HALF, decode_skew=0.01))[0].key
    assert a != b


def test_moe_at_tp4_and_8_is_flagged_unvalidated() -> None:
    from atoll.solvers.perf import template_unvalidated, unvalidated
    from atoll.solvers.tables import perf_rows

    moe, dense = get_model("Qwen3-235B-A22B"), get_model("Llama-3-70B")
    assert unvalidated(moe, CATALOG.config("4xH100")) and unvalidated(moe, CATALOG.config("8xH100"))
    assert not unvalidated(moe, CATALOG.config("2xH100")) and not unvalidated(dense, CATALOG.config("8xH100"))
    assert template_unvalidated(moe, ["1xL4", "8xA100-80GB"]) and not template_unvalidated(dense, ["8xH100"])
    rows = perf_rows([moe, dense], [CATALOG.config("8xH100"), CATALOG.config("1xH100")])
    assert [r["unvalidated"] for r in rows] == [True, False, False, False]
