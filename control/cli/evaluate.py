"""``atoll evaluate``: compare policies on held-out days (one MLflow parent run, one nested run each)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rich.table import Table

from atoll.control.cli.common import (
    add_env_options,
    make_env,
    parse_days,
    policy_value,
    split_names,
    split_policies,
)
from atoll.control.cli.output import Output, UserError, as_user_error, output_for, progress, results_table
from atoll.control.cli.train import add_env_id_option

if TYPE_CHECKING:
    from atoll.envs.vocabulary import PolicySpec

DEFAULT_POLICIES = "fixed:1,fixed:3,fixed:6,fixed:12,threshold,never,hindsight"


def evaluate(out: Output, args: argparse.Namespace, days: tuple[int, int], specs: list[str], seeds: int,
             run_name: str = "evaluate", tags: dict[str, str] | None = None) -> dict[str, Any]:
    """Evaluate and log ``specs`` and show the results table (shared with ``atoll demo``)."""
    from atoll.training.evaluate_tracking import evaluate_run

    if seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {seeds}")

    env = make_env(args, days)
    day_list = list(range(days[0], days[1] + 1))
    total = len(specs) * seeds * len(day_list) * env.config.episode_steps
    with progress("evaluating", total) as advance:
        try:
            result = evaluate_run(env, [policy_value(s) for s in specs], days=day_list, seeds=seeds,
                                  run_name=run_name, tags=tags, tick=advance)
        except (KeyError, ValueError, OSError) as exc:
            raise as_user_error(exc) from exc
    from atoll.envs import world_of

    out.result(results_table(f"{env.config.scenario} / {env.config.availability} / {world_of(env.config)} "
                             f"world / days "
                             f"{days[0]}-{days[1]} / {seeds} seed(s) (mean ± std)", result["policies"]))
    return result


def contest_config(args: argparse.Namespace, settings: Any = None) -> Any:
    """The contest's FleetConfig from the shared env options, with make_env's defaults (spot
    availability when none is given). With ``--fleet``, the env the simulator builds for the fleet
    file (its own series and market per pool) over ``settings``' validation and test days: the
    contest's workers rebuild it from the config."""
    from atoll.envs.config import FleetConfig
    from atoll.forecast.scaling import with_scale

    if getattr(args, "fleet", None):
        if settings is None:
            raise UserError(f"--fleet {args.fleet}: the contest's days are needed to build the fleet's env")
        days = (min(settings.validation_days[0], settings.test_days[0]),
                max(settings.validation_days[1], settings.test_days[1]))
        return make_env(args, days).config
    from atoll.control.cli.common import world_options

    extra: dict[str, Any] = {"solver_time_limit": args.solver_time_limit} \
        if args.solver_time_limit is not None else {}
    extra.update(world_options(args))  # the world, and --capacity-error etc. where given
    return FleetConfig(scenario=args.scenario, workload=with_scale(args.workload, args.scale),
                       availability=args.availability or "spot", prices=args.prices,
                       forecaster=args.forecaster, **extra)


def contest(out: Output, args: argparse.Namespace, learned: list[PolicySpec], settings: Any,
            run_name: str = "contest", tags: dict[str, str] | None = None) -> dict[str, Any]:
    """Run and log the contest (rule grid on validation days, frontier vs ``learned`` on test
    days) and show the test-day table and the headline (shared with ``atoll demo``)."""
    from atoll.training.contest import frontier_note
    from atoll.training.contest_tracking import contest_run
    from atoll.training.naming import short_name

    bad = [str(s) for s in learned if not s.is_learned]
    if bad:
        raise UserError(f"--rules grid: --policies {','.join(bad)!r} are not learned policies; the rules "
                        f"come from the grid (fixed:K@q, threshold:LOW:HIGH@q), so list only "
                        f"learned:<model uri> there")
    try:
        config = contest_config(args, settings)
        st = settings
        v, t = st.validation_days, st.test_days
        grid_runs = (st.validation_seeds or st.seeds) * len(st.grid) * (v[1] - v[0] + 1)
        steps = config.episode_steps * (grid_runs + st.seeds * (len(learned) + 3) * (t[1] - t[0] + 1))
        with progress("contest", steps) as advance:
            result = contest_run(config, learned, st, tick=advance, run_name=run_name, tags=tags)
    except UserError:
        raise
    except (KeyError, ValueError, OSError) as exc:
        raise as_user_error(exc) from exc
    out.result(results_table(f"{contest_title(config)} / test days {t[0]}-{t[1]} / "
                             f"{st.seeds} seed(s) (mean ± std); frontier chosen on days {v[0]}-{v[1]}",
                             result["policies"]))
    named = {str(s): s for s in learned}  # the headline is keyed by each policy's name
    out.result(headline_table(result, named, st.seeds))
    engine = f"Ray at {st.ray_address}" if st.ray_address else f"{st.workers} worker process(es)"
    out.note(f"rule grid: {result['grid_size']} rules x {result['validation_seeds']} seed(s) on days "
             f"{v[0]}-{v[1]} in {result['grid_seconds']:.0f} s ({engine}); "
             f"test days {result['test_seconds']:.0f} s")
    pm = result.get("per_model")
    if pm:
        out.note(f"per-model reference (coordinate descent on days {v[0]}-{v[1]}): frontier "
                 f"{', '.join(pm['frontier'])}; best {pm['best']}")
    for name, fig in result["headline"].items():
        note = frontier_note(fig)
        if note:
            out.note(f"{short_name(named[name])}: {note}")
    return result


def contest_title(config: Any) -> str:
    """``scenario / market`` of the contest's table: the config's own availability (the option's
    default is None and make_env's is spot, so the option itself may not say)."""
    return f"{config.scenario} / {config.availability}"


RATIOS = ("frontier_cost_ratio", "effective_cost_ratio", "per_model_frontier_cost_ratio",
          "per_model_effective_cost_ratio")


def interval_text(mean: float, std: float, seeds: int, fmt: str) -> str:
    """A ratio over ``seeds`` paired seeds: its mean and 95% t interval (``mean [low, high]``); one
    seed has no interval, and says so. ``std`` is the seeds' population std, as the contest
    reports it (numpy's ``std``), so the sample's is std x sqrt(n / (n - 1))."""
    if seeds < 2:
        return f"{mean:{fmt}} (1 seed)"
    from scipy import stats

    sample_sd = std * (seeds / (seeds - 1)) ** 0.5
    half = float(stats.t.ppf(0.975, seeds - 1)) * sample_sd / seeds ** 0.5
    return f"{mean:{fmt}} [{mean - half:{fmt}}, {mean + half:{fmt}}]"


def headline_table(result: dict[str, Any], named: dict[str, PolicySpec], seeds: int) -> Table:
    """Each learned policy's headline against the rule frontier over ``seeds`` paired seeds: the
    ratios with a 95% interval (a ratio whose interval holds 1 is a tie), the rest mean ± std;
    ``named``: the learned policies by name (what the headline is keyed by)."""
    from atoll.training.naming import short_name

    table = Table(title=f"headline vs the rule frontier {', '.join(result['frontier'])} (best rule "
                        f"{result['best_rule']}; lost demand at {result['lost_usd_per_mtok']:g} $/M tokens; "
                        f"ratios: mean [95% interval] over {seeds} paired seed(s))")
    cols = (("frontier_cost_ratio", "frontier cost ratio", ".3f"),
            ("effective_cost_ratio", "effective cost ratio", ".3f"),
            ("per_model_frontier_cost_ratio", "vs per-model frontier", ".3f"),
            ("per_model_effective_cost_ratio", "vs per-model best", ".3f"),
            ("usd_per_mtok", "$/M goodput tok", ".4f"),
            ("slo_attainment", "SLO att.", ".1%"), ("reoptimizations", "re-opts", ".0f"),
            ("solver_seconds", "solver s", ".1f"))
    table.add_column("learned policy")
    for _, header, _ in cols:
        table.add_column(header, justify="right")
    for name, fig in result["headline"].items():
        table.add_row(short_name(named[name]), *(
            "-" if k not in fig else interval_text(fig[k]["mean"], fig[k]["std"], seeds, f) if k in RATIOS
            else f"{fig[k]['mean']:{f}} ± {fig[k]['std']:{f}}" for k, _, f in cols))
    return table


def contest_settings(args: argparse.Namespace) -> Any:
    from atoll.envs.policies import FIXED_INTERVALS
    from atoll.envs.vocabulary import PLANNING_LEVELS
    from atoll.training.contest import ContestSettings

    try:
        levels = tuple(float(q) for q in split_names(args.levels, "--levels")) if args.levels \
            else PLANNING_LEVELS
    except ValueError:
        raise UserError(f"--levels {args.levels!r} must be comma-separated numbers, "
                        f"e.g. 0.5,0.9") from None
    try:
        intervals = tuple(int(k) for k in split_names(args.intervals, "--intervals")) if args.intervals \
            else FIXED_INTERVALS
    except ValueError:
        raise UserError(f"--intervals {args.intervals!r} must be whole 5-minute steps, e.g. 1,3") from None
    risks = tuple(r.strip() for r in args.risks.split(";") if r.strip())
    return ContestSettings(validation_days=parse_days(args.validation_days),
                           test_days=parse_days(args.eval_days), seeds=args.seeds,
                           validation_seeds=args.validation_seeds, levels=levels, intervals=intervals,
                           risks=risks,
                           lost_usd_per_mtok=args.lost_usd_per_mtok, workers=args.workers,
                           hindsight=not args.no_hindsight, per_model_targets=args.per_model_targets,
                           per_model_passes=args.per_model_passes, ray_address=args.ray)


def cmd_evaluate(args: argparse.Namespace) -> int:
    out = output_for(args)
    if args.rules == "grid":
        texts = split_policies(args.policies, "--policies") if args.policies else []
        settings = contest_settings(args)
        result = contest(out, args, _learned(texts), settings)
        out.note(f"MLflow parent run {result['parent_run_id']}")
        out.json({k: v for k, v in result.items() if k != "table"})
        return 0
    specs = split_policies(args.policies or DEFAULT_POLICIES, "--policies")
    result = evaluate(out, args, parse_days(args.eval_days), specs, args.seeds)
    out.note(f"MLflow parent run {result['parent_run_id']}")
    out.json({"parent_run_id": result["parent_run_id"], "policies": result["policies"]})
    return 0


def _learned(texts: list[str]) -> list[PolicySpec]:
    """``--policies`` of ``--rules grid`` as specs (the contest refuses any that is not learned)."""
    from atoll.envs.vocabulary import parse_policy

    try:
        return [parse_policy(s) for s in texts]
    except ValueError as exc:
        raise UserError(f"--policies: {as_user_error(exc)}") from exc


def add_parser(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("evaluate", help="compare policies on held-out days (MLflow parent + nested runs)")
    add_env_options(e)
    e.add_argument("--eval-days", default="11-14", help="the test days")
    e.add_argument("--policies", default=None,
                   help="comma-separated: learned:<model uri>, learned:file:PATH (a policy file), "
                        f"fixed:K[@q], threshold[:LOW:HIGH][@q], never, hindsight (default "
                        f"{DEFAULT_POLICIES}); with --rules grid only learned policies")
    e.add_argument("--seeds", type=int, default=3,
                   help="seeds per policy (availability offsets, preemptions); results are mean ± std")
    e.add_argument("--rules", choices=("listed", "grid"), default="listed",
                   help="grid: tune the rule family on --validation-days, keep its cost-SLO frontier and "
                        "compare the learned policies with it on --eval-days (the contest)")
    e.add_argument("--validation-days", default="8-10",
                   help="days the rule frontier is chosen on (--rules grid)")
    e.add_argument("--validation-seeds", type=int, default=None, help="seeds on the validation days "
                   "(default: --seeds)")
    e.add_argument("--levels", default=None, help="planning levels of the grid, comma-separated "
                   "(default: every forecast level >= 0.5)")
    e.add_argument("--intervals", default=None, help="re-plan intervals (5-min steps) of the grid's fixed "
                   "rules, comma-separated (default: the rule family's)")
    e.add_argument("--risks", default="neutral",
                   help="the grid's risk menu, ';'-separated: neutral, h<headroom>, s<spread>, f<on-demand "
                        "floor> and combinations like h0.85,s0.5 (default neutral: the rules without +RISK)")
    e.add_argument("--lost-usd-per-mtok", type=float, default=None,
                   help="price of a million tokens not served within SLO in the effective cost "
                        "(default: the reward's unserved_usd_per_mtok)")
    e.add_argument("--workers", type=int, default=2, help="worker processes running the rules")
    e.add_argument("--ray", default=None, metavar="auto|ADDRESS",
                   help="--rules grid: run the rules and seeds as Ray tasks on this cluster (auto: the local "
                        "or configured one; needs the ray extra) instead of the process pool")
    e.add_argument("--per-model-targets", type=int, default=3,
                   help="--rules grid: SLO targets (from the rule frontier) of the per-model reference's "
                        "coordinate descent (0: only its least-effective-cost assignment)")
    e.add_argument("--per-model-passes", type=int, default=3,
                   help="--rules grid: coordinate-descent passes over the models")
    e.add_argument("--no-hindsight", action="store_true",
                   help="--rules grid: skip the hindsight reference on the test days (it re-solves every "
                        "step)")
    add_env_id_option(e)
    e.set_defaults(handler=cmd_evaluate)
