"""Evaluation runs in MLflow (``atoll evaluate``, ``atoll demo``): one parent run, one nested run
per policy with its test-day summary, the first seed's per-step metrics and the online
correction's learned factors; the comparison table (markdown, CSV), its summary and the first
episode's plot as artifacts. The store is :mod:`atoll.training.tracking`'s.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
from mlflow.tracking import MlflowClient

from atoll.envs import world_of
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.plot import plot_episodes
from atoll.envs.vocabulary import PolicySpec
from atoll.training.evaluate import comparison_rows, evaluate_policies, markdown_table, policy_name
from atoll.training.tracking import config_params, configure, csv_text, step_metrics

if TYPE_CHECKING:
    from atoll.training.tuning import TunedPolicy


def _log_correction(episodes: Sequence[Any]) -> None:
    """The learned capacity factors of each seed's days (online correction), as an artifact, and
    their spread as metrics; nothing without the correction."""
    learned = {f"seed_{e.seed}": e.correction for e in episodes if getattr(e, "correction", None)}
    if not learned:
        return
    mlflow.log_dict(learned, "correction_factors.json")
    last = [k for days in learned.values() for k in days[-1].values()]
    if last:
        mlflow.log_metrics({"correction_families": float(len(last)), "correction_factor_min": min(last),
                            "correction_factor_max": max(last)})


def evaluate_run(env: FleetEnv, specs: Sequence[PolicySpec | TunedPolicy], *, days: Sequence[int],
                 seeds: int, tick: Callable[[int], None] | None = None, run_name: str = "evaluate",
                 tags: dict[str, str] | None = None) -> dict[str, Any]:
    """One parent run, one nested run per policy; table (markdown, CSV) and plot as artifacts."""
    experiment = configure()
    client = MlflowClient()
    results = evaluate_policies(env, specs, days=days, seeds=seeds, tick=tick)
    with mlflow.start_run(experiment_id=experiment, run_name=run_name,
                          tags={"atoll.kind": "evaluate", "atoll.world": world_of(env.config),
                                **(tags or {})}) as parent:
        mlflow.log_params({**config_params(env.config), "eval.days": ",".join(map(str, days)),
                           "eval.seeds": str(seeds),
                           "eval.policies": ",".join(policy_name(s) for s in specs)})
        for r in results:
            with mlflow.start_run(experiment_id=experiment, run_name=r.name, nested=True) as child:
                mlflow.log_param("policy", r.name)
                summary = r.summary()
                mlflow.log_metrics({f"{k}_mean": v["mean"] for k, v in summary.items()}
                                   | {f"{k}_std": v["std"] for k, v in summary.items()})
                metrics = step_metrics(r)
                for i in range(0, len(metrics), 1000):
                    client.log_batch(child.info.run_id, metrics=metrics[i:i + 1000])
                _log_correction(r.episodes)
        table = markdown_table(results)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "comparison.md").write_text(table)
            (folder / "comparison.csv").write_text(csv_text(comparison_rows(results)))
            plot_episodes([r.episodes[0] for r in results], env.models, folder / "policies.png",
                          title=f"{env.config.scenario}, {env.config.availability}, days "
                                f"{days[0]}-{days[-1]}, seed 0")
            (folder / "summary.json").write_text(json.dumps({r.name: r.summary() for r in results}, indent=1))
            mlflow.log_artifacts(str(folder), artifact_path="comparison")
        parent_id = parent.info.run_id
    return {"parent_run_id": parent_id, "table": table,
            "policies": {r.name: r.summary() for r in results}}


