"""The cost-SLO picture of the room: one panel per cell of ``benchmarks/results/room.json``.

Each policy of a cell is a point at its mean node cost ($, test days) and mean SLO attainment over
the cell's paired seeds, with 95% t intervals on both (across seeds): the uniform presets joined
as the rule frontier, the per-model rule, the lever oracle run as a policy (1-h and 4-h blocks),
the time-of-day rule and the demand oracles; where they ran on the cell, the rule switched by
preemptions and the learned preset chooser (their test runs in ``benchmarks/runs/switched/`` and
``benchmarks/runs/bandit/``, on the room's seeds). Effective cost is node $ plus lost tokens, so a point
below and to the right of the frontier is better on both. Reads the stored per-seed rows; runs
nothing. Prints one JSON document (the points) and writes the PNG.

    .venv/bin/python benchmarks/room_chart.py [--results benchmarks/results/room.json]
        [--out docs/room.png]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from emit import emit  # noqa: E402
from scipy import stats  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MARKERS = {"per_model_rule": ("per-model rule", "s", "tab:blue"),
           "lever_oracle/12": ("lever oracle, 1 h (run)", "v", "tab:red"),
           "lever_oracle/48": ("lever oracle, 4 h (run)", "^", "tab:red"),
           "time_of_day": ("time-of-day rule", "D", "tab:purple"),
           "oracle-rate": ("oracle-rate", "o", "tab:green"),
           "oracle-quantile": ("oracle-quantile", "P", "tab:green"),
           "switched": ("switched rule", "X", "tab:brown"),
           "bandit": ("learned preset chooser", "*", "tab:orange")}
# the policies benchmarks/switched.py and benchmarks/bandit.py ran on a cell: their run folders
RUN_FOLDERS = {"switched": ROOT / "benchmarks/runs/switched", "bandit": ROOT / "benchmarks/runs/bandit"}


def _mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t interval (0 for fewer than two values)."""
    a = np.asarray(values, dtype=float)
    if len(a) < 2:
        return float(a.mean()), 0.0
    return float(a.mean()), float(stats.t.ppf(0.975, len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)))


def learned_rows(key: str, seeds: int) -> dict[str, list[dict[str, float]]]:
    """The switched rule's and the chooser's test rows on the room's ``seeds`` seeds, each where it
    ran on every one of them (its run folder's ``test.json``)."""
    out = {}
    for name, root in RUN_FOLDERS.items():
        path = root / key.replace("/", "-") / "test.json"
        if path.is_file():
            runs = json.loads(path.read_text()).get("runs", {})
            if all(str(k) in runs for k in range(seeds)):
                out[name] = [runs[str(k)] for k in range(seeds)]
    return out


def points(cell: dict[str, Any], key: str = "") -> dict[str, dict[str, float]]:
    """Per policy: mean node $, its 95% half-width, mean SLO attainment and its half-width."""
    seeds = cell["per_seed"]
    out: dict[str, dict[str, float]] = {}
    extra = learned_rows(key, len(seeds)) if key else {}
    for name in [*seeds[0], *extra]:
        rows = extra[name] if name in extra else [s[name] for s in seeds if name in s]
        cost, dc = _mean_ci([r["cost_usd"] for r in rows])
        slo, ds = _mean_ci([r["slo_attainment"] for r in rows])
        out[name] = {"cost_usd": round(cost, 2), "cost_ci": round(dc, 2), "slo": round(slo, 4),
                     "slo_ci": round(ds, 4), "seeds": len(rows)}
    return out


def draw(doc: dict[str, dict[str, Any]], cells: dict[str, dict[str, Any]], out: Path) -> Path:
    n = len(doc)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    for ax, (key, pts) in zip(axes.flat, doc.items(), strict=False):
        presets = [p for p in cells[key]["presets"] if p in pts]
        frontier = sorted((pts[p] for p in presets), key=lambda q: q["cost_usd"])
        ax.plot([q["cost_usd"] for q in frontier], [q["slo"] for q in frontier], "-", color="0.5", lw=1)
        for p in presets:
            q = pts[p]
            ax.errorbar(q["cost_usd"], q["slo"], xerr=q["cost_ci"], yerr=q["slo_ci"], fmt="o", color="0.3",
                        ms=4, capsize=2)
            ax.annotate(p.removeprefix("fixed:1@0.9") or "neutral", (q["cost_usd"], q["slo"]), fontsize=7,
                        xytext=(3, -9), textcoords="offset points", color="0.3")
        for name, (label, marker, color) in MARKERS.items():
            if name in pts:
                q = pts[name]
                ax.errorbar(q["cost_usd"], q["slo"], xerr=q["cost_ci"], yerr=q["slo_ci"], fmt=marker,
                            color=color, ms=6, capsize=2, label=label)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("node cost, test days ($)")
        ax.set_ylabel("SLO attainment")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle("The room per cell: the uniform presets (grey, joined: the rule frontier) and the "
                 "references, mean of the paired seeds with 95% intervals", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks/results/room.json")
    ap.add_argument("--out", type=Path, default=ROOT / "docs/room.png")
    ap.add_argument("--json", action="store_true", help="accepted: the document is printed either way")
    args = ap.parse_args()
    cells = json.loads(args.results.read_text())
    doc = {key: points(cell, key) for key, cell in cells.items() if cell.get("per_seed")}
    path = draw(doc, cells, args.out)
    emit({"benchmark": "room_chart", "figure": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT)
          else str(path), "cells": doc}, None)


if __name__ == "__main__":
    main()
