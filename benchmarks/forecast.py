"""Figures of the forecasting issue, as one JSON document on stdout.

ServeGen m-large, m-mid, m-small at 5-min steps; fit on days 1-7, rolling origin over days
8-14 with updates every step. Targets: 30-min MASE <= 0.8 x seasonal naive's on each series;
90% intervals cover 85-95% at 30 min; one update + forecast <= 5 ms per series; the whole
backtest of the three series <= 3 min on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.forecast.backtest import backtest  # noqa: E402
from atoll.forecast.workloads import load_workload  # noqa: E402

SERIES = ("m-large", "m-mid", "m-small")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--forecaster", default="auto")
    args = parser.parse_args()
    t_load = time.perf_counter()
    data = {m: load_workload(f"servegen:{m}").requests_per_s for m in SERIES}
    load_s = time.perf_counter() - t_load
    out: dict[str, object] = {"forecaster": args.forecaster, "load_seconds": load_s, "series": {}}
    t_all = time.perf_counter()
    for m, y in data.items():
        t = time.perf_counter()
        res, per_step = backtest(y, series=m, forecaster=args.forecaster)
        r30 = next(r for r in res if r.horizon_min == 30)
        out["series"][m] = {  # type: ignore[index]
            "by_horizon": [r.as_dict() for r in res],
            "mase_30min": r30.mase, "naive_mase_30min": r30.naive_mase,
            "ratio_30min": r30.mase / r30.naive_mase, "ratio_target_met": r30.mase <= 0.8 * r30.naive_mase,
            "coverage_90_30min": r30.coverage_90, "coverage_target_met": 0.85 <= r30.coverage_90 <= 0.95,
            "update_forecast_ms": per_step * 1e3, "backtest_seconds": time.perf_counter() - t,
        }
    out["backtest_seconds_all"] = time.perf_counter() - t_all
    out["backtest_target_seconds"] = 180
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
