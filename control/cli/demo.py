"""``atoll demo``: the main job on the bundled default data.

Core scenario, ServeGen-derived demand, spot availability: train a small PPO trigger on days
4-10 (or reuse the one a finished run trained with the same environment and settings), evaluate it against
fixed-interval re-planning and the threshold rule on held-out days 11-12, log everything to
MLflow and print the comparison and the command that opens the MLflow UI.
"""

from __future__ import annotations

import argparse

from atoll.control.cli.common import add_env_options, parse_days
from atoll.control.cli.evaluate import evaluate
from atoll.control.cli.output import output_for, progress
from atoll.control.cli.train import add_train_options, train_config

DEMO_POLICIES = ("fixed:1", "fixed:6", "fixed:12", "threshold")


def cmd_demo(args: argparse.Namespace) -> int:
    import mlflow

    from atoll.training.tracking import train_or_reuse

    out = output_for(args)
    train_days, eval_days = parse_days(args.train_days), parse_days(args.eval_days)
    config, settings = train_config(args, train_days, args.timesteps, seed=0)
    with progress("training", settings.bootstrap_steps + settings.timesteps) as advance:
        trained = train_or_reuse(config, settings, retrain=args.retrain, tick=advance)
    if trained["reused"]:
        out.note(f"reusing the policy run {trained['run_id']} trained with the same settings: "
                 f"{trained['model_uri']} (--retrain to train again)")
    else:
        out.note(f"trained: run {trained['run_id']}, model {trained['model_uri']}")
    specs = [f"learned:{trained['model_uri']}", *DEMO_POLICIES]
    result = evaluate(out, args, eval_days, specs, 1, run_name="demo")
    out.note(f"MLflow parent run {result['parent_run_id']}; open the UI with:\n"
             f"  .venv/bin/mlflow ui --backend-store-uri {mlflow.get_tracking_uri()}")
    out.json({"parent_run_id": result["parent_run_id"], "model_uri": trained["model_uri"],
              "reused_policy": trained["reused"], "policies": result["policies"]})
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train, evaluate and compare a re-planning policy on the default data")
    add_env_options(p)
    p.add_argument("--train-days", default="4-10")
    p.add_argument("--eval-days", default="11-12")
    p.add_argument("--timesteps", type=int, default=4_032)
    add_train_options(p, bootstrap_steps=1_440)
    p.add_argument("--retrain", action="store_true",
                   help="train even if a finished run trained a policy with the same settings")
    p.set_defaults(handler=cmd_demo)
