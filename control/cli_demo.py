"""``atoll demo``: the main job on the bundled default data.

Core scenario, ServeGen-derived demand, spot availability: train a small PPO trigger on days
4-10 (or reuse the one an earlier demo logged with the same settings), evaluate it against
fixed-interval re-planning and the threshold rule on held-out days 11-12, log everything to
MLflow and print the comparison and the command that opens the MLflow UI.
"""

from __future__ import annotations

import argparse
import hashlib
import json

from atoll.control.cli_simulate import parse_days
from atoll.control.cli_train import evaluate, train
from atoll.control.output import console, emit_json

DEMO_POLICIES = ("fixed:1", "fixed:6", "fixed:12", "threshold")


def _reusable(key: str) -> str | None:
    from mlflow.tracking import MlflowClient

    from atoll.training.tracking import configure

    experiment = configure()
    runs = MlflowClient().search_runs([experiment], filter_string=f"tags.`atoll.demo_key` = '{key}' and "
                                      "attributes.status = 'FINISHED'", max_results=1,
                                      order_by=["attributes.start_time DESC"])
    return runs[0].data.tags.get("atoll.model_uri") if runs else None


def cmd_demo(args: argparse.Namespace) -> int:
    import mlflow

    settings = {"scenario": args.scenario, "workload": args.workload, "availability": args.availability,
                "prices": args.prices, "forecaster": args.forecaster, "train_days": args.train_days,
                "timesteps": args.timesteps, "bootstrap": args.bootstrap_steps, "seed": 0,
                "bootstrap_rule": args.bootstrap_rule, "unserved_usd_per_mtok": args.unserved_usd_per_mtok,
                "reopt_usd": args.reopt_usd}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    uri = None if args.retrain else _reusable(key)
    if uri:
        console.print(f"reusing the policy an earlier demo trained: {uri} (--retrain to train again)",
                      highlight=False)
        trained = {"model_uri": uri, "reused": True}
    else:
        run = train(args, parse_days(args.train_days), args.timesteps, 0, tags={"atoll.demo_key": key})
        trained = {**run, "reused": False}
    first, last = parse_days(args.eval_days)
    specs = [f"learned:{trained['model_uri']}", *DEMO_POLICIES]
    out = evaluate(args, (first, last), specs, 1, run_name="demo")
    console.print(f"MLflow parent run {out['parent_run_id']}; open the UI with:\n"
                  f"  .venv/bin/mlflow ui --backend-store-uri {mlflow.get_tracking_uri()}", highlight=False)
    if args.json:
        emit_json({"parent_run_id": out["parent_run_id"], "model_uri": trained["model_uri"],
                   "reused_policy": trained["reused"], "policies": out["policies"]})
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    from atoll.control.cli_simulate import add_env_options
    from atoll.control.cli_train import add_train_options

    p = sub.add_parser("demo", help="train, evaluate and compare a re-planning policy on the default data")
    add_env_options(p)
    p.add_argument("--train-days", default="4-10")
    p.add_argument("--eval-days", default="11-12")
    p.add_argument("--timesteps", type=int, default=4_032)
    add_train_options(p, bootstrap_steps=1_440)
    p.add_argument("--retrain", action="store_true", help="train even if an earlier demo logged a policy")
    p.set_defaults(handler=cmd_demo)
