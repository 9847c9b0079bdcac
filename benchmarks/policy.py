"""Figures of the fair-contest issue, as one JSON document on stdout (progress on stderr).

Per scenario and availability: train PPO on ServeGen days ``--train-days`` (default 4-7, before
the validation days), then run the contest (``atoll.training.contest``): the rule grid
(``fixed:K@q``, ``threshold:LOW:HIGH@q``) on validation days 8-10, its cost-SLO frontier chosen
there, and the frontier rules, the best rule, the learned policy and hindsight on test days
11-14 over ``--seeds`` seeds, logged to MLflow (``sqlite:///mlruns/mlflow.db`` unless
MLFLOW_TRACKING_URI is set). Reports the frontier, its test-day points, both headline ratios
(mean and std over seeds), the grid's wall time and the training wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.envs.config import FleetConfig, RewardWeights  # noqa: E402
from atoll.envs.policies import FIXED_INTERVALS, PLANNING_LEVELS, THRESHOLD_BANDS  # noqa: E402
from atoll.training.contest import ContestSettings  # noqa: E402
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
    parser.add_argument("--bootstrap-rule", default="threshold")
    parser.add_argument("--bootstrap-steps", type=int, default=2_880)
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
    for scenario in args.scenarios.split(","):
        for availability in args.availabilities.split(","):
            t = time.perf_counter()
            train = train_run(FleetConfig(scenario=scenario, availability=availability,
                                          days=_days(args.train_days), reward=reward),
                              TrainSettings(timesteps=args.timesteps, seed=0,
                                            bootstrap_rule=args.bootstrap_rule,
                                            bootstrap_steps=args.bootstrap_steps))
            train_s = time.perf_counter() - t
            print(f"{scenario}/{availability}: trained in {train_s:.0f} s: {train['model_uri']}",
                  file=sys.stderr, flush=True)
            learned = f"learned:{train['model_uri']}"
            t = time.perf_counter()
            doc = contest_run(FleetConfig(scenario=scenario, availability=availability, reward=reward),
                              [learned], settings, run_name=f"benchmark-{scenario}-{availability}")
            contest_s = time.perf_counter() - t
            print(doc["table"], file=sys.stderr, flush=True)
            pol = doc["policies"]
            out[f"{scenario}/{availability}"] = {
                "train_seconds": train_s, "contest_seconds": contest_s, "grid_seconds": doc["grid_seconds"],
                "test_seconds": doc["test_seconds"], "train_run_id": train["run_id"],
                "model_uri": train["model_uri"], "parent_run_id": doc["parent_run_id"],
                "frontier": doc["frontier"], "best_rule": doc["best_rule"],
                "frontier_validation_points": {r: doc["validation"][r] for r in doc["frontier"]},
                "frontier_test_points": {
                    r: {k: pol[r][k]
                        for k in ("cost_usd", "slo_attainment", "usd_per_mtok", "reoptimizations")}
                    for r in doc["frontier"]},
                "headline": doc["headline"][learned],
                "hindsight": {k: pol["hindsight"][k] for k in ("cost_usd", "slo_attainment", "usd_per_mtok")},
                "validation": doc["validation"], "policies": pol,
            }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
