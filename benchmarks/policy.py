"""Figures of the learned-trigger issue, as one JSON document on stdout (progress on stderr).

Trains PPO on ServeGen days 4-10 (spot availability) and evaluates it against every fixed
interval, threshold, never and hindsight on held-out days 11-14 over 3 seeds, in MLflow
(``sqlite:///mlruns/mlflow.db`` unless MLFLOW_TRACKING_URI is set). Reports, per scenario, the
learned policy's $/M goodput tokens against the best fixed interval's (chosen on those days),
SLO attainment and re-optimizations, and the training wall time.
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
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.training.tracking import evaluate_run, train_run  # noqa: E402
from atoll.training.train import TrainSettings  # noqa: E402

FIXED = ("fixed:1", "fixed:3", "fixed:6", "fixed:12")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenarios", default="core")
    parser.add_argument("--timesteps", type=int, default=30_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eval-days", default="11-14")
    parser.add_argument("--bootstrap-rule", default="threshold")
    parser.add_argument("--bootstrap-steps", type=int, default=2_880)
    parser.add_argument("--unserved-usd-per-mtok", type=float, default=RewardWeights.unserved_usd_per_mtok)
    parser.add_argument("--reopt-usd", type=float, default=RewardWeights.reopt_usd)
    args = parser.parse_args()
    first, last = (int(x) for x in args.eval_days.split("-"))
    out: dict[str, object] = {}
    for scenario in args.scenarios.split(","):
        t = time.perf_counter()
        reward = RewardWeights(unserved_usd_per_mtok=args.unserved_usd_per_mtok, reopt_usd=args.reopt_usd)
        train = train_run(FleetConfig(scenario=scenario, days=(4, 10), reward=reward),
                          TrainSettings(timesteps=args.timesteps, seed=0, bootstrap_rule=args.bootstrap_rule,
                                        bootstrap_steps=args.bootstrap_steps))
        train_s = time.perf_counter() - t
        print(f"{scenario}: trained in {train_s:.0f} s: {train}", file=sys.stderr, flush=True)
        env = FleetEnv(FleetConfig(scenario=scenario, days=(first, last)))
        learned = f"learned:{train['model_uri']}"
        specs = [learned, *FIXED, "threshold", "never", "hindsight"]
        ev = evaluate_run(env, specs, days=list(range(first, last + 1)), seeds=args.seeds,
                          run_name=f"benchmark-{scenario}")
        pol = ev["policies"]
        best = min(FIXED, key=lambda k: pol[k]["usd_per_mtok"]["mean"])
        ratio = pol[learned]["usd_per_mtok"]["mean"] / pol[best]["usd_per_mtok"]["mean"]
        out[scenario] = {
            "train_seconds": train_s, "timesteps": args.timesteps, "bootstrap_rule": args.bootstrap_rule,
            "bootstrap_steps": args.bootstrap_steps,
            "reward": {"unserved_usd_per_mtok": reward.unserved_usd_per_mtok, "reopt_usd": reward.reopt_usd},
            "train_run_id": train["run_id"],
            "model_uri": train["model_uri"], "parent_run_id": ev["parent_run_id"],
            "best_fixed": best, "usd_per_mtok_ratio_learned_to_best_fixed": ratio,
            "slo_learned_minus_best_fixed": pol[learned]["slo_attainment"]["mean"]
            - pol[best]["slo_attainment"]["mean"],
            "reoptimizations_best_fixed_over_learned": pol[best]["reoptimizations"]["mean"]
            / max(pol[learned]["reoptimizations"]["mean"], 1e-9),
            "policies": pol, "table": ev["table"],
        }
        print(ev["table"], file=sys.stderr, flush=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
