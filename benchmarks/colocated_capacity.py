"""The co-located replica's shared weight pass against Vidur's linear-layer profiles.

A co-located (chunked-prefill) step carries b decode sequences and a prompt chunk of c tokens;
:func:`atoll.solvers.perf.mixed_step_seconds` assumes the linear layers see all T = b + c tokens
in one pass over the weights: per layer, max(2·active_params·T / (n·peak·eta_c),
weight_bytes / (n·HBM_bw·eta_m)). Nobody publishes a whole mixed step (see ``no_mixed_step_data``
in the output), but Vidur (Agrawal et al., MLSys 2024) profiles exactly the shared part: the
linear operators of ONE transformer layer, by the total number of tokens in the batch and the
tensor-parallel degree, on A100 / H100 / A40. This script compares the two:

- measured: the sum of the median times of the GEMMs (attn_pre_proj = QKV, attn_post_proj = O,
  mlp_up_proj = gate+up, mlp_down_proj) of each (GPU, model, TP, tokens) row; duplicate rows of
  one key are averaged. Variants add mlp_act and the two layernorms, or every non-embedding op;
- predicted: atoll's dense FLOPs and weight bytes of one layer (:func:`step_terms` with no
  attention: context 0, the KV write subtracted) under the fitted factors of the package table,
  divided over the TP GPUs; no attention FLOPs, KV bytes, per-layer overhead or all-reduce
  (Vidur's mlp.csv has none of those kernels);
- per GPU: the median absolute percentage error (MdAPE) over all rows and over the token range
  of mixed batches (64..4096), the "free rider" share (rows whose time is within 10% of the
  group's minimum at 1..32 tokens: tokens a chunk adds at no cost), measured and predicted, and
  the knee (the token count where the layer turns compute bound) fitted to the measurements
  against atoll's, peak·eta_c·bytes_per_param / (2·bw·eta_m).

Every row is held out: the factors were fitted on Helix, Splitwise and LLM-Inference-Bench only
(checked below against :data:`atoll.solvers.profiles.DATASETS` and the calibration's source).

One JSON document on stdout (progress on stderr), also written to
``benchmarks/results/colocated_capacity.json`` (``--out`` to change). Deterministic; ~5 s.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import inspect
import json
import math
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from atoll.solvers import calibrate as calibrate_mod
from atoll.solvers import profiles as profiles_mod
from atoll.solvers.calibrate import rounded
from atoll.solvers.catalog import load_catalog
from atoll.solvers.models import get_model
from atoll.solvers.paths import shared_data_dir
from atoll.solvers.perf import SIBLING, load_factors, step_terms
from atoll.solvers.types import GpuType, ModelSpec, NodeConfig, Phase, Slo

OUT = Path(__file__).resolve().parent / "results" / "colocated_capacity.json"
VIDUR = "vidur-profiling"
COMPUTE = Path("data") / "profiling" / "compute"
GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ACT_NORMS = ("mlp_act", "input_layernorm", "post_attention_layernorm")
OTHER_OPS = ("attn_rope", "add")  # "emb" is once per model, not per layer: left out everywhere
MIXED_RANGE = (64, 4096)  # token counts of a mixed step (decode batch + prompt chunk)
FREE_MAX_TOKENS = 32  # the free-rider baseline: the group's fastest row at 1..32 tokens
FREE_TOLERANCE = 0.10
KNEE_GRID = np.geomspace(1.0, 65536.0, 1601)
TOKEN_BANDS = ((1, 32), (33, 128), (129, 512), (513, 2048), (2049, 4096), (4097, 32768))

# Vidur's SKU -> atoll's GPU type. Vidur's A100 is the 80 GB card (its device config:
# total_memory_gb = 80); whether SXM (2039 GB/s) or PCIe (1935 GB/s) is not recorded.
VIDUR_GPUS = {"a100": "A100-80GB", "h100": "H100", "a40": "A40"}
# The A40 is not in atoll's catalog. Its datasheet (GA102, 48 GB GDDR6): 696 GB/s, 149.7 dense
# fp16 tensor TFLOPS (299.4 with sparsity), NVLink bridge 112.5 GB/s both ways. It has no fitted
# factors and no sibling, so PerfFactors lends it the median of the fitted GPUs' factors (what
# atoll does for a user's own card); reported apart from the catalogued GPUs.
A40 = GpuType(name="A40", memory_gb=48.0, hbm_bandwidth_gbs=696.0, bf16_tflops=149.7, link_gbs=56.25,
              family="Ampere-GDDR")

# Vidur's model folder -> (atoll catalog name or None, layers, real vocab, tied embeddings).
# Layers and vocab from each model's Hugging Face config.json (Vidur's CSV pads Llama-2's vocab
# to 32768 and does not record the layer count); everything else comes from the CSV's dims.
VIDUR_MODELS: dict[str, tuple[str | None, int, int, bool]] = {
    "meta-llama/Llama-2-7b-hf": ("Llama-2-7B", 32, 32000, False),
    "meta-llama/Llama-2-70b-hf": ("Llama-2-70B", 80, 32000, False),
    "meta-llama/Meta-Llama-3-8B": ("Llama-3-8B", 32, 128256, False),
    "meta-llama/Meta-Llama-3-70B": ("Llama-3-70B", 80, 128256, False),
    "codellama/CodeLlama-34b-Instruct-hf": (None, 48, 32000, False),  # 33.7B published
    "internlm/internlm-20b": (None, 60, 103168, False),  # 20B published
    "Qwen/Qwen-72B": (None, 80, 152064, False),  # 72B published
    "microsoft/phi-2": (None, 32, 51200, False),  # 2.7B published; untied lm_head
}


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    inter: int
    gated: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def linear_params(self) -> float:
        """Weights of one layer's four GEMMs (biases, a <0.1% share, left out)."""
        h, hd = self.hidden, self.head_dim
        qkv = h * (self.heads + 2 * self.kv_heads) * hd
        out = self.heads * hd * h
        mlp = (3 if self.gated else 2) * h * self.inter
        return float(qkv + out + mlp)


@dataclass
class Group:
    """One (GPU, model, TP) series: per token count, the averaged per-op medians (ms)."""

    gpu: str
    model: str
    tp: int
    dims: Dims
    ops: dict[int, dict[str, float]]


def read_groups(root: Path) -> tuple[list[Group], int]:
    groups: dict[tuple[str, str, int], Group] = {}
    acc: dict[tuple[str, str, int, int], list[dict[str, float]]] = defaultdict(list)
    raw = 0
    for sku in sorted(VIDUR_GPUS):
        for path in sorted((root / COMPUTE / sku).glob("*/*/mlp.csv.gz")):
            model = f"{path.parent.parent.name}/{path.parent.name}"
            if model not in VIDUR_MODELS:
                raise SystemExit(f"unmapped Vidur model {model} ({path}): add it to VIDUR_MODELS")
            with gzip.open(path, "rt", newline="") as fh:
                for r in csv.DictReader(fh):
                    raw += 1
                    tp, tokens = int(r["num_tensor_parallel_workers"]), int(r["num_tokens"])
                    dims = Dims(int(r["n_embd"]), int(r["n_head"]), int(r["n_kv_head"]),
                                int(r["n_expanded_embd"]), r["use_gated_mlp"] == "True")
                    key = (sku, model, tp)
                    if key not in groups:
                        groups[key] = Group(sku, model, tp, dims, {})
                    elif groups[key].dims != dims:
                        raise SystemExit(f"{path}: model dims change between rows")
                    # phi-2 (parallel attention + MLP) has one layernorm: an absent op counts 0
                    acc[(*key, tokens)].append({op: float(r.get(f"time_stats.{op}.median") or 0.0)
                                                for op in (*GEMMS, *ACT_NORMS, *OTHER_OPS)})
    for (sku, model, tp, tokens), rows in sorted(acc.items()):
        groups[(sku, model, tp)].ops[tokens] = {op: sum(x[op] for x in rows) / len(rows) for op in rows[0]}
    return [groups[k] for k in sorted(groups)], raw


def model_spec(vidur_name: str, dims: Dims) -> tuple[ModelSpec, str]:
    """atoll's catalog entry when one matches (checked against the CSV's dims), else a ModelSpec
    built the catalog's way: total parameters (embeddings and norms included) from the dims."""
    name, layers, vocab, tied = VIDUR_MODELS[vidur_name]
    if name is not None:
        m = get_model(name)
        if (m.hidden, m.heads, m.kv_heads, m.head_dim, m.layers) != (
                dims.hidden, dims.heads, dims.kv_heads, dims.head_dim, layers):
            raise SystemExit(f"atoll's {name} does not match Vidur's {vidur_name} dims {dims}")
        return m, "catalog"
    total = layers * (dims.linear_params + 2 * dims.hidden) + vocab * dims.hidden * (1 if tied else 2)
    m = ModelSpec(name=vidur_name.split("/")[1], layers=layers, hidden=dims.hidden, heads=dims.heads,
                  kv_heads=dims.kv_heads, head_dim=dims.head_dim, params_b=total / 1e9,
                  active_params_b=total / 1e9, bytes_per_param=2.0, vocab=vocab, slo=Slo(1500, 80),
                  role="calibration")
    return m, "constructed from the CSV dims + config.json layers/vocab"


def linear_seconds(model: ModelSpec, config: NodeConfig, tokens: np.ndarray, eta_c: float,
                   eta_m: float) -> np.ndarray:
    """atoll's dense part of one layer at ``tokens`` tokens: step_terms with no attention (context 0)
    and without the KV write, under the roofline of perf.step_seconds."""
    out = np.empty(len(tokens))
    gpu, n = config.gpu, config.count
    for i, t in enumerate(tokens):
        flops, nbytes, _ = step_terms(model, 1, Phase.PREFILL, tokens=float(t), context=0.0)
        nbytes -= float(t) * model.kv_bytes_per_token_layer
        out[i] = max(flops / (n * gpu.bf16_tflops * 1e12 * eta_c),
                     nbytes / (n * gpu.hbm_bandwidth_gbs * 1e9 * eta_m))
    return out


def arch_seconds(params: float, config: NodeConfig, tokens: np.ndarray, eta_c: float,
                 eta_m: float) -> np.ndarray:
    """The same roofline with the layer's exact GEMM weights (no embedding share)."""
    gpu, n = config.gpu, config.count
    return np.maximum(2.0 * params * tokens / (n * gpu.bf16_tflops * 1e12 * eta_c),
                      2.0 * params / (n * gpu.hbm_bandwidth_gbs * 1e9 * eta_m))


def fit_knee(tokens: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """Least squares in log time of the roofline shape t = a·max(1, T/K): (K, a)."""
    lt, lT = np.log(seconds), np.log(tokens)
    lk = np.log(KNEE_GRID)[:, None]
    r = lt[None, :] - np.maximum(0.0, lT[None, :] - lk)
    la = r.mean(axis=1)
    sse = ((r - la[:, None]) ** 2).sum(axis=1)
    i = int(np.argmin(sse))
    return float(KNEE_GRID[i]), float(math.exp(la[i]))


def free_mask(tokens: np.ndarray, seconds: np.ndarray) -> tuple[np.ndarray, int]:
    """Rows within FREE_TOLERANCE of the fastest row at <= FREE_MAX_TOKENS tokens, and the largest
    token count before the first row that is not."""
    base = seconds[tokens <= FREE_MAX_TOKENS].min()
    free = seconds <= (1.0 + FREE_TOLERANCE) * base
    order = np.argsort(tokens)
    last = int(tokens[order[0]])
    for i in order:
        if not free[i]:
            break
        last = int(tokens[i])
    return free, last


def split_sums(tokens: np.ndarray, measured: np.ndarray, predicted: np.ndarray) -> dict[str, np.ndarray]:
    """Every split T = b + c of the group's token counts with b, c and T all measured and T in the
    mixed range: the measured parts run apart over the fused batch (t(b) + t(c)) / t(T), and atoll's
    separate-pass prediction over the fused measurement (pred(b) + pred(c)) / t(T)."""
    at = {int(t): i for i, t in enumerate(tokens)}
    apart, bound = [], []
    for b in at:
        for c in at:
            if c < b or (b + c) not in at or not MIXED_RANGE[0] <= b + c <= MIXED_RANGE[1]:
                continue
            i, j, k = at[b], at[c], at[b + c]
            apart.append((measured[i] + measured[j]) / measured[k])
            bound.append((predicted[i] + predicted[j]) / measured[k])
    return {"apart": np.asarray(apart), "bound": np.asarray(bound)}


def split_summary(splits: list[dict[str, np.ndarray]]) -> dict[str, float]:
    apart = np.concatenate([s["apart"] for s in splits])
    bound = np.concatenate([s["bound"] for s in splits])
    def share(x: np.ndarray) -> float:
        return float((x >= 1.0).mean()) if len(x) else float("nan")

    return {"splits": int(len(apart)),
            "measured_apart_over_fused_median": _med(apart),
            "share_measured_apart_at_least_fused": share(apart),
            "separate_prediction_over_fused_median": _med(bound),
            "share_separate_prediction_at_least_fused": share(bound)}


def _med(x: list[float] | np.ndarray) -> float:
    return float(np.median(x)) if len(x) else float("nan")


def summarize(recs: list[dict], groups: list[dict]) -> dict:
    """Error and regime figures over rows ``recs`` (each a dict of arrays of one group)."""
    cat = {k: np.concatenate([r[k] for r in recs]) for k in recs[0] if isinstance(recs[0][k], np.ndarray)}
    T = cat["tokens"]
    mixed = (T >= MIXED_RANGE[0]) & (T <= MIXED_RANGE[1])

    def err(pred: str, meas: str, mask: np.ndarray | None = None) -> dict[str, float]:
        m = np.ones(len(T), bool) if mask is None else mask
        rel = cat[pred][m] / cat[meas][m] - 1.0
        p90 = float(np.quantile(np.abs(rel), 0.9)) if len(rel) else float("nan")
        return {"mdape": _med(np.abs(rel)), "median_signed": _med(rel), "p90_ape": p90, "rows": int(m.sum())}

    knees_meas = [g["knee_measured"] for g in groups]
    knees_pred = [g["knee_predicted"] for g in groups]
    return {
        "rows": len(T), "groups": len(groups),
        "gemm": {"all": err("pred", "gemm"), "mixed_64_4096": err("pred", "gemm", mixed)},
        "by_token_band": {f"{lo}-{hi}": err("pred", "gemm", (T >= lo) & (T <= hi))
                          for lo, hi in TOKEN_BANDS if ((T >= lo) & (T <= hi)).any()},
        "variants": {
            "measured_gemm_plus_act_norms": {"all": err("pred", "gemm_act"),
                                             "mixed_64_4096": err("pred", "gemm_act", mixed)},
            "predicted_with_exact_layer_gemm_params": {"all": err("pred_arch", "gemm"),
                                                       "mixed_64_4096": err("pred_arch", "gemm", mixed)},
            "measured_all_layer_ops_vs_predicted_plus_t_layer": {
                "all": err("pred_tl", "all_ops"), "mixed_64_4096": err("pred_tl", "all_ops", mixed)},
        },
        "free_rider": {
            "definition": f"time at T within {FREE_TOLERANCE:.0%} of the group's fastest row at "
                          f"T <= {FREE_MAX_TOKENS}",
            "share_all_rows": {"measured": float(cat["free_meas"].mean()),
                               "predicted": float(cat["free_pred"].mean())},
            "share_mixed_64_4096": {"measured": float(cat["free_meas"][mixed].mean()),
                                    "predicted": float(cat["free_pred"][mixed].mean())},
            "largest_free_tokens_median_over_groups": {
                "measured": _med([g["free_until_measured"] for g in groups]),
                "predicted": _med([g["free_until_predicted"] for g in groups])},
        },
        "knee_tokens": {
            "definition": "measured: least squares in log time of t = a·max(1, T/K) per (model, TP) "
                          "group; asymptotes: the floor at <= 32 tokens x the compute rate at 2048..4096 "
                          "tokens (where the two measured asymptotes cross); predicted: atoll's ridge "
                          "peak·eta_c·bytes_per_param / (2·bw·eta_m)",
            "measured_median_over_groups": _med(knees_meas),
            "asymptotes_median_over_groups": _med([g["knee_asymptotes"] for g in groups]),
            "measured_range_over_groups": [float(min(knees_meas)), float(max(knees_meas))],
            "predicted_median_over_groups": _med(knees_pred),
            "measured_over_predicted_median": _med(np.asarray(knees_meas) / np.asarray(knees_pred)),
        },
        "implied_efficiency": {
            "note": "the efficiencies the measurements imply at the memory floor (fastest row at <= 32 "
                    "tokens) and in the compute regime (median rate at 2048..4096 tokens), with atoll's "
                    "layer parameters (comparable to the fitted factors) and with the layer's exact GEMM "
                    "weights (the hardware's)",
            **{f"{k}_median": _med([g[k] for g in groups])
               for k in ("eta_m_floor_atoll_params", "eta_c_2048_4096_atoll_params",
                         "eta_m_floor_gemm_params", "eta_c_2048_4096_gemm_params")},
        },
    }


def check_held_out() -> dict:
    """Vidur is in none of the calibration's datasets nor mentioned by its code."""
    src = inspect.getsource(calibrate_mod) + inspect.getsource(profiles_mod)
    mentioned = "vidur" in src.lower()
    return {"calibration_datasets": list(profiles_mod.DATASETS),
            "vidur_in_calibration_datasets": any("vidur" in d for d in profiles_mod.DATASETS),
            "vidur_mentioned_in_calibrate_or_profiles_source": mentioned,
            "verified": not mentioned and not any("vidur" in d for d in profiles_mod.DATASETS)}


def check_no_mixed_data(data: Path, vidur: Path) -> dict:
    with (data / "splitwise-sim-perf" / "perf_model.csv").open(newline="") as fh:
        cols = next(csv.reader(fh))
    attention = sorted(str(p.relative_to(vidur)) for p in (vidur / COMPUTE).rglob("attention.csv*"))
    return {
        "splitwise_perf_model_columns": cols,
        "splitwise": "prompt_time (whole prefill) and token_time (decode step) are separate columns of "
                     "separate phases; no row mixes a prompt chunk into a decode batch",
        "vidur": "mlp.csv profiles linear ops by total tokens (what a mixed step shares); every "
                 f"attention.csv is absent from the bundle (found: {attention or 'none'}), and Vidur's "
                 "simulator composes mixed batches from operator profiles rather than measuring them",
        "helix": "per-layer prompt and decode times, separate files (prompt_bs2time / decode_bs2time)",
        "llm-inference-bench": "whole offline batches' latency (input = output length); no per-step times",
        "conclusion": "no measured time of a whole mixed (prefill chunk + decode) step exists in the "
                      "bundled data; only the shared linear-layer part is tested here",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="accepted; the JSON document is printed either way")
    ap.add_argument("--out", type=Path, default=OUT, help=f"output file (default {OUT})")
    args = ap.parse_args(argv)
    t0 = time.process_time()

    data = shared_data_dir()
    vidur = data / VIDUR
    say(f"reading {vidur / COMPUTE}")
    groups, raw_rows = read_groups(vidur)
    catalog = load_catalog()
    factors = load_factors()
    gpus = {sku: catalog.gpus.get(name, A40 if name == "A40" else None) for sku, name in VIDUR_GPUS.items()}

    specs: dict[str, dict] = {}
    per_gpu: dict[str, list[dict]] = defaultdict(list)
    group_out: dict[str, list[dict]] = defaultdict(list)
    splits: dict[str, list[dict[str, np.ndarray]]] = defaultdict(list)
    for g in groups:
        model, source = model_spec(g.model, g.dims)
        gpu = gpus[g.gpu]
        assert gpu is not None
        config = NodeConfig(gpu, g.tp)
        eta_c, eta_m = factors.compute_eff(gpu.name), factors.memory_eff(gpu.name)
        if g.model not in specs:
            specs[g.model] = {
                "atoll_model": model.name, "source": source, "params_b": model.params_b,
                "atoll_layer_active_params_m": model.layer_active_params / 1e6,
                "layer_gemm_params_m": g.dims.linear_params / 1e6,
                "atoll_over_gemm_params": model.layer_active_params / g.dims.linear_params,
                "dims": {"hidden": g.dims.hidden, "heads": g.dims.heads, "kv_heads": g.dims.kv_heads,
                         "head_dim": g.dims.head_dim, "intermediate": g.dims.inter,
                         "gated_mlp": g.dims.gated, "layers": model.layers}}
        T = np.asarray(sorted(g.ops), dtype=float)
        ops = [g.ops[int(t)] for t in T]
        gemm = np.asarray([sum(o[k] for k in GEMMS) for o in ops]) / 1e3
        gemm_act = gemm + np.asarray([sum(o[k] for k in ACT_NORMS) for o in ops]) / 1e3
        all_ops = gemm_act + np.asarray([sum(o[k] for k in OTHER_OPS) for o in ops]) / 1e3
        pred = linear_seconds(model, config, T, eta_c, eta_m)
        pred_arch = arch_seconds(g.dims.linear_params, config, T, eta_c, eta_m)
        free_meas, until_meas = free_mask(T, gemm)
        free_pred, until_pred = free_mask(T, pred)
        knee, plateau = fit_knee(T, gemm)
        knee_pred = (gpu.bf16_tflops * 1e12 * eta_c * model.bytes_per_param
                     / (2.0 * gpu.hbm_bandwidth_gbs * 1e9 * eta_m))
        # the measured asymptotes: the weight-streaming floor (fastest row at <= 32 tokens) and the
        # compute rate (median tokens/s at 2048..4096 tokens); their ratio is the roofline's ridge
        floor = float(gemm[T <= FREE_MAX_TOKENS].min())
        big = (T >= 2048) & (T <= 4096)
        rate = float(np.median(T[big] / gemm[big]))
        implied = {"knee_asymptotes": floor * rate}
        for name, params in (("atoll_params", model.layer_active_params),
                             ("gemm_params", g.dims.linear_params)):
            implied[f"eta_m_floor_{name}"] = 2.0 * params / (g.tp * gpu.hbm_bandwidth_gbs * 1e9 * floor)
            implied[f"eta_c_2048_4096_{name}"] = 2.0 * params * rate / (g.tp * gpu.bf16_tflops * 1e12)
        rec = {"tokens": T, "gemm": gemm, "gemm_act": gemm_act, "all_ops": all_ops, "pred": pred,
               "pred_arch": pred_arch, "pred_tl": pred + factors.t_layer_ms * 1e-3,
               "free_meas": free_meas, "free_pred": free_pred}
        ginfo = {"model": g.model, "tp": g.tp, "rows": len(T),
                 "mdape": _med(np.abs(pred / gemm - 1.0)),
                 "mdape_mixed_64_4096": _med(np.abs(pred / gemm - 1.0)[(T >= 64) & (T <= 4096)]),
                 "knee_measured": knee, "knee_predicted": knee_pred,
                 "plateau_ms_measured": plateau * 1e3, "plateau_ms_predicted": float(pred[0]) * 1e3,
                 "free_until_measured": until_meas, "free_until_predicted": until_pred,
                 **implied}
        per_gpu[g.gpu].append(rec)
        group_out[g.gpu].append(ginfo)
        splits[g.gpu].append(split_sums(T, gemm, pred))
        say(f"{g.gpu} {g.model} TP{g.tp}: {len(T)} token counts, MdAPE {ginfo['mdape']:.3f}, "
            f"knee {knee:.0f} vs {knee_pred:.0f}")

    by_gpu: dict[str, dict] = {}
    for sku in sorted(per_gpu):
        gpu = gpus[sku]
        assert gpu is not None
        recs, ginfo = per_gpu[sku], group_out[sku]
        s = summarize(recs, ginfo)
        s["atoll_gpu"] = gpu.name
        s["in_atoll_catalog"] = gpu.name in catalog.gpus
        s["factors"] = {"eta_c": factors.compute_eff(gpu.name), "eta_m": factors.memory_eff(gpu.name),
                        "from": ("borrowed: median of the fitted GPUs' factors" if factors.borrowed(gpu.name)
                                 else f"fitted ({SIBLING.get(gpu.name, gpu.name)})")}
        for key, sel in (("by_tp", "tp"), ("by_model", "model")):
            s[key] = {}
            for v in sorted({gi[sel] for gi in ginfo}, key=str):
                idx = [i for i, gi in enumerate(ginfo) if gi[sel] == v]
                sub = summarize([recs[i] for i in idx], [ginfo[i] for i in idx])
                s[key][str(v)] = {"mdape": sub["gemm"]["all"]["mdape"],
                                  "mdape_mixed_64_4096": sub["gemm"]["mixed_64_4096"]["mdape"],
                                  "median_signed": sub["gemm"]["all"]["median_signed"],
                                  "knee_measured_median": sub["knee_tokens"]["measured_median_over_groups"]}
        s["separate_pass"] = split_summary(splits[sku])
        s["groups_detail"] = ginfo
        by_gpu[sku] = s

    cat_recs = [r for sku in per_gpu if by_gpu[sku]["in_atoll_catalog"] for r in per_gpu[sku]]
    cat_groups = [gi for sku in per_gpu if by_gpu[sku]["in_atoll_catalog"] for gi in group_out[sku]]
    pooled = summarize(cat_recs, cat_groups)
    for k in ("free_rider", "knee_tokens", "implied_efficiency"):
        pooled.pop(k)  # per-GPU quantities

    doc = {
        "what": "atoll's shared-weight-pass roofline (mixed_step_seconds' linear part) against Vidur's "
                "measured linear-layer time of one transformer layer at T tokens",
        "source": {"data": f"{VIDUR}/{COMPUTE}/<gpu>/<org>/<model>/mlp.csv.gz",
                   "origin": "github.com/microsoft/vidur @ 7d47513 (MIT); Agrawal et al., MLSys 2024",
                   "rows_raw": raw_rows, "rows_unique": sum(len(g.ops) for g in groups),
                   "duplicates": "rows repeating a (gpu, model, TP, tokens) key are averaged into one"},
        "measured": f"sum of the median times of {', '.join(GEMMS)} (ms -> s), one layer, one GPU of TP",
        "predicted": "max(2·layer_active_params·T / (n·peak·eta_c), layer_weight_bytes / (n·bw·eta_m)) from "
                     "perf.step_terms (context 0, KV write removed) with the package's fitted factors; "
                     "no attention, KV, per-layer overhead or all-reduce",
        "held_out": "all rows: Vidur is not in atoll's calibration",
        "held_out_check": check_held_out(),
        "gpu_map": {sku: {"atoll_gpu": gpus[sku].name,  # type: ignore[union-attr]
                          "in_atoll_catalog": gpus[sku].name in catalog.gpus}  # type: ignore[union-attr]
                    for sku in sorted(gpus)},
        "a40": "not in atoll's catalog (load_catalog().gpus has no A40): evaluated with a datasheet GpuType "
               "(696 GB/s, 149.7 TFLOPS) and the median factors atoll lends a card with none; excluded "
               "from the pooled figures",
        "models": specs,
        "mixed_range_tokens": list(MIXED_RANGE),
        "separate_pass": "by_gpu.*.separate_pass: the default co-located model charges a mixed step as its "
                         "parts run apart; over every split T = b + c (b, c, T measured, T in the mixed "
                         "range): measured t(b) + t(c) against the fused t(T) (is running apart ever "
                         "faster?), and atoll's pred(b) + pred(c) against the fused t(T) (is the default "
                         "an upper bound on the linear layers?)",
        "by_gpu": by_gpu,
        "catalogued_gpus_pooled": pooled,
        "no_mixed_step_data": check_no_mixed_data(data, vidur),
        "caveats": [
            "atoll's ModelSpec spreads embeddings over the layers (layer_active_params = params / layers); "
            "for Llama-3-8B's 128k vocabulary that is +15% over the layer's GEMM weights, +3-5% for the "
            "others (see models.*.atoll_over_gemm_params and the exact-params variant)",
            "CodeLlama-34b, internlm-20b, Qwen-72B and phi-2 have no atoll catalog entry: their ModelSpecs "
            "are built from the CSV dims with layers and vocabulary from config.json; biases ignored; "
            "phi-2 has a plain (not gated) MLP, which the GEMM parameter count follows",
            "Vidur's A100 is taken as A100-80GB (Vidur's SKU config: 80 GB); SXM vs PCIe (2039 vs 1935 "
            "GB/s) is not recorded",
            "the roofline has no per-kernel latency floor: at small weights per GPU (7B/phi-2, TP 4-8) "
            "the measured plateau is launch-bound and the prediction low (see by_tp)",
            "this tests only the linear layers a mixed step shares; attention time of a mixed step and "
            "the chunk's KV traffic are untested (no attention profiles in the bundle)",
        ],
    }
    doc = rounded(doc)
    text = json.dumps(doc, indent=1, sort_keys=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)
    say(f"wrote {args.out} ({time.process_time() - t0:.1f} s CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
