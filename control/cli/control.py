"""``atoll control``: the live controller — Prometheus metrics in, plans out, safe under faults.

One tick every ``--interval`` (see ``atoll.control.controller`` for what a tick does, and
``atoll.control.loop`` for the schedule); ``--once`` runs a single tick — two, ``--first-gap``
apart, when the state holds no earlier sample, so a first run plans and delivers rather than only
reading the counters. SIGTERM or SIGINT lets the tick in progress finish and persist, then exits
0; a controller killed harder resumes from ``--state DIR`` at its next start. Tick lines are the
log (stderr); ``--once``'s tick and the final summary are the result (stdout); in loop mode
``--json`` writes one JSON line per tick, then the summary's. Exit codes: 0 done, 1 metrics
unavailable (the plan held), 3 a plan not delivered (kept pending, retried at the next run).
``--dry-run`` works on a copy of the state and renders what the sink would be given, delivering
and persisting nothing.

Time: the controller's clock is a :class:`~atoll.control.clock.SteadyClock` (monotonic, anchored
to wall time), and ``--scrape`` samples are dated by it too, so a wall-clock step never lands in
an interval.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import FrameType

from atoll.control.cli.common import add_json, policy_value
from atoll.control.cli.output import Output, UserError, _clean, as_user_error, output_for
from atoll.control.clock import SteadyClock
from atoll.control.controller import Controller, ControllerSettings, TickReport, live_codec
from atoll.control.k8s.render import K8sOptions, k8s_options
from atoll.control.k8s.vllm import VLLM_IMAGE
from atoll.control.live_demand import SHAPE_TOLERANCE
from atoll.control.live_fleet import LiveFleet, load_fleet_file
from atoll.control.loop import run_loop
from atoll.control.metrics import (
    DEFAULT_MAX_BYTES,
    DEFAULT_TIMEOUT_S,
    MetricsSource,
    PrometheusSource,
    ScrapeSource,
)
from atoll.control.plans import SinkError
from atoll.control.sinks import SINK_SPECS, DryRunSink, MetricsSink, PlanSink, make_sink
from atoll.control.state import StateError, StateLock, state_path
from atoll.forecast.planning import DEFAULT_FORECASTER
from atoll.solvers.fleet import load_fleet, resolve_fleet
from atoll.solvers.types import PD_MODES as SERVING_MODES
from atoll.solvers.types import ModelSpec

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_interval(text: str, flag: str = "--interval") -> float:
    """``60s``, ``5m``, ``1h`` or plain seconds -> seconds (> 0)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise UserError(f"{flag} {text!r} must be a positive duration like 60s, 5m or 1h")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _source(args: argparse.Namespace, clock: Callable[[], float] = time.time) -> MetricsSource:
    """The metrics source; ``--scrape`` samples are dated by ``clock`` (the steady clock)."""
    if bool(args.prometheus) == bool(args.scrape):
        raise UserError("give exactly one of --prometheus URL (the Prometheus HTTP API) or --scrape "
                        "URL[,URL...] (vLLM /metrics endpoints)")
    try:
        limits = {"timeout": args.timeout, "max_bytes": _max_bytes(args.max_response_mb)}
        if args.prometheus:
            return PrometheusSource(args.prometheus, **limits)
        return ScrapeSource([u.strip() for u in args.scrape.split(",") if u.strip()], clock=clock, **limits)
    except ValueError as exc:
        raise as_user_error(exc) from exc


def _max_bytes(mb: float) -> int:
    if not (math.isfinite(mb) and mb > 0):
        raise UserError(f"--max-response-mb must be > 0 (MiB per metrics answer), got {mb:g}")
    return max(1024, int(mb * 2**20))


def _fleet(args: argparse.Namespace) -> LiveFleet:
    limit: float = args.solver_time_limit
    # a bundled fleet's name (core, extended) as well as a path
    removal = args.removal_weight
    if removal is not None and not (math.isfinite(removal) and removal >= 0):
        raise UserError(f"--removal-weight must be a finite number >= 0 (x an instance's $/h), "
                        f"got {removal:g}")
    try:
        if args.fleet:
            given: dict[str, object] = {"prices": args.prices} if args.prices else {}  # else the market says
            if removal is not None:  # else the fleet file's removal_weight
                given["removal_weight"] = removal
            if args.pd is not None:  # else the fleet file's pd
                given["pd"] = args.pd
            return load_fleet_file(args.fleet, solver_time_limit=limit, **given)
        return LiveFleet(args.scenario, prices=args.prices or "on-demand", solver_time_limit=limit,
                         removal_weight=removal or 0.0, pd=args.pd)
    except (KeyError, ValueError) as exc:
        raise as_user_error(exc) from exc


def _k8s_options(args: argparse.Namespace) -> K8sOptions:
    """The Kubernetes sinks' settings: a YAML fleet file's ``kubernetes`` section, ``--pd`` on top."""
    section: dict[str, object] = {}
    users: tuple[ModelSpec, ...] = ()
    if args.fleet and resolve_fleet(args.fleet).suffix in (".yaml", ".yml"):
        spec = load_fleet(args.fleet)
        section, users = dict(spec.kubernetes), spec.user_models
    if args.pd == "aggregated":  # every pod serves whole requests (auto renders each template by its kind)
        section["pd"] = args.pd
    if args.image:
        section["image"] = args.image
    if args.kube_version:
        section["kube_version"] = args.kube_version
    return k8s_options(section, f"{args.fleet}: kubernetes" if args.fleet else "--pd/--image/--kube-version",
                       users)


def build_controller(args: argparse.Namespace, clock: Callable[[], float],
                     metrics_clock: Callable[[], float] = time.time,
                     state_dir: Path | None = None) -> Controller:
    """The controller the arguments describe; ``clock`` is the controller's, ``metrics_clock``
    dates scraped samples (see cmd_control); ``state_dir`` replaces ``--state`` (a dry run's copy)."""
    from atoll.training.evaluate import resolve_policy

    fleet = _fleet(args)
    try:
        settings = ControllerSettings(interval_s=parse_interval(args.interval), forecaster=args.forecaster,
                                      time_scale=args.time_scale,
                                      flat_hold_s=parse_interval(args.flat_hold, "--flat-hold"),
                                      shape_tolerance=args.shape_tolerance, correction=not args.no_correction,
                                      growth_factor=args.max_growth_factor, growth_add=args.max_growth_add,
                                      outlier_factor=args.outlier_factor,
                                      scale_down_window_s=0.0 if args.scale_down_window in ("0", "off")
                                      else parse_interval(args.scale_down_window, "--scale-down-window"))
    except ValueError as exc:
        raise as_user_error(exc) from exc
    from atoll.envs.vocabulary import PolicySpec

    try:  # a rule, a learned policy, or an `atoll tune` file
        value = policy_value(args.policy)
    except (ValueError, OSError) as exc:
        raise UserError(f"--policy {args.policy!r}: {as_user_error(exc)}") from exc
    spec = value if isinstance(value, PolicySpec) else value.policy
    if not isinstance(value, PolicySpec) and tuple(value.models) != tuple(fleet.models):
        # a per-model rule's entries follow the models' order: the file must be this fleet's
        raise UserError(f"--policy {args.policy!r} was tuned for models {', '.join(value.models)}; this "
                        f"fleet has {', '.join(fleet.models)}: tune it for this fleet (atoll tune --fleet)")
    if spec.is_learned:
        from atoll.training.tracking import configure

        configure()  # the store every command uses: $MLFLOW_TRACKING_URI or sqlite:///mlruns/mlflow.db
    from atoll.training.registry import FleetSpaces

    try:  # an unloadable URI, or one that does not fit this fleet, is an InputError
        policy = resolve_policy(value, len(fleet.models), fleet=FleetSpaces.of_live_fleet(fleet))
    except (KeyError, ValueError, OSError) as exc:
        raise UserError(f"--policy {args.policy!r}: {as_user_error(exc)}") from exc
    # a rule's @q and a per-model rule's (or a policy file's) levels configure the controller, as
    # they configure the simulator's env (training.evaluate.env_at_level); its +RISK goes to every
    # re-plan (Controller.risk), and what the controller cannot honour is refused there
    q = getattr(policy, "planning_quantile", None)
    levels = getattr(policy, "action_levels", None)
    settings = replace(settings, planning_quantile=q if q is not None else settings.planning_quantile,
                       action_levels=tuple(levels) if levels else None,
                       risk_presets=tuple(getattr(policy, "risk_presets", ()) or ()))
    codes = dict(getattr(policy, "metadata", None) or {}).get("action_codes")
    if codes:  # the controller decodes with its own levels: the policy's codes must mean the same
        ours = live_codec(settings, fleet, getattr(policy, "risk", None)).names()
        if list(codes) != ours:
            raise UserError(f"--policy {args.policy!r}: its action codes ({', '.join(codes)}) are not this "
                            f"controller's ({', '.join(ours)}); use a policy trained with this fleet's "
                            f"planning level and action levels")
    try:
        sink: PlanSink = DryRunSink(args.sink, _k8s_options(args)) if args.dry_run else \
            make_sink(args.sink, apply=args.apply, options=_k8s_options(args))
    except SinkError as exc:
        raise as_user_error(exc) from exc
    events = None
    if args.pool_events:
        from atoll.control.risk_signals import PoolEventLog

        try:
            configs = frozenset(c for t in fleet.templates.values() for c, _ in t.node_use)
            events = PoolEventLog(Path(args.pool_events), configs)
        except FileNotFoundError as exc:
            raise UserError(f"--pool-events: {exc}") from exc
    try:
        source = _source(args, metrics_clock)
        return Controller(fleet, source, policy, sink, state_dir or args.state, settings=settings,
                          clock=clock, events=events)
    except (StateError, ValueError) as exc:
        raise as_user_error(exc) from exc


def _line(r: TickReport) -> str:
    if not r.metrics.get("ok"):
        stale = r.metrics.get("stale_s")
        return (f"tick {r.tick}: metrics unavailable — holding the plan (data "
                f"{'never read' if stale is None else f'{stale:.0f} s stale'}): {r.metrics.get('error')}; "
                f"check that the server is up and the URL (--prometheus / --scrape) is right")
    chosen = ", ".join(r.decision.chosen) or "none"
    held = f"; held {', '.join(r.decision.held)}" if r.decision.held else ""
    change = f"plan {r.plan_sequence}: {sum(1 for d in r.diff if d['change'] > 0)} add, " \
             f"{sum(1 for d in r.diff if d['change'] < 0)} remove" if r.plan_changed else "plan unchanged"
    sink = ""
    if r.sink_result is not None:
        sink = " — delivered" if r.sink_result["ok"] else f" — NOT delivered, kept pending: " \
                                                          f"{r.sink_result['message']}"
    # a request shape off the profiled one is said on the tick line, never only in the JSON
    drift = "".join(f"; request shape drift {m}: {why}" for m, why in r.shape_drift.items())
    implausible = "".join(f"; implausible signals of {m} held: {'; '.join(v['held'])}"
                          for m, v in r.metrics.get("implausible", {}).items() if v.get("held"))
    jump = r.clock.get("wall_jump_s", 0.0)
    step = f"; wall clock stepped {jump:+.0f} s (intervals keep the monotonic clock)" if jump else ""
    when = f"{r.clock['wall_time']} " if r.clock.get("wall_time") else ""
    return (f"{when}tick {r.tick}: re-optimize {chosen}{held}; {change}{sink} "
            f"({r.seconds.get('total', 0.0) * 1000:.0f} ms){drift}{implausible}{step}")


def cmd_control(args: argparse.Namespace) -> int:
    out = output_for(args)
    if not (math.isfinite(args.time_scale) and args.time_scale > 0):
        raise UserError(f"--time-scale must be > 0 (trace seconds per wall second), got {args.time_scale:g}")
    # Metrics are dated in wall time (their rates are divided by the time scale); the
    # controller's own clock (intervals, history, time of day) runs time_scale x wall time, a
    # clock that a restarted controller continues rather than restarts.
    steady = SteadyClock(scale=args.time_scale)
    gap = parse_interval(args.first_gap, "--first-gap")
    if args.dry_run:
        # a copy of the state: the dry run plans as the controller would, and forgets it
        with tempfile.TemporaryDirectory(prefix="atoll-dry-run-") as tmp:
            saved = state_path(args.state)
            if saved.exists():
                shutil.copy2(saved, Path(tmp) / saved.name)
            return _locked(out, args, build_controller(args, steady, steady.metrics_clock(), Path(tmp)), gap)
    # one controller per state folder, held until this command returns (StateLocked: exit 2)
    with StateLock(args.state) as lock:
        if lock.took_over:
            out.note(f"took over the state folder lock of {lock.took_over} (no longer running)")
        return _locked(out, args, build_controller(args, steady, steady.metrics_clock()), gap)


def _exit_code(report: TickReport) -> int:
    """0 done; 1 metrics unavailable (held on stale data); 3 a plan not delivered."""
    if not report.metrics.get("ok"):
        return 1
    failed = [d for d in (report.sink_result, report.earlier_delivery) if d is not None and not d.get("ok")]
    return 3 if failed else 0


def _locked(out: Output, args: argparse.Namespace, controller: Controller, gap_s: float) -> int:
    sink = controller.sink
    if isinstance(sink, MetricsSink):
        out.note(f"metrics sink listening on http://{sink.host}:{sink.port}/metrics")
    if controller.resumed:
        st = controller.state
        out.note(f"resuming from {args.state}: tick {st.tick}, plan {st.plan_sequence}"
                 f"{', a plan pending delivery' if st.pending else ''}")
    if args.once:
        first = None
        if controller.state.last_metrics is None:
            # no earlier sample: a rate needs two, so take the first now and the second a short
            # gap later — a first run plans and delivers, or fails loudly
            first = controller.tick()
            if first.metrics.get("ok"):
                out.note(f"{_line(first)}; first sample taken, the second in {gap_s:g} s")
                time.sleep(gap_s)
        report = controller.tick() if first is None or first.metrics.get("ok") else first
        out.result(_line(report))
        doc = report.as_dict()
        if isinstance(controller.sink, DryRunSink):
            doc["dry_run"] = controller.sink.rendered
            out.result(controller.sink.text())
        out.json(doc)
        code = _exit_code(report)
        if code == 3:
            out.note("the plan was not delivered (kept pending; the next run retries it): exit 3")
        return code
    return _run(out, args, controller)


def _run(out: Output, args: argparse.Namespace, controller: Controller) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        out.note(f"{signal.Signals(signum).name}: finishing the tick in progress, then exiting")
        stop.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    last: list[TickReport] = []

    def on_tick(report: TickReport) -> None:
        out.note(_line(report))
        last[:] = [report]
        if args.json:  # one JSON line per tick (JSON Lines), the summary's last
            sys.stdout.write(json.dumps(_clean(report.as_dict()), separators=(",", ":")) + "\n")
            sys.stdout.flush()

    try:
        summary = run_loop(controller, wall_interval_s=controller.settings.interval_s / args.time_scale,
                           max_ticks=args.ticks, stop=stop, on_tick=on_tick)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    out.result(f"{summary.ticks} tick(s), {summary.late} late, {summary.missed} missed; "
               f"state in {args.state}")
    if args.json:
        sys.stdout.write(json.dumps({"summary": summary.as_dict()}, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    return _exit_code(last[0]) if last and _exit_code(last[0]) == 3 else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    from atoll.envs.config import PRICE_KINDS

    p = sub.add_parser("control", help="run the live controller: metrics in, plans out")
    p.add_argument("--prometheus", default=None, metavar="URL", help="Prometheus server (HTTP API)")
    p.add_argument("--scrape", default=None, metavar="URL[,URL...]", help="vLLM /metrics endpoints")
    p.add_argument("--policy", default="threshold",
                   help="learned:<model uri>, learned:champion (this fleet's, atoll-trigger-<fleet>) or "
                        "learned:file:PATH (a policy file), "
                        "fixed:K (every K ticks), "
                        "threshold[:LOW:HIGH], grow:K, never, a per-model rule, or an `atoll tune` "
                        "file (FILE.yaml, tuned for this fleet's models)")
    p.add_argument("--scenario", default="core", help="solver scenario the fleet is planned from")
    p.add_argument("--fleet", default=None, metavar="FILE",
                   help="a YAML fleet file, or a bundled fleet's name (core, extended), instead of "
                        "--scenario (a .json fleet file, the retired format, is refused with its YAML)")
    p.add_argument("--pd", default=None, choices=SERVING_MODES,
                   help="how models are served, planned and deployed: auto (the ILP chooses per model; "
                        "the default), disaggregated (a replica per phase, KV transfer and a router) or "
                        "aggregated (one replica serves prefill and decode together: plain vllm serve "
                        "behind the model's Service). Default: the fleet file's pd, else auto")
    p.add_argument("--image", default=None, metavar="IMAGE",
                   help=f"k8s sinks: the vLLM serving image (default {VLLM_IMAGE}, the version whose flags "
                        f"atoll's table holds; overrides the fleet file's kubernetes.image)")
    p.add_argument("--kube-version", default=None, metavar="1.N",
                   help="k8s sinks: check every object against this Kubernetes version's OpenAPI schemas "
                        "and the LeaderWorkerSet CRD's structural schema before writing or applying "
                        "(1.25-1.37; overrides the fleet file's kubernetes.kube_version)")
    p.add_argument("--prices", default=None, choices=PRICE_KINDS,
                   help="node prices the plans are costed at (default: a YAML fleet file's own market per "
                        "pool, each plan line at its pool's tier — spot, on-demand, or either in a hedged "
                        "pool; --scenario: on-demand). With a fleet file, spot puts every pool in the spot "
                        "market and on-demand every pool on-demand")
    p.add_argument("--removal-weight", type=float, default=None, metavar="R",
                   help="each running instance a re-plan removes costs R x its $/h in the re-plan's "
                        "objective (the price of churn; default: the fleet file's removal_weight, else 0)")
    p.add_argument("--state", required=True, metavar="DIR", help="where the controller persists its state")
    p.add_argument("--sink", required=True,
                   help=f"where plans go: {SINK_SPECS} (metrics: binds 127.0.0.1 unless a HOST is given)")
    p.add_argument("--apply", action="store_true", help="k8s-apply: really apply (default: dry run)")
    p.add_argument("--interval", default="60s", help="time between ticks (60s, 5m, ...)")
    p.add_argument("--once", action="store_true",
                   help="run one tick and exit — two, --first-gap apart, when the state has no earlier "
                        "sample (exit code 1 if the metrics could not be read, 3 if the plan was not "
                        "delivered)")
    p.add_argument("--first-gap", default="5s", metavar="DURATION",
                   help="--once without an earlier sample: wall time between its two samples (default 5s)")
    p.add_argument("--dry-run", action="store_true",
                   help="plan on a copy of the state and print what the sink would be given (the plan, and "
                        "the manifests of a k8s sink); nothing is delivered or saved")
    p.add_argument("--ticks", type=int, default=None, help="stop after this many ticks")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="trace seconds per wall second of the metrics (a replay's --speedup); rates are "
                        "divided by it and the interval runs that much faster")
    p.add_argument("--forecaster", default=DEFAULT_FORECASTER,
                   help="naive, ets, sarimax, uc, auto or "
                        "peak:persistence|ewma|naive|ets|llt|blend|auto|learned "
                        f"(default {DEFAULT_FORECASTER}, as the simulator's)")
    p.add_argument("--pool-events", default=None, metavar="FILE",
                   help="pool event log (JSON Lines: preempted and refused nodes per node config), which a "
                        "policy trained on atoll/Fleet-v3 or -v4 observes; required for one")
    p.add_argument("--solver-time-limit", type=float, default=10.0, help="seconds per solve")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help="seconds per metrics request in all (connect, headers and body): a deadline, "
                        "not a per-read time-out")
    p.add_argument("--max-response-mb", type=float, default=DEFAULT_MAX_BYTES / 2**20,
                   help="largest metrics answer read (MiB); a larger one fails the read and holds the plan")
    p.add_argument("--flat-hold", default="15m",
                   help="how long counters that stop rising while their server answers hold the model "
                        "(a frozen exporter) before they count as zero demand (trace time)")
    p.add_argument("--no-correction", action="store_true",
                   help="plan on the performance model's capacities: do not learn them from the servers' "
                        "latency and queues (the online capacity correction is on by default)")
    p.add_argument("--shape-tolerance", type=float, default=SHAPE_TOLERANCE, metavar="FRACTION",
                   help="report a request shape drift when the measured tokens per request of either phase "
                        "is more than this fraction off the shape the templates were profiled at")
    p.add_argument("--max-growth-factor", type=float, default=2.0, metavar="X",
                   help="a plan grows a service to at most X x its instances + --max-growth-add per tick "
                        "(the rest waits for the next tick; reported in solve.guard_rails)")
    p.add_argument("--max-growth-add", type=int, default=4, metavar="N",
                   help="instances a service may gain per tick beyond --max-growth-factor x its count")
    p.add_argument("--scale-down-window", default="0", metavar="DURATION",
                   help="a service shrinks only to the most instances the solver wanted for it over this "
                        "window (trace time, e.g. 30m; HPA's scale-down stabilization): a dip taken back "
                        "within it removes nothing (default 0: off)")
    p.add_argument("--outlier-factor", type=float, default=10.0, metavar="X",
                   help="a rate above X x the model's range over the last hour (or beyond what the fleet "
                        "could serve) is held until the next interval confirms it")
    add_json(p)
    p.set_defaults(handler=cmd_control)
