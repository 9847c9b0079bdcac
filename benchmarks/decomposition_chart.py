"""Bar chart of the ladder (each rung's $/h over joint) from benchmarks/results/decomposition.json.

Ample availability (cost mode), 1x and 3x demand, core and extended x the three mixes; the
paper's Homo/joint figure as a marker where it reports one. Writes docs/decomposition.png.

    .venv/bin/python benchmarks/decomposition_chart.py [--results FILE] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHOWN = ("homo-node", "homo-node-per-replica", "homo-config", "single-type", "independent")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "decomposition.json")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "decomposition.png")
    args = ap.parse_args()
    doc = json.loads(args.results.read_text())
    cells = [c for c in doc["grid"] if c["availability"] == "ample"]
    labels = [f"{c['scenario']}\n{c['mix']}\n{c['demand_scale']:g}x" for c in cells]
    fig, ax = plt.subplots(figsize=(max(8.0, 0.9 * len(cells)), 4.5))
    width = 0.8 / len(SHOWN)
    for i, rung in enumerate(SHOWN):
        values = [c["over_joint"].get(rung) or 0.0 for c in cells]
        ax.bar([x + (i - (len(SHOWN) - 1) / 2) * width for x in range(len(cells))], values, width,
               label=rung)
    paper = doc.get("paper_homo_over_joint", {})
    for x, c in enumerate(cells):
        v = paper.get(f"{c['scenario']}/{c['mix']}", paper.get(c["scenario"]))
        if v is not None and c["demand_scale"] == 1:
            ax.plot([x - 0.4, x + 0.4], [v, v], color="black", linestyle="--", linewidth=1)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(cells)), labels, fontsize=7)
    ax.set_ylabel("$/h over joint ILP")
    ax.set_title("Ladder of baselines, ample availability (dashed: the Coral paper's Homo/ILP)")
    ax.legend(fontsize=7, ncols=3)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(json.dumps({"chart": str(args.out), "cells": len(cells)}))


if __name__ == "__main__":
    main()
