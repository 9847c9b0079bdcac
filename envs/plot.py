"""A picture of an episode: demand vs ready capacity per model, and fleet cost over time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from atoll.envs.rollout import Episode


def plot_episodes(episodes: Sequence[Episode], models: Sequence[str], out: Path, *, title: str = "") -> Path:
    """One row per model with its demand (black) and each policy's ready capacity, decode solid
    and prefill dotted, on a log scale; a last row with each policy's fleet $/h per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not episodes:
        raise ValueError("nothing to plot: no episodes")
    fig, axes = plt.subplots(len(models) + 1, 1, figsize=(11, 2.2 * (len(models) + 1)), sharex=True)
    first = episodes[0]
    hours = np.array([r["seconds"] for r in first.steps]) / 3600.0
    hours = hours - hours[0] + (first.steps[0]["seconds"] % 86400) / 3600.0 if len(hours) else hours
    for i, m in enumerate(models):
        ax = axes[i]
        for phase, style in (("decode", "-"), ("prefill", ":")):
            demand = np.array([r[f"{m}/demand_{phase}"] for r in first.steps])
            ax.plot(hours, demand, color="black", lw=1.2, ls=style, label=f"{phase} demand")
            for j, ep in enumerate(episodes):
                ready = np.array([r[f"{m}/ready_{phase}"] for r in ep.steps])
                ax.plot(hours[: len(ready)], ready, color=f"C{j}", lw=0.9, ls=style,
                        label=f"{ep.policy} {phase}" if phase == "decode" else None)
        ax.set_ylabel("tokens/s")
        ax.set_yscale("log")
        ax.set_title(m, fontsize=9, loc="left")
        if i == 0:
            ax.legend(fontsize=7, ncol=3, loc="upper right")
    ax = axes[-1]
    for j, ep in enumerate(episodes):
        cost = np.array([r["cost_usd"] for r in ep.steps]) * 3600.0 / max(
            (ep.steps[1]["seconds"] - ep.steps[0]["seconds"]) if len(ep.steps) > 1 else 300.0, 1e-9)
        ax.plot(hours[: len(cost)], cost, color=f"C{j}", lw=1, label=ep.policy)
    ax.set_ylabel("fleet $/h")
    ax.set_xlabel("hours since the first day's midnight")
    ax.legend(fontsize=7, ncol=4)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
