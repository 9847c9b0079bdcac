"""``atoll train`` and ``atoll evaluate``: PPO trigger policies and their comparison in MLflow."""

from __future__ import annotations

import argparse
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from atoll.control.cli_simulate import add_env_options, make_env, parse_days
from atoll.control.output import UserError, console, emit_json
from atoll.envs.config import FleetConfig, RewardWeights
from atoll.training.train import TrainSettings

DEFAULT_POLICIES = "fixed:1,fixed:3,fixed:6,fixed:12,threshold,never,hindsight"


def progress_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True)


def train(args: argparse.Namespace, days: tuple[int, int], timesteps: int, seed: int,
          tags: dict[str, str] | None = None) -> dict[str, Any]:
    from atoll.training.tracking import train_run

    try:
        reward = RewardWeights(unserved_usd_per_mtok=args.unserved_usd_per_mtok, reopt_usd=args.reopt_usd)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    env = make_env(args, days, reward=reward)  # validates the settings before any run is created
    config: FleetConfig = env.config
    try:
        settings = TrainSettings(timesteps=timesteps, seed=seed, bootstrap_steps=args.bootstrap_steps,
                                 bootstrap_rule=args.bootstrap_rule)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    with progress_bar() as progress:
        task = progress.add_task("training", total=settings.bootstrap_steps + timesteps)
        out = train_run(config, settings, tags=tags, tick=lambda n: progress.advance(task, n))
    console.print(f"trained: run {out['run_id']}, model {out['model_uri']}", highlight=False)
    return out


def cmd_train(args: argparse.Namespace) -> int:
    out = train(args, parse_days(args.train_days), args.timesteps, args.seed)
    if args.json:
        emit_json(out)
    return 0


def summary_table(title: str, policies: dict[str, dict[str, dict[str, float]]]) -> Table:
    table = Table(title=title)
    for col in ("policy", "cost $", "goodput", "SLO att.", "$/M goodput tok", "re-opts", "solver s"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, s in policies.items():
        def pm(k: str, fmt: str, s: dict[str, dict[str, float]] = s) -> str:
            return f"{s[k]['mean']:{fmt}} ± {s[k]['std']:{fmt}}"
        table.add_row(name, pm("cost_usd", ".0f"), pm("goodput_share", ".3f"), pm("slo_attainment", ".3f"),
                      pm("usd_per_mtok", ".4f"), pm("reoptimizations", ".0f"), pm("solver_seconds", ".1f"))
    return table


def evaluate(args: argparse.Namespace, days: tuple[int, int], specs: list[str], seeds: int,
             run_name: str = "evaluate", tags: dict[str, str] | None = None) -> dict[str, Any]:
    from atoll.training.tracking import evaluate_run

    env = make_env(args, days)
    day_list = list(range(days[0], days[1] + 1))
    with progress_bar() as progress:
        total = len(specs) * seeds * len(day_list) * env.config.episode_steps
        task = progress.add_task("evaluating", total=total)
        try:
            out = evaluate_run(env, specs, days=day_list, seeds=seeds, run_name=run_name, tags=tags,
                               tick=lambda n: progress.advance(task, n))
        except (KeyError, ValueError, OSError) as exc:
            raise UserError(str(exc).strip("'\"")) from exc
    console.print(summary_table(f"{env.config.scenario} / {env.config.availability} / days "
                                f"{days[0]}-{days[1]} / {seeds} seed(s)", out["policies"]))
    return out


def cmd_evaluate(args: argparse.Namespace) -> int:
    specs = [s.strip() for s in args.policies.split(",") if s.strip()]
    out = evaluate(args, parse_days(args.eval_days), specs, args.seeds)
    console.print(f"MLflow parent run {out['parent_run_id']}", highlight=False)
    if args.json:
        emit_json({"parent_run_id": out["parent_run_id"], "policies": out["policies"]})
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
    p.add_argument("--seed", type=int, default=0)
    add_train_options(p, bootstrap_steps=2_880)
    p.set_defaults(handler=cmd_train)
    e = sub.add_parser("evaluate", help="compare policies on held-out days (MLflow parent + nested runs)")
    add_env_options(e)
    e.add_argument("--eval-days", default="11-14")
    e.add_argument("--policies", default=DEFAULT_POLICIES,
                   help="comma-separated: learned:<model uri>, fixed:K, threshold, never, hindsight")
    e.add_argument("--seeds", type=int, default=3)
    e.set_defaults(handler=cmd_evaluate)
