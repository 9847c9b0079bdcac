"""``atoll simulate``: run rule policies through FleetEnv episodes and total the results."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.progress import Progress, TaskID
from rich.table import Table

from atoll.control.output import UserError, console, emit_json
from atoll.envs.config import AVAILABILITY_KINDS, PRICE_KINDS, FleetConfig
from atoll.envs.demand import DemandError
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.plot import plot_episodes
from atoll.envs.policies import Policy, make_policy
from atoll.envs.rollout import TOTAL_KEYS, Episode, run_policy
from atoll.forecast.workloads import WorkloadError
from atoll.solvers.registry import UnknownNameError


def parse_days(text: str) -> tuple[int, int]:
    """``11-14`` or ``11`` -> (11, 14) / (11, 11)."""
    first, sep, last = text.partition("-")
    try:
        a = int(first)
        b = int(last) if sep else a
    except ValueError:
        raise UserError(f"days {text!r} must look like 11-14 or 11") from None
    if not 1 <= a <= b:
        raise UserError(f"days {text!r}: need 1 <= first <= last")
    return a, b


def make_env(args: argparse.Namespace, days: tuple[int, int], **extra: Any) -> FleetEnv:
    """FleetEnv from the shared --scenario/--workload/--availability/--prices options."""
    try:
        config = FleetConfig(scenario=args.scenario, workload=args.workload, days=days,
                             availability=args.availability, prices=args.prices,
                             forecaster=args.forecaster, **extra)
        return FleetEnv(config)
    except (ValueError, KeyError, UnknownNameError, DemandError, WorkloadError, FileNotFoundError) as exc:
        raise UserError(str(exc).strip("'\"")) from exc


def add_env_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", default="core", help="solver scenario: core or extended")
    p.add_argument("--workload", default="servegen",
                   help="servegen (ServeGen client groups, one per model) or one workload per model, "
                        "comma-separated (servegen:m-large, csv:PATH#MODEL, ...)")
    p.add_argument("--availability", default="spot", choices=AVAILABILITY_KINDS)
    p.add_argument("--prices", default=None, choices=PRICE_KINDS,
                   help="node prices (default: spot with spot availability, else on-demand)")
    p.add_argument("--forecaster", default="ets", help="naive, ets, sarimax, uc or auto")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def totals_table(title: str, rows: dict[str, dict[str, float]]) -> Table:
    table = Table(title=title)
    for col in ("policy", "cost $", "goodput", "SLO att.", "$/M goodput tok", "re-opts", "solver s"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, t in rows.items():
        table.add_row(name, f"{t['cost_usd']:.0f}", f"{t['goodput_share']:.1%}", f"{t['slo_attainment']:.1%}",
                      f"{t['usd_per_mtok']:.3f}", f"{t['reoptimizations']:.0f}", f"{t['solver_seconds']:.1f}")
    return table


def cmd_simulate(args: argparse.Namespace) -> int:
    days = parse_days(args.days)
    env = make_env(args, days)
    names = [p.strip() for p in args.policy.split(",") if p.strip()]
    policies: list[Policy] = []
    for name in names:
        try:
            policies.append(make_policy(name, len(env.models)))
        except (KeyError, ValueError) as exc:
            raise UserError(str(exc).strip("'\"")) from exc
    day_list = list(range(days[0], days[1] + 1))
    episodes: list[Episode] = []
    with Progress(console=console, transient=True) as progress:
        for policy in policies:
            task = progress.add_task(policy.name, total=len(day_list) * env.config.episode_steps)

            def tick(n: int, task: TaskID = task) -> None:
                progress.advance(task, n)

            episodes.append(run_policy(env, policy, days=day_list, seed=args.seed, tick=tick))
    results = {ep.policy: ep.totals() for ep in episodes}
    doc: dict[str, Any] = {
        "scenario": args.scenario, "workload": args.workload, "days": day_list,
        "availability": args.availability, "prices": env.config.price_kind, "seed": args.seed,
        "models": list(env.models),
        "policies": {name: {"totals": {k: t[k] for k in TOTAL_KEYS},
                            "extra": {k: v for k, v in t.items() if k not in TOTAL_KEYS}}
                     for name, t in results.items()},
    }
    if len(episodes) == 1:
        doc["policy"] = episodes[0].policy
        doc["totals"] = doc["policies"][episodes[0].policy]["totals"]
    console.print(totals_table(f"{args.scenario} / {args.availability} / days {args.days}", results))
    if args.plot:
        out = plot_episodes(episodes, env.models, Path(args.plot),
                            title=f"{args.scenario}, {args.availability} availability, days {args.days}")
        doc["plot"] = str(out)
        console.print(f"plot written to {out}")
    if args.json:
        emit_json(doc)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="run re-planning policies through the fleet simulator")
    add_env_options(p)
    p.add_argument("--days", default="11", help="days of the workload to simulate, e.g. 11-14 (from 4)")
    p.add_argument("--policy", default="fixed:1",
                   help="fixed:K, threshold[:LOW:HIGH], never or hindsight; several comma-separated")
    p.add_argument("--seed", type=int, default=0, help="seed of availability offsets and preemptions")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw demand vs capacity and cost")
    p.set_defaults(handler=cmd_simulate)
