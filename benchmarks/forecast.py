"""Figures of the forecasters, as one JSON document on stdout: the robustness suite.

Series (5-min steps): the seeded synthetic shapes of ``atoll.forecast.synthetic`` (10 days: fit on
7, roll over 3), ServeGen m-large, m-mid, m-small (14 days: fit on 7, roll over 7), the six
client groups of the 6-model scenario (likewise), and the 1-day ServeGen deepseek-r1 and
mm-image (the short-history path: a 1-hour season, fit on 12 h, roll over 12 h).

Per series at 30 min: the forecaster's MASE and seasonal naive's and persistence's, 80/90%
coverage, the model auto chose (and every re-selection), and the planning demand (the 0.9
quantile's peak over 15 min) over the realized 15-min peak, median over origins.
Targets: MASE <= min(naive, persistence) everywhere; <= 0.8 x naive on the ServeGen
models; 90% coverage in [0.85, 0.95]; median planning ratio <= 2. Both cores: one process per
series (``--jobs``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

from atoll.forecast.backtest import backtest  # noqa: E402
from atoll.forecast.synthetic import SYNTHETIC, synthetic_series  # noqa: E402
from atoll.forecast.workloads import load_workload, n_model_scenario  # noqa: E402

SERVEGEN = ("m-large", "m-mid", "m-small")
SHORT = ("deepseek-r1", "mm-image")
DAY = 288


def _series() -> list[tuple[str, str, np.ndarray, int, int]]:
    """(name, kind, values, season, train steps)."""
    out = [(name, "synthetic", synthetic_series(name, days=10, seed=0), DAY, 7 * DAY)
           for name in SYNTHETIC]
    out += [(m, "servegen", load_workload(f"servegen:{m}").requests_per_s, DAY, 7 * DAY)
            for m in SERVEGEN]
    out += [(s.name, "client-group", s.requests_per_s, DAY, 7 * DAY) for s in n_model_scenario(6)]
    out += [(m, "short-history", load_workload(f"servegen:{m}").requests_per_s, 12, DAY // 2)
            for m in SHORT]
    return out


def _one(args: tuple[str, str, np.ndarray, int, int, str]) -> dict[str, object]:
    name, kind, y, season, train, forecaster = args
    t = time.perf_counter()
    res, per_step = backtest(np.asarray(y, dtype=float), series=name, forecaster=forecaster,
                             train_steps=train, season=season, horizons=(1, 6, 12))
    r = next(r for r in res if r.horizon_min == 30)
    best_trivial = min(r.naive_mase, r.persistence_mase)
    return {
        "series": name, "kind": kind, "season_steps": season,
        "mase_30min": r.mase, "naive_mase_30min": r.naive_mase,
        "persistence_mase_30min": r.persistence_mase,
        "ratio_to_naive": r.mase / r.naive_mase if r.naive_mase else None,
        "ratio_to_best_trivial": r.mase / best_trivial if best_trivial else None,
        "coverage_80_30min": r.coverage_80, "coverage_90_30min": r.coverage_90,
        "planning_ratio_median": r.planning_ratio_median, "cap_binds": r.cap_binds,
        "chosen": r.chosen, "selections": [list(s) for s in r.selections],
        "targets": {
            "never_worse_than_trivial": r.mase <= best_trivial * (1 + 1e-9),
            "servegen_0.8x_naive": (r.mase <= 0.8 * r.naive_mase) if kind == "servegen" else None,
            "coverage_90_in_0.85_0.95": 0.85 <= r.coverage_90 <= 0.95,
            "planning_ratio_le_2": r.planning_ratio_median <= 2.0,
        },
        "update_forecast_ms": per_step * 1e3, "backtest_seconds": time.perf_counter() - t,
    }


def simulate_heavy_tailed(forecaster: str, mean_rate: float = 10.0) -> dict[str, object]:
    """The heavy-tailed figure: one day (day 11) of the heavy-tailed synthetic series on core, every
    model's demand a Pareto-burst series (seeds 0-2) scaled to ``mean_rate`` req/s, spot
    availability, fixed:1: the wall time of the forecast pass plus the simulated day."""
    import numpy as np

    from atoll.envs.config import FleetConfig
    from atoll.envs.fleet_env import FleetEnv
    from atoll.envs.policies import make_policy
    from atoll.envs.rollout import run_policy
    from atoll.envs.vocabulary import parse_policy
    from atoll.forecast.synthetic import synthetic_series
    from atoll.forecast.workloads import DemandSeries, scale_to_mean_rate

    t0 = time.perf_counter()
    demand = []
    for i in range(3):
        rates = synthetic_series("pareto-bursts", days=14, seed=i)
        ones = np.ones(len(rates))
        demand.append(scale_to_mean_rate(DemandSeries(f"pareto-{i}", 300.0, rates, 2048 * ones, 28 * ones),
                                         mean_rate))
    env = FleetEnv(FleetConfig(scenario="core", demand=tuple(demand), forecaster=forecaster,
                               availability="spot", days=(11, 11)))
    t1 = time.perf_counter()
    rule = make_policy(parse_policy("fixed:1"), len(env.models))
    totals = run_policy(env, rule, days=[11], seed=0).totals()
    t2 = time.perf_counter()
    return {"series": "pareto-bursts x 3 models (seeds 0-2), mean 10 req/s", "scenario": "core",
            "availability": "spot", "policy": "fixed:1", "day": 11, "forecast_pass_seconds": t1 - t0,
            "simulate_seconds": t2 - t1, "total_seconds": t2 - t0, "target_seconds": 120,
            "totals": {k: totals[k] for k in ("cost_usd", "slo_attainment", "reoptimizations",
                                              "solver_seconds", "time_limited_solves")}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--forecaster", default="auto")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated series names")
    parser.add_argument("--simulate-only", action="store_true",
                        help="only the 1-day heavy-tailed simulation figure")
    args = parser.parse_args()
    if args.simulate_only:
        print(json.dumps({"simulate_heavy_tailed": simulate_heavy_tailed(args.forecaster)}, indent=2))
        return
    t_all = time.perf_counter()
    series = _series()
    if args.only:
        keep = set(args.only.split(","))
        series = [s for s in series if s[0] in keep]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(_one, [(*s, args.forecaster) for s in series]))
    met = {k: all(r["targets"][k] in (True, None) for r in rows)  # type: ignore[index]
           for k in rows[0]["targets"]}  # type: ignore[union-attr]
    print(json.dumps({"forecaster": args.forecaster, "series": rows, "all_targets_met": met,
                      "seconds": time.perf_counter() - t_all,
                      "simulate_heavy_tailed": simulate_heavy_tailed(args.forecaster)}, indent=2))


if __name__ == "__main__":
    main()
