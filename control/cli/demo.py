"""``atoll demo``: the main job on the bundled default data.

Core scenario, ServeGen-derived demand, spot availability: train a small PPO trigger on days
4-10 (or reuse the one an earlier demo logged with the same settings), evaluate it against
fixed-interval re-planning and the threshold rule on held-out days 11-12, log everything to
MLflow and print the comparison and the command that opens the MLflow UI.
"""

from __future__ import annotations

import argparse

from atoll.control.cli.common import add_env_options, parse_days
from atoll.control.cli.evaluate import evaluate
from atoll.control.cli.output import output_for
from atoll.control.cli.train import add_train_options, train

DEMO_POLICIES = ("fixed:1", "fixed:6", "fixed:12", "threshold")
DEMO_TAG = "atoll.demo_key"


def cmd_demo(args: argparse.Namespace) -> int:
    import mlflow

    from atoll.training.tracking import find_logged_policy, settings_key

    out = output_for(args)
    train_days, eval_days = parse_days(args.train_days), parse_days(args.eval_days)
    availability = args.availability or ("ample" if args.fleet else "spot")
    settings = {"scenario": args.scenario, "workload": args.workload, "availability": availability,
                "prices": args.prices, "forecaster": args.forecaster, "train_days": args.train_days,
                "timesteps": args.timesteps, "bootstrap": args.bootstrap_steps, "seed": 0,
                "bootstrap_rule": args.bootstrap_rule, "unserved_usd_per_mtok": args.unserved_usd_per_mtok,
                "reopt_usd": args.reopt_usd}
    if args.fleet:  # only then, so keys of earlier demos stay valid
        settings["fleet"] = str(args.fleet)
    key = settings_key(settings)
    uri = None if args.retrain else find_logged_policy(DEMO_TAG, key)
    if uri:
        out.note(f"reusing the policy an earlier demo trained: {uri} (--retrain to train again)")
        model_uri, reused = uri, True
    else:
        model_uri = train(out, args, train_days, args.timesteps, 0, tags={DEMO_TAG: key})["model_uri"]
        reused = False
    specs = [f"learned:{model_uri}", *DEMO_POLICIES]
    result = evaluate(out, args, eval_days, specs, 1, run_name="demo")
    out.note(f"MLflow parent run {result['parent_run_id']}; open the UI with:\n"
             f"  .venv/bin/mlflow ui --backend-store-uri {mlflow.get_tracking_uri()}")
    out.json({"parent_run_id": result["parent_run_id"], "model_uri": model_uri,
              "reused_policy": reused, "policies": result["policies"]})
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train, evaluate and compare a re-planning policy on the default data")
    add_env_options(p)
    p.add_argument("--train-days", default="4-10")
    p.add_argument("--eval-days", default="11-12")
    p.add_argument("--timesteps", type=int, default=4_032)
    add_train_options(p, bootstrap_steps=1_440)
    p.add_argument("--retrain", action="store_true", help="train even if an earlier demo logged a policy")
    p.set_defaults(handler=cmd_demo)
