"""``atoll replay``: serve vLLM-style metrics per model from demand traces until stopped."""

from __future__ import annotations

import argparse
import signal
import threading
from types import FrameType

from atoll.control.cli.common import add_fleet_option, add_json, read_fleet_arg, split_names
from atoll.control.cli.output import UserError, as_user_error, output_for
from atoll.control.live_fleet import LiveFleet, live_fleet
from atoll.control.replay import ReplayExporter
from atoll.control.served import ServedFleet, latest_plan
from atoll.forecast.workloads import DAY_S, DemandSeries, WorkloadError, load_workload


def _load(workloads: list[str], step_s: float) -> list[DemandSeries]:
    out = []
    for name in workloads:
        try:
            out.append(load_workload(name, step_s=step_s))
        except (WorkloadError, FileNotFoundError) as exc:
            raise UserError(f"workload {name!r}: {exc}") from exc
    return out


def _sources(args: argparse.Namespace) -> tuple[list[str], list[str], list[DemandSeries] | None]:
    """(workload names, model names, series): a fleet's own scaled series (``--fleet``, at the
    simulator's step and scaling, so a controller sees the demand its policy trained on), or
    the ``--workload`` traces as recorded."""
    if args.fleet:
        if args.workload or args.models:
            raise UserError("--fleet names the workloads and models; drop --workload and --models")
        active = read_fleet_arg(args)
        assert active is not None
        return ([w.source for w in active.spec.workloads], list(active.spec.model_names),
                list(active.series))
    if not args.workload:
        raise UserError("give --workload W[,W] (with --models) or --fleet FILE")
    workloads = split_names(args.workload, "--workload")
    return workloads, split_names(args.models, "--models") if args.models else workloads, None


def build_exporter(args: argparse.Namespace) -> ReplayExporter:
    """The exporter the parsed arguments describe (not started)."""
    workloads, models, fleet_series = _sources(args)
    args.replayed = workloads
    if len(models) != len(workloads):
        raise UserError(f"--models names {len(models)} models for {len(workloads)} workloads; give one "
                        f"name per workload, in the same order")
    if len(set(models)) != len(models):
        raise UserError(f"--models {args.models!r} repeats a name; each model needs its own")
    if not args.speedup > 0:
        raise UserError(f"--speedup must be > 0 (trace seconds per wall second), got {args.speedup:g}")
    if args.start_day < 1:
        raise UserError(f"--start-day is 1-based, got {args.start_day:g}; use 1 for the trace's first day")
    series = fleet_series if fleet_series is not None else _load(workloads, args.step)
    start_s = (args.start_day - 1) * DAY_S
    longest = max(len(s) * s.step_s for s in series)
    if start_s >= longest:
        raise UserError(f"--start-day {args.start_day:g} starts after the trace ends ({longest / DAY_S:.2f} "
                        f"days); pick a day from 1 to {longest / DAY_S:.2f}")
    try:
        return ReplayExporter(series, models, speedup=args.speedup, port=args.port, host=args.host,
                              start_s=start_s, served=_served(args, models))
    except ValueError as exc:
        raise as_user_error(exc) from exc


def _served(args: argparse.Namespace, models: list[str]) -> ServedFleet | None:
    """With ``--plans DIR``: the fleet that runs the plans a controller writes there (its json:DIR
    sink), in the world ``--capacity-error`` draws with ``--seed``; without it None (the trace's
    demand is exported as if all served)."""
    if not args.plans:
        if args.capacity_error not in (None, "0"):
            raise UserError("--capacity-error needs --plans DIR: only a replay that serves a plan has "
                            "capacities to be wrong about")
        return None
    active = getattr(args, "loaded_fleet", None)
    fleet = live_fleet(active) if active is not None else LiveFleet(args.scenario, models=models)
    unknown = sorted(set(models) - set(fleet.models))
    if unknown:
        raise UserError(f"--models {', '.join(unknown)} are not models of scenario {fleet.scenario!r} "
                        f"({', '.join(fleet.models)}); a served replay needs the fleet's own names")
    return ServedFleet(fleet.model, latest_plan(args.plans), capacity_error=args.capacity_error or 0,
                       seed=args.seed)


def cmd_replay(args: argparse.Namespace) -> int:
    out = output_for(args)
    exporter = build_exporter(args)
    try:
        exporter.start()
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc}") from exc
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        remaining = exporter.trace.duration_s - exporter.start_s
        out.note(f"replaying {', '.join(exporter.models)} at {args.speedup:g}x on "
                 f"{exporter.url}/metrics ({remaining / args.speedup:.0f} s of wall time left in "
                 f"the trace); Ctrl-C or SIGTERM stops")
        workloads = args.replayed
        out.json({"fleet": args.fleet, "url": exporter.url, "metrics_url": f"{exporter.url}/metrics",
                  "target": exporter.target,
                  "models": [{"model": m, "workload": w}
                             for m, w in zip(exporter.models, workloads, strict=True)],
                  "speedup": args.speedup, "start_day": args.start_day,
                  "trace_start_s": exporter.start_s, "trace_duration_s": exporter.trace.duration_s,
                  "served": None if exporter.served is None else {
                      "plans": args.plans, "capacity_error": exporter.served.spec.label,
                      "truth": exporter.served.truth}})
        # wait() in slices: a bare wait() would not let Ctrl-C's KeyboardInterrupt through promptly
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        exporter.stop()
    out.note("replay stopped")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="serve vLLM-style /metrics per model from demand traces")
    add_fleet_option(p)
    p.add_argument("--workload", default="",
                   help="servegen:<model>, azure:<trace> or csv:<path>#<model>; comma-separated for several")
    p.add_argument("--models", default="",
                   help="model_name label per workload, comma-separated (default: the workload names)")
    p.add_argument("--speedup", type=float, default=60.0, help="trace seconds per wall-clock second")
    p.add_argument("--port", type=int, default=0, help="TCP port (0 = any free port, printed on start)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--start-day", type=float, default=1.0, help="trace day to start at (1-based)")
    p.add_argument("--step", type=float, default=300.0, help="trace resolution in seconds")
    p.add_argument("--plans", default=None, metavar="DIR",
                   help="serve the plans a controller writes to DIR (its json:DIR sink): export what that "
                        "fleet serves, its latency histograms and queues, instead of the demand")
    p.add_argument("--scenario", default="core",
                   help="with --plans: the scenario whose templates the plans use")
    p.add_argument("--capacity-error", default=None, metavar="SPEC",
                   help="with --plans: true capacities off the model (0, calibration, sigma, stress:S, "
                        "scale:F, file:PATH)")
    p.add_argument("--seed", type=int, default=0, help="with --plans: seed of the capacity error's draw")
    add_json(p)
    p.set_defaults(handler=cmd_replay)
