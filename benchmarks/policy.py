"""Figures of the learned-policy issue (and the contest's), as one JSON document on stdout
(progress on stderr).

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
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import pickle
import sys
import time
from pathlib import Path

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.envs.config import FleetConfig, RewardWeights  # noqa: E402
from atoll.envs.policies import FIXED_INTERVALS, PLANNING_LEVELS, THRESHOLD_BANDS  # noqa: E402
from atoll.solvers.paths import cache_root  # noqa: E402
from atoll.training.contest import ContestSettings, validation_grid, validation_scorer  # noqa: E402
from atoll.training.evaluate import resolve_policy  # noqa: E402
from atoll.training.tracking import contest_run, train_run  # noqa: E402
from atoll.training.train import TrainSettings  # noqa: E402


def _days(text: str) -> tuple[int, int]:
    a, _, b = text.partition("-")
    return int(a), int(b or a)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenarios", default="core,extended")
    parser.add_argument("--availabilities", default="hedged,spot")
    parser.add_argument("--timesteps", type=int, default=30_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--validation-seeds", type=int, default=None)
    parser.add_argument("--train-days", default="4-7")
    parser.add_argument("--validation-days", default="8-10")
    parser.add_argument("--test-days", default="11-14")
    parser.add_argument("--levels", default=",".join(f"{q:g}" for q in PLANNING_LEVELS))
    parser.add_argument("--intervals", default=",".join(map(str, FIXED_INTERVALS)))
    parser.add_argument("--bands", default=",".join(f"{lo:g}:{hi:g}" for lo, hi in THRESHOLD_BANDS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bootstrap-rule", default="fixed:1")
    parser.add_argument("--bootstrap-steps", type=int, default=2_880)
    parser.add_argument("--n-envs", type=int, default=2)
    parser.add_argument("--demand-seeds", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=4_000)
    parser.add_argument("--patience", type=int, default=3)
    parser.add_argument("--ent-coef", type=float, default=TrainSettings.ent_coef)
    parser.add_argument("--bootstrap-epochs", type=int, default=TrainSettings.bootstrap_epochs)
    parser.add_argument("--learning-rate", type=float, default=TrainSettings.learning_rate)
    parser.add_argument("--out-suffix", default="", help="label of this attempt in the JSON keys")
    parser.add_argument("--unserved-usd-per-mtok", type=float, default=RewardWeights.unserved_usd_per_mtok)
    parser.add_argument("--reopt-usd", type=float, default=RewardWeights.reopt_usd)
    args = parser.parse_args()
    reward = RewardWeights(unserved_usd_per_mtok=args.unserved_usd_per_mtok, reopt_usd=args.reopt_usd)
    settings = ContestSettings(
        validation_days=_days(args.validation_days), test_days=_days(args.test_days), seeds=args.seeds,
        validation_seeds=args.validation_seeds, levels=tuple(float(q) for q in args.levels.split(",")),
        intervals=tuple(int(k) for k in args.intervals.split(",")),
        bands=tuple((float(b.split(":")[0]), float(b.split(":")[1])) for b in args.bands.split(",")),
        workers=args.workers)
    out: dict[str, object] = {"settings": {**vars(args), "grid": settings.grid}}
    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    for scenario in args.scenarios.split(","):
        for availability in args.availabilities.split(","):
            key = f"{scenario}/{availability}{args.out_suffix}"
            config = FleetConfig(scenario=scenario, availability=availability, reward=reward)
            grid_key = (config, settings.grid, settings.validation_days,
                        settings.validation_seeds or settings.seeds)
            digest = hashlib.sha256(pickle.dumps(grid_key)).hexdigest()[:20]
            cached = cache_root() / "contest" / f"validation-{digest}.pkl"
            if cached.exists():
                validation, grid_s = pickle.loads(cached.read_bytes())
                log(f"{key}: validation grid read from {cached} (it took {grid_s:.0f} s)")
            else:
                validation, grid_s = validation_grid(config, settings)
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_bytes(pickle.dumps((validation, grid_s)))
                log(f"{key}: validation grid of {len(validation)} rules in {grid_s:.0f} s")
            scorer = validation_scorer(config, validation, settings)
            t = time.perf_counter()
            train = train_run(dataclasses.replace(config, days=_days(args.train_days)),
                              TrainSettings(timesteps=args.timesteps, seed=0, n_envs=args.n_envs,
                                            demand_seeds=args.demand_seeds,
                                            bootstrap_rule=args.bootstrap_rule,
                                            bootstrap_steps=args.bootstrap_steps,
                                            eval_every=args.eval_every, patience=args.patience,
                                            ent_coef=args.ent_coef, bootstrap_epochs=args.bootstrap_epochs,
                                            learning_rate=args.learning_rate),
                              validate=scorer, note=lambda text, k=key: log(f"{k}: {text}"))
            train_s = time.perf_counter() - t
            log(f"{key}: trained in {train_s:.0f} s: {train['model_uri']} ({train['registered']})")
            learned = f"learned:{train['registered'].removeprefix('models:/')}"
            t = time.perf_counter()
            doc = contest_run(config, [learned], settings, run_name=f"benchmark-{scenario}-{availability}",
                              validation=validation, references=[args.bootstrap_rule, "fixed:1@0.9"])
            contest_s = time.perf_counter() - t
            log(doc["table"])
            pol = doc["policies"]
            days = settings.test_days[1] - settings.test_days[0] + 1
            bootstrap_val = scorer.run(resolve_policy(args.bootstrap_rule, len(scorer.env.models)))
            out[key] = {
                "train_seconds": train_s, "contest_seconds": contest_s, "grid_seconds": grid_s,
                "test_seconds": doc["test_seconds"], "train_run_id": train["run_id"],
                "model_uri": train["model_uri"], "registered": train["registered"],
                "training": {k: train[k] for k in ("bootstrap_loss", "validation_best", "stopped_at",
                                                   "validation_evaluations") if k in train},
                "parent_run_id": doc["parent_run_id"],
                "frontier": doc["frontier"], "best_rule": doc["best_rule"],
                "frontier_validation_points": {r: doc["validation"][r] for r in doc["frontier"]},
                "frontier_test_points": {
                    r: {k: pol[r][k]
                        for k in ("cost_usd", "slo_attainment", "usd_per_mtok", "reoptimizations")}
                    for r in doc["frontier"]},
                "headline": doc["headline"][learned],
                "learned_validation": doc["learned_validation"].get(learned),
                "champion": doc["champion"],
                "reoptimizations_per_day": {
                    "learned": _mean(pol[learned]["reoptimizations"]) / days,
                    "fixed:1@0.9": _mean(pol["fixed:1@0.9"]["reoptimizations"]) / days},
                "bootstrap_rule": {"name": args.bootstrap_rule, "validation": bootstrap_val,
                                   "test": pol.get(args.bootstrap_rule)},
                "hindsight": {k: pol["hindsight"][k] for k in ("cost_usd", "slo_attainment", "usd_per_mtok")},
                "validation": doc["validation"], "policies": pol,
            }
            print(json.dumps({key: out[key]["headline"]}, default=str), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=2))


def _mean(value: object) -> float:
    return float(value["mean"]) if isinstance(value, dict) else float(value)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
