"""The per-policy plot: drawn for every model, including one with no demand all episode."""

from pathlib import Path

from atoll.envs.plot import plot_episodes
from atoll.envs.rollout import Episode


def _episode(models: list[str], idle: str) -> Episode:
    ep = Episode("fixed:1@0.9", 0, days=[11])
    for k in range(12):
        row = {"day": 11, "step": k, "seconds": 300.0 * k, "cost_usd": 2.0 + k}
        for m in models:
            busy = 0.0 if m == idle else 100.0 + 10 * k
            for phase in ("prefill", "decode"):
                row[f"{m}/demand_{phase}"] = busy
                row[f"{m}/ready_{phase}"] = 0.9 * busy if k % 3 else busy
        ep.steps.append(row)
    return ep


def test_plot_draws_a_model_idle_all_episode(tmp_path: Path) -> None:
    models = ["a", "b-ft1", "c"]
    out = plot_episodes([_episode(models, idle="b-ft1")], models, tmp_path / "policies.png", title="t")
    assert out.exists() and out.stat().st_size > 1000
