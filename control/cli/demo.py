"""``atoll demo``: the main job on the bundled default data.

Core scenario, ServeGen-derived demand, spot availability: train a small PPO trigger on days
4-7 (or reuse the one a finished run trained with the same environment and settings), run the
contest — a small rule grid (``fixed:K@q`` for K in 1, 3, 12 and ``threshold@q``, q in 0.5,
0.7, 0.9, 0.95, 0.99) on validation days 8-10 (one seed), its cost-SLO frontier against the learned
policy on held-out days 11-12, beside the per-model reference (coordinate descent on the same
validation days) — log everything to MLflow and print the headline (``frontier_cost_ratio``,
``effective_cost_ratio``, and both against the per-model reference) and the command that opens
the MLflow UI. The policy is registered as ``atoll-trigger-<fleet>``; ``champion`` moves only
within that fleet's model.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from atoll.control.cli.common import add_env_options, parse_days
from atoll.control.cli.evaluate import contest
from atoll.control.cli.output import UserError, output_for, progress
from atoll.control.cli.train import add_train_options, train_config

if TYPE_CHECKING:
    from atoll.envs.vocabulary import PolicySpec

DEMO_INTERVALS = (1, 3, 12)
DEMO_LEVELS = (0.5, 0.7, 0.9, 0.95, 0.99)  # 20 rules: the demo stays within 10 minutes on 2 cores
DEMO_BANDS = ((0.5, 1.0),)
# the per-model reference's SLO targets: one (plus its least-effective-cost assignment), so the
# per-model reference adds at most two policies on the test days
DEMO_PER_MODEL_TARGETS = 1


def cmd_demo(args: argparse.Namespace) -> int:
    import mlflow

    from atoll.envs.vocabulary import PolicySpec, parse_policy
    from atoll.training.registry import champion_uri, registered_name
    from atoll.training.train_tracking import train_or_reuse

    out = output_for(args)
    train_days, eval_days = parse_days(args.train_days), parse_days(args.eval_days)
    config, settings = train_config(args, train_days, args.timesteps, seed=0)
    given = parse_policy(args.policy) if args.policy is not None else None
    if given is not None:
        trained = _given_policy(given, config)
        out.note(f"evaluating {args.policy} (no training)")
    else:
        with progress("training", settings.bootstrap_steps + settings.ppo_steps) as advance:
            trained = train_or_reuse(config, settings, retrain=args.retrain, tick=advance)
        if trained["reused"]:
            out.note(f"reusing the policy run {trained['run_id']} trained with the same settings: "
                     f"{trained['model_uri']} (--retrain to train again)")
        else:
            out.note(f"trained: run {trained['run_id']}, model {trained['model_uri']}")
    from atoll.training.contest import ContestSettings

    validation_days = parse_days(args.validation_days)
    if train_days[1] >= validation_days[0]:
        raise UserError(f"--train-days {args.train_days} must end before --validation-days "
                        f"{args.validation_days}: the rules are chosen on days the policy never trained on")
    grid = ContestSettings(validation_days=validation_days, test_days=eval_days, seeds=1,
                           levels=DEMO_LEVELS, intervals=DEMO_INTERVALS, bands=DEMO_BANDS,
                           workers=args.workers, per_model_targets=DEMO_PER_MODEL_TARGETS)
    spec = given or PolicySpec("learned", uri=trained["model_uri"])
    result = contest(out, args, [spec], grid, run_name="demo")
    for name, version in result.get("champion", {}).items():
        model = version.rpartition("/")[0]
        out.note(f"{name} beat the rule frontier on the validation days: {version} is now 'champion' of "
                 f"fleet {trained['fleet']!r} (use --policy learned:{model}@champion, or learned:champion "
                 f"where the fleet is known: atoll control, atoll evaluate)")
    if not result.get("champion"):
        out.note(f"the policy did not beat the rule frontier on the validation days: fleet "
                 f"{trained['fleet']!r}'s champion alias ({champion_uri(trained['fleet'])}) is unchanged")
    out.note(f"MLflow parent run {result['parent_run_id']}; open the UI with:\n"
             f"  .venv/bin/mlflow ui --backend-store-uri {mlflow.get_tracking_uri()}")
    out.json({"parent_run_id": result["parent_run_id"], "model_uri": trained["model_uri"],
              "fleet": trained["fleet"], "registered_model": registered_name(trained["fleet"]),
              "champion": result.get("champion", {}),
              "validation": result.get("learned_validation", {}).get(str(spec)),
              "reused_policy": trained["reused"], "headline": result["headline"][str(spec)],
              "frontier": result["frontier"], "best_rule": result["best_rule"],
              "policies": result["policies"]})
    return 0


def _given_policy(spec: PolicySpec, config: Any) -> dict[str, Any]:
    """What the demo reports of a policy it was given instead of training one (``--policy``)."""
    from atoll.training.registry import fleet_name

    if not spec.is_learned:
        raise UserError(f"--policy {str(spec)!r}: the demo compares a learned policy with the rules; give "
                        f"learned:file:PATH or learned:<model uri>")
    return {"model_uri": spec.uri, "reused": True,
            "fleet": fleet_name(config.scenario, config.models, config.scenario_spec.models)}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train, evaluate and compare a re-planning policy on the default data")
    add_env_options(p)
    p.add_argument("--train-days", default="4-7",
                   help="training days, e.g. 4-7 (day 1 is the first day of the data; days 1-3 warm the "
                        "forecaster up)")
    p.add_argument("--validation-days", default="8-10", help="days the rule frontier is chosen on")
    p.add_argument("--eval-days", default="11-12", help="the test days")
    p.add_argument("--workers", type=int, default=2, help="worker processes running the rules")
    p.add_argument("--timesteps", type=int, default=4_032,
                   help="PPO environment steps after the bootstrap (default 4032: 14 days of 5-minute steps)")
    add_train_options(p, bootstrap_steps=1_440)
    p.add_argument("--policy", default=None, metavar="SPEC",
                   help="a learned policy to compare instead of training one: learned:file:PATH (a policy "
                        "file, e.g. a shipped one under training/policies) or learned:<model uri>")
    p.add_argument("--retrain", action="store_true",
                   help="train even if a finished run trained a policy with the same settings")
    p.set_defaults(handler=cmd_demo)
