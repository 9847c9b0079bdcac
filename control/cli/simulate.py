"""``atoll simulate``: run rule policies through FleetEnv episodes and total the results."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from atoll.control.cli.common import (
    add_env_options,
    check_image_path,
    make_env,
    parse_days,
    policy_value,
    require_servable_env,
    split_policies,
    workloads_used,
)
from atoll.control.cli.output import UserError, as_user_error, output_for, progress, results_table
from atoll.control.cli.plots import cost_slo_scatter, fleet_tiers, sibling
from atoll.envs import world_of
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.plot import plot_episodes
from atoll.envs.policies import Policy
from atoll.envs.rollout import TOTAL_KEYS, Episode, run_policy


def cmd_simulate(args: argparse.Namespace) -> int:
    out = output_for(args)
    names = split_policies(args.policy, "--policy")
    days = parse_days(args.days)
    if args.plot:
        check_image_path(Path(args.plot), "--plot")
    if args.plot_policy is not None and args.plot_policy not in names:
        raise UserError(f"--plot-policy {args.plot_policy!r} is not among --policy {args.policy!r}")
    env = make_env(args, days)
    if not args.allow_unservable:
        require_servable_env(env)  # exit 2 before simulating a model that nothing can serve
    from atoll.training.evaluate import resolve_policy

    try:  # rules, per-model assignments, learned policies and `atoll tune` files
        policies: list[Policy] = [resolve_policy(policy_value(name), len(env.models)) for name in names]
    except (KeyError, OSError) as exc:
        raise as_user_error(exc) from exc
    day_list = list(range(days[0], days[1] + 1))
    from atoll.training.evaluate import env_at_level

    episodes: list[Episode] = []
    learned: dict[str, dict[str, float]] = {}
    levels: dict[float, FleetEnv] = {}
    partial = False
    try:
        for policy in policies:
            with progress(f"simulate {policy.name}", len(day_list) * env.config.episode_steps) as advance:
                at = env_at_level(env, policy, levels)  # fixed:K@q plans at q
                episodes.append(run_policy(at, policy, days=day_list, seed=args.seed, tick=advance))
                if at.config.correction:  # what the planner had learned at the end of the last day
                    learned[policy.name] = at.correction.planning_factors()
    except KeyboardInterrupt as exc:  # Ctrl-C: the totals of what ran, marked partial
        partial = True
        cut = getattr(exc, "partial_episode", None)
        if cut is not None and cut.steps:
            episodes.append(cut)
        out.note(f"interrupted: partial totals of {len(episodes)} policy run(s), the last one cut after "
                 f"{len(cut.steps) if cut is not None else 0} step(s)")
    results = {ep.policy: ep.totals() for ep in episodes}
    spec = env.config.scenario_spec
    doc: dict[str, Any] = {
        "partial": partial,
        "scenario": args.scenario, "fleet": args.fleet, "workload": workloads_used(args), "days": day_list,
        "availability": env.config.availability, "prices": env.config.price_kind, "seed": args.seed,
        "world": world_of(env.config), "pd": spec.pd,
        **({"model_pd": dict(spec.model_pd)} if spec.model_pd else {}),
        **({"market": args.loaded_fleet.spec.market_summary} if getattr(args, "loaded_fleet", None) else {}),
        "closed_loop": {"capacity_error": env.config.capacity_error_spec.label,
                        "correction": env.config.correction, "slo_model": env.config.slo_model},
        "models": list(env.models),
        "policies": {name: {"totals": {k: t[k] for k in TOTAL_KEYS},
                            "extra": {k: v for k, v in t.items() if k not in TOTAL_KEYS}}
                     for name, t in results.items()},
    }
    if learned:
        doc["correction_factors"] = learned
    if len(episodes) == 1:
        doc["policy"] = episodes[0].policy
        doc["totals"] = doc["policies"][episodes[0].policy]["totals"]
    title = f"{args.scenario} / {env.config.availability} / {world_of(env.config)} world / days {args.days}"
    out.result(results_table(title + (" / PARTIAL (interrupted)" if partial else ""), results))
    if args.plot and episodes:
        written = plot_episodes(episodes, env.models, Path(args.plot), policy=args.plot_policy,
                                title=f"{args.scenario}, {env.config.availability} availability, "
                                      f"days {args.days}")
        doc["plot"] = str(written)
        out.note(f"plot written to {written}")
        where = f"{args.scenario}, {env.config.availability}, days {args.days}"
        drawn = [e for e in episodes if args.plot_policy is None or e.policy == args.plot_policy]
        doc["plots"] = {
            "capacity": str(written),
            "cost_slo": str(cost_slo_scatter(results, sibling(Path(args.plot), "cost-slo"), where)),
            "tiers": str(fleet_tiers(drawn, sibling(Path(args.plot), "tiers"), env.config.step_s, where)),
        }
        out.note(f"cost vs SLO scatter written to {doc['plots']['cost_slo']}; nodes by tier with "
                 f"preemptions to {doc['plots']['tiers']}")
    out.json(doc)
    return 130 if partial else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="run re-planning policies through the fleet simulator")
    add_env_options(p)
    p.add_argument("--days", default="11", help="days of the workload to simulate, e.g. 11-14 (from 4)")
    p.add_argument("--policy", default="fixed:1",
                   help="fixed:K[@q][+RISK], threshold[:LOW:HIGH][@q], grow:K[@q] (q a planning level), "
                        "never, hindsight, per-model:K@q[+RISK],... (one entry per model), "
                        "learned:file:PATH, or an `atoll tune` file (.yaml); several comma-separated")
    p.add_argument("--plot-policy", default=None, help="draw only this policy (default: one panel each)")
    p.add_argument("--seed", type=int, default=0, help="seed of availability offsets and preemptions")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw demand vs capacity and cost; beside it FILE-cost-slo.png (each policy's cost "
                        "vs SLO attainment) and FILE-tiers.png (nodes by price tier, preemptions marked)")
    p.add_argument("--allow-unservable", action="store_true",
                   help="simulate even when a model has no serving template (it is served by nothing)")
    p.set_defaults(handler=cmd_simulate)
