"""``atoll train``: a PPO re-planning trigger on FleetEnv in a run folder, logged to MLflow;
``atoll train --status DIR``: where a run stands."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.control.cli.common import add_env_options, make_env, parse_days
from atoll.control.cli.output import output_for, progress
from atoll.envs import ENV_ID, ENV_ID_V2, ENV_ID_V3, ENV_ID_V4
from atoll.envs.config import FleetConfig, RewardWeights
from atoll.solvers.errors import AtollError, InputError

if TYPE_CHECKING:
    from atoll.training.train import TrainSettings

BOOTSTRAP_RULE = "fixed:1"
CHECKPOINT_EVERY = 2_304  # two rollouts of the default 2 envs x 576 steps


def train_config(args: argparse.Namespace, days: tuple[int, int], timesteps: int, seed: int
                 ) -> tuple[FleetConfig, TrainSettings]:
    """The environment and PPO settings the options describe, all validated before MLflow starts
    a run, so bad input leaves no FAILED run (shared with ``atoll demo``)."""
    from atoll.envs.vocabulary import parse_policy
    from atoll.training.cloning import bootstrap_teacher  # torch: only when training
    from atoll.training.train import TrainSettings, bootstrap_rule_error

    reward = RewardWeights(unserved_usd_per_mtok=args.unserved_usd_per_mtok, reopt_usd=args.reopt_usd)
    try:
        rule = parse_policy(args.bootstrap_rule)
    except AtollError:  # not a policy: the settings' own error, naming the text
        raise bootstrap_rule_error(args.bootstrap_rule) from None
    settings = TrainSettings(timesteps=timesteps, seed=seed, bootstrap_steps=args.bootstrap_steps,
                             bootstrap_rule=rule,
                             bootstrap_smoothing=args.bootstrap_smoothing, n_envs=args.n_envs,
                             demand_seeds=args.demand_seeds,
                             normalize_observations=args.normalize_observations)
    env = make_env(args, days, reward=reward)
    if settings.bootstrap_steps:
        bootstrap_teacher(settings.bootstrap_rule, env)  # a rule that does not fit the env fails here
    return env.config, settings


def cmd_train(args: argparse.Namespace) -> int:
    out = output_for(args)
    if args.status is not None:
        return _status(out, args.status)
    from atoll.training.registry import fleet_name
    from atoll.training.run_folder import default_run_dir, identity
    from atoll.training.tracking import settings_key
    from atoll.training.train_tracking import train_params, train_run

    if args.checkpoint_every < 0:
        raise InputError(f"--checkpoint-every: PPO steps between checkpoints must be >= 0 (0: only at the "
                         f"end), got {args.checkpoint_every}")
    config, settings = train_config(args, parse_days(args.train_days), args.timesteps, args.seed)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(
        fleet_name(config.scenario, config.models, config.scenario_spec.models),
        settings_key(identity(train_params(config, settings))))
    out.note(f"run folder {run_dir} (the same command again resumes it; 'atoll train --status {run_dir}')")
    with progress("training", settings.bootstrap_steps + settings.ppo_steps) as advance:
        run = train_run(config, settings, tick=advance, checkpoint_every=args.checkpoint_every,
                        run_dir=run_dir, command=shlex.join(["atoll", *getattr(args, "argv", sys.argv[1:])]),
                        note=out.note)
    out.result(f"run_id      {run['run_id']}\nmodel_uri   {run['model_uri']}\n"
               f"registered  {run['registered']}\nrun_dir     {run['run_dir']}\n"
               f"policy_file {run['policy_file']} "
               f"(--policy learned:file:{run['policy_file']})")
    out.json(run)
    return 0


def _status(out: Any, folder: str) -> int:
    from atoll.training.run_folder import run_status

    status = run_status(Path(folder))
    left = status["steps_left"]
    lines = [f"run_dir      {status['run_dir']}", f"state        {status['state']}",
             f"checkpoint   {status['checkpoint_steps']} PPO steps"
             + ("" if status["checkpoint_exact"] is None else
                " (resumes exactly)" if status["checkpoint_exact"] else " (resumes mid-episode)"),
             f"budget       {status['timesteps']} PPO steps" + (f", {left} left" if left else ""),
             f"validation   best {status['validation_best']} over {len(status['validation_scores'])} scores",
             *(f"policy-{name:<7} {path}" for name, path in status["policies"].items()),
             f"command      {status['command']}"]
    out.result("\n".join(lines))
    out.json(status)
    return 0


def add_env_id_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=None, choices=(ENV_ID, ENV_ID_V2, ENV_ID_V3, ENV_ID_V4),
                   help=f"{ENV_ID}: the world as modelled (the default); {ENV_ID_V2}: the closed loop "
                        "(capacities off the model by the calibration's spread, drawn at every reset; online "
                        "correction; latency SLO; the policy observes latency, queues and the correction); "
                        f"{ENV_ID_V3}: the charged world (the closed loop plus sampled start-up, "
                        "zone-correlated preemptions and failing spot acquisition; the policy also observes "
                        f"risk); {ENV_ID_V4}: the charged world where each re-plan also chooses its risk "
                        "preset (--risk-menu). The first three are the same as --world exact, calibration "
                        "or charged")
    p.add_argument("--risk-menu", default=None, metavar="RISK;RISK...",
                   help=f"{ENV_ID_V4}: the risk presets a re-plan chooses among besides the configured "
                        "--risk, ';'-separated (h0.85;h0.7; default: the market's menu)")


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
    p.add_argument("--run-dir", default=None, metavar="DIR",
                   help="the run's folder: settings, checkpoints, policy-best and policy-last; the same "
                        "command again resumes it, a larger --timesteps continues it, a changed setting is "
                        "refused (default runs/<fleet>-<settings key> under the working directory)")
    p.add_argument("--checkpoint-every", type=int, default=CHECKPOINT_EVERY, metavar="STEPS",
                   help="save the run's state every STEPS PPO steps into the run folder (and always at the "
                        f"end; 0: only at the end; default {CHECKPOINT_EVERY})")
    p.add_argument("--status", default=None, metavar="DIR",
                   help="print where the run in DIR stands (steps, budget, scores, policy files) and exit")
    add_train_options(p, bootstrap_steps=2_880)
    p.set_defaults(handler=cmd_train)
