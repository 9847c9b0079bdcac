"""Regenerate ``solvers/data/catalog.json`` from the public data in ``../shared/data``.

Run ``python -m atoll.solvers.build_catalog [--data DIR]``. Every value in the output records where it
came from; the package reads only the output file, never ``../shared/data``.

Choices (each is recorded in the table's ``notes``):
- GPU specs: Epoch AI's hardware table first; winston-zhang-orz/gpu-specs for L40S and T4, which
  Epoch leaves blank; llm-analysis for A10G (the only A10G-specific sheet). ``link_gbs`` is the
  intra-node bandwidth per direction: NVLink totals halved, PCIe Gen3/4/5 x16 = 16/32/64 GB/s.
- AWS (us-east-2, ap-northeast-2): cheapest on-demand instance per (GPU type, GPU count). The
  data has no AWS spot prices, so AWS spot = on-demand x the median spot/on-demand ratio of the
  same GPU type in the GCP and Azure catalogs (all types pooled when a type has no ratio);
  such offers carry ``spot_estimated: true``.
- GCP (us-central1): instance = host VM row + GPU row in the same zone (SkyPilot convention);
  the region's price is the cheapest zone. Hosts: a2-highgpu (A100), a2-ultragpu (A100-80GB),
  a3-highgpu (H100), a3-ultragpu (H200), g2-standard (L4), n1-standard with 4 vCPU per GPU
  (T4, V100).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from atoll.solvers.paths import CATALOG_PATH, shared_data_dir

GPU_NAMES = ("T4", "L4", "A10G", "L40S", "V100", "A100-40GB", "A100-80GB", "H100", "H200")
COUNTS = (1, 2, 4, 8)
PCIE_GBS = {"PCIe Gen3": 16.0, "PCIe Gen4": 32.0, "PCIe Gen5": 64.0}

AWS_REGIONS = ("us-east-2", "ap-northeast-2")
AWS_FAMILY = {  # instance family -> GPU type
    "g4dn": "T4", "g5": "A10G", "g6": "L4", "g6e": "L40S", "p3": "V100", "p4d": "A100-40GB",
    "p4de": "A100-80GB", "p5": "H100", "p5e": "H200", "p5en": "H200",
}
GCP_REGION = "us-central1"
GCP_ACCEL = {"T4": "T4", "L4": "L4", "V100": "V100", "A100": "A100-40GB",
             "A100-80GB": "A100-80GB", "H100": "H100", "H200": "H200"}
AZURE_ACCEL = {"T4": "T4", "A10": "A10G", "V100": "V100", "A100": "A100-40GB",
               "A100-80GB": "A100-80GB", "H100": "H100", "H200": "H200"}
# Catalog rows whose spot price is not below on-demand carry no spot discount information
# (Azure lists some that way); they would drag the AWS estimate toward "no discount".
_NO_DISCOUNT = 0.999
L4_HOSTS = {1: "g2-standard-4", 2: "g2-standard-24", 4: "g2-standard-48", 8: "g2-standard-96"}


def _need(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(
            f"catalog source file missing: {path} — point --data (or ATOLL_SHARED_DATA) at the "
            f"shared data folder that holds it"
        )
    return path


def _gcp_host(gpu: str, n: int) -> str | None:
    if gpu == "A100-40GB":
        return f"a2-highgpu-{n}g"
    if gpu == "A100-80GB":
        return f"a2-ultragpu-{n}g"
    if gpu == "H100":
        return f"a3-highgpu-{n}g"
    if gpu == "H200":
        return "a3-ultragpu-8g" if n == 8 else None
    if gpu == "L4":
        return L4_HOSTS[n]
    return f"n1-standard-{4 * n}"


def gpu_specs(data: Path) -> tuple[list[dict[str, Any]], list[str]]:
    epoch: dict[str, dict[str, str]] = {}
    with _need(data / "gpu-specs-epoch-ai" / "ml_hardware.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            epoch[row["Hardware name"]] = row
    winston = json.loads(_need(data / "gpu-specs-winston" / "specs.json").read_text())
    a10g = json.loads(
        _need(data / "gpu-specs-llm-analysis" / "gpu_configs" / "a10g-pcie-24gb.json").read_text()
    )
    aws = json.loads(_need(data / "aws-gpu-prices-vantage" / "all_gpu_instances.json").read_text())

    def ep(name: str, col: str, scale: float) -> float:
        cell = epoch[name][col]
        if not cell:
            raise ValueError(f"Epoch AI row {name!r} has no {col!r}")
        return float(cell) / scale

    tf, mem, bw, link = (
        "Tensor-FP16/BF16 performance (FLOP/s)", "Memory size per board (Byte)",
        "Memory bandwidth (byte/s)", "Intranode bandwidth (byte/s)",
    )
    h200_mem = next(
        float(x["gpuMemory"].split()[0]) / x["gpuCount"]
        for x in aws if x.get("apiName", "").startswith("p5en.")
    )
    specs = [
        dict(name="T4", family="Turing", memory_gb=ep("NVIDIA Tesla T4", mem, 1e9),
             hbm_bandwidth_gbs=ep("NVIDIA Tesla T4", bw, 1e9),
             bf16_tflops=float(winston["t4"]["fp16"]), link_gbs=PCIE_GBS[winston["t4"]["interconnect"]],
             source="Epoch AI (memory, bandwidth); winston gpu-specs fp16 tensor (no bf16 on T4)"),
        dict(name="L4", family="Ada", memory_gb=ep("NVIDIA L4", mem, 1e9),
             hbm_bandwidth_gbs=ep("NVIDIA L4", bw, 1e9), bf16_tflops=ep("NVIDIA L4", tf, 1e12),
             link_gbs=PCIE_GBS[winston["l4"]["interconnect"]], source="Epoch AI; winston (link)"),
        dict(name="A10G", family="Ampere-GDDR", memory_gb=float(a10g["mem_per_GPU_in_GB"]),
             hbm_bandwidth_gbs=float(a10g["hbm_bandwidth_in_GB_per_sec"]),
             bf16_tflops=float(a10g["peak_fp16_TFLOPS"]),
             link_gbs=float(a10g["intra_node_bandwidth_in_GB_per_sec"]),
             source="llm-analysis a10g-pcie-24gb (the only A10G sheet; Epoch leaves TFLOPS blank)"),
        dict(name="L40S", family="Ada", memory_gb=float(winston["l40s"]["gpu_memory"]),
             hbm_bandwidth_gbs=float(winston["l40s"]["memory_bandwidth"]),
             bf16_tflops=float(winston["l40s"]["bf16_tensor_core"]),
             link_gbs=PCIE_GBS[winston["l40s"]["interconnect"]],
             source="winston gpu-specs (Epoch has L40, not L40S)"),
        dict(name="V100", family="Volta", memory_gb=ep("NVIDIA Tesla V100 SXM2", mem, 1e9),
             hbm_bandwidth_gbs=ep("NVIDIA Tesla V100 SXM2", bw, 1e9),
             bf16_tflops=ep("NVIDIA Tesla V100 SXM2", tf, 1e12),
             link_gbs=ep("NVIDIA Tesla V100 SXM2", link, 1e9) / 2,
             source="Epoch AI 'NVIDIA Tesla V100 SXM2' (16 GB; fp16, no bf16 on V100)"),
        dict(name="A100-40GB", family="Ampere", memory_gb=ep("NVIDIA A100 SXM4 40 GB", mem, 1e9),
             hbm_bandwidth_gbs=ep("NVIDIA A100 SXM4 40 GB", bw, 1e9),
             bf16_tflops=ep("NVIDIA A100 SXM4 40 GB", tf, 1e12),
             link_gbs=ep("NVIDIA A100 SXM4 40 GB", link, 1e9) / 2, source="Epoch AI"),
        dict(name="A100-80GB", family="Ampere", memory_gb=ep("NVIDIA A100 SXM4 80 GB", mem, 1e9),
             hbm_bandwidth_gbs=ep("NVIDIA A100 SXM4 80 GB", bw, 1e9),
             bf16_tflops=ep("NVIDIA A100 SXM4 80 GB", tf, 1e12),
             link_gbs=ep("NVIDIA A100 SXM4 80 GB", link, 1e9) / 2, source="Epoch AI"),
        dict(name="H100", family="Hopper", memory_gb=ep("NVIDIA H100 SXM5 80GB", mem, 1e9),
             hbm_bandwidth_gbs=ep("NVIDIA H100 SXM5 80GB", bw, 1e9),
             bf16_tflops=ep("NVIDIA H100 SXM5 80GB", tf, 1e12),
             link_gbs=ep("NVIDIA H100 SXM5 80GB", link, 1e9) / 2, source="Epoch AI"),
        dict(name="H200", family="Hopper", memory_gb=h200_mem,
             hbm_bandwidth_gbs=ep("NVIDIA H200 SXM", bw, 1e9),
             bf16_tflops=ep("NVIDIA H200 SXM", tf, 1e12),
             link_gbs=ep("NVIDIA H100 SXM5 80GB", link, 1e9) / 2,
             source="Epoch AI (TFLOPS, bandwidth); memory from AWS p5en (1128 GB / 8), Epoch "
                    "blank; NVLink as H100 (same NVLink 4), Epoch blank"),
    ]
    notes = [
        "Known wrong cells avoided: llm-analysis a10-pcie-28gb (28 GB; A10 has 24) and "
        "v100-sxm-16gb (says 32 GB) are not used.",
        "A10G TFLOPS (70, dense fp16) comes from llm-analysis only; treat A10G predictions with "
        "the leave-one-GPU-out error in mind.",
    ]
    return specs, notes


def _aws_offers(data: Path) -> list[dict[str, Any]]:
    aws = json.loads(_need(data / "aws-gpu-prices-vantage" / "all_gpu_instances.json").read_text())
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    for inst in aws:
        api = inst.get("apiName") or inst.get("name", "")
        gpu = AWS_FAMILY.get(api.split(".")[0])
        n = inst.get("gpuCount")
        if gpu is None or n not in COUNTS:
            continue
        for region in AWS_REGIONS:
            price = (inst.get("pricing", {}).get(region) or {}).get("onDemand")
            if not price:
                continue
            key = (region, gpu, int(n))
            if key not in best or float(price) < best[key]["on_demand_per_hour"]:
                best[key] = dict(region=f"aws:{region}", config=f"{n}x{gpu}",
                                 on_demand_per_hour=float(price), instance=api,
                                 source="aws-gpu-prices-vantage/all_gpu_instances.json")
    return list(best.values())


def _read_gz_csv(path: Path) -> list[list[str]]:
    with gzip.open(_need(path), "rt", newline="") as fh:
        return list(csv.reader(fh))


def _gcp_offers(data: Path) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    rows = _read_gz_csv(data / "cloud-catalog-anycloud" / "gcp" / "vms.csv.gz")
    head = rows[0]
    ix = {c: i for i, c in enumerate(head)}
    hosts: dict[tuple[str, str], tuple[float, float | None]] = {}
    gpus: dict[tuple[str, int, str], tuple[float, float | None]] = {}

    def num(cell: str) -> float | None:
        return float(cell) if cell else None

    for r in rows[1:]:
        if len(r) < len(head) or r[ix["Region"]] != GCP_REGION:
            continue
        zone, price, spot = r[ix["AvailabilityZone"]], num(r[ix["Price"]]), num(r[ix["SpotPrice"]])
        if price is None:
            continue
        if r[ix["InstanceType"]]:
            hosts[(r[ix["InstanceType"]], zone)] = (price, spot)
        elif r[ix["AcceleratorName"]] in GCP_ACCEL:
            n = int(float(r[ix["AcceleratorCount"]]))
            gpus[(GCP_ACCEL[r[ix["AcceleratorName"]]], n, zone)] = (price, spot)
    offers: dict[tuple[str, int], dict[str, Any]] = {}
    ratios: dict[str, list[float]] = defaultdict(list)
    for (gpu, n, zone), (gprice, gspot) in gpus.items():
        host = _gcp_host(gpu, n) if n in COUNTS else None
        if host is None or (host, zone) not in hosts:
            continue
        hprice, hspot = hosts[(host, zone)]
        od = gprice + hprice
        spot = gspot + hspot if gspot is not None and hspot is not None else None
        if spot is not None and spot / od < _NO_DISCOUNT:
            ratios[gpu].append(spot / od)
        cur = offers.get((gpu, n))
        if cur is None or od < cur["on_demand_per_hour"]:
            offers[(gpu, n)] = dict(region=f"gcp:{GCP_REGION}", config=f"{n}x{gpu}",
                                    on_demand_per_hour=round(od, 5),
                                    spot_per_hour=None if spot is None else round(spot, 5),
                                    instance=f"{host}+{n}x{gpu} ({zone})",
                                    source="cloud-catalog-anycloud/gcp/vms.csv.gz (host + GPU rows)")
    return list(offers.values()), ratios


def _azure_ratios(data: Path) -> dict[str, list[float]]:
    rows = _read_gz_csv(data / "cloud-catalog-anycloud" / "azure" / "vms.csv.gz")
    ix = {c: i for i, c in enumerate(rows[0])}
    ratios: dict[str, list[float]] = defaultdict(list)
    for r in rows[1:]:
        gpu = AZURE_ACCEL.get(r[ix["AcceleratorName"]]) if len(r) > ix["SpotPrice"] else None
        if gpu and r[ix["Price"]] and r[ix["SpotPrice"]] and float(r[ix["Price"]]) > 0:
            ratio = float(r[ix["SpotPrice"]]) / float(r[ix["Price"]])
            if ratio < _NO_DISCOUNT:
                ratios[gpu].append(ratio)
    return ratios


def build(data: Path) -> dict[str, Any]:
    specs, notes = gpu_specs(data)
    gcp, ratios = _gcp_offers(data)
    for gpu, vals in _azure_ratios(data).items():
        ratios[gpu].extend(vals)
    pooled = statistics.median(v for vals in ratios.values() for v in vals)
    spot_ratio = {g: statistics.median(ratios[g]) if ratios.get(g) else pooled for g in GPU_NAMES}
    aws = _aws_offers(data)
    for o in aws:
        gpu = o["config"].split("x", 1)[1]
        o["spot_per_hour"] = round(o["on_demand_per_hour"] * spot_ratio[gpu], 5)
        o["spot_estimated"] = True
    offers = sorted(aws + gcp, key=lambda o: (o["region"], o["config"]))
    notes.append(
        "AWS spot prices are estimates (no AWS spot data in ../shared/data): on-demand x median "
        "spot/on-demand ratio per GPU type over GCP and Azure catalogs: "
        + ", ".join(f"{g} {r:.2f}" for g, r in spot_ratio.items())
    )
    return {
        "generated_by": "python -m atoll.solvers.build_catalog",
        "sources": {
            "gpu-specs-epoch-ai": "Epoch AI, Machine Learning Hardware (CC-BY 4.0)",
            "gpu-specs-winston": "github.com/winston-zhang-orz/gpu-specs (Apache-2.0)",
            "gpu-specs-llm-analysis": "github.com/cli99/llm-analysis (Apache-2.0)",
            "aws-gpu-prices-vantage": "github.com/tsaol/aws-gpu from instances.vantage.sh",
            "cloud-catalog-anycloud": "github.com/anycloud-sh/catalog (SkyPilot catalog format)",
        },
        "notes": notes,
        "gpus": specs,
        "spot_ratio": spot_ratio,
        "offers": offers,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="shared data folder")
    parser.add_argument("--out", type=Path, default=CATALOG_PATH)
    args = parser.parse_args(argv)
    try:
        table = build(args.data or shared_data_dir())
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {args.out}: {len(table['gpus'])} GPU types, {len(table['offers'])} offers",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
