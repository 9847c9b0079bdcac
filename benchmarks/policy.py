"""Figures of the learned policy and the contest, as one JSON document on stdout (progress on
stderr).

Per scenario and availability:

1. the rule grid (``fixed:K@q``, ``threshold:LOW:HIGH@q``) on validation days 8-10
   (``atoll.training.contest.validation_grid``; cached under the cache folder by its settings,
   so a re-run of the training does not re-run the grid);
2. PPO on ``Fleet-v1`` (hold / grow / full at a planning level per model) on training days
   ``--train-days`` (default 4-7, before the validation days), ``--n-envs`` processes with
   ``--demand-seeds`` demand realizations, bootstrapped from ``--bootstrap-rule``, early-stopped
   on the validation score (frontier cost ratio on days 8-10 + an SLO penalty below
   fixed:1@0.9; only validation days are read);
3. the contest with that same grid: the frontier chosen on days 8-10; the frontier rules, the best
   rule, the learned policy, hindsight and the bootstrap rule (a reference, not in the frontier)
   on test days 11-14 over ``--seeds`` seeds, logged to MLflow (``sqlite:///mlruns/mlflow.db``
   unless MLFLOW_TRACKING_URI is set); the champion alias is set if the policy beats the
   frontier on the validation days.

Reports the frontier, its test-day points, both headline ratios (mean and std over seeds),
re-optimizations per day against fixed:1@0.9's, and the wall times.

Worlds (``--worlds``): a cell is scenario x availability x world — ``exact`` (``atoll/Fleet-v1``),
``calibration`` (``atoll/Fleet-v2``: capacities off the model by the calibration's spread,
drawn at every reset, online correction, latency SLO; the policy trains on its observation with
the closed-loop signals) or ``charged`` (``atoll/Fleet-v3``: the closed loop in the world that
charges what a cluster charges, with the observation of risk; with ``--risk-action`` the learned
policy acts on ``atoll/Fleet-v4``, whose per-model action also chooses a risk preset).

The risk levers (``--risks``, risk labels separated by ``;``): the rule grid is crossed with them
(``fixed:1@0.9+h0.7``: the rule's re-plans take that risk for every model), and hindsight runs on
the test days with each of them — the bound with the same levers (``bound``: the best of them by
its frontier cost ratio, read off the test-day means).

The demand (``--workload``): ``servegen`` (every ServeGen client), ``servegen-steady`` or
``servegen-bursty`` (the steady or the bursty half of each source's requests); a cell of either
half has its key end in ``/steady`` or ``/bursty``.

Beside the one-rule frontier the contest reports the per-model
reference (coordinate descent on the validation days, :mod:`atoll.training.per_model`) and both
ratios against it. Every cell records ``os.getloadavg()`` before and after each phase; the
document is rewritten after every cell (``--out``), so an interrupted run keeps what it measured.
``--merge FILE[=SUFFIX] ... --into benchmarks/results/policy.json`` runs nothing: it copies the
cells of earlier documents into the one document that gathers every cell.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.envs import CHARGED, CLOSED_LOOP  # noqa: E402
from atoll.envs.config import FleetConfig, RewardWeights  # noqa: E402
from atoll.envs.policies import FIXED_INTERVALS, THRESHOLD_BANDS  # noqa: E402
from atoll.envs.vocabulary import PLANNING_LEVELS, parse_policy  # noqa: E402
from atoll.forecast.workloads import SERVEGEN_WORKLOADS  # noqa: E402
from atoll.solvers.scenarios import SCENARIOS  # noqa: E402
from atoll.training.contest import (  # noqa: E402
    ContestSettings,
    cached_validation_grid,
    per_model_best,
    validation_scorer,
)
from atoll.training.contest_tracking import contest_run  # noqa: E402
from atoll.training.frontier import Point, frontier_cost_at  # noqa: E402
from atoll.training.train import TrainSettings  # noqa: E402
from atoll.training.train_tracking import train_run  # noqa: E402


def _days(text: str) -> tuple[int, int]:
    a, _, b = text.partition("-")
    return int(a), int(b or a)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenarios", default="core,extended")
    parser.add_argument("--availabilities", default="hedged,spot")
    parser.add_argument("--timesteps", type=int, default=30_000)
    parser.add_argument("--checkpoint-every", type=int, default=2_304,
                        help="save the training run's state every this many PPO steps into its run folder; "
                             "the same command run again after a stop resumes it (0: only at the end)")
    parser.add_argument("--run-dir", type=Path, default=Path("benchmarks/runs"),
                        help="where each cell's training run folder lives (<run-dir>/<cell>): inside the "
                             "repository, so a run longer than a sitting is committed and resumed")
    parser.add_argument("--policy-file", default=None, metavar="PATH",
                        help="evaluate this policy file (e.g. training/policies/<cell>) instead of training: "
                             "the command that re-evaluates a shipped policy on more --seeds")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--validation-seeds", type=int, default=None)
    parser.add_argument("--train-days", default="4-7")
    parser.add_argument("--validation-days", default="8-10")
    parser.add_argument("--test-days", default="11-14")
    parser.add_argument("--levels", default=",".join(f"{q:g}" for q in PLANNING_LEVELS))
    parser.add_argument("--intervals", default=",".join(map(str, FIXED_INTERVALS)))
    parser.add_argument("--bands", default=",".join(f"{lo:g}:{hi:g}" for lo, hi in THRESHOLD_BANDS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bootstrap-rule", default="fixed:1",
                        help="the rule cloned before PPO; per-model:best is the per-model reference's best "
                             "assignment chosen on the validation days")
    parser.add_argument("--bootstrap-smoothing", type=float, default=TrainSettings.bootstrap_smoothing)
    parser.add_argument("--bootstrap-min-updates", type=int, default=TrainSettings.bootstrap_min_updates)
    parser.add_argument("--action-levels", default=None,
                        help="the learned policy's planning levels (default: --levels), comma-separated")
    parser.add_argument("--bootstrap-steps", type=int, default=2_880)
    parser.add_argument("--n-envs", type=int, default=2)
    parser.add_argument("--demand-seeds", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=4_000)
    parser.add_argument("--patience", type=int, default=3)
    parser.add_argument("--ent-coef", type=float, default=TrainSettings.ent_coef)
    parser.add_argument("--bootstrap-epochs", type=int, default=TrainSettings.bootstrap_epochs)
    parser.add_argument("--learning-rate", type=float, default=TrainSettings.learning_rate)
    parser.add_argument("--normalize-observations", action="store_true",
                        help="standardize observations (VecNormalize norm_obs), as results before it was "
                             "off by default were trained")
    parser.add_argument("--out-suffix", default="", help="label of this attempt in the JSON keys")
    parser.add_argument("--unserved-usd-per-mtok", type=float, default=RewardWeights.unserved_usd_per_mtok)
    parser.add_argument("--reopt-usd", type=float, default=RewardWeights.reopt_usd)
    parser.add_argument("--worlds", default="exact",
                        help="exact (Fleet-v1), calibration (Fleet-v2, the closed loop) and/or charged "
                             "(Fleet-v3, the world that charges what a cluster charges), comma-separated")
    parser.add_argument("--risks", default="neutral",
                        help="the risk menu crossed with the rule grid, labels separated by ';' "
                             "(e.g. 'neutral;h0.85;h0.7'); hindsight also runs with each")
    parser.add_argument("--workload", default="servegen", choices=sorted(SERVEGEN_WORKLOADS),
                        help="the scenario's demand: every ServeGen client, or its steady or bursty half "
                             "(a cell's key ends in /steady or /bursty)")
    parser.add_argument("--risk-action", action="store_true",
                        help="the learned policy chooses a risk preset per model (atoll/Fleet-v4; needs "
                             "--worlds charged)")
    parser.add_argument("--references", default=None,
                        help="rules outside the grid also run on the test days, comma-separated "
                             "(default: the bootstrap rule and fixed:1@0.9; '' for none)")
    parser.add_argument("--no-hindsight", action="store_true", help="skip hindsight on the test days")
    parser.add_argument("--per-model-targets", type=int, default=3)
    parser.add_argument("--per-model-passes", type=int, default=3)
    parser.add_argument("--ray", default=None, help="run the rules as Ray tasks (auto or an address)")
    parser.add_argument("--n-steps", type=int, default=TrainSettings.n_steps)
    parser.add_argument("--batch-size", type=int, default=TrainSettings.batch_size)
    parser.add_argument("--out", default=None, help="rewrite this JSON file after every cell")
    parser.add_argument("--learned-run", default=None, metavar="RUN_ID",
                        help="contest the policy this finished training run registered instead of training "
                             "one (one cell only; its training time is the run's wall time)")
    parser.add_argument("--no-learned", action="store_true",
                        help="no training: the grid, the frontier and the per-model reference on the test "
                             "days only (a cell too costly to train on in the time at hand)")
    parser.add_argument("--into", type=Path, default=None,
                        help="also merge each finished cell, with this run's settings, into this JSON "
                             "(one key per cell: benchmarks/results/policy.json gathers every cell "
                             "measured; a cell measured again replaces its key)")
    parser.add_argument("--merge", nargs="+", default=None, metavar="FILE[=SUFFIX]",
                        help="run nothing: copy every cell of these earlier documents of this script, with "
                             "their settings and the file's name, into --into (SUFFIX is appended to the "
                             "file's cell keys, to keep two attempts at one cell apart)")
    parser.add_argument("--withdraw", nargs="+", default=None, metavar="KEY=REASON",
                        help="run nothing: move these cells of --into under its 'withdrawn' key with the "
                             "reason (a cell whose policy is lost cannot be re-evaluated on more seeds; its "
                             "figures stay as measured, apart from the cells that carry an interval)")
    parser.add_argument("--grid-only", action="store_true",
                        help="run (or read) each cell's validation grid into the cache and stop there: "
                             "a later run of the same cell reads it")
    args = parser.parse_args()
    if args.merge is not None or args.withdraw is not None:
        if args.into is None:
            raise SystemExit("--merge and --withdraw change the document --into names; add --into FILE")
        done: dict[str, object] = {"into": str(args.into)}
        if args.merge is not None:
            done["merged"] = merge_documents(args.into, args.merge)
        if args.withdraw is not None:
            done["withdrawn"] = withdraw_cells(args.into, args.withdraw)
        print(json.dumps(done, indent=2))
        return
    reward = RewardWeights(unserved_usd_per_mtok=args.unserved_usd_per_mtok, reopt_usd=args.reopt_usd)
    settings = ContestSettings(
        validation_days=_days(args.validation_days), test_days=_days(args.test_days), seeds=args.seeds,
        validation_seeds=args.validation_seeds, levels=tuple(float(q) for q in args.levels.split(",")),
        intervals=tuple(int(k) for k in args.intervals.split(",")),
        bands=tuple((float(b.split(":")[0]), float(b.split(":")[1])) for b in args.bands.split(",") if b),
        workers=args.workers, hindsight=not args.no_hindsight, per_model_targets=args.per_model_targets,
        per_model_passes=args.per_model_passes, ray_address=args.ray,
        risks=tuple(r.strip() for r in args.risks.split(";") if r.strip()))
    out: dict[str, object] = {"settings": {**vars(args), "grid": settings.grid}}
    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    for scenario in args.scenarios.split(","):
        for availability in args.availabilities.split(","):
            for world in args.worlds.split(","):
                demand = "" if args.workload == "servegen" else "/" + args.workload.removeprefix("servegen-")
                key = f"{scenario}/{availability}/{world}{demand}{args.out_suffix}"
                out[key] = cell(args, settings, scenario, availability, world, reward, key, log)
                print(json.dumps({key: out[key]["headline"]}, default=str), file=sys.stderr, flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
                if args.into and not args.grid_only:
                    merge_cell(args.into, key, {**out[key], "settings": out["settings"]})
    print(json.dumps(out, indent=2, default=str))


def merge_cell(path: Path, key: str, cell: dict[str, object]) -> None:
    """Put ``cell`` under ``key`` in the JSON document at ``path`` (created if missing), the
    other keys kept; written to a temporary file and renamed, so a crash leaves the old file."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    if not isinstance(doc, dict):
        raise SystemExit(f"--into {path}: expected a JSON object of cells, got {type(doc).__name__}")
    doc[key] = cell
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    tmp.replace(path)


def withdraw_cells(into: Path, specs: list[str]) -> dict[str, str]:
    """Move each cell ``KEY`` of ``into`` under its ``withdrawn`` key, with ``REASON`` as
    ``withdrawn_because`` (what is left at the top level are the cells that can be checked).
    Returns key -> reason; a key that is not a cell there is refused by name."""
    doc = json.loads(into.read_text()) if into.exists() else {}
    if not isinstance(doc, dict):
        raise SystemExit(f"--into {into}: expected a JSON object of cells, got {type(doc).__name__}")
    out: dict[str, str] = {}
    gone = doc.setdefault("withdrawn", {})
    for spec in specs:
        key, sep, reason = spec.partition("=")
        if not sep or not reason.strip():
            raise SystemExit(f"--withdraw {spec!r}: give KEY=REASON (why the cell is withdrawn)")
        cell = doc.get(key)
        if key == "withdrawn" or not isinstance(cell, dict) or "headline" not in cell:
            cells = sorted(k for k, v in doc.items() if isinstance(v, dict) and "headline" in v)
            raise SystemExit(f"--withdraw: {key!r} is not a cell of {into} (cells: {', '.join(cells)})")
        gone[key] = {**doc.pop(key), "withdrawn_because": reason.strip()}
        out[key] = reason.strip()
    tmp = into.with_suffix(into.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    tmp.replace(into)
    return out


def merge_documents(into: Path, specs: list[str]) -> dict[str, str]:
    """Copy every cell (a key whose value has a ``headline``) of each earlier document of this
    script into ``into`` (:func:`merge_cell`), with the document's ``settings`` and its file name
    as ``source``; ``FILE=SUFFIX`` appends SUFFIX to the file's keys. Returns key -> file."""
    merged: dict[str, str] = {}
    for spec in specs:
        name, _, suffix = spec.partition("=")
        path = Path(name)
        if not path.is_file():
            raise SystemExit(f"--merge: no file {path}; give documents this script wrote (--out)")
        try:
            doc = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--merge: {path} is not JSON ({exc})") from exc
        cells = {k: v for k, v in doc.items() if isinstance(v, dict) and "headline" in v} \
            if isinstance(doc, dict) else {}
        if not cells:
            raise SystemExit(f"--merge: {path} holds no contest cell (a key with a 'headline')")
        for key, value in cells.items():
            merge_cell(into, key + suffix, {**value, "settings": doc.get("settings"), "source": path.name})
            merged[key + suffix] = path.name
    return merged


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def cell(args: argparse.Namespace, settings: ContestSettings, scenario: str, availability: str, world: str,
         reward: RewardWeights, key: str, log: Any) -> dict[str, Any]:
    """One cell: the validation grid (cached), PPO early-stopped on it, the contest on the test days."""
    if world not in ("exact", "calibration", "charged"):
        raise SystemExit(f"--worlds: {world!r} is not exact, calibration or charged")
    if args.risk_action and world != "charged":
        raise SystemExit(f"--risk-action acts on atoll/Fleet-v4, the charged world; got --worlds {world}")
    closed = {"calibration": CLOSED_LOOP, "charged": CHARGED}.get(world, {})
    levels = tuple(float(q) for q in (args.action_levels or args.levels).split(","))
    config = FleetConfig(scenario=scenario, availability=availability, reward=reward, action_levels=levels,
                         workload=args.workload,
                         action="risk" if args.risk_action else "reopt", **closed)
    env_id = {"exact": "atoll/Fleet-v1", "calibration": "atoll/Fleet-v2",
              "charged": "atoll/Fleet-v4" if args.risk_action else "atoll/Fleet-v3"}[world]
    loads: dict[str, list[float]] = {"start": _load()}
    validation, grid_s, cached = cached_validation_grid(config, settings, note=lambda t: log(f"{key}: {t}"))
    loads["after_grid"] = _load()
    if args.grid_only:
        return {"world": world, "grid_seconds": grid_s, "grid_cache": str(cached), "loadavg": loads,
                "headline": None, "validation": validation}
    teacher = args.bootstrap_rule
    if teacher == "per-model:best":
        teacher = per_model_best(config, validation, len(SCENARIOS[scenario].models), settings)
        log(f"{key}: bootstrap teacher (per-model best on the validation days): {teacher}")
    refs = [teacher, "fixed:1@0.9"] if args.references is None else _specs(args.references)
    if not args.no_hindsight:  # the bound with the same levers as the rules
        refs += [f"hindsight+{r}" for r in settings.risks if r != "neutral"]
    if args.no_learned:
        return _rules_only(config, settings, validation, grid_s, refs, key, loads, log, world)
    scorer = validation_scorer(config, validation, settings)
    if args.policy_file:
        train, train_s = _given_file(args.policy_file), 0.0
    elif args.learned_run:
        train, train_s = _finished_run(args.learned_run)
    else:
        train, train_s = _train(args, config, scorer, key, log, teacher)
    loads["after_training"] = _load()
    log(f"{key}: trained in {train_s:.0f} s: {train['model_uri']} ({train['registered']})")
    # the figure is the policy file's: the same file ships, and re-evaluates to the same figure
    learned = (f"learned:file:{train['policy_file']}" if train.get("policy_file")
               else f"learned:{train['registered'].removeprefix('models:/')}")
    spec = parse_policy(learned)
    learned = str(spec)  # the name the contest's results are keyed by
    t = time.perf_counter()
    doc = contest_run(config, [spec], settings, run_name=f"benchmark-{key}",
                      validation=validation, references=[parse_policy(r) for r in refs])
    contest_s = time.perf_counter() - t
    loads["after_contest"] = _load()
    log(doc["table"])
    pol = doc["policies"]
    days = settings.test_days[1] - settings.test_days[0] + 1
    pm = doc.get("per_model") or {}
    per_day = {name: _mean(pol[name]["reoptimizations"]) / days for name in pol}
    return {
        "world": world, "env_id": env_id, "risks": list(settings.risks), "bound": _bound(doc),
        "train_seconds": train_s, "contest_seconds": contest_s, "grid_seconds": grid_s,
        "test_seconds": doc["test_seconds"], "train_run_id": train["run_id"],
        "policy_file": train.get("policy_file"), "run_dir": train.get("run_dir"),
        "model_uri": train["model_uri"], "registered": train["registered"], "fleet": train["fleet"],
        "bootstrap_rule": teacher,
        "training": {**{k: train[k] for k in ("bootstrap_loss", "bootstrap_agreement",
                                              "clone_validation_agreement", "validation_best", "stopped_at",
                                              "validation_evaluations", "episodes",
                                              "capacity_error_draws", "moved_from_clone",
                                              "teacher_agreement_after")
                        if k in train},
                     "ppo_steps": _ppo_steps(args), "bootstrap_steps": args.bootstrap_steps},
        "parent_run_id": doc["parent_run_id"], "loadavg": loads,
        "frontier": doc["frontier"], "best_rule": doc["best_rule"],
        "per_model": pm,
        "frontier_validation_points": {r: doc["validation"][r] for r in doc["frontier"]},
        "frontier_test_points": {
            r: {k: pol[r][k] for k in ("cost_usd", "slo_attainment", "usd_per_mtok", "reoptimizations")}
            for r in doc["frontier"]},
        "per_model_test_points": {
            r: {k: pol[r][k] for k in ("cost_usd", "slo_attainment", "usd_per_mtok", "reoptimizations")}
            for r in dict.fromkeys([*pm.get("frontier", []), *([pm["best"]] if pm.get("best") else [])])},
        "headline": doc["headline"][learned],
        "learned_validation": doc["learned_validation"].get(learned),
        "champion": doc["champion"],
        "reoptimizations_per_day": per_day,
        "hindsight": ({k: pol["hindsight"][k] for k in ("cost_usd", "slo_attainment", "usd_per_mtok")}
                      if "hindsight" in pol else None),
        "validation": doc["validation"], "policies": pol,
    }


def _rules_only(config: FleetConfig, settings: ContestSettings, validation: Any, grid_s: float,
                refs: list[str], key: str, loads: dict[str, list[float]], log: Any, world: str
                ) -> dict[str, Any]:
    """A cell without a learned policy: the frontier and the per-model reference chosen on the
    validation days, run on the test days (``--no-learned``)."""
    t = time.perf_counter()
    doc = contest_run(config, [], settings, run_name=f"benchmark-{key}", validation=validation,
                      references=[parse_policy(r) for r in refs])
    loads["after_contest"] = _load()
    log(doc["table"])
    pol = doc["policies"]
    days = settings.test_days[1] - settings.test_days[0] + 1
    return {
        "world": world, "learned": None,
        "grid_seconds": grid_s, "contest_seconds": time.perf_counter() - t,
        "test_seconds": doc["test_seconds"],
        "parent_run_id": doc["parent_run_id"], "loadavg": loads, "frontier": doc["frontier"],
        "best_rule": doc["best_rule"], "per_model": doc.get("per_model") or {}, "headline": None,
        "reoptimizations_per_day": {name: _mean(pol[name]["reoptimizations"]) / days for name in pol},
        "validation": doc["validation"], "policies": pol,
    }


def _train(args: argparse.Namespace, config: FleetConfig, scorer: Any, key: str, log: Any, teacher: str
           ) -> tuple[dict[str, Any], float]:
    t = time.perf_counter()
    train = train_run(dataclasses.replace(config, days=_days(args.train_days)),
                      TrainSettings(timesteps=args.timesteps, seed=0, n_envs=args.n_envs,
                                    demand_seeds=args.demand_seeds, n_steps=args.n_steps,
                                    batch_size=args.batch_size,
                                    bootstrap_rule=parse_policy(teacher),
                                    bootstrap_steps=args.bootstrap_steps,
                                    bootstrap_smoothing=args.bootstrap_smoothing,
                                    bootstrap_min_updates=args.bootstrap_min_updates,
                                    eval_every=args.eval_every, patience=args.patience,
                                    ent_coef=args.ent_coef, bootstrap_epochs=args.bootstrap_epochs,
                                    learning_rate=args.learning_rate,
                                    normalize_observations=args.normalize_observations),
                      validate=scorer, note=lambda text, k=key: log(f"{k}: {text}"),
                      checkpoint_every=args.checkpoint_every, run_dir=args.run_dir / _folder_name(key),
                      command=shlex.join(["python", "benchmarks/policy.py", *sys.argv[1:]]))
    return train, time.perf_counter() - t


def _folder_name(key: str) -> str:
    """A cell key as a folder name: ``extended/spot/charged`` -> ``extended-spot-charged``."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in key.replace("/", "-")).strip("-")


def _given_file(path: str) -> dict[str, Any]:
    """A policy file evaluated as the cell's learned policy (``--policy-file``): what its card says."""
    from atoll.training.policy_file import read_card

    card = read_card(Path(path))
    return {"run_id": None, "model_uri": f"file:{path}", "registered": f"file:{path}", "fleet": card.fleet,
            "policy_file": path, "validation_best": card.validation_score}


def _ppo_steps(args: argparse.Namespace) -> int:
    """PPO's env steps without an early stop: ``--timesteps`` rounded up to whole rollouts."""
    rollout = args.n_steps * args.n_envs
    return -(-args.timesteps // rollout) * rollout


def _finished_run(run_id: str) -> tuple[dict[str, Any], float]:
    """A finished training run's policy (as train_run returns it) and its wall seconds."""
    from mlflow.tracking import MlflowClient

    from atoll.training.tracking import configure

    configure()
    run = MlflowClient().get_run(run_id)
    tags, metrics = run.data.tags, run.data.metrics
    train: dict[str, Any] = {"run_id": run_id, "model_uri": tags["atoll.model_uri"],
                             "registered": "models:/" + tags["atoll.registered"],
                             "fleet": tags["atoll.registered"].split("/")[0].removeprefix("atoll-trigger-"),
                             **metrics}
    return train, (run.info.end_time - run.info.start_time) / 1000.0


def _bound(doc: dict[str, Any]) -> dict[str, Any] | None:
    """Hindsight with each risk of the menu against the test-day frontier (means over seeds): each
    variant's frontier cost ratio and the best of them, the bound with the rules' levers."""
    pol = doc["policies"]
    line = [Point(r, pol[r]["cost_usd"]["mean"], pol[r]["slo_attainment"]["mean"], 0.0)
            for r in doc["frontier"]]
    ratios = {}
    for name, s in pol.items():
        if name == "hindsight" or name.startswith("hindsight+"):
            reading = frontier_cost_at(line, s["slo_attainment"]["mean"])
            ratios[name] = {"frontier_cost_ratio": s["cost_usd"]["mean"] / reading.cost_usd,
                            "cost_usd": s["cost_usd"]["mean"], "slo_attainment": s["slo_attainment"]["mean"],
                            "position": reading.position}
    if not ratios:
        return None
    best = min(ratios, key=lambda n: ratios[n]["frontier_cost_ratio"])
    return {"best": best, "frontier_cost_ratio": ratios[best]["frontier_cost_ratio"], "variants": ratios}


def _specs(text: str) -> list[str]:
    """Policy specs from a comma-separated list; a per-model spec's own ``K@q`` entries (no colon)
    stay with it: ``fixed:1,per-model:1@0.9,3@0.8`` is two specs; so do the further parts of a
    risk suffix (``fixed:1+h0.85,s0.5``)."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if part and ":" not in part and out and (out[-1].startswith("per-model:") or "+" in out[-1]) \
                and not part.startswith(("hindsight", "never", "oracle-rate", "oracle-quantile")):
            out[-1] += f",{part}"
        elif part:
            out.append(part)
    return out


def _mean(value: object) -> float:
    return float(value["mean"]) if isinstance(value, dict) else float(value)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
