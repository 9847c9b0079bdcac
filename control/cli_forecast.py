"""``atoll forecast backtest`` and ``atoll forecast plot``."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rich.progress import Progress, TaskID
from rich.table import Table

from atoll.control.output import UserError, console, emit_json
from atoll.forecast.backtest import HORIZONS, backtest
from atoll.forecast.forecasters import DAY, FORECASTERS, ForecastError
from atoll.forecast.plot import plot_forecast
from atoll.forecast.workloads import DemandSeries, WorkloadError, load_workload


def _series(name: str, step_s: float) -> DemandSeries:
    try:
        return load_workload(name, step_s=step_s)
    except (WorkloadError, FileNotFoundError) as exc:
        raise UserError(str(exc)) from exc


def cmd_backtest(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING)
    results = []
    names = [n.strip() for n in args.workload.split(",")]
    forecasters = [f.strip() for f in args.forecaster.split(",")]
    for f in forecasters:
        if f not in FORECASTERS:
            raise UserError(f"unknown forecaster {f!r}; valid: {', '.join(FORECASTERS)}")
    timings = {}
    with Progress(console=console, transient=True) as progress:
        for name in names:
            series = _series(name, 300.0)
            y = series.requests_per_s
            train = args.train_days * DAY
            if len(y) < train + DAY:
                raise UserError(f"workload {name!r} has {len(y) // DAY} days; the backtest needs "
                                f"{args.train_days} training days plus at least one test day")
            for f in forecasters:
                task = progress.add_task(f"{name} {f}", total=len(y) - train)

                def tick(task: TaskID = task) -> None:
                    progress.advance(task)

                try:
                    res, per_step = backtest(y, series=name, forecaster=f, train_steps=train, tick=tick)
                except ForecastError as exc:
                    raise UserError(f"{name}: {exc}") from exc
                results.extend(res)
                timings[f"{name}/{f}"] = per_step
    table = Table(title="Rolling-origin backtest (MASE scaled by in-sample daily seasonal naive)")
    for col in ("series", "forecaster", "horizon", "MASE", "naive MASE", "ratio", "pinball",
                "cov 80%", "cov 90%"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r.series, r.forecaster, f"{r.horizon_min:g} min", f"{r.mase:.3f}",
                      f"{r.naive_mase:.3f}", f"{r.mase / r.naive_mase:.2f}", f"{r.pinball:.3f}",
                      f"{r.coverage_80:.2f}", f"{r.coverage_90:.2f}")
    console.print(table)
    if args.json:
        emit_json({"results": [r.as_dict() for r in results], "train_days": args.train_days,
                   "update_forecast_seconds": timings})
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    series = _series(args.workload, 300.0)
    origin = int(args.origin_day * DAY)
    if not 2 * DAY <= origin < len(series):
        raise UserError(f"--origin-day {args.origin_day} must leave >= 2 days of history and lie "
                        f"inside the series' {len(series) // DAY} days")
    if args.forecaster not in FORECASTERS:
        raise UserError(f"unknown forecaster {args.forecaster!r}; valid: {', '.join(FORECASTERS)}")
    info = plot_forecast(series, forecaster=args.forecaster, origin_step=origin,
                         horizon=int(args.hours * 12), history_steps=2 * DAY, out=args.out)
    console.print(f"wrote {args.out}")
    if args.json:
        emit_json({"out": str(args.out), **info})
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("forecast", help="demand forecasting: backtests and plots")
    fsub = p.add_subparsers(dest="forecast_command", required=True, metavar="SUBCOMMAND")
    b = fsub.add_parser("backtest", help="rolling-origin backtest over the test days")
    b.add_argument("--workload", default="servegen:m-large",
                   help="servegen:<model>, azure:<trace> or csv:<path>#<model>; comma-separated")
    b.add_argument("--forecaster", default="auto", help=f"one or more of {', '.join(FORECASTERS)}")
    b.add_argument("--train-days", type=int, default=7)
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=cmd_backtest, horizons=HORIZONS)
    pl = fsub.add_parser("plot", help="plot history, forecast and intervals to a PNG")
    pl.add_argument("--workload", default="servegen:m-large")
    pl.add_argument("--forecaster", default="auto")
    pl.add_argument("--origin-day", type=float, default=8.0, help="forecast origin, in days")
    pl.add_argument("--hours", type=float, default=6.0, help="forecast length")
    pl.add_argument("--out", type=Path, required=True)
    pl.add_argument("--json", action="store_true")
    pl.set_defaults(handler=cmd_plot)
