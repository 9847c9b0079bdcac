"""Pictures an operator reads at a glance: an episode per policy, and the cost-SLO frontier.

``plot_episodes``: one column per policy (or only the ``policy`` chosen), one row per model
with its demand and the ready capacity, prefill and decode both in the legend, the demand left
unserved shaded; a last row with the fleet's $/h. Token rates are on a log scale, where a
capacity of zero has no place: those steps are left out of the line (no drop to the axis
floor) and the unserved shading reaches the bottom of the panel instead.

``plot_frontier``: cost against SLO attainment — the rules of the grid as points, the frontier
as a line, hindsight and each learned policy marked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from atoll.envs.rollout import Episode

PHASE_STYLE = (("decode", "-"), ("prefill", "--"))


def _hours(ep: Episode) -> np.ndarray:
    seconds = np.array([r["seconds"] for r in ep.steps], dtype=float)
    if not len(seconds):
        return seconds
    return (seconds - seconds[0] + (ep.steps[0]["seconds"] % 86400)) / 3600.0


def plot_episodes(episodes: Sequence[Episode], models: Sequence[str], out: Path, *, title: str = "",
                  policy: str | None = None) -> Path:
    """One panel column per policy (or only ``policy``): demand vs ready capacity per model and
    phase (log scale), unserved demand shaded, fleet $/h in the last row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not episodes:
        raise ValueError("nothing to plot: no episodes")
    if policy is not None:
        chosen = [e for e in episodes if e.policy == policy]
        if not chosen:
            raise ValueError(f"policy {policy!r} is not among the episodes "
                             f"({', '.join(e.policy for e in episodes)})")
        episodes = chosen
    cols = len(episodes)
    fig, axes = plt.subplots(len(models) + 1, cols, figsize=(min(6.0 * cols, 24.0), 2.3 * (len(models) + 1)),
                             sharex=True, squeeze=False)
    for j, ep in enumerate(episodes):
        hours = _hours(ep)
        for i, m in enumerate(models):
            ax = axes[i, j]
            positive = []
            for phase, style in PHASE_STYLE:
                demand = np.array([r[f"{m}/demand_{phase}"] for r in ep.steps], dtype=float)
                ready = np.array([r[f"{m}/ready_{phase}"] for r in ep.steps], dtype=float)
                positive += [demand[demand > 0], ready[ready > 0]]
                ax.step(hours, np.where(demand > 0, demand, np.nan), where="post", color="black", lw=1.0,
                        ls=style, label=f"{phase} demand")
                ax.step(hours, np.where(ready > 0, ready, np.nan), where="post",
                        color="C0" if phase == "decode" else "C2", lw=1.0, ls=style,
                        label=f"{phase} ready capacity")
                short = ready < demand
                floor = np.where(ready > 0, ready, 1e-30)  # clipped to the panel bottom below
                ax.fill_between(hours, floor, demand, where=short, step="post", color="C3", alpha=0.25, lw=0,
                                label="unserved demand" if phase == "decode" else None)
            values = np.concatenate(positive) if positive else np.array([])
            if values.size:
                ax.set_yscale("log")
                ax.set_ylim(values.min() / 2.0, values.max() * 2.0)
            else:  # a log axis of nothing fails to draw: a model idle all episode (a small client group)
                ax.text(0.5, 0.5, "no demand and no capacity", transform=ax.transAxes, ha="center",
                        va="center", fontsize=8, color="0.4")
            ax.set_title(f"{ep.policy} — {m}" if i == 0 else m, fontsize=9, loc="left")
            if j == 0:
                ax.set_ylabel("tokens/s")
            if i == 0 and j == cols - 1:
                ax.legend(fontsize=6.5, ncol=2, loc="upper right")
        ax = axes[-1, j]
        step_s = (ep.steps[1]["seconds"] - ep.steps[0]["seconds"]) if len(ep.steps) > 1 else 300.0
        cost = np.array([r["cost_usd"] for r in ep.steps], dtype=float) * 3600.0 / max(step_s, 1e-9)
        ax.step(hours, cost, where="post", color="C1", lw=1.0)
        ax.set_ylabel("fleet $/h" if j == 0 else "")
        ax.set_xlabel("hours since the first day's midnight")
    return _save(fig, out, title)


Mark = tuple[str, float, float]  # name, cost $, SLO attainment


def plot_frontier(rules: Sequence[Mark], frontier: Sequence[Mark], out: Path, *,
                  marked: Sequence[Mark] = (), title: str = "",
                  validation: Sequence[Mark] = (), validation_frontier: Sequence[Mark] = ()) -> Path:
    """Cost against SLO attainment. Left (when ``validation`` is given): every rule of the grid
    on the validation days with the frontier chosen there; right: the test days — the rules run
    there as points, the frontier rules joined as a line in SLO order, ``marked`` (hindsight,
    learned policies) as labelled stars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[str, Sequence[Mark], Sequence[Mark], Sequence[Mark]]] = []
    if validation:
        panels.append(("validation days: the grid", validation, validation_frontier, ()))
    panels.append(("test days", rules, frontier, marked))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    for ax, (label, points, line, stars) in zip(axes[0], panels, strict=True):
        if points:
            ax.scatter([p[2] for p in points], [p[1] for p in points], s=14, color="C0", alpha=0.6,
                       label="rules")
        if line:
            ordered = sorted(line, key=lambda p: (p[2], p[1]))
            ax.plot([p[2] for p in ordered], [p[1] for p in ordered], "-o", color="C1", ms=4, lw=1.4,
                    label="frontier (chosen on validation days)")
            for name, cost, slo in ordered:
                ax.annotate(name, (slo, cost), fontsize=6, xytext=(3, -8), textcoords="offset points")
        for k, (name, cost, slo) in enumerate(stars):
            ax.scatter([slo], [cost], marker="*", s=140, color=f"C{k + 2}", zorder=5, label=name)
        ax.set_xlabel("SLO attainment")
        ax.set_ylabel("cost $")
        ax.set_title(label, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out, title)


def _save(fig: Any, out: Path, title: str | None) -> Path:
    """``fig`` titled, laid out and written to ``out`` (its folder made), then closed."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
