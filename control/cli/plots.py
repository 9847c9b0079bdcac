"""Pictures the commands draw beside their tables: the policies' cost against SLO attainment
(``simulate --plot``), the fleet's nodes by price tier with its preemptions marked (``simulate
--plot``), and $/h per rung of the baseline ladder (``solve --decompose --plot``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def sibling(path: Path, suffix: str) -> Path:
    """``out.png`` -> ``out-<suffix>.png``: a second picture beside the one asked for."""
    return path.with_name(f"{path.stem}-{suffix}{path.suffix}")


def cost_slo_scatter(totals: Mapping[str, Mapping[str, Any]], out: Path, title: str = "") -> Path:
    """One point per policy: total node cost ($) against SLO attainment, each named."""
    if not totals:
        raise ValueError("nothing to plot: no policy totals")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, t in totals.items():
        cost, slo = float(t["cost_usd"]), float(t["slo_attainment"])
        ax.scatter([slo * 100], [cost], s=36, zorder=3)
        ax.annotate(name, (slo * 100, cost), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("SLO attainment (%)")
    ax.set_ylabel("node cost ($)")
    ax.grid(True, alpha=0.3)
    ax.set_title(title or "cost vs SLO attainment", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def fleet_tiers(episodes: Sequence[Any], out: Path, step_s: float, title: str = "") -> Path:
    """Per policy: nodes held over time split into on-demand and spot (stacked), and a mark at
    every step that lost instances to a preemption (with how many)."""
    if not episodes:
        raise ValueError("nothing to plot: no episodes")
    plt = _pyplot()
    fig, axes = plt.subplots(len(episodes), 1, figsize=(8.0, 2.4 * len(episodes)), sharex=True,
                             squeeze=False)
    hours_per_step = step_s / 3600.0
    for ax, ep in zip(axes[:, 0], episodes, strict=True):
        steps = ep.steps
        hours = [i * hours_per_step for i in range(len(steps))]
        nodes = [float(r["node_hours"]) / hours_per_step for r in steps]
        on_demand = [float(r["ondemand_node_hours"]) / hours_per_step for r in steps]
        spot = [max(n - o, 0.0) for n, o in zip(nodes, on_demand, strict=True)]
        ax.stackplot(hours, on_demand, spot, labels=("on-demand nodes", "spot nodes"),
                     colors=("C0", "C1"), alpha=0.7, step="post")
        lost = [(h, int(r["preemptions"]), n) for h, r, n in zip(hours, steps, nodes, strict=True)
                if r["preemptions"]]
        if lost:
            ax.scatter([h for h, _, _ in lost], [n for _, _, n in lost], marker="v", color="C3", zorder=3,
                       label=f"preemption ({sum(k for _, k, _ in lost)} instances)")
        ax.set_ylabel("nodes")
        ax.set_title(f"{ep.policy}", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel("hours from the first simulated day's start")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def ladder_bars(doc: Mapping[str, Any], out: Path) -> Path:
    """$/h of every rung of ``solve --decompose`` (and its side rungs), a bar each; rungs with no
    plan are drawn empty and named so."""
    rows = [*doc["rungs"], *doc.get("side", [])]
    if not rows:
        raise ValueError("nothing to plot: the ladder has no rungs")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(rows)), 4.2))
    names = [r["rung"] for r in rows]
    costs = [r["cost_per_hour"] for r in rows]
    heights = [0.0 if c is None or not math.isfinite(c) else float(c) for c in costs]
    bars = ax.bar(names, heights, color=["C0" if i < len(doc["rungs"]) else "C7" for i in range(len(rows))])
    for bar, cost, row in zip(bars, costs, rows, strict=True):
        label = f"{cost:.2f}" if cost is not None and math.isfinite(cost) else row["status"]
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=8, textcoords="offset points", xytext=(0, 2))
    ax.set_ylabel("$/h")
    ax.set_title(f"{doc['scenario']} / {doc['availability']} / {doc['mix']}: $/h per rung", fontsize=10)
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
