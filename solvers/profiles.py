"""Measured public inference profiles, as rows the performance model can be fitted to.

Each observation is a measured time that the model predicts as a weighted sum of forward-step
times (``parts``): a per-layer step (Helix), a TTFT or a per-token step (Splitwise), or a whole
offline batch of prefill plus decode steps (LLM-Inference-Bench).

Assumptions, where a source leaves a quantity unstated:
- Helix per-layer prompt times are integers in ms: rows under 10 ms (>= 10% rounding) are
  dropped. Prompt batches are taken as prompts of up to 1024 tokens; decode rows as context 512.
- LLM-Inference-Bench's "Nvidia A100" is taken as A100-40GB (the Polaris system's card). A batch
  whose KV cache does not fit runs in waves of the largest batch that fits.
- Splitwise repeats each measurement; repeats are averaged into one row.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from atoll.solvers.catalog import Catalog
from atoll.solvers.models import get_model
from atoll.solvers.perf import kv_capacity_tokens
from atoll.solvers.types import ModelSpec, NodeConfig, Phase

HELIX_MACHINES = {"a100": ("A100-40GB", 1), "v100": ("V100", 1), "l4": ("L4", 1),
                  "l4x2": ("L4", 2), "t4": ("T4", 1), "t4x2": ("T4", 2), "t4x4": ("T4", 4)}
HELIX_MODELS = {"llama1_30b": "LLaMA-30B", "llama2_70b": "Llama-2-70B"}
HELIX_PROMPT_LEN = 1024
HELIX_DECODE_CONTEXT = 512
HELIX_MIN_PROMPT_MS = 10.0
SPLITWISE_GPUS = {"a100-80gb": "A100-80GB", "h100-80gb": "H100"}
BENCH_GPUS = {"Nvidia A100 GPU": "A100-40GB", "Nvidia H100 GPU": "H100"}
BENCH_MODELS = {"meta-llama/Llama-2-7b-hf": "Llama-2-7B", "meta-llama/Meta-Llama-3-8B": "Llama-3-8B",
                "meta-llama/Llama-2-70b-hf": "Llama-2-70B",
                "meta-llama/Meta-Llama-3-70B": "Llama-3-70B"}
DATASETS = ("helix", "splitwise", "llm-inference-bench")


@dataclass(frozen=True)
class StepPart:
    """``weight`` x the time of one forward step with these arguments."""

    phase: Phase
    layers: int
    tokens: float
    context: float
    weight: float


@dataclass(frozen=True)
class Observation:
    dataset: str
    gpu: str
    config: NodeConfig
    model: ModelSpec
    measured_s: float
    parts: tuple[StepPart, ...]
    group: str  # rows of one group share a configuration; splits never cut a group


def _need(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"profile file missing: {path} — check ATOLL_SHARED_DATA")
    return path


def helix(data: Path, catalog: Catalog) -> list[Observation]:
    root = data / "helix-profiles" / "simulator" / "model_manager"
    out: list[Observation] = []
    for mdir, mname in HELIX_MODELS.items():
        model = get_model(mname)
        for machine, (gpu, n) in HELIX_MACHINES.items():
            config = NodeConfig(catalog.gpus[gpu], n)
            for fname, phase in (("prompt_bs2time.csv", Phase.PREFILL),
                                 ("decode_bs2time.csv", Phase.DECODE)):
                with _need(root / mdir / machine / fname).open() as fh:
                    for batch_s, ms_s in csv.reader(fh):
                        batch, ms = float(batch_s), float(ms_s)
                        if batch <= 0 or ms <= 0:
                            continue
                        if phase is Phase.PREFILL and ms < HELIX_MIN_PROMPT_MS:
                            continue
                        ctx = (min(batch, HELIX_PROMPT_LEN) if phase is Phase.PREFILL
                               else HELIX_DECODE_CONTEXT)
                        part = StepPart(phase, 1, batch, ctx, 1.0)
                        out.append(Observation("helix", gpu, config, model, ms / 1e3, (part,),
                                               f"helix/{mdir}/{machine}/{phase.value}/{batch:g}"))
    return out


def splitwise(data: Path, catalog: Catalog) -> list[Observation]:
    sums: dict[tuple[str, int, int, int, int], list[tuple[float, float]]] = defaultdict(list)
    with _need(data / "splitwise-sim-perf" / "perf_model.csv").open(newline="") as fh:
        for r in csv.DictReader(fh):
            if r["model"] != "llama2-70b" or r["hardware"] not in SPLITWISE_GPUS:
                continue
            key = (SPLITWISE_GPUS[r["hardware"]], int(r["tensor_parallel"]), int(r["prompt_size"]),
                   int(r["batch_size"]), int(r["token_size"]))
            sums[key].append((float(r["prompt_time"]), float(r["token_time"])))
    model = get_model("Llama-2-70B")
    out: list[Observation] = []
    for (gpu, tp, prompt, batch, toks), vals in sorted(sums.items()):
        config = NodeConfig(catalog.gpus[gpu], tp)
        group = f"splitwise/{gpu}/{tp}/{prompt}/{batch}/{toks}"
        ttft = sum(v[0] for v in vals) / len(vals) / 1e3
        tbt = sum(v[1] for v in vals) / len(vals) / 1e3
        out.append(Observation("splitwise", gpu, config, model, ttft,
                               (StepPart(Phase.PREFILL, model.layers, batch * prompt, prompt, 1.0),),
                               group + "/ttft"))
        out.append(Observation("splitwise", gpu, config, model, tbt,
                               (StepPart(Phase.DECODE, model.layers, batch, prompt + toks / 2, 1.0),),
                               group + "/tbt"))
    return out


def inference_bench(data: Path, catalog: Catalog) -> list[Observation]:
    out: list[Observation] = []
    with _need(data / "llm-inference-bench" / "Plots" / "All_results.csv").open(newline="") as fh:
        for r in csv.DictReader(fh):
            if (r["Framework"] != "vLLM" or r["Hardware"] not in BENCH_GPUS
                    or r["Model"] not in BENCH_MODELS):
                continue
            gpu, model = BENCH_GPUS[r["Hardware"]], get_model(BENCH_MODELS[r["Model"]])
            config = NodeConfig(catalog.gpus[gpu], int(r["Num of Hardware"]))
            batch, length = int(r["Batch Size"]), int(r["Input Output Length"])
            cap_seqs = math.floor(kv_capacity_tokens(model, config, model.layers) / (2 * length))
            if cap_seqs < 1:
                continue  # the benchmark could not have run this without offloading
            conc = min(batch, cap_seqs)
            waves = math.ceil(batch / conc)
            parts = (StepPart(Phase.PREFILL, model.layers, conc * length, length, waves),
                     StepPart(Phase.DECODE, model.layers, conc, 1.5 * length, waves * length))
            out.append(Observation("llm-inference-bench", gpu, config, model, float(r["Latency"]),
                                   parts, f"bench/{gpu}/{model.name}/{config.count}/{batch}/{length}"))
    return out


def load_observations(data: Path, catalog: Catalog) -> list[Observation]:
    return helix(data, catalog) + splitwise(data, catalog) + inference_bench(data, catalog)
