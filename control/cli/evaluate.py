"""``atoll evaluate``: compare policies on held-out days (one MLflow parent run, one nested run each)."""

from __future__ import annotations

import argparse
from typing import Any

from atoll.control.cli.common import add_env_options, make_env, parse_days, split_names
from atoll.control.cli.output import Output, UserError, as_user_error, output_for, progress, results_table

DEFAULT_POLICIES = "fixed:1,fixed:3,fixed:6,fixed:12,threshold,never,hindsight"


def evaluate(out: Output, args: argparse.Namespace, days: tuple[int, int], specs: list[str], seeds: int,
             run_name: str = "evaluate", tags: dict[str, str] | None = None) -> dict[str, Any]:
    """Evaluate and log ``specs`` and show the results table (shared with ``atoll demo``)."""
    from atoll.training.tracking import evaluate_run

    if seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {seeds}")
    env = make_env(args, days)
    day_list = list(range(days[0], days[1] + 1))
    total = len(specs) * seeds * len(day_list) * env.config.episode_steps
    with progress("evaluating", total) as advance:
        try:
            result = evaluate_run(env, specs, days=day_list, seeds=seeds, run_name=run_name, tags=tags,
                                  tick=advance)
        except (KeyError, ValueError, OSError) as exc:
            raise as_user_error(exc) from exc
    out.result(results_table(f"{env.config.scenario} / {env.config.availability} / days "
                             f"{days[0]}-{days[1]} / {seeds} seed(s) (mean ± std)", result["policies"]))
    return result


def cmd_evaluate(args: argparse.Namespace) -> int:
    out = output_for(args)
    specs = split_names(args.policies, "--policies")
    result = evaluate(out, args, parse_days(args.eval_days), specs, args.seeds)
    out.note(f"MLflow parent run {result['parent_run_id']}")
    out.json({"parent_run_id": result["parent_run_id"], "policies": result["policies"]})
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("evaluate", help="compare policies on held-out days (MLflow parent + nested runs)")
    add_env_options(e)
    e.add_argument("--eval-days", default="11-14")
    e.add_argument("--policies", default=DEFAULT_POLICIES,
                   help="comma-separated: learned:<model uri>, fixed:K, threshold, never, hindsight")
    e.add_argument("--seeds", type=int, default=3)
    e.set_defaults(handler=cmd_evaluate)
