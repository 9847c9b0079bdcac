"""``atoll train``: a PPO re-planning trigger on FleetEnv, logged to MLflow."""

from __future__ import annotations

import argparse
from typing import Any

from atoll.control.cli.common import add_env_options, make_env, parse_days
from atoll.control.cli.output import Output, output_for, progress
from atoll.envs.config import RewardWeights
from atoll.training.train import TrainSettings


def train(out: Output, args: argparse.Namespace, days: tuple[int, int], timesteps: int, seed: int,
          tags: dict[str, str] | None = None) -> dict[str, Any]:
    """Validate every setting, then train and log one run (shared with ``atoll demo``)."""
    from atoll.training.tracking import train_run

    # Everything is validated before MLflow starts a run, so bad input leaves no FAILED run.
    reward = RewardWeights(unserved_usd_per_mtok=args.unserved_usd_per_mtok, reopt_usd=args.reopt_usd)
    settings = TrainSettings(timesteps=timesteps, seed=seed, bootstrap_steps=args.bootstrap_steps,
                             bootstrap_rule=args.bootstrap_rule)
    env = make_env(args, days, reward=reward)
    with progress("training", settings.bootstrap_steps + timesteps) as advance:
        run = train_run(env.config, settings, tags=tags, tick=advance)
    out.note(f"trained: run {run['run_id']}, model {run['model_uri']}")
    return run


def cmd_train(args: argparse.Namespace) -> int:
    out = output_for(args)
    run = train(out, args, parse_days(args.train_days), args.timesteps, args.seed)
    out.result(f"run_id     {run['run_id']}\nmodel_uri  {run['model_uri']}")
    out.json(run)
    return 0


def add_train_options(p: argparse.ArgumentParser, *, bootstrap_steps: int) -> None:
    """Bootstrapping and reward options shared by ``atoll train`` and ``atoll demo``."""
    p.add_argument("--bootstrap-steps", type=int, default=bootstrap_steps,
                   help="behaviour-cloning steps from --bootstrap-rule before PPO (0 = none)")
    p.add_argument("--bootstrap-rule", default="threshold",
                   help="rule the policy imitates before PPO: threshold[:LOW:HIGH] or fixed:K")
    p.add_argument("--unserved-usd-per-mtok", type=float, default=RewardWeights.unserved_usd_per_mtok,
                   help="reward: value of a million tokens not served within SLO ($)")
    p.add_argument("--reopt-usd", type=float, default=RewardWeights.reopt_usd,
                   help="reward: charge per model re-optimized ($)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a PPO re-planning trigger on FleetEnv (logged to MLflow)")
    add_env_options(p)
    p.add_argument("--train-days", default="4-10", help="training days, e.g. 4-10 (days 1-3 warm the "
                   "forecaster up)")
    p.add_argument("--timesteps", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0, help="seed of PPO and of the envs (>= 0)")
    add_train_options(p, bootstrap_steps=2_880)
    p.set_defaults(handler=cmd_train)
