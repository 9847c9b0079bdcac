"""The model catalog: public architecture facts and SLOs.

Sources: each model's Hugging Face ``config.json`` / model card (layers, hidden size, heads,
KV heads, head dim, experts, parameter counts). SLOs of the six serving models are those of the
Coral evaluation (prefill TTFT / decode per-token ms). The calibration models are the ones the
public profiles were measured on; their SLOs follow the serving model of the same size class.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import replace

from atoll.solvers.registry import Registry
from atoll.solvers.types import ModelSpec, Slo

# MXFP4 checkpoints: experts in 4.25-bit MXFP4, attention and embeddings in bf16; the
# effective bytes/param is checkpoint size / parameter count (13.8 GB / 20.9 B, 65 GB / 116.8 B).
_GPT_OSS_20B_BPP = 13.8 / 20.9
_GPT_OSS_120B_BPP = 65.0 / 116.8

_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(name="Phi-4-14B", layers=40, hidden=5120, heads=40, kv_heads=10, head_dim=128,
              params_b=14.7, active_params_b=14.7, bytes_per_param=2.0, vocab=100352,
              slo=Slo(1200, 60), aliases=("phi-4", "phi4")),
    ModelSpec(name="GPT-OSS-20B", layers=24, hidden=2880, heads=64, kv_heads=8, head_dim=64,
              params_b=20.9, active_params_b=3.6, bytes_per_param=_GPT_OSS_20B_BPP, experts=32,
              active_experts=4, vocab=201088, precision="mxfp4", slo=Slo(900, 30),
              aliases=("gpt-oss-20b",)),
    ModelSpec(name="Qwen3-32B", layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128,
              params_b=32.8, active_params_b=32.8, bytes_per_param=2.0, vocab=151936,
              slo=Slo(1600, 100), aliases=("qwen3-32b",)),
    ModelSpec(name="Llama-3-70B", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
              params_b=70.6, active_params_b=70.6, bytes_per_param=2.0, vocab=128256,
              slo=Slo(1500, 80), aliases=("llama3-70b", "meta-llama-3-70b")),
    ModelSpec(name="GPT-OSS-120B", layers=36, hidden=2880, heads=64, kv_heads=8, head_dim=64,
              params_b=116.8, active_params_b=5.1, bytes_per_param=_GPT_OSS_120B_BPP,
              experts=128, active_experts=4, vocab=201088, precision="mxfp4", slo=Slo(1000, 40),
              aliases=("gpt-oss-120b",)),
    ModelSpec(name="Qwen3-235B-A22B", layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128,
              params_b=235.1, active_params_b=22.2, bytes_per_param=2.0, experts=128,
              active_experts=8, vocab=151936, slo=Slo(1800, 120), aliases=("qwen3-235b",)),
    # Models the public profiles were measured on (calibration).
    ModelSpec(name="LLaMA-30B", layers=60, hidden=6656, heads=52, kv_heads=52, head_dim=128,
              params_b=32.5, active_params_b=32.5, bytes_per_param=2.0, slo=Slo(1600, 100),
              role="calibration", aliases=("llama1_30b", "llama-30b")),
    ModelSpec(name="Llama-2-70B", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
              params_b=69.0, active_params_b=69.0, bytes_per_param=2.0, slo=Slo(1500, 80),
              role="calibration", aliases=("llama2_70b", "llama2-70b", "llama-2-70b-hf")),
    ModelSpec(name="Llama-2-7B", layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128,
              params_b=6.74, active_params_b=6.74, bytes_per_param=2.0, slo=Slo(1200, 60),
              role="calibration", aliases=("llama-2-7b-hf",)),
    ModelSpec(name="Llama-3-8B", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
              params_b=8.03, active_params_b=8.03, bytes_per_param=2.0, vocab=128256,
              slo=Slo(1200, 60), role="calibration", aliases=("meta-llama-3-8b",)),
)

DEFAULT_MODELS: tuple[str, ...] = tuple(m.name for m in _MODELS if m.role == "serving")


def fleet_model_names(n: int) -> tuple[str, ...]:
    """``n`` model names for a fleet of many models: the six serving models in turn, then the
    same architectures again as fine-tunes ``<model>-ft<k>`` (k = 1, 2, ...), so 20 models are
    each serving model three or four times. A fine-tune has its base's architecture and SLO and
    its own demand, templates and replicas (it is a separate deployment)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"fleet_model_names: n must be an integer >= 1, got {n!r}")
    base = DEFAULT_MODELS
    return tuple(base[i % len(base)] if i < len(base) else f"{base[i % len(base)]}-ft{i // len(base)}"
                 for i in range(n))


@functools.lru_cache(maxsize=256)
def _fine_tune(name: str) -> ModelSpec | None:
    """``<serving model>-ft<k>`` (k >= 1): that model's architecture and SLO under this name
    (resolved by name, not listed, so an unknown name's error lists only the real models)."""
    base, sep, k = name.rpartition("-ft")
    if not (sep and k.isdigit() and int(k) >= 1 and base in DEFAULT_MODELS):
        return None
    return replace(next(m for m in _MODELS if m.name == base), name=name, role="variant", aliases=())


def model_registry(extra: Iterable[ModelSpec] = ()) -> Registry[ModelSpec]:
    """Every model by name (aliases resolve too); user models override built-ins."""
    reg = Registry[ModelSpec]("model")
    for m in (*_MODELS, *extra):
        reg[m.name] = m
    return reg


def get_model(name: str, extra: Iterable[ModelSpec] = ()) -> ModelSpec:
    """A model by name or alias: the built-in ones, ``extra`` (a fleet file's own models, which
    override built-ins of the same name) and the fine-tunes ``<serving model>-ft<k>``."""
    reg = model_registry(extra)
    for m in reg.values():
        if name.lower() in (a.lower() for a in m.aliases):
            return m
    if name not in reg and (tuned := _fine_tune(name)) is not None:
        return tuned
    return reg[name]
