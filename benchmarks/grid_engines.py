"""The contest's rule grid on its two engines — the process pool (the default) and Ray tasks on a
local Ray instance (``atoll evaluate --rules grid --ray ...``) — on the same grid, as one JSON
document on stdout (progress on stderr): wall seconds of each, whether their totals are equal,
and the load before and after.

Both engines run the same (rule, seed) jobs with the same number of processes (``--workers``,
at least 2: pool workers, or the CPUs the local Ray instance is given), and each process builds
its own envs, so the difference is the engine's own overhead (Ray's start-up and object store
against spawn and pickling). Totals are compared without ``solver_seconds`` (wall time). On a
cluster Ray spreads the jobs over more machines; that is not measured here (one machine, 2 cores).

Example: ``python benchmarks/grid_engines.py --scenario core --days 8 --intervals 1,3
--levels 0.9,0.95 --seeds 2 --workers 2``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.envs import CLOSED_LOOP  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.training.contest import ContestSettings, validation_grid  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="core")
    ap.add_argument("--availability", default="spot")
    ap.add_argument("--world", choices=("exact", "calibration"), default="exact")
    ap.add_argument("--days", default="8", help="validation days, e.g. 8 or 8-10")
    ap.add_argument("--intervals", default="1,3")
    ap.add_argument("--levels", default="0.9,0.95")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if args.workers < 2:
        # one worker runs the grid in this process, on its warm envs: not the pool
        raise SystemExit("--workers: give 2 or more (one worker is the in-process path, not the pool)")
    first, _, last = args.days.partition("-")
    days = (int(first), int(last or first))
    closed = CLOSED_LOOP if args.world == "calibration" else {}
    config = FleetConfig(scenario=args.scenario, availability=args.availability, **closed)
    settings = ContestSettings(validation_days=days, test_days=(days[1] + 1, days[1] + 1), seeds=args.seeds,
                               levels=tuple(float(q) for q in args.levels.split(",")),
                               intervals=tuple(int(k) for k in args.intervals.split(",")), bands=(),
                               workers=args.workers, hindsight=False)
    out: dict[str, object] = {"settings": {**vars(args), "jobs": len(settings.grid) * args.seeds}}

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    # Only the validation grid runs here (the test days are never simulated). The forecast caches
    # both engines read are written by the first run: warm them first, so neither pays for them.
    t = time.perf_counter()
    validation_grid(config, dataclasses.replace(settings, intervals=(max(settings.intervals),),
                                                levels=settings.levels[:1], seeds=1, workers=1))
    out["warm_up_seconds"] = round(time.perf_counter() - t, 1)
    out["load_before"] = [round(v, 2) for v in os.getloadavg()]
    log(f"warm-up {out['warm_up_seconds']} s; the pool next")
    pool, pool_s = validation_grid(config, settings)
    out["pool_seconds"] = round(pool_s, 1)
    log(f"pool: {pool_s:.1f} s; Ray next")
    import ray

    t = time.perf_counter()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - t
    try:
        on_ray, ray_s = validation_grid(config, dataclasses.replace(settings, ray_address="auto"))
    finally:
        ray.shutdown()
    out["ray_seconds"] = round(ray_s, 1)
    out["ray_init_seconds"] = round(init_s, 1)
    out["load_after"] = [round(v, 2) for v in os.getloadavg()]
    out["equal_totals"] = _untimed(pool) == _untimed(on_ray)
    log(f"ray: {ray_s:.1f} s (+{init_s:.1f} s init); equal totals: {out['equal_totals']}")
    print(json.dumps(out, indent=2))


def _untimed(grid: dict[str, list[dict[str, float]]]) -> dict[str, list[dict[str, float]]]:
    """The grid's totals without the solves' wall seconds (never equal between two runs)."""
    return {r: [{k: v for k, v in t.items() if k != "solver_seconds"} for t in rows]
            for r, rows in grid.items()}


if __name__ == "__main__":
    main()
