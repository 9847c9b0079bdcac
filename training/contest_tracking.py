"""Contest runs in MLflow (:mod:`atoll.training.contest`), and the contest as a document, a
table and plots.

A parent run with the settings as parameters, the headline as metrics and the evaluated demand as
its input dataset; one nested run per grid rule on the validation days and per policy on the test
days; the comparison tables, ``contest.json`` (:func:`contest_document`), the frontier plot and the
headline policies' episodes as artifacts. A learned policy whose validation score beats the rule
frontier is crowned its fleet's champion (:func:`atoll.training.train_tracking.crown`). The store is
:mod:`atoll.training.tracking`'s.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
from mlflow.tracking import MlflowClient

from atoll.envs import world_of
from atoll.envs.config import FleetConfig
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.plot import plot_episodes, plot_frontier
from atoll.envs.vocabulary import PolicySpec
from atoll.training.contest import ContestSettings, frontier_note, run_contest
from atoll.training.evaluate import PolicyResult, comparison_rows, markdown_table
from atoll.training.naming import metric_key, policy_params, short_name
from atoll.training.tracking import config_params, configure, csv_text, git_commit, step_metrics
from atoll.training.train_tracking import crown


def _log_workload(env: FleetEnv, days: Sequence[int]) -> None:
    """The evaluated demand (req/s per model and step) as the run's input dataset."""
    import mlflow.data
    import pandas as pd

    book = env.book
    per_day = book.steps_per_day
    cols = {m: np.concatenate([book.rates[i, (d - 1) * per_day: d * per_day] for d in days])
            for i, m in enumerate(book.models)}
    frame = pd.DataFrame({"day": np.repeat(list(days), per_day),
                          "step": np.tile(np.arange(per_day), len(days)), **cols})
    c = env.config
    name = f"{c.workload}-{c.scenario}-seed{c.demand_seed}" if c.demand is None else f"custom-{c.scenario}"
    mlflow.log_input(mlflow.data.from_pandas(frame, name=name),  # type: ignore[attr-defined]
                     context="evaluation")


def contest_run(config: FleetConfig, learned: Sequence[PolicySpec], settings: Any = None, *,
                tick: Callable[[int], None] | None = None, run_name: str = "contest",
                tags: dict[str, str] | None = None,
                validation: dict[str, list[dict[str, float]]] | None = None,
                references: Sequence[PolicySpec] = ()) -> dict[str, Any]:
    """Run the contest (``atoll.training.contest``) and log it: a parent run with the headline as
    metrics, the settings as parameters and the workload as input dataset; one nested run per
    grid rule on the validation days and per policy on the test days; the frontier plot, the
    comparison tables and the per-policy plot as artifacts."""
    st: ContestSettings = settings or ContestSettings()
    experiment = configure()
    client = MlflowClient()
    result = run_contest(config, learned, st, tick=tick, validation=validation, references=references)
    cfg = result.config
    tdays = list(range(st.test_days[0], st.test_days[1] + 1))
    with mlflow.start_run(experiment_id=experiment, run_name=run_name,
                          tags={"atoll.kind": "contest", "atoll.world": world_of(cfg),
                                **(tags or {})}) as parent:
        mlflow.log_params(_contest_params(result, st))
        if result.per_model_frontier:
            mlflow.log_text("\n".join(result.per_model_frontier) + "\n", "contest/per_model_frontier.txt")
        _log_workload(FleetEnv(cfg), tdays)
        _log_headlines(result, len(learned))
        _log_validation_runs(experiment, result, st)
        _log_test_runs(experiment, client, result, st)
        table = contest_table(result)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            _write_contest_tables(folder, result, table)
            _draw_contest(folder, result, st, tdays)
            mlflow.log_artifacts(str(folder), artifact_path="contest")
        champions = _crown_learned(result)
        parent_id = parent.info.run_id
    doc = contest_document(result)
    return {"parent_run_id": parent_id, "table": table, "champion": champions,
            "learned_validation": result.learned_validation, **doc}


def _contest_params(result: Any, st: Any) -> dict[str, Any]:
    """The contest's parameters: its world, days, seeds, rule grid and what it chose."""
    cfg = result.config
    return {
        **config_params(cfg), "scenario": cfg.scenario, "workload": cfg.workload,
        "availability": cfg.availability,
        "validation_days": f"{st.validation_days[0]}-{st.validation_days[1]}",
        "test_days": f"{st.test_days[0]}-{st.test_days[1]}", "seeds": str(st.seeds),
        "validation_seeds": str(st.validation_seeds or st.seeds), "git_commit": git_commit(),
        "grid.levels": ",".join(f"{q:g}" for q in st.levels),
        "grid.intervals": ",".join(map(str, st.intervals)),
        "grid.bands": ",".join(f"{lo:g}:{hi:g}" for lo, hi in st.bands), "grid.size": str(len(st.grid)),
        "lost_usd_per_mtok": f"{st.lost_price(cfg):g}", "frontier": ",".join(result.frontier),
        "best_rule": result.best_rule, "learned": ",".join(result.learned), "workers": str(st.workers),
        "ray_address": str(st.ray_address), "hindsight": str(st.hindsight),
        "per_model_targets": str(st.per_model_targets), "per_model_passes": str(st.per_model_passes),
        "per_model_best": str(result.per_model_best)}


def _log_headlines(result: Any, n_learned: int) -> None:
    """The parent run's metrics: the timings and each learned policy's headline (mean and std; a
    prefix per policy when there are several), with a tag for a frontier note."""
    metrics = {"grid_seconds": result.grid_seconds, "test_seconds": result.test_seconds,
               "frontier_size": float(len(result.frontier))}
    for name, fig in result.headlines.items():
        prefix = "" if n_learned == 1 else metric_key(short_name(result.specs[name])) + "."
        for key, v in fig.items():
            if isinstance(v, dict):
                metrics[f"{prefix}{key}_mean"], metrics[f"{prefix}{key}_std"] = v["mean"], v["std"]
        note = frontier_note(fig)
        if note:
            mlflow.set_tag(f"atoll.frontier_note.{metric_key(short_name(result.specs[name]))}", note)
    mlflow.log_metrics(metrics)


def _log_validation_runs(experiment: str, result: Any, st: Any) -> None:
    """One nested run per grid rule: its validation-day means and stds."""
    for name, rows in result.validation.items():
        with mlflow.start_run(experiment_id=experiment, run_name=f"val {name}", nested=True,
                              tags={"atoll.phase": "validation"}):
            mlflow.log_params({**policy_params(result.specs[name]),
                               "days": f"{st.validation_days[0]}-{st.validation_days[1]}",
                               "on_frontier": str(name in result.frontier)})
            for key in ("cost_usd", "slo_attainment", "usd_per_mtok", "reoptimizations",
                        "solver_seconds"):
                values = np.array([r[key] for r in rows], dtype=float)
                mlflow.log_metrics({f"{key}_mean": float(values.mean()),
                                    f"{key}_std": float(values.std())})


def _log_test_runs(experiment: str, client: MlflowClient, result: Any, st: Any) -> None:
    """One nested run per tested policy: its test-day summary, its headline ratios (a learned
    policy) and the first seed's per-step metrics."""
    for r in result.test:
        policy = result.specs[r.name]
        with mlflow.start_run(experiment_id=experiment, run_name=short_name(policy), nested=True,
                              tags={"atoll.phase": "test"}) as child:
            params = policy_params(policy)
            params.update({"days": f"{st.test_days[0]}-{st.test_days[1]}",
                           "on_frontier": str(r.name in result.frontier),
                           "on_per_model_frontier": str(r.name in result.per_model_frontier),
                           "best_rule": str(r.name == result.best_rule)})
            mlflow.log_params(params)
            summary = r.summary()
            mlflow.log_metrics({f"{k}_mean": v["mean"] for k, v in summary.items()}
                               | {f"{k}_std": v["std"] for k, v in summary.items()})
            if r.name in result.headlines:
                fig = result.headlines[r.name]
                mlflow.log_metrics({f"{k}_{s}": fig[k][s] for k in (
                    "frontier_cost_ratio", "effective_cost_ratio", "per_model_frontier_cost_ratio",
                    "per_model_effective_cost_ratio") if k in fig for s in ("mean", "std")})
            steps = step_metrics(r)
            for i in range(0, len(steps), 1000):
                client.log_batch(child.info.run_id, metrics=steps[i:i + 1000])


def _write_contest_tables(folder: Path, result: Any, table: str) -> None:
    """comparison.md (``table``), comparison.csv, validation_grid.csv and contest.json in ``folder``."""
    (folder / "comparison.md").write_text(table)
    (folder / "comparison.csv").write_text(csv_text(comparison_rows(result.test)))
    grid_rows: list[dict[str, object]] = [
        {"rule": p.name, "cost_usd": p.cost_usd, "slo_attainment": p.slo_attainment,
         "unserved_tokens": p.unserved_tokens, "on_frontier": p.name in result.frontier}
        for p in result.validation_points()]
    (folder / "validation_grid.csv").write_text(csv_text(grid_rows))
    doc = contest_document(result)
    (folder / "contest.json").write_text(json.dumps(doc, indent=1))


def _draw_contest(folder: Path, result: Any, st: Any, tdays: list[int]) -> None:
    """frontier.png (the rules tested, the learned policies and hindsight marked, over the
    validation frontier) and policies.png (the headline policies' first episode) in ``folder``."""
    cfg = result.config
    vpoints = {p.name: p for p in result.validation_points()}

    def mark(r: PolicyResult) -> tuple[str, float, float]:
        s = r.summary()
        return short_name(result.specs[r.name]), s["cost_usd"]["mean"], s["slo_attainment"]["mean"]

    marks = [mark(r) for r in result.test if r.name == "hindsight" or r.name in result.headlines]
    test_rules = [mark(r) for r in result.test
                  if r.name != "hindsight" and r.name not in result.headlines]
    plot_frontier(test_rules, [m for m in test_rules if m[0] in result.frontier],
                  folder / "frontier.png", marked=marks,
                  validation=[(p.name, p.cost_usd, p.slo_attainment) for p in vpoints.values()],
                  validation_frontier=[(n, vpoints[n].cost_usd, vpoints[n].slo_attainment)
                                       for n in result.frontier],
                  title=f"{cfg.scenario}, {cfg.availability}: rules chosen on days "
                        f"{st.validation_days[0]}-{st.validation_days[1]}, tested on "
                        f"{st.test_days[0]}-{st.test_days[1]} ({st.seeds} seed(s), means)")
    shown = [r for r in result.test
             if r.name in result.headlines or r.name in (result.best_rule, "hindsight")]
    for e in (r.episodes[0] for r in shown):
        e.policy = short_name(result.specs[e.policy])
    plot_episodes([r.episodes[0] for r in shown], FleetEnv(cfg).models, folder / "policies.png",
                  title=f"{cfg.scenario}, {cfg.availability}, days {tdays[0]}-{tdays[-1]}, seed 0")
    for r in shown:
        r.episodes[0].policy = r.name


def _crown_learned(result: Any) -> dict[str, str]:
    """Log each learned policy's validation figures and crown it champion of its fleet when its
    validation score beats the rule frontier (:func:`crown`); policy -> version crowned."""
    champions = {}
    for name, val in result.learned_validation.items():
        key = metric_key(short_name(result.specs[name]))
        mlflow.log_metrics({f"validation.{key}.{k}": float(v) for k, v in val.items()})
        version = crown(result.specs[name], val)  # only validation days decide
        if version is not None:
            champions[name] = version
            mlflow.set_tag(f"atoll.champion.{key}", version)
    return champions


def contest_document(result: Any) -> dict[str, Any]:
    """The contest as plain JSON: settings, the validation grid, the frontier, the test-day
    summaries and each learned policy's headline."""
    st = result.settings
    return {
        "validation_days": list(st.validation_days), "test_days": list(st.test_days), "seeds": st.seeds,
        "validation_seeds": st.validation_seeds or st.seeds, "grid_size": len(st.grid),
        "grid_seconds": result.grid_seconds, "test_seconds": result.test_seconds,
        "lost_usd_per_mtok": st.lost_price(result.config),
        "validation": {p.name: {"cost_usd": p.cost_usd, "slo_attainment": p.slo_attainment,
                                "unserved_tokens": p.unserved_tokens} for p in result.validation_points()},
        "frontier": result.frontier, "best_rule": result.best_rule,
        "per_model": per_model_document(result),
        "policies": {r.name: r.summary() for r in result.test},
        "headline": result.headlines,
    }


def per_model_document(result: Any) -> dict[str, Any] | None:
    """The per-model reference as JSON: its frontier and best (chosen on the validation days),
    their validation points (table estimates for per-model assignments) and the descents."""
    if result.per_model is None:
        return None
    return {"frontier": result.per_model_frontier, "best": result.per_model_best,
            "validation": {n: {"cost_usd": p.cost_usd, "slo_attainment": p.slo_attainment,
                               "unserved_tokens": p.unserved_tokens}
                           for n, p in result.per_model_points.items()},
            "descent": result.per_model.document()}


def contest_table(result: Any) -> str:
    """Markdown: the test-day results of every policy run there, then each learned policy's headline."""
    table = markdown_table(result.test)
    lines = ["", "| learned policy | frontier_cost_ratio | effective_cost_ratio "
             "| per-model frontier_cost_ratio | per-model effective_cost_ratio | $/M goodput tok "
             "| SLO att. | re-opts | solver s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for spec, f in result.headlines.items():
        cells = [f"{f[k]['mean']:{fmt}} ± {f[k]['std']:{fmt}}" if k in f else "-" for k, fmt in (
            ("frontier_cost_ratio", ".3f"), ("effective_cost_ratio", ".3f"),
            ("per_model_frontier_cost_ratio", ".3f"), ("per_model_effective_cost_ratio", ".3f"),
            ("usd_per_mtok", ".4f"), ("slo_attainment", ".1%"), ("reoptimizations", ".0f"),
            ("solver_seconds", ".1f"))]
        lines.append(f"| {short_name(result.specs[spec])} | " + " | ".join(cells) + " |")
    notes = [f"- {short_name(result.specs[s])}: {frontier_note(f)}" for s, f in result.headlines.items()
             if frontier_note(f)]
    footer = ["", f"frontier (chosen on days {result.settings.validation_days[0]}-"
              f"{result.settings.validation_days[1]}): {', '.join(result.frontier)}; best rule (effective "
              f"cost there): {result.best_rule}; lost demand priced at "
              f"{result.settings.lost_price(result.config):g} $/M tokens",
              *([f"per-model frontier (coordinate descent on the same days): "
                 f"{', '.join(result.per_model_frontier)}; per-model best: {result.per_model_best}"]
                if result.per_model is not None else []), *notes]
    return table + ("\n".join(lines) + "\n" if result.headlines else "") + "\n".join(footer) + "\n"


