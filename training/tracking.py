"""MLflow bookkeeping of training and evaluation runs (the only training module that logs runs).

Store: ``sqlite:///mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts`` (MLflow >= 3.13
refuses the old ``./mlruns`` file store); ``MLFLOW_TRACKING_URI`` overrides the store (tests
point it at a temporary directory). Open the UI with
``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db``.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
import numpy as np
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from atoll.envs import world_of
from atoll.envs.config import FleetConfig
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.plot import plot_episodes
from atoll.envs.vocabulary import PolicySpec
from atoll.solvers.paths import cache_root
from atoll.training import checkpoint as ckpt
from atoll.training.evaluate import (
    PolicyResult,
    comparison_rows,
    evaluate_policies,
    markdown_table,
    policy_name,
)
from atoll.training.mlflow_output import make_logger
from atoll.training.naming import metric_key, policy_params, short_name
from atoll.training.policy_file import PolicyCard, write_policy_file
from atoll.training.policy_model import log_policy
from atoll.training.registry import CHAMPION, PREFIX, env_id, fleet_name, registered_name
from atoll.training.run_folder import RunFolder, identity, run_status
from atoll.training.train import TrainSettings, train_policy

if TYPE_CHECKING:
    from atoll.training.tuning import TunedPolicy

EXPERIMENT = "atoll"
DEFAULT_URI = "sqlite:///mlruns/mlflow.db"


def configure(tracking_uri: str | None = None, experiment: str = EXPERIMENT) -> str:
    """Point MLflow at the store and return the experiment id (created with its artifact root
    beside the database, so artifacts never land in the working directory by accident)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        db.parent.mkdir(parents=True, exist_ok=True)
        artifacts = (db.parent / "artifacts").resolve().as_uri()
    else:
        artifacts = None
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        return str(found.experiment_id)
    return str(client.create_experiment(experiment, artifact_location=artifacts))


def settings_key(settings: Mapping[str, Any]) -> str:
    """A short stable digest of settings, tagged on a training run so a later identical
    request can find and reuse its policy."""
    return hashlib.sha256(json.dumps(dict(settings), sort_keys=True).encode()).hexdigest()[:16]


REUSE_TAG = "atoll.settings_key"


def checkpoint_folder(key: str) -> Path:
    """The run folder of a training run asked for checkpoints without a run folder of its own:
    ``training/<key>`` under the cache root (``$ATOLL_CACHE_DIR`` or the user's cache folder)."""
    return cache_root() / "training" / key


def find_logged_policy(tag: str, value: str) -> tuple[str, str] | None:
    """(model URI, run id) of the newest FINISHED run tagged ``tag = value`` that logged a
    policy, or None."""
    experiment = configure()
    runs = MlflowClient().search_runs([experiment], filter_string=f"tags.`{tag}` = '{value}' and "
                                      "attributes.status = 'FINISHED'", max_results=1,
                                      order_by=["attributes.start_time DESC"])
    if not runs or "atoll.model_uri" not in runs[0].data.tags:
        return None
    return runs[0].data.tags["atoll.model_uri"], runs[0].info.run_id


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


def config_params(config: FleetConfig) -> dict[str, str]:
    skip = {"templates", "demand", "reward", "fleet"}
    params = {f"env.{k}": str(v) for k, v in dataclasses.asdict(config).items() if k not in skip}
    params.update({f"reward.{k}": str(v) for k, v in dataclasses.asdict(config.reward).items()})
    return params


def _train_params(config: FleetConfig, settings: TrainSettings) -> dict[str, str]:
    """A training run's parameters: the environment's and PPO's (explicit ``templates`` and
    ``demand`` objects, as tests pass, are not among them); a field's text is ``str`` of its value
    (the bootstrap rule's spec text, not its fields)."""
    return {**config_params(config),
            **{f"ppo.{f.name}": str(getattr(settings, f.name)) for f in dataclasses.fields(settings)}}


def register_policy(model_uri: str, tags: Mapping[str, str], fleet: str) -> str:
    """Register a logged policy as a new version of its fleet's model, ``atoll-trigger-<fleet>``
    (:mod:`atoll.training.registry`); returns ``models:/atoll-trigger-<fleet>/<version>``."""
    name = registered_name(fleet)
    version = mlflow.register_model(model_uri, name, tags={**dict(tags), "fleet": fleet})
    return f"models:/{name}/{version.version}"


def registered_version(model_uri: str) -> tuple[str, str] | None:
    """(registered name, version) of a policy URI: ``models:/atoll-trigger-core/3``,
    ``models:/atoll-trigger-core@champion``, or the logged model's own ``models:/m-...`` (found
    among the versions of every ``atoll-trigger-*`` model); None when it is not registered."""
    client = MlflowClient()
    body = model_uri.removeprefix("models:/")
    name, sep, alias = body.partition("@")
    try:
        if sep and name.startswith(PREFIX):
            return name, str(client.get_model_version_by_alias(name, alias).version)
        head, _, number = body.partition("/")
        if head.startswith(PREFIX) and number.isdigit():
            return head, number
        for mv in client.search_model_versions(f"name LIKE '{PREFIX}-%'"):
            if mv.source == model_uri or getattr(mv, "model_id", None) == body:
                return str(mv.name), str(mv.version)
    except MlflowException:
        return None
    return None


def crown(spec: PolicySpec, validation: Mapping[str, float]) -> str | None:
    """Set the ``champion`` alias of the policy's own fleet model (``atoll-trigger-<fleet>``) on
    the registered version of learned policy ``spec`` when its validation-day score beats the rule
    frontier (score < 1: cheaper than the frontier at its SLO attainment and no less reliable than
    fixed:1@0.9); returns the version crowned as ``atoll-trigger-<fleet>/<version>``."""
    if not spec.is_learned or validation.get("score", float("inf")) >= 1.0:
        return None
    uri = spec.uri
    found = registered_version(uri if ":/" in uri else f"models:/{uri}")
    if found is None:
        return None
    name, version = found
    MlflowClient().set_registered_model_alias(name, CHAMPION, version)
    return f"{name}/{version}"


def data_hash(config: FleetConfig) -> str:
    """sha256 (16 hex digits) of the demand the env samples on the config's days: the training
    data a policy card names."""
    book = FleetEnv(config).book
    first, last = config.days
    per_day = book.steps_per_day
    digest = hashlib.sha256(np.ascontiguousarray(book.rates[:, (first - 1) * per_day: last * per_day],
                                                 dtype=np.float64).tobytes())
    digest.update(json.dumps(list(book.models)).encode())
    return digest.hexdigest()[:16]


def policy_card(config: FleetConfig, settings: TrainSettings, *, observation_size: int, steps: int,
                selected: str, validation_score: float | None, command: str, created: str,
                digest: str) -> PolicyCard:
    """The card of a policy trained with ``config`` and ``settings``."""
    models = tuple(config.models or config.scenario_spec.models)
    codec = config.action_codec
    return PolicyCard(
        env_id=env_id(config), observation=config.observation, observation_size=observation_size,
        action=config.action if config.action in ("reopt", "risk") else "multibinary",
        action_codes=tuple(codec.names() if config.action in ("reopt", "risk") else ("hold", "full")),
        fleet=fleet_name(config.scenario, config.models, config.scenario_spec.models), models=models,
        scenario=config.scenario, availability=config.availability,
        world=config_params(config),
        train_days=(int(config.days[0]), int(config.days[1])), demand_seeds=settings.demand_seeds,
        data_hash=digest, steps=steps, bootstrap_steps=settings.bootstrap_steps, selected=selected,
        validation_score=validation_score, command=command, git_commit=git_commit(), created=created,
        planning_quantile=float(config.planning_quantile), action_levels=tuple(config.action_levels),
        risk=config.risk.label(),
        risk_menu=tuple(r.label() for r in codec.risks) if config.action == "risk" else ())


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def train_run(config: FleetConfig, settings: TrainSettings, *, tags: dict[str, str] | None = None,
              tick: Callable[[int], None] | None = None,
              validate: Callable[[Any], float] | None = None,
              note: Callable[[str], None] | None = None, checkpoint_every: int = 0,
              run_dir: Path | None = None, command: str = "",
              now: Callable[[], str] = _utc_now) -> dict[str, Any]:
    """Train and log: params, SB3 learning curves, the policy as one pyfunc model, registered as
    a version of ``atoll-trigger-<fleet>`` (its signature and metadata say what it takes and
    returns), and the same policy as a policy file (:mod:`atoll.training.policy_file`) among the
    run's artifacts (``policy_file/``).

    ``run_dir`` (or, without it, ``checkpoint_every`` > 0: a folder under the cache root) is the
    run's folder (:mod:`atoll.training.run_folder`): checkpoints every ``checkpoint_every`` PPO
    steps (0: only at the end), resumed when the same run is asked again (a larger budget goes
    on from the last one; the new MLflow run is tagged ``atoll.resumed_at``), and the finished
    command's ``policy-best`` and ``policy-last`` files. ``command`` is recorded on the cards;
    ``now`` gives their time."""
    params = _train_params(config, settings)
    key = settings_key(params)
    run_key = settings_key(identity(params))
    folder = None
    if run_dir is not None or checkpoint_every:
        where = Path(run_dir) if run_dir is not None else checkpoint_folder(run_key)
        folder = RunFolder.open(where, params, run_key, command=command)
    checkpoint = folder.checkpoint_spec(checkpoint_every or sys.maxsize) if folder is not None else None
    experiment = configure()
    earlier = run_status(folder.path).get("mlflow_runs", []) if folder is not None else []
    with mlflow.start_run(experiment_id=experiment, run_name=f"train-{config.scenario}",
                          tags={"atoll.kind": "train", "atoll.world": world_of(config),
                                **(tags or {})}) as run:
        run_id = run.info.run_id
        mlflow.log_params(params)
        mlflow.set_tag(REUSE_TAG, key)  # what train_or_reuse looks runs up by
        if folder is not None:
            mlflow.set_tag("atoll.run_dir", str(folder.path))
            folder.write_status({"state": "running", "timesteps": settings.timesteps,
                                 "mlflow_runs": [*earlier, run_id], "updated": now()})
        model, vec, stats = train_policy(config, settings, logger=make_logger(run_id, extra_formats=()),
                                         tick=tick, validate=validate, note=note, checkpoint=checkpoint)
        if "resumed_at" in stats:
            mlflow.set_tag("atoll.resumed_at", str(int(stats["resumed_at"])))
        if stats:
            mlflow.log_metrics(stats)
        size = int(np.prod(vec.observation_space.shape or (0,)))
        steps = int(model.num_timesteps)
        card = functools.partial(policy_card, config, settings, observation_size=size, command=command,
                                 created=now(), digest=data_hash(config))
        best_score = stats.get("validation_best")
        best_card = card(steps=int(stats.get("validation_best_at", steps)), selected="best",
                         validation_score=best_score)
        uri, registered = _log_and_register(model, vec, run_id, size, best_card, config, settings)
        with tempfile.TemporaryDirectory(prefix="atoll-policy-file-") as tmp:
            best = folder.best if folder is not None else Path(tmp) / "policy"
            write_policy_file(best, best_card, model=model, obs_rms=ckpt.obs_stats(vec))
            mlflow.log_artifacts(str(best), artifact_path="policy_file")
        result = {"run_id": run_id, "model_uri": uri, "registered": registered, "fleet": best_card.fleet,
                  **stats}
        if folder is not None and checkpoint is not None:
            result.update(_finish_folder(folder, checkpoint, card, stats, settings, steps, [*earlier, run_id],
                                         now))
    return result


def _log_and_register(model: Any, vec: Any, run_id: str, size: int, card: PolicyCard, config: FleetConfig,
                      settings: TrainSettings) -> tuple[str, str]:
    """Log the trained policy as the run's pyfunc model and register it under its fleet's name;
    (model URI, registered version)."""
    fleet = card.fleet
    # the registry's metadata names what the card names (one source for both)
    uri = log_policy(model, vec, run_id=run_id, observation_size=size,
                     n_models=card.n_models,
                     metadata={"scenario": config.scenario, "fleet": fleet,
                               "models": list(card.models), "train_days": list(config.days),
                               "availability": config.availability,
                               "env_id": card.env_id,
                               "world": {"capacity_error": str(config.capacity_error),
                                         "correction": config.correction, "slo_model": config.slo_model,
                                         "observation": config.observation},
                               "demand_seeds": settings.demand_seeds,
                               "action_codes": list(card.action_codes)})
    mlflow.set_tag("atoll.model_uri", uri)
    registered = register_policy(uri, {"scenario": config.scenario, "availability": config.availability,
                                       "run_id": run_id}, fleet)
    mlflow.set_tag("atoll.registered", registered.removeprefix("models:/"))
    return uri, registered


def _finish_folder(folder: RunFolder, checkpoint: ckpt.CheckpointSpec, card: Callable[..., PolicyCard],
                   stats: Mapping[str, float], settings: TrainSettings, steps: int, runs: list[str],
                   now: Callable[[], str]) -> dict[str, str]:
    """The run folder at the end of a command: the last checkpoint's policy file and the status."""
    best_score = stats.get("validation_best")
    last = ckpt.load(checkpoint)
    if last is not None:
        write_policy_file(folder.last, card(steps=last.steps, selected="last", validation_score=best_score),
                          model_zip=last.model_path, obs_rms=last.obs_rms)
    scores = [[t, v] for t, v in (last.stop or {}).get("scores", [])] if last is not None else []
    folder.write_status({"state": "stopped-early" if stats.get("stopped_early") else "finished",
                         "timesteps": settings.timesteps, "steps": steps,
                         "validation_scores": scores, "validation_best": best_score,
                         "mlflow_runs": runs, "updated": now()})
    return {"run_dir": str(folder.path), "policy_file": str(folder.best)}


def train_or_reuse(config: FleetConfig, settings: TrainSettings, *, retrain: bool = False,
                   tick: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The policy a finished run trained with exactly this environment and these settings (its
    params are the key), or a new training run when there is none or ``retrain``. Returns
    ``model_uri``, ``run_id`` (of the run that trained it) and ``reused``."""
    found = None if retrain else find_logged_policy(REUSE_TAG, settings_key(_train_params(config, settings)))
    if found is not None:
        fleet = fleet_name(config.scenario, config.models, config.scenario_spec.models)
        known = registered_version(found[0])
        if known is None or known[0] != registered_name(fleet):  # logged before per-fleet names
            register_policy(found[0], {"scenario": config.scenario, "availability": config.availability,
                                       "run_id": found[1]}, fleet)
        return {"model_uri": found[0], "run_id": found[1], "reused": True, "fleet": fleet}
    return {**train_run(config, settings, tick=tick), "reused": False}


def _step_metrics(result: PolicyResult) -> list[Metric]:
    """Per-step metrics of the first seed (step = index over the evaluated days)."""
    out = []
    for i, row in enumerate(result.episodes[0].steps):
        ts = int(row["seconds"] * 1000)
        for key in ("cost_usd", "slo_attainment", "reoptimizations", "solver_seconds", "preemptions"):
            out.append(Metric(f"step/{key}", float(row[key]), ts, i))
        share = row["goodput_tokens"] / row["demand_tokens"] if row["demand_tokens"] > 0 else 1.0
        out.append(Metric("step/goodput_share", float(share), ts, i))
    return out


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
                metrics = _step_metrics(r)
                for i in range(0, len(metrics), 1000):
                    client.log_batch(child.info.run_id, metrics=metrics[i:i + 1000])
                _log_correction(r.episodes)
        table = markdown_table(results)
        rows = comparison_rows(results)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "comparison.md").write_text(table)
            (folder / "comparison.csv").write_text(buf.getvalue())
            plot_episodes([r.episodes[0] for r in results], env.models, folder / "policies.png",
                          title=f"{env.config.scenario}, {env.config.availability}, days "
                                f"{days[0]}-{days[-1]}, seed 0")
            (folder / "summary.json").write_text(json.dumps({r.name: r.summary() for r in results}, indent=1))
            mlflow.log_artifacts(str(folder), artifact_path="comparison")
        parent_id = parent.info.run_id
    return {"parent_run_id": parent_id, "table": table,
            "policies": {r.name: r.summary() for r in results}}


# ----- the contest -------------------------------------------------------------------------------
def git_commit() -> str:
    """The commit of the atoll checkout this runs from, or ``unknown`` (an installed wheel)."""
    import subprocess

    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


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
    from atoll.training.contest import ContestSettings, run_contest

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
    from atoll.training.contest import frontier_note

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
            steps = _step_metrics(r)
            for i in range(0, len(steps), 1000):
                client.log_batch(child.info.run_id, metrics=steps[i:i + 1000])


def _csv_text(rows: Sequence[Mapping[str, object]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def _write_contest_tables(folder: Path, result: Any, table: str) -> None:
    """comparison.md (``table``), comparison.csv, validation_grid.csv and contest.json in ``folder``."""
    (folder / "comparison.md").write_text(table)
    (folder / "comparison.csv").write_text(_csv_text(comparison_rows(result.test)))
    grid_rows: list[dict[str, object]] = [
        {"rule": p.name, "cost_usd": p.cost_usd, "slo_attainment": p.slo_attainment,
         "unserved_tokens": p.unserved_tokens, "on_frontier": p.name in result.frontier}
        for p in result.validation_points()]
    (folder / "validation_grid.csv").write_text(_csv_text(grid_rows))
    doc = contest_document(result)
    (folder / "contest.json").write_text(json.dumps(doc, indent=1))


def _draw_contest(folder: Path, result: Any, st: Any, tdays: list[int]) -> None:
    """frontier.png (the rules tested, the learned policies and hindsight marked, over the
    validation frontier) and policies.png (the headline policies' first episode) in ``folder``."""
    from atoll.envs.plot import plot_frontier

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
    from atoll.training.contest import frontier_note

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


DEMAND_MODEL = "atoll-demand"


def demand_model_run(weights: Path, report: Mapping[str, Any], command: str) -> dict[str, str]:
    """Log a trained ``peak:learned`` network (``atoll forecast train``): its settings as
    parameters, the validation loss per epoch as a metric, the weights and card as artifacts,
    registered as a new version of ``atoll-demand`` (the weights file stays the thing to ship)."""
    experiment = configure()
    with mlflow.start_run(experiment_id=experiment, run_name="forecast-train",
                          tags={"atoll.kind": "forecast-train", "atoll.command": command}) as run:
        settings = report.get("settings", {})
        mlflow.log_params({f"demand.{k}": str(v) for k, v in dict(settings).items()}
                          | {"demand.data_hash": str(report.get("data_hash"))})
        for epoch, value in enumerate(report.get("validation_history", []), 1):
            mlflow.log_metric("validation_pinball_0.9", float(value), step=epoch)
        mlflow.log_artifact(str(weights), artifact_path="demand_model")
        card = weights.with_suffix(".json")
        if card.is_file():
            mlflow.log_artifact(str(card), artifact_path="demand_model")
        # the weights are numpy arrays, not an MLflow model flavour: the version points at the
        # logged folder itself
        source = mlflow.get_artifact_uri("demand_model")
    client = MlflowClient()
    try:
        client.get_registered_model(DEMAND_MODEL)
    except mlflow.exceptions.MlflowException:
        client.create_registered_model(DEMAND_MODEL,
                                       description="peak:learned's network (atoll forecast train)")
    version = client.create_model_version(DEMAND_MODEL, source=source, run_id=run.info.run_id,
                                          tags={"data_hash": str(report.get("data_hash"))})
    return {"run_id": run.info.run_id, "registered": f"models:/{DEMAND_MODEL}/{version.version}"}
