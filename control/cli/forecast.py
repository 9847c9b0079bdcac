"""``atoll forecast backtest``, ``atoll forecast plot`` and ``atoll forecast train``."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

from rich.table import Table

from atoll.control.cli.common import add_json, check_image_path, split_names
from atoll.control.cli.output import UserError, as_user_error, output_for, progress
from atoll.envs.demand import WARMUP_DAYS
from atoll.forecast.backtest import HORIZONS, backtest, planning_backtest
from atoll.forecast.forecasters import DAY, ForecastError
from atoll.forecast.planning import DEFAULT_HORIZON, PLANNING_CANDIDATES
from atoll.forecast.plot import plot_forecast
from atoll.forecast.registry import FORECASTERS
from atoll.forecast.workloads import DemandSeries, WorkloadError, load_workload
from atoll.solvers.errors import UnknownNameError

DEFAULT_WORKLOAD = "servegen:m-large"


def _series(name: str, step_s: float) -> DemandSeries:
    try:
        return load_workload(name, step_s=step_s)
    except (WorkloadError, FileNotFoundError) as exc:
        raise as_user_error(exc) from exc


def _named_series(args: argparse.Namespace, step_s: float) -> list[tuple[str, DemandSeries]]:
    """(name, series) per requested series: a fleet's models (``--fleet``, scaled as its file
    says; ``--model`` picks some), else each ``--workload``."""
    if args.fleet:
        if args.workload is not None:
            raise UserError(f"--fleet {args.fleet} names each model's workload; drop --workload (or use "
                            f"--model to pick models)")
        from atoll.envs.fleet_file import read_fleet

        active = read_fleet(args.fleet, step_s=step_s)
        by_model = {s.name: s for s in active.series}
        wanted = split_names(args.model, "--model") if args.model else list(by_model)
        unknown = [m for m in wanted if m not in by_model]
        if unknown:
            raise UserError(f"--model {', '.join(unknown)}: not a model of fleet {active.name!r} "
                            f"({', '.join(by_model)})")
        return [(m, by_model[m]) for m in wanted]
    if args.model:
        raise UserError("--model picks models of a fleet; give --fleet FILE, or --workload per series")
    names = split_names(args.workload or DEFAULT_WORKLOAD, "--workload")
    return [(name, _series(name, step_s)) for name in names]


def _forecasters(text: str) -> list[str]:
    names = split_names(text, "--forecaster")
    for f in names:
        if f not in FORECASTERS:
            raise UnknownNameError(f"unknown forecaster {f!r}; valid: {', '.join(FORECASTERS)}")
    return names


def cmd_backtest(args: argparse.Namespace) -> int:
    if args.target == "planning":
        return _backtest_planning(args)
    out = output_for(args)
    logging.basicConfig(level=logging.WARNING)
    forecasters = _forecasters(args.forecaster or "auto")
    args.train_days = 7 if args.train_days is None else args.train_days
    if args.train_days < 1:
        raise UserError(f"--train-days must be >= 1, got {args.train_days}")
    results = []
    timings = {}
    for name, series in _named_series(args, 300.0):
        y = series.requests_per_s
        train = args.train_days * DAY
        if len(y) < train + DAY:
            raise UserError(f"workload {name!r} has {len(y) // DAY} days; the backtest needs "
                            f"{args.train_days} training days plus at least one test day")
        for f in forecasters:
            out.note(f"backtest {name} {f}: fitting on days 1-{args.train_days}, then stepping through "
                     f"days {args.train_days + 1}-{len(y) // DAY} ({len(y) - train} steps)")
            with progress(f"backtest {name} {f}", len(y) - train) as advance:
                try:
                    res, per_step = backtest(y, series=name, forecaster=f, train_steps=train,
                                             tick=lambda: advance(1))
                except ForecastError as exc:
                    raise UserError(f"{name}: {exc}") from exc
            results.extend(res)
            timings[f"{name}/{f}"] = per_step
    table = Table(title="Rolling-origin backtest (MASE scaled by in-sample daily seasonal naive)")
    for col in ("series", "forecaster", "chosen", "horizon", "MASE", "naive MASE", "ratio", "pinball",
                "cov 80%", "cov 90%"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r.series, r.forecaster, r.chosen, f"{r.horizon_min:g} min", f"{r.mase:.3f}",
                      f"{r.naive_mase:.3f}", f"{r.mase / r.naive_mase:.2f}", f"{r.pinball:.3f}",
                      f"{r.coverage_80:.2f}", f"{r.coverage_90:.2f}")
    out.result(table)
    out.json({"results": [r.as_dict() for r in results], "train_days": args.train_days,
              "update_forecast_seconds": timings})
    return 0


def _backtest_planning(args: argparse.Namespace) -> int:
    """``--target planning``: the peak over the look-ahead (see atoll.forecast.planning)."""
    out = output_for(args)
    logging.basicConfig(level=logging.WARNING)
    forecasters = _forecasters(args.forecaster or ",".join(PLANNING_CANDIDATES))
    train_days = WARMUP_DAYS if args.train_days is None else args.train_days
    if args.look_ahead < 1:
        raise UserError(f"--look-ahead must be >= 1 step, got {args.look_ahead}")
    if train_days < 2:
        raise UserError(f"--train-days must be >= 2 for --target planning, got {train_days}")
    rows: list[dict[str, object]] = []
    for name, series in _named_series(args, 300.0):
        y = series.requests_per_s
        out.note(f"planning backtest {name}: {', '.join(forecasters)} on days 1-{train_days}, then "
                 f"rolling through days {train_days + 1}-{len(y) // DAY}")
        if len(y) < (train_days + 1) * DAY:
            raise UserError(f"workload {name!r} has {len(y) // DAY} days; the backtest needs "
                            f"{train_days} training days plus at least one test day")
        try:
            rows += planning_backtest(y, series=name, forecasters=forecasters, train_steps=train_days * DAY,
                                      horizon=args.look_ahead)
        except ForecastError as exc:
            raise UserError(f"{name}: {exc}") from exc
    table = Table(title=f"Planning target: the 0.9 quantile of the peak over {args.look_ahead} steps "
                        f"(fit on {train_days} days, rolling origin after)")
    for col in ("series", "forecaster", "MAPE", "pinball", "vs ets", "cov 0.9", "chosen"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["series"]), str(r["forecaster"]), f"{r['mape']:.3f}", f"{r['pinball']:.4g}",
                      f"{r['pinball_vs_ets']:.3f}", f"{r['coverage']:.3f}", str(r.get("chosen", "")))
    out.result(table)
    out.json({"target": "planning", "train_days": train_days, "look_ahead_steps": args.look_ahead,
              "results": rows})
    return 0


PLOT_STEP_S = 300.0
MAX_PLOT_HOURS = 7 * 24.0  # a week ahead: longer forecasts say nothing and cost memory


def cmd_plot(args: argparse.Namespace) -> int:
    out = output_for(args)
    if not (math.isfinite(args.hours) and 0 < args.hours <= MAX_PLOT_HOURS):
        raise UserError(f"--hours {args.hours:g} must be > 0 and at most {MAX_PLOT_HOURS:g} (one week)")
    horizon = int(round(args.hours * 3600.0 / PLOT_STEP_S))
    if horizon < 1:
        raise UserError(f"--hours {args.hours:g} is shorter than one {PLOT_STEP_S / 60:g}-minute step; "
                        f"use at least {PLOT_STEP_S / 3600:.3g}")
    if not math.isfinite(args.origin_day):
        raise UserError(f"--origin-day {args.origin_day:g} must be a day of the data, e.g. 9 (day 1 is "
                        f"its first)")
    _forecasters(args.forecaster)
    check_image_path(args.out, "--out")
    picked = _named_series(args, PLOT_STEP_S)
    if len(picked) != 1:
        raise UserError(f"forecast plot draws one series; pick one with --model (of {len(picked)}) or "
                        f"--workload")
    name, series = picked[0]
    origin = int(round((args.origin_day - 1) * DAY))  # day 1 starts at the data's first step
    if not 2 * DAY <= origin < len(series):
        raise UserError(f"--origin-day {args.origin_day:g} must leave >= 2 days of history (>= 3: day 1 "
                        f"is the data's first) and lie inside the series' {len(series) / DAY:g} days")
    out.note(f"forecast plot {name}: fitting {args.forecaster} on days 1-{args.origin_day - 1:g}, then "
             f"{args.hours:g} h ahead")
    info = plot_forecast(series, forecaster=args.forecaster, origin_step=origin, horizon=horizon,
                         history_steps=2 * DAY, out=args.out)
    out.note(f"wrote {args.out}")
    out.json({"out": str(args.out), "series": name, "origin_day": args.origin_day, **info})
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train ``peak:learned``'s network on the bundled series (and ``--workload`` csv series)."""
    import shlex
    import sys

    from atoll.forecast.learned import SHIPPED
    from atoll.forecast.learned_fit import FitSettings, fit_net

    out = output_for(args)
    extra: list[tuple[str, tuple[float, ...]]] = []
    for name in split_names(args.workload, "--workload") if args.workload else []:
        s = _series(name, 300.0)
        if len(s.requests_per_s) < 2 * DAY:
            raise UserError(f"--workload {name}: {len(s.requests_per_s)} steps of 5 min; training needs "
                            f"at least two days (a day of history before each target)")
        extra.append((name, tuple(float(v) for v in s.requests_per_s)))
    try:
        seeds = tuple(int(v) for v in split_names(args.demand_seeds, "--demand-seeds"))
        scenarios = () if args.scenarios == "none" else tuple(split_names(args.scenarios, "--scenarios"))
        settings = FitSettings(seed=args.seed, demand_seeds=seeds, hold_out=args.hold_out, epochs=args.epochs,
                               scenarios=scenarios, extra=tuple(extra))
    except ValueError as exc:
        raise as_user_error(exc) from exc
    target = SHIPPED if args.ship else args.out
    with progress("training peak:learned", settings.epochs) as advance:
        def note(text: str) -> None:
            if text.startswith("epoch"):
                advance(1)
            out.note(text)

        net, report = fit_net(settings, note=note)
    command = shlex.join(["atoll", *getattr(args, "argv", sys.argv[1:])])
    net.card["command"] = command
    net.save(Path(target))
    doc: dict[str, object] = {"weights": str(target), **{k: v for k, v in report.items()}}
    if not args.no_mlflow:
        from atoll.training.demand_tracking import demand_model_run

        doc["mlflow"] = demand_model_run(Path(target), report, command)
    out.result(f"weights     {target}\nvalidation  0.9 pinball {report['validation_pinball_0.9']} (x level), "
               f"best epoch {report['best_epoch']} of {report['epochs_run']}\nseries      {report['series']} "
               f"(data hash {report['data_hash']}), {report['seconds']} s")
    out.json(doc)
    return 0


def _fleet_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fleet", default=None, metavar="FILE",
                   help="forecast a fleet file's models on their scaled demand (or core, extended)")
    p.add_argument("--model", default=None,
                   help="with --fleet: the model(s) to forecast, comma-separated (default: every model)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("forecast", help="demand forecasting: backtests and plots")
    fsub = p.add_subparsers(dest="forecast_command", required=True, metavar="SUBCOMMAND")
    b = fsub.add_parser("backtest", help="rolling-origin backtest over the test days")
    b.add_argument("--workload", default=None,
                   help=f"servegen:<model>, azure:<trace> or csv:<path>#<model>; comma-separated "
                        f"(default {DEFAULT_WORKLOAD})")
    _fleet_options(b)
    b.add_argument("--forecaster", default=None,
                   help=f"one or more of {', '.join(FORECASTERS)} (default: auto; with --target "
                        f"planning: {', '.join(PLANNING_CANDIDATES)})")
    b.add_argument("--train-days", type=int, default=None,
                   help=f"days to fit on (default 7; with --target planning {WARMUP_DAYS}, the env's "
                        "warm-up)")
    b.add_argument("--target", choices=("step", "planning"), default="step",
                   help="step: each future step (MASE, intervals); planning: the peak over the "
                        "look-ahead a re-plan sizes for (MAPE, pinball loss, 0.9 coverage, auto's choice)")
    b.add_argument("--look-ahead", type=int, default=DEFAULT_HORIZON,
                   help=f"--target planning: look-ahead in 5-min steps (default {DEFAULT_HORIZON})")
    add_json(b)
    b.set_defaults(handler=cmd_backtest, horizons=HORIZONS)
    pl = fsub.add_parser("plot", help="plot history, forecast and intervals to a PNG")
    pl.add_argument("--workload", default=None,
                    help=f"servegen:<model>, azure:<trace> or csv:<path>#<model> "
                         f"(default {DEFAULT_WORKLOAD})")
    _fleet_options(pl)
    pl.add_argument("--forecaster", default="auto",
                    help=f"one of {', '.join(FORECASTERS)} (default auto)")
    pl.add_argument("--origin-day", type=float, default=9.0,
                    help="forecast from the start of this day (day 1 is the data's first; default 9: "
                         "after 8 days of history; at least 3)")
    pl.add_argument("--hours", type=float, default=6.0, help="forecast length (at most a week)")
    pl.add_argument("--out", type=Path, required=True, help="image file; the extension picks the "
                    "format (.png, .svg, .pdf, ...)")
    add_json(pl)
    pl.set_defaults(handler=cmd_plot)
    t = fsub.add_parser("train", help="train peak:learned's network on the bundled series (days 2-10)")
    t.add_argument("--out", type=Path, default=Path("peak_learned.npz"),
                   help="weights file (.npz; its card goes beside it as .json)")
    t.add_argument("--ship", action="store_true",
                   help="write the package's shipped weights (forecast/data/peak_learned.npz) instead "
                        "of --out")
    t.add_argument("--workload", default=None,
                   help="more series to train on beside the bundled ones: csv:<path>#<model>, "
                        "comma-separated")
    t.add_argument("--hold-out", default=None, metavar="SOURCE",
                   help="leave out every bundled series whose name starts with SOURCE (e.g. m-small)")
    t.add_argument("--scenarios", default="core,extended,fleet20",
                   help="the bundled scenarios whose demand (every ServeGen half) trains the network, "
                        "or none (then only --workload's series)")
    t.add_argument("--demand-seeds", default="0,1", help="demand realizations of each bundled series")
    t.add_argument("--epochs", type=int, default=40, help="at most this many passes (early-stopped)")
    t.add_argument("--seed", type=int, default=0, help="seeds the weights' start and the batch order")
    t.add_argument("--no-mlflow", action="store_true", help="do not log the run nor register atoll-demand")
    add_json(t)
    t.set_defaults(handler=cmd_train)
