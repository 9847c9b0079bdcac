"""Options and argument parsing shared by several commands (days, the simulator's environment)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.control.cli.output import UserError, console
from atoll.solvers.errors import AtollError

if TYPE_CHECKING:  # the simulator loads only in the commands that run it
    from atoll.envs.fleet_env import FleetEnv
    from atoll.envs.fleet_file import Fleet
    from atoll.envs.vocabulary import PolicySpec
    from atoll.solvers.problem import Risk
    from atoll.solvers.scenarios import ScenarioSpec
    from atoll.training.tuning import TunedPolicy


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")


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


class Given(argparse.Action):
    """Stores the value and records that the user gave the option (``args.given_options``), so
    an option that another one overrides is refused rather than silently ignored."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        given = set(getattr(namespace, "given_options", ()))
        given.add(self.option_strings[0])
        namespace.given_options = given


# What a fleet file sets, and so what --fleet cannot be combined with.
FLEET_OWNS = {"--scenario": "its models, GPUs and regions",
              "--workload": "its workloads", "--scale": "each workload's scale or mean_rate"}


def read_fleet_arg(args: argparse.Namespace) -> Fleet | None:
    """``--fleet FILE`` (or a bundled fleet's name), loaded and validated once per command
    (``args.loaded_fleet``), with ``args.scenario`` naming it; None without ``--fleet``. Options
    the fleet file overrides (``--scenario``, ``--workload``, ``--scale``) are refused when given
    with it."""
    if not getattr(args, "fleet", None):
        return None
    if getattr(args, "loaded_fleet", None) is not None:
        return args.loaded_fleet
    given: set[str] = getattr(args, "given_options", set())
    clash = [o for o in FLEET_OWNS if o in given]
    if clash:
        what = "; ".join(f"{o}: {FLEET_OWNS[o]}" for o in clash)
        raise UserError(f"--fleet {args.fleet} sets {what}; drop {' and '.join(clash)}, or edit the fleet "
                        f"file (a workload's source, scale: or mean_rate:)")
    from atoll.envs.fleet_file import read_fleet

    fleet = read_fleet(args.fleet)
    args.scenario = fleet.name
    args.loaded_fleet = fleet
    return fleet


def scenario_of(args: argparse.Namespace) -> ScenarioSpec:
    """The scenario a command plans: the ``--fleet`` file's (loaded once), or the bundled
    ``--scenario``."""
    from atoll.solvers.scenarios import SCENARIOS

    fleet = read_fleet_arg(args)
    return fleet.scenario if fleet is not None else SCENARIOS[args.scenario]


def workloads_used(args: argparse.Namespace) -> str | dict[str, str]:
    """What a JSON document echoes as its workload: the fleet's workloads with their scaling (per
    model), else the --workload names with --scale applied, as the simulator got them."""
    active: Fleet | None = getattr(args, "loaded_fleet", None)
    if active is not None:
        said = dict(active.scalings)
        return {w.model: f"{w.source} ({said.get(w.model, 'as recorded')})" for w in active.spec.workloads}
    from atoll.forecast.scaling import with_scale

    return with_scale(args.workload, args.scale)


def add_fleet_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fleet", default=None, metavar="FILE",
                   help="a fleet file (YAML: models, GPUs, regions and prices, availability, workloads), "
                        "or a bundled one: core, extended; replaces --scenario")


# What an --availability given with --fleet does to its pools (said on stderr: it overrides the file's market)
FLEET_OVERRIDES = {"ample": "every pool on-demand at its static cap (spot traces unused)",
                   "scarce": "every pool on-demand, capped just above the cheapest plan",
                   "spot": "every pool spot (on its own trace, or its region's bundled one)",
                   "hedged": "every pool hedged (spot on its trace beside an on-demand quota)"}


def fleet_market(args: argparse.Namespace, active: Fleet) -> str:
    """The availability a fleet runs under, as :meth:`FleetSpec.market_choice` decides for
    ``--availability`` and ``--prices``: its file's market per pool (``market``) unless
    ``--availability`` overrides it, which is said on stderr; ``--prices`` only with the static
    overrides (``ample``, ``scarce``), the markets bill each pool at its tier (refused in the
    flags' words)."""
    from atoll.solvers.fleet import MarketChoiceError

    try:
        choice = active.spec.market_choice(getattr(args, "availability", None), getattr(args, "prices", None))
    except MarketChoiceError as exc:
        raise UserError(exc.said("--availability", "--prices")) from exc
    if choice.overrides:
        console.print(f"note: --availability {choice.availability} overrides the fleet file's market "
                      f"({active.spec.market_summary}): {FLEET_OVERRIDES[choice.availability]}")
    return choice.availability


def world_options(args: argparse.Namespace) -> dict[str, Any]:
    """The FleetConfig fields of the world the options name (``atoll.envs.WORLDS``): ``--world``,
    or the world of ``--env`` (``atoll/Fleet-v1`` exact, ``-v2`` calibration, ``-v3`` charged);
    both given must agree. ``--capacity-error``, ``--correction`` and ``--slo-model`` given with it win."""
    from atoll.envs import ENV_ID_V3, ENV_ID_V4, WORLD_ENV_IDS, WORLDS

    world = getattr(args, "world", None)
    env_id = getattr(args, "env", None)
    action: dict[str, Any] = {}
    menu = getattr(args, "risk_menu", None)
    if menu is not None and env_id != ENV_ID_V4:
        raise UserError(f"--risk-menu {menu!r} is the presets of {ENV_ID_V4}'s action; "
                        f"give --env {ENV_ID_V4}")
    if env_id == ENV_ID_V4:  # the charged world, each re-plan choosing its risk preset
        action = {"action": "risk"}
        if menu is not None:
            from atoll.solvers.problem import Risk

            try:
                action["risk_menu"] = tuple(Risk.parse(r.strip()) for r in menu.split(";") if r.strip())
            except ValueError as exc:
                raise UserError(f"--risk-menu {menu!r}: {exc}") from exc
        env_id = ENV_ID_V3
    if env_id is not None:
        implied = next(name for name, eid in WORLD_ENV_IDS.items() if eid == env_id)
        if world is not None and world != implied:
            raise UserError(f"--env {env_id} trains in the {implied} world, but --world {world} was given: "
                            f"give one of them (--world {world} trains on {WORLD_ENV_IDS[world]})")
        world = implied
    settings = WORLDS[world or "exact"]
    given = {name: getattr(args, name) for name in ("capacity_error", "correction", "slo_model")
             if getattr(args, name, None) is not None}
    return {**settings, **given, **action}


def make_env(args: argparse.Namespace, days: tuple[int, int], **extra: Any) -> FleetEnv:
    """FleetEnv from the shared --scenario/--fleet/--workload/--availability/--prices options.
    With ``--fleet`` the env serves the fleet's own scaled workloads in the fleet file's market
    per pool (:func:`fleet_market`: ``--availability`` overrides it, and says so)."""
    from atoll.envs.config import FleetConfig
    from atoll.envs.demand import DemandError
    from atoll.envs.fleet_env import FleetEnv
    from atoll.envs.fleet_file import fleet_config
    from atoll.forecast.scaling import with_scale
    from atoll.forecast.workloads import WorkloadError

    extra = {**world_options(args), **extra}
    limit = getattr(args, "solver_time_limit", None)
    if limit is not None:
        extra = {"solver_time_limit": limit, **extra}
    risk = getattr(args, "risk", None)
    if risk is not None and "risk" not in extra:
        extra = {"risk": parse_risk(risk), **extra}
    removal = getattr(args, "removal_weight", None)
    if removal is not None and "removal_weight" not in extra:
        extra = {"removal_weight": removal, **extra}
    pd = getattr(args, "pd", None)
    if pd is not None and "pd" not in extra:
        extra = {"pd": pd, **extra}
    try:
        active = read_fleet_arg(args)
        if active is not None:
            config = fleet_config(active, days, availability=fleet_market(args, active),
                                  prices=args.prices, forecaster=args.forecaster, **extra)
        else:
            if args.availability == "market":
                raise UserError(f"--availability market is a fleet file's own market per pool; give --fleet "
                                f"FILE, or --availability ample, scarce, spot or hedged for --scenario "
                                f"{args.scenario}")
            config = FleetConfig(scenario=args.scenario, workload=with_scale(args.workload, args.scale),
                                 days=days,
                                 availability=args.availability or "spot", prices=args.prices,
                                 forecaster=args.forecaster, **extra)
        return FleetEnv(config)
    except AtollError:
        raise
    except (ValueError, KeyError, DemandError, WorkloadError, FileNotFoundError) as exc:
        raise UserError(str(exc).strip("'\"")) from exc


def add_env_options(p: argparse.ArgumentParser) -> None:
    from atoll.envs.config import AVAILABILITY_KINDS, PRICE_KINDS
    from atoll.forecast.planning import DEFAULT_FORECASTER
    from atoll.solvers.scenarios import BUNDLED_SCENARIOS

    p.add_argument("--scenario", default="core", action=Given,
                   help=f"solver scenario: {', '.join(BUNDLED_SCENARIOS)}")
    p.add_argument("--workload", default="servegen", action=Given,
                   help="servegen (ServeGen client groups, one per model), servegen-steady or "
                        "servegen-bursty (the groups from the steady or the bursty half of each source's "
                        "requests), or one workload per model, comma-separated (servegen:m-large, "
                        "csv:PATH#MODEL, ...)")
    add_fleet_option(p)
    p.add_argument("--availability", default=None, choices=AVAILABILITY_KINDS,
                   help="node availability and market: ample, scarce (static caps, on-demand), spot "
                        "(trace-driven, spot prices), hedged (spot pools beside an on-demand quota), "
                        "market (a fleet file's own market per pool). Default: spot; with --fleet: market "
                        "(the file's); a value given with --fleet overrides the file's market for every pool")
    p.add_argument("--prices", default=None, choices=PRICE_KINDS,
                   help="bill every node at these prices (default: spot under spot availability, else "
                        "on-demand; with --fleet's market: each pool's own tier, and --prices is refused)")
    p.add_argument("--forecaster", default=DEFAULT_FORECASTER,
                   help="naive, ets, sarimax, uc, auto, or a planning-target forecaster "
                        "peak:persistence|ewma|naive|ets|llt|blend|auto|learned (learned: one network "
                        "trained on the bundled traces, `atoll forecast train`) "
                        f"(default {DEFAULT_FORECASTER})")
    p.add_argument("--scale", default=None, metavar="SPEC", action=Given,
                   help="scale every workload without its own @spec: mean:R (req/s), factor:F or none; "
                        "csv: workloads are otherwise served as recorded")
    p.add_argument("--world", default=None, choices=("exact", "calibration", "charged"),
                   help="the world simulated: exact (capacities as modelled, the default), calibration "
                        "(the closed loop: capacities off the model by the calibration's spread, "
                        "corrected online, latency SLO) or charged (the closed loop plus what a cluster "
                        "charges for a re-plan: sampled start-up, zone-correlated preemptions, spot "
                        "acquisition that fails when the trace has no node); policies train on "
                        "atoll/Fleet-v1, -v2 or -v3")
    p.add_argument("--capacity-error", default=None, metavar="SPEC",
                   help="how the true capacities differ from the performance model: 0 (default, exact), "
                        "calibration (the calibration's held-out spread), a sigma, stress:S, scale:F or "
                        "file:PATH (see atoll.envs.capacity_error)")
    p.add_argument("--correction", action="store_const", const=True, default=None,
                   help="plan with capacities corrected online from the servers' latency and queues")
    p.add_argument("--slo-model", default=None, choices=("fluid", "latency"),
                   help="SLO attainment: fluid (served / demand, default) or latency (the queueing "
                        "approximation of vLLM's TTFT and inter-token latency)")
    p.add_argument("--solver-time-limit", type=float, default=None, metavar="SECONDS",
                   help="time limit of each re-optimization's solve (default 120 s, a runaway guard: each "
                        "HiGHS run first stops at 5,000 branch-and-bound nodes, which does not depend on the "
                        "machine's load); a solve stopped at either keeps its best plan found (counted as "
                        "time_limited_solves) or holds the fleet")
    add_risk_option(p)
    p.add_argument("--removal-weight", type=float, default=None, metavar="R",
                   help="each running instance a re-plan removes costs R x its $/h in the re-plan's "
                        "objective (the price of churn; default 0)")
    add_pd_option(p)
    add_json(p)


def add_pd_option(p: argparse.ArgumentParser) -> None:
    """``--pd``: how every model is served (default: the scenario's own, a fleet file's ``pd``)."""
    from atoll.solvers.types import PD_MODES

    p.add_argument("--pd", default=None, choices=PD_MODES,
                   help="how models are served: auto (the ILP chooses per model between a replica per "
                        "phase and one replica serving prefill and decode together), aggregated (one "
                        "replica serves both, vLLM's default) or disaggregated (a replica per phase). "
                        "Default: the fleet file's pd, else disaggregated")


def add_risk_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--risk", default=None, metavar="SPEC",
                   help="the risk every re-plan takes for every model: h<headroom> (plan at that "
                        "utilization), s<spread> (largest share of demand one spot pool may carry), "
                        "f<floor> (share of demand on-demand capacity covers), e.g. h0.85,s0.5,f0.3; "
                        "default: none (the cheapest plan)")


def parse_risk(text: str) -> Risk:
    """``--risk`` as a :class:`~atoll.solvers.problem.Risk`, or a user error naming the option."""
    from atoll.solvers.problem import Risk

    try:
        return Risk.parse(text)
    except ValueError as exc:
        raise UserError(f"--risk {text}: {exc}") from exc


def check_image_path(path: Path, option: str) -> None:
    """Fail before any work if matplotlib cannot write ``path``'s format (taken from its extension)."""
    from matplotlib.backend_bases import FigureCanvasBase

    supported = FigureCanvasBase.get_supported_filetypes()
    ext = path.suffix.lstrip(".").lower()
    if ext not in supported:
        raise UserError(f"{option} {str(path)!r}: unknown image format {ext or '(no extension)'!r}; use one "
                        f"of {', '.join('.' + e for e in sorted(supported))} (e.g. out.png)")


def split_names(text: str, option: str) -> list[str]:
    """A comma-separated option -> its names; an empty entry or an empty list is an error."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise UserError(f"{option} {text!r} has an empty name; give a comma-separated list without "
                        f"empty entries")
    return names


def split_policies(text: str, option: str) -> list[str]:
    """A comma-separated list of policies -> the policies. A per-model assignment's entries
    (``per-model:1@0.9,3@0.95``) and a risk's parts (``+h0.85,s0.5``) hold commas too: a part
    that starts with a digit, or is a risk part (``s0.5``, ``f0.3``, ``h0.7``), continues the policy
    before it."""
    import re

    out: list[str] = []
    for part in split_names(text, option):
        continues = part[:1].isdigit() or re.fullmatch(r"[hsf][0-9.]+", part) is not None
        if out and continues:
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def policy_value(text: str) -> PolicySpec | TunedPolicy:
    """A ``--policy`` as the value the library takes: an ``atoll tune`` file (``.yaml``) read, any
    other text parsed as a policy spec (:func:`atoll.envs.vocabulary.parse_policy`). The edge:
    past it, a policy is a value."""
    from atoll.envs.vocabulary import parse_policy
    from atoll.training.tuning import is_policy_file, read_tuned

    return read_tuned(text) if is_policy_file(text) else parse_policy(text)


def require_servable_env(env: FleetEnv) -> None:
    """An error naming every model of the env's scenario that no template can serve, and why."""
    from atoll.envs.fleet_model import scenario_library
    from atoll.solvers.servable import require_servable

    c = env.config
    spec = c.scenario_spec
    # the library the env was built from (memoized per process), not a second read of the cache
    require_servable(spec, scenario_library(spec, c.runtime), c.runtime)
