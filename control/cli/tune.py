"""``atoll tune``: which rule a fleet should run and what it buys, as a YAML policy file
(:mod:`atoll.training.tuning`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from atoll.control.cli.common import add_env_options, parse_days, split_names
from atoll.control.cli.output import UserError, as_user_error, output_for, progress

if TYPE_CHECKING:
    from atoll.envs.vocabulary import PolicySpec

RISKS = "neutral;h0.85;h0.7"


def cmd_tune(args: argparse.Namespace) -> int:
    from atoll.control.cli.evaluate import contest_config
    from atoll.training.contest import ContestSettings
    from atoll.training.tuning import learned_candidates, tune

    out = output_for(args)
    try:
        levels = tuple(float(q) for q in split_names(args.levels, "--levels"))
        intervals = tuple(int(k) for k in split_names(args.intervals, "--intervals"))
    except ValueError:
        raise UserError(f"--levels {args.levels!r} must be planning levels (e.g. 0.9,0.95) and --intervals "
                        f"{args.intervals!r} whole steps (e.g. 1,3)") from None
    risks = tuple(r.strip() for r in args.risks.split(";") if r.strip())
    try:
        settings = ContestSettings(validation_days=parse_days(args.validation_days),
                                   test_days=parse_days(args.test_days), seeds=args.seeds,
                                   validation_seeds=args.validation_seeds, levels=levels, intervals=intervals,
                                   bands=(), risks=risks, workers=args.workers, hindsight=False,
                                   per_model_targets=args.per_model_targets,
                                   lost_usd_per_mtok=args.lost_usd_per_mtok)
        config = contest_config(args, settings)  # a --fleet file's own series and market too
    except ValueError as exc:
        raise as_user_error(exc) from exc
    if args.out.suffix not in (".yaml", ".yml"):
        raise UserError(f"--out {args.out}: a policy file ends in .yaml or .yml")
    try:
        learned = learned_candidates(config, _learned(args.learned))
    except ValueError as exc:
        raise as_user_error(exc) from exc
    if learned:
        out.note(f"learned candidates: {', '.join(str(s) for s in learned)}")
    v, t = settings.validation_days, settings.test_days
    vseeds = settings.validation_seeds or settings.seeds
    runs = vseeds * (len(settings.grid) + len(learned)) * (v[1] - v[0] + 1) + \
        settings.seeds * 3 * (t[1] - t[0] + 1)
    command = shlex.join(["atoll", *getattr(args, "argv", sys.argv[1:])])
    with progress("tune", runs * config.episode_steps) as advance:
        try:
            tuned = tune(config, settings, command=command, tick=advance, learned=learned)
        except (KeyError, ValueError, OSError) as exc:
            raise as_user_error(exc) from exc
    tuned.write(args.out)
    ev = tuned.evidence
    table = Table(title=f"{tuned.scenario} / {tuned.availability} / {tuned.world} world: chosen on days "
                        f"{v[0]}-{v[1]}, reported on days {t[0]}-{t[1]} ({tuned.seeds} seed(s))")
    for col in ("policy", "validation effective $", "test node $", "test SLO", "test effective $",
                "vs fixed:1@0.9 (95% interval)"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, fig in ev["test"].items():
        ratio = ev["effective_cost_vs_baseline"].get(name)
        shown = "-" if ratio is None else f"{ratio['mean']:.3f}" + (
            f" [{ratio['low']:.3f}, {ratio['high']:.3f}]" if ratio.get("low") is not None else "")
        role = " (chosen)" if name == str(tuned.policy) else " (baseline)" if name == ev["baseline"] else ""
        chosen_on = ev["validation"].get(name, {}).get("effective_usd", float("nan"))
        table.add_row(name + role, f"{chosen_on:,.0f}", f"{fig['cost_usd']:,.0f}",
                      f"{fig['slo_attainment']:.1%}", f"{fig['effective_usd']:,.0f}", shown)
    out.result(table)
    shown = ev["validation"]
    for spec in ev.get("learned_candidates", []):
        if spec != str(tuned.policy):
            theirs, ours = shown[spec]["effective_usd"], shown[str(tuned.policy)]["effective_usd"]
            out.result(f"learned candidate {spec}: validation effective ${theirs:,.0f} (the chosen policy's: "
                       f"${ours:,.0f}); not chosen")
    out.result(f"policy file {args.out}: {tuned.policy}\nrun it: atoll simulate --policy {args.out} | "
               f"atoll control --policy {args.out}")
    out.json({"policy_file": str(args.out), **tuned.as_dict()})
    return 0


def _learned(text: str) -> str | list[PolicySpec]:
    """``--learned``: ``auto``, ``none`` or the comma-separated ``learned:`` specs, parsed."""
    from atoll.envs.vocabulary import parse_policy

    if text in ("auto", "none"):
        return text
    return [parse_policy(s.strip()) for s in text.split(",") if s.strip()]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="choose the rule a fleet should run on its own history; write it as a "
                                    "policy file")
    add_env_options(p)
    p.add_argument("--out", type=Path, default=Path("policy.yaml"), help="the policy file to write (.yaml)")
    p.add_argument("--validation-days", default="8-10", help="days the rule is chosen on")
    p.add_argument("--test-days", default="11-14", help="later days it is reported on (never chosen on)")
    p.add_argument("--seeds", type=int, default=3, help="paired seeds on the test days")
    p.add_argument("--validation-seeds", type=int, default=1, help="seeds on the validation days")
    p.add_argument("--levels", default="0.9", help="planning levels of the family, comma-separated")
    p.add_argument("--intervals", default="1,3", help="re-plan intervals (5-min steps) of the family")
    p.add_argument("--risks", default=RISKS,
                   help="the risk menu, ';'-separated: neutral, h<headroom>, s<spread>, f<on-demand floor> "
                        f"and their combinations like h0.85,s0.5 (default {RISKS})")
    p.add_argument("--per-model-targets", type=int, default=0,
                   help="SLO targets of the per-model descent beside its least-effective-cost assignment")
    p.add_argument("--lost-usd-per-mtok", type=float, default=None,
                   help="price of a million tokens not served within SLO (default: the reward's)")
    p.add_argument("--learned", default="auto", metavar="auto|none|SPEC[,SPEC...]",
                   help="learned candidates, chosen only if they beat the rules on the validation days: "
                        "auto (the shipped policy files trained on this fleet, market and world, and the "
                        "fleet's registered champion), none, or learned:... specs")
    p.add_argument("--workers", type=int, default=2, help="worker processes running the rules")
    p.set_defaults(handler=cmd_tune)
