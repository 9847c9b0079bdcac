"""``atoll control``: the live controller — Prometheus metrics in, plans out, safe under faults.

One tick every ``--interval`` (see ``atoll.control.controller`` for what a tick does); ``--once`` runs
a single tick. SIGTERM or SIGINT lets the tick in progress finish and persist, then exits 0; a
controller killed harder resumes from ``--state DIR`` at its next start.
"""

from __future__ import annotations

import argparse
import math
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from atoll.control.controller import Controller, ControllerSettings, TickReport
from atoll.control.live_fleet import LiveFleet, load_fleet_file
from atoll.control.metrics import MetricsSource, PrometheusSource, ScrapeSource
from atoll.control.output import UserError, console, emit_json
from atoll.control.plans import SinkError
from atoll.control.sinks import SINK_SPECS, make_sink
from atoll.control.state import StateError

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
LATE_FRACTION = 0.1  # a tick starting more than 10% of an interval after its slot is late


def parse_interval(text: str) -> float:
    """``60s``, ``5m``, ``1h`` or plain seconds -> seconds (> 0)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise UserError(f"--interval {text!r} must be a positive duration like 60s, 5m or 1h")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass
class LoopSummary:
    """ticks run; late: ticks that started over ``LATE_FRACTION`` of an interval after their
    scheduled time; missed: scheduled ticks
    skipped because an earlier one ran past them; stopped_by: why the loop ended."""

    ticks: int = 0
    late: int = 0
    missed: int = 0
    stopped_by: str = ""
    tick_seconds: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        s = sorted(self.tick_seconds)
        return {"ticks": self.ticks, "late_ticks": self.late, "missed_ticks": self.missed,
                "stopped_by": self.stopped_by,
                "tick_seconds_median": s[len(s) // 2] if s else None,
                "tick_seconds_max": s[-1] if s else None}


def run_loop(controller: Controller, *, wall_interval_s: float, max_ticks: int | None, stop: threading.Event,
             on_tick: Callable[[TickReport], None], monotonic: Callable[[], float] = time.monotonic
             ) -> LoopSummary:
    """Tick on a fixed schedule (``start + k x wall_interval_s``) until ``stop`` is set or
    ``max_ticks`` ran; a tick is never interrupted — ``stop`` is only looked at between ticks."""
    summary = LoopSummary()
    start = monotonic()
    k = 0
    while not stop.is_set() and (max_ticks is None or summary.ticks < max_ticks):
        if monotonic() - (start + k * wall_interval_s) > LATE_FRACTION * wall_interval_s:
            summary.late += 1
        report = controller.tick()
        summary.ticks += 1
        summary.tick_seconds.append(report.seconds.get("total", 0.0))
        on_tick(report)
        k += 1
        behind = monotonic() - (start + k * wall_interval_s)
        if behind > wall_interval_s:  # whole slots passed during the tick: they are skipped
            skipped = int(behind // wall_interval_s)
            summary.missed += skipped
            k += skipped
        if max_ticks is not None and summary.ticks >= max_ticks:
            break
        stop.wait(max(0.0, start + k * wall_interval_s - monotonic()))
    summary.stopped_by = "signal" if stop.is_set() else "ticks"
    return summary


def _source(args: argparse.Namespace) -> MetricsSource:
    """The metrics source; its samples are dated in wall time (see cmd_control)."""
    if bool(args.prometheus) == bool(args.scrape):
        raise UserError("give exactly one of --prometheus URL (the Prometheus HTTP API) or --scrape "
                        "URL[,URL...] (vLLM /metrics endpoints)")
    try:
        if args.prometheus:
            return PrometheusSource(args.prometheus, timeout=args.timeout)
        return ScrapeSource([u.strip() for u in args.scrape.split(",") if u.strip()], timeout=args.timeout)
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def _fleet(args: argparse.Namespace) -> LiveFleet:
    settings = {"solver_time_limit": args.solver_time_limit}
    try:
        if args.fleet:
            return load_fleet_file(args.fleet, **settings)
        return LiveFleet(args.scenario, prices=args.prices, **settings)
    except (KeyError, ValueError) as exc:
        raise UserError(str(exc).strip("'\"")) from exc


def build_controller(args: argparse.Namespace, clock: Callable[[], float]) -> Controller:
    """The controller the arguments describe; ``clock`` is the controller's (see cmd_control)."""
    from atoll.training.evaluate import resolve_policy

    fleet = _fleet(args)
    try:
        settings = ControllerSettings(interval_s=parse_interval(args.interval), forecaster=args.forecaster,
                                      time_scale=args.time_scale)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    try:
        policy = resolve_policy(args.policy, len(fleet.models))
    except (KeyError, ValueError, OSError) as exc:
        raise UserError(f"--policy {args.policy!r}: {str(exc).strip(chr(39) + chr(34))}") from exc
    except Exception as exc:  # MLflow raises its own types for unknown or unreachable model URIs
        raise UserError(f"--policy {args.policy!r}: cannot load the model ({type(exc).__name__}: {exc}); "
                        f"use the model_uri 'atoll train' printed, with MLFLOW_TRACKING_URI set as it "
                        f"was") from exc
    try:
        sink = make_sink(args.sink, apply=args.apply)
    except SinkError as exc:
        raise UserError(str(exc)) from exc
    try:
        source = _source(args)
        return Controller(fleet, source, policy, sink, args.state, settings=settings, clock=clock)
    except (StateError, ValueError) as exc:
        raise UserError(str(exc)) from exc


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
    return (f"tick {r.tick}: re-optimize {chosen}{held}; {change}{sink} "
            f"({r.seconds.get('total', 0.0) * 1000:.0f} ms)")


def cmd_control(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.time_scale) and args.time_scale > 0):
        raise UserError(f"--time-scale must be > 0 (trace seconds per wall second), got {args.time_scale:g}")
    # Metrics are dated in wall time (their rates are divided by the time scale); the
    # controller's own clock (intervals, history, time of day) runs time_scale x wall time, a
    # clock that a restarted controller continues rather than restarts.
    scale = args.time_scale
    clock = time.time if scale == 1 else (lambda: time.time() * scale)
    controller = build_controller(args, clock)
    if controller.resumed:
        st = controller.state
        console.print(f"resuming from {args.state}: tick {st.tick}, plan {st.plan_sequence}"
                      f"{', a plan pending delivery' if st.pending else ''}", highlight=False)
    if args.once:
        report = controller.tick()
        console.print(_line(report), highlight=False)
        if args.json:
            emit_json(report.as_dict())
        return 0 if report.metrics.get("ok") else 1  # held on stale data: say so to cron and scripts
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        console.print(f"{signal.Signals(signum).name}: finishing the tick in progress, then exiting",
                      highlight=False)
        stop.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    last: list[TickReport] = []

    def on_tick(report: TickReport) -> None:
        console.print(_line(report), highlight=False)
        last[:] = [report]

    try:
        summary = run_loop(controller, wall_interval_s=controller.settings.interval_s / args.time_scale,
                           max_ticks=args.ticks, stop=stop, on_tick=on_tick)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    console.print(f"{summary.ticks} tick(s), {summary.late} late, {summary.missed} missed; state in "
                  f"{args.state}", highlight=False)
    if args.json:
        emit_json({"summary": summary.as_dict(), "last": last[0].as_dict() if last else None})
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    from atoll.envs.config import PRICE_KINDS

    p = sub.add_parser("control", help="run the live controller: metrics in, plans out")
    p.add_argument("--prometheus", default=None, metavar="URL", help="Prometheus server (HTTP API)")
    p.add_argument("--scrape", default=None, metavar="URL[,URL...]", help="vLLM /metrics endpoints")
    p.add_argument("--policy", default="threshold",
                   help="learned:<model uri>, fixed:K (every K ticks), threshold[:LOW:HIGH] or never")
    p.add_argument("--scenario", default="core", help="solver scenario the fleet is planned from")
    p.add_argument("--fleet", default=None, metavar="FILE.json",
                   help="a fleet file (scenario, models, prices, availability) instead of --scenario")
    p.add_argument("--prices", default="on-demand", choices=PRICE_KINDS)
    p.add_argument("--state", required=True, metavar="DIR", help="where the controller persists its state")
    p.add_argument("--sink", required=True, help=f"where plans go: {SINK_SPECS}")
    p.add_argument("--apply", action="store_true", help="k8s-apply: really apply (default: dry run)")
    p.add_argument("--interval", default="60s", help="time between ticks (60s, 5m, ...)")
    p.add_argument("--once", action="store_true",
                   help="run one tick and exit (exit code 1 if the metrics could not be read)")
    p.add_argument("--ticks", type=int, default=None, help="stop after this many ticks")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="trace seconds per wall second of the metrics (a replay's --speedup); rates are "
                        "divided by it and the interval runs that much faster")
    p.add_argument("--forecaster", default="ets", help="naive, ets, sarimax, uc or auto")
    p.add_argument("--solver-time-limit", type=float, default=10.0, help="seconds per solve")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per metrics request")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.set_defaults(handler=cmd_control)
