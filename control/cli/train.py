"""``atoll train``: a PPO re-planning trigger on FleetEnv, logged to MLflow."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from atoll.control.cli.common import add_env_options, make_env, parse_days
from atoll.control.cli.output import output_for, progress
from atoll.envs import CLOSED_LOOP, ENV_ID, ENV_ID_V2
from atoll.envs.config import FleetConfig, RewardWeights
from atoll.solvers.errors import InputError

if TYPE_CHECKING:
    from atoll.training.train import TrainSettings

BOOTSTRAP_RULE = "fixed:1"


def world_options(args: argparse.Namespace) -> dict[str, Any]:
    """The FleetConfig fields ``--env`` implies: ``atoll/Fleet-v2`` is the closed loop
    (``atoll.envs.CLOSED_LOOP``: capacity_error calibration, correction, latency SLO, the v2
    observation); ``--capacity-error``, ``--correction`` and ``--slo-model`` given with it win."""
    if getattr(args, "env", ENV_ID) != ENV_ID_V2:
        return {}
    given = {name: getattr(args, name) for name in ("capacity_error", "correction", "slo_model")
             if getattr(args, name, None) is not None}
    return {**CLOSED_LOOP, **given}


def train_config(args: argparse.Namespace, days: tuple[int, int], timesteps: int, seed: int
                 ) -> tuple[FleetConfig, TrainSettings]:
    """The environment and PPO settings the options describe, all validated before MLflow starts
    a run, so bad input leaves no FAILED run (shared with ``atoll demo``)."""
    from atoll.training.cloning import bootstrap_teacher  # torch: only when training
    from atoll.training.train import TrainSettings

    reward = RewardWeights(unserved_usd_per_mtok=args.unserved_usd_per_mtok, reopt_usd=args.reopt_usd)
    settings = TrainSettings(timesteps=timesteps, seed=seed, bootstrap_steps=args.bootstrap_steps,
                             bootstrap_rule=args.bootstrap_rule,
                             bootstrap_smoothing=args.bootstrap_smoothing, n_envs=args.n_envs,
                             demand_seeds=args.demand_seeds,
                             normalize_observations=args.normalize_observations)
    env = make_env(args, days, reward=reward, **world_options(args))
    if settings.bootstrap_steps:
        bootstrap_teacher(settings.bootstrap_rule, env)  # a rule that does not fit the env fails here
    return env.config, settings


def cmd_train(args: argparse.Namespace) -> int:
    from atoll.training.tracking import train_run

    out = output_for(args)
    if args.checkpoint_every < 0:
        raise InputError(f"--checkpoint-every: PPO steps between checkpoints must be >= 0 (0: never), "
                         f"got {args.checkpoint_every}")
    config, settings = train_config(args, parse_days(args.train_days), args.timesteps, args.seed)
    with progress("training", settings.bootstrap_steps + settings.ppo_steps) as advance:
        run = train_run(config, settings, tick=advance, checkpoint_every=args.checkpoint_every)
    out.result(f"run_id     {run['run_id']}\nmodel_uri  {run['model_uri']}\nregistered {run['registered']}")
    out.json(run)
    return 0


def add_env_id_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=ENV_ID, choices=(ENV_ID, ENV_ID_V2),
                   help=f"{ENV_ID}: the world as modelled; {ENV_ID_V2}: the closed loop (capacities off the "
                        "model by the calibration's spread, drawn at every reset; online correction; latency "
                        "SLO; the policy observes latency, queues and the correction)")


def add_train_options(p: argparse.ArgumentParser, *, bootstrap_steps: int) -> None:
    """Bootstrapping and reward options shared by ``atoll train`` and ``atoll demo``."""
    p.add_argument("--bootstrap-steps", type=int, default=bootstrap_steps,
                   help="behaviour-cloning steps from --bootstrap-rule before PPO (0 = none)")
    p.add_argument("--bootstrap-rule", default=BOOTSTRAP_RULE,
                   help="rule the policy imitates before PPO: grow:K[@q], threshold[:LOW:HIGH][@q], "
                        "fixed:K[@q] or per-model:K1@q1,... (one K@q per model; its levels among the env's "
                        f"action levels) (default {BOOTSTRAP_RULE}: chosen on validation days 8-10, "
                        "core/spot)")
    p.add_argument("--bootstrap-smoothing", type=float, default=0.0,
                   help="share of the cloned action's probability spread over the same kind at the other "
                        "planning levels and risk presets (PPO then explores them, not holds); 0 <= S < 0.5")
    p.add_argument("--n-envs", type=int, default=2,
                   help="training envs, one process each (both cores; a fleet file's envs step in-process)")
    p.add_argument("--demand-seeds", type=int, default=2,
                   help="demand realizations trained on (env i uses demand seed i mod this)")
    p.add_argument("--normalize-observations", action="store_true",
                   help="standardize the observation by its running mean and std (off by default: its "
                        "entries are already scaled to their bounds, and a short cloning set's std blows "
                        "up a rare feature on days it never saw)")
    add_env_id_option(p)
    p.add_argument("--unserved-usd-per-mtok", type=float, default=RewardWeights.unserved_usd_per_mtok,
                   help="reward: value of a million tokens not served within SLO ($)")
    p.add_argument("--reopt-usd", type=float, default=RewardWeights.reopt_usd,
                   help="reward: charge per model re-optimized ($)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a PPO re-planning trigger on FleetEnv (logged to MLflow)")
    add_env_options(p)
    p.add_argument("--train-days", default="4-10", help="training days, e.g. 4-10 (days 1-3 warm the "
                   "forecaster up)")
    p.add_argument("--timesteps", type=int, default=20_000,
                   help="PPO environment steps after the bootstrap (default 20000)")
    p.add_argument("--seed", type=int, default=0, help="seed of PPO and of the envs (>= 0)")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                   help="save the run's state every STEPS PPO steps under the cache folder; the same "
                        "command run again after a stop goes on from the last one (default 0: never)")
    add_train_options(p, bootstrap_steps=2_880)
    p.set_defaults(handler=cmd_train)
