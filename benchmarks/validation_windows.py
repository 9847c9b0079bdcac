"""Which validation days represent the test days: the uniform preset each window of days chooses,
and what that choice costs on the test days, per room cell. One JSON document on stdout (progress
on stderr), written to ``--out``.

The contests choose their rules on days 8-10, and those are light days: the heavy headroom
(``+h0.7``) chosen there then lost on the test days in several cells. A window that represents
days 11-14 should have their load. Days 4-7 are the same weekdays one week earlier: a weekly
seasonal forecast made at the end of day 10 (the only thing a planner knows of the test days)
expects exactly their load. So the windows compared are:

- ``8-10``: the days every contest chose on so far;
- ``4-7``: the test days' weekdays, a week earlier (rules are not trained, so a rule grid may be
  chosen on days a policy trains on);
- ``4-10``: both, every day after the forecasters' warm-up and before the test days.

The scheme is fixed before any test day is read, on a principle, not on a comparison: the
weekday-matched window (``4-7``) is the one a weekly seasonal forecast says has the test days'
load. Nothing here picks a window by its test-day cost; the test days only report, per cell, what
each window's choice costs. Each cell's mean demand per day is recorded beside it (the trace's own
rate), so whether a window's load is the test days' can be read, after the fact.

Per cell (``scenario/market/world[/half]``, as ``benchmarks/room.py`` names them) and window: the
cell's ``fixed:1`` presets (``--risks`` on ``fixed:1@0.9``) run on the window's days
(``--validation-seeds``, the contest's validation grid, cached), the preset of least effective
cost is the window's choice, and on the test days the room's stored per-seed runs of that preset
(``--room``, 8 seeds) give its effective cost against the preset best on each seed in hindsight
and against the ``8-10`` window's choice, paired per seed with a 95% interval. Only uniform
presets are compared: the room ran each of them on the test days, so no new test run is needed.

    .venv/bin/python benchmarks/validation_windows.py --out benchmarks/results/validation_windows.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

from atoll.control.cli.common import parse_days  # noqa: E402
from atoll.envs import WORLDS  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.demand import workload_series  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.solvers.allocation.direct import SOLVER_VERSION  # noqa: E402
from atoll.solvers.files import atomic_write_text  # noqa: E402
from atoll.training.contest import ContestSettings, cached_validation_grid, validation_choices  # noqa: E402
from atoll.training.lever_oracle import mean_interval, paired_ratio  # noqa: E402

CORE_CELLS = ("core/spot/charged", "core/spot/charged/bursty", "core/spot/charged/steady",
              "core/hedged/charged", "core/hedged/charged/bursty", "core/hedged/charged/steady")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cell_config(key: str) -> FleetConfig:
    """The room cell's world (a replica per phase, as the room measured it)."""
    scenario, availability, world, *half = key.split("/")
    workload = f"servegen-{half[0]}" if half else "servegen"
    return FleetConfig(scenario=scenario, availability=availability, workload=workload, pd="disaggregated",
                       action_levels=(0.9,), **WORLDS[world])


def daily_demand(config: FleetConfig, models: tuple[str, ...], days: range) -> dict[int, float]:
    """The fleet's mean demand (requests/s, summed over ``models``) on each day: the trace's own rate."""
    series = workload_series(config.workload, models, config.scenario_spec.req_per_s, config.step_s,
                             resample="hold")
    total = np.sum([s.requests_per_s for s in series], axis=0)
    steps = int(round(86_400 / config.step_s))
    return {d: float(total[(d - 1) * steps:d * steps].mean()) for d in days}


def window_choice(config: FleetConfig, n_models: int, window: tuple[int, int], risks: tuple[str, ...],
                  seeds: int, test_days: tuple[int, int]) -> dict[str, Any]:
    """The uniform preset the window's days choose (least effective cost), with each preset's
    validation totals."""
    st = ContestSettings(validation_days=window, test_days=test_days, seeds=seeds, validation_seeds=seeds,
                         levels=(0.9,), intervals=(1,), bands=(), workers=1, risks=risks,
                         per_model_targets=0, hindsight=False)
    validation, grid_s, _ = cached_validation_grid(config, st, note=lambda t: log(f"  {t}"))
    _, best, _ = validation_choices(validation, n_models, st, st.lost_price(config))
    means = {rule: {k: float(np.mean([r[k] for r in rows])) for k in ("cost_usd", "slo_attainment")}
             for rule, rows in validation.items()}
    return {"choice": best, "grid_seconds": round(grid_s, 1), "presets": means}


def on_test_days(rows: list[dict[str, Any]], presets: list[str], choice: str, reference: str
                 ) -> dict[str, Any]:
    """The choice's effective cost on the room's test-day seeds: over the per-seed best preset in
    hindsight, and over ``reference`` (another window's choice), paired per seed."""
    cost = {p: [r[p]["effective_usd"] for r in rows] for p in presets}
    best = [min(r[p]["effective_usd"] for p in presets) for r in rows]
    return {"over_hindsight_best_preset": paired_ratio(cost[choice], best),
            "over_8_10_choice": paired_ratio(cost[choice], cost[reference]),
            "hindsight_best_preset_per_seed": [min(presets, key=lambda p: r[p]["effective_usd"])
                                               for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default=",".join(CORE_CELLS))
    ap.add_argument("--windows", default="8-10,4-7,4-10")
    ap.add_argument("--risks", default="neutral;h0.85;h0.7")
    ap.add_argument("--validation-seeds", type=int, default=1)
    ap.add_argument("--test-days", default="11-14")
    ap.add_argument("--room", type=Path, default=Path("benchmarks/results/room.json"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/validation_windows.json"))
    args = ap.parse_args()
    room = json.loads(args.room.read_text())
    windows = [parse_days(w) for w in args.windows.split(",")]
    risks = tuple(r.strip() for r in args.risks.split(";") if r.strip())
    test = parse_days(args.test_days)
    doc: dict[str, Any] = {"settings": vars(args) | {"room": str(args.room), "out": str(args.out)},
                           "solver_version": SOLVER_VERSION, "loadavg_start": list(os.getloadavg()),
                           "cells": {}}
    t0 = time.perf_counter()
    for key in args.cells.split(","):
        if key not in room:
            raise SystemExit(f"validation_windows: cell {key!r} is not in {args.room} (its test-day runs are "
                             f"the room's): run benchmarks/room.py --cells {key} first")
        cell = room[key]
        config = cell_config(key)
        presets = cell["presets"]
        models = FleetEnv(config).models
        load = daily_demand(config, models, range(min(w[0] for w in windows), test[1] + 1))
        test_load = float(np.mean([load[d] for d in range(test[0], test[1] + 1)]))
        out: dict[str, Any] = {"room_solver": cell.get("settings", {}).get("solver_version"),
                               "demand_req_per_s_by_day": {str(d): round(v, 3) for d, v in load.items()},
                               "windows": {}}
        for w in windows:
            label = f"{w[0]}-{w[1]}"
            log(f"{key}: window {label}")
            got = window_choice(config, len(models), w, risks, args.validation_seeds, test)
            wl = float(np.mean([load[d] for d in range(w[0], w[1] + 1)]))
            got["demand_over_test_days"] = round(wl / test_load, 4)
            out["windows"][label] = got
        reference = out["windows"][args.windows.split(",")[0]]["choice"]
        for label, got in out["windows"].items():
            got["test_days"] = on_test_days(cell["per_seed"], presets, got["choice"], reference)
            seen = got["test_days"]
            hind, ref = seen["over_hindsight_best_preset"]["mean"], seen["over_8_10_choice"]["mean"]
            log(f"{key}: {label} chose {got['choice']}: {hind:.3f} of the per-seed best preset, {ref:.3f} of "
                f"8-10's choice")
        doc["cells"][key] = out
        doc["seconds"] = round(time.perf_counter() - t0, 1)
        atomic_write_text(args.out, json.dumps(doc, indent=1, default=str) + "\n")
    # across cells: each window's choice over the 8-10 choice, one ratio per (cell, seed) pair
    for label in out["windows"]:
        ratios = [r for c in doc["cells"].values()
                  for r in c["windows"][label]["test_days"]["over_8_10_choice"]["per_seed"]]
        doc.setdefault("pooled_over_8_10_choice", {})[label] = mean_interval(ratios)
    doc["loadavg_end"] = list(os.getloadavg())
    atomic_write_text(args.out, json.dumps(doc, indent=1, default=str) + "\n")
    print(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
