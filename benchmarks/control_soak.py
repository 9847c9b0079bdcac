"""Soak of the live controller (issue 29), as one JSON document on stdout (progress on stderr).

2,000 ticks at ``--interval 5s`` on a scripted clock (no real waiting: only the controller's
own work runs) against vLLM counters of the ``core`` scenario's three models, with:

- **churned names**: every read also carries a model the fleet does not have, a new name each
  tick (a cluster where other teams' servers come and go);
- **spikes**: every 150 ticks one model's prompt counter reads 1e12 for one scrape, and at
  tick 400 a counter of 1.7e308 (an overflow over a 5 s interval);
- **a gap**: at tick 1,200 the controller is down for 30 days (the clock jumps), then the
  process restarts from its state folder, as after an outage.

The demand is a daily pattern (the ``core`` scenario's mean rates x 0.5..1.5) so the history
and forecasts see real variation; policy ``threshold``; sink ``json:DIR``. At the end it
reports the process's RSS (current and peak), the state file's size, the median of 20 timed
saves of the final state, history points kept, plan files kept, tick seconds, and the guard
rails' counts (outliers held, invalid samples, growth capped); a tick raising would end the
run with the traceback.

    python benchmarks/control_soak.py > benchmarks/results/control_soak.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.control.controller import Controller, ControllerSettings  # noqa: E402
from atoll.control.live_fleet import LiveFleet  # noqa: E402
from atoll.control.metrics import GENERATION, PROMPT, RUNNING, WAITING, MetricsSnapshot, assemble  # noqa: E402
from atoll.control.sinks import JsonDirSink  # noqa: E402
from atoll.control.state import STATE_FILE, save_state  # noqa: E402
from atoll.envs.policies import make_policy  # noqa: E402

DAY = 86400.0


class SoakSource:
    """Cumulative vLLM counters per model on the soak's clock, with the faults above."""

    url = "soak://metrics"

    def __init__(self, fleet: LiveFleet, base_rps: dict[str, float], start_s: float) -> None:
        self.fleet, self.base = fleet, base_rps
        self.now = start_s
        self.counters = {m: [1e6, 1e5] for m in fleet.models}
        self.override: dict[str, float] = {}
        self.extra = ""

    def rate(self, model: str, t: float) -> float:
        return self.base[model] * (1.0 + 0.5 * math.sin(2 * math.pi * t / DAY))

    def advance(self, seconds: float) -> None:
        shapes = self.fleet.shapes
        for m in self.fleet.models:
            r = self.rate(m, self.now)
            self.counters[m][0] += r * shapes[m][0] * seconds
            self.counters[m][1] += r * shapes[m][1] * seconds
        self.now += seconds

    def read(self) -> MetricsSnapshot:
        raw = []
        for m, (p, g) in self.counters.items():
            raw += [(m, "r0", PROMPT, self.override.pop(m, p)), (m, "r0", GENERATION, g),
                    (m, "r0", WAITING, 0.0), (m, "r0", RUNNING, 1.0)]
        if self.extra:
            raw += [(self.extra, "r0", PROMPT, 1.0), (self.extra, "r0", GENERATION, 1.0)]
        return assemble(raw, {}, self.now, self.url)


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def soak(root: Path, ticks: int, interval_s: float, gap_at: int, gap_s: float) -> dict[str, object]:
    fleet = LiveFleet("core")
    base = {m: 2.0 + i for i, m in enumerate(fleet.models)}
    source = SoakSource(fleet, base, 10 * DAY)
    settings = ControllerSettings(interval_s=interval_s)
    state_dir, sink = root / "state", JsonDirSink(root / "plans")

    def controller() -> Controller:
        return Controller(fleet, source, make_policy("threshold", len(fleet.models)), sink, state_dir,
                          settings=settings, clock=lambda: source.now, sleep=lambda s: None)

    ctl = controller()
    counts = {"outlier": 0, "invalid": 0, "growth_capped": 0, "plans": 0}
    tick_s: list[float] = []
    t0 = time.perf_counter()
    for i in range(ticks):
        source.extra = f"churn-{i}"
        if i and i % 150 == 0:
            source.override[fleet.models[i % len(fleet.models)]] = 1e12
        if i == 400:
            source.override[fleet.models[0]] = 1.7e308
        if i == gap_at:
            source.advance(gap_s)  # down for gap_s: the counters kept rising
            ctl = controller()  # the restart after the outage
        report = ctl.tick()
        tick_s.append(report.seconds.get("total", 0.0))
        for r in report.metrics.get("rates", {}).values():
            if r["status"] in counts:
                counts[r["status"]] += 1
        if report.solve and report.solve.get("guard_rails", {}).get("growth_capped"):
            counts["growth_capped"] += 1
        counts["plans"] += int(report.plan_changed)
        source.advance(interval_s)
        if (i + 1) % 250 == 0:
            print(f"tick {i + 1}/{ticks}: {time.perf_counter() - t0:.0f} s, RSS {_rss_mib():.0f} MiB",
                  file=sys.stderr)
    saves = []
    for _ in range(20):
        t = time.perf_counter()
        save_state(state_dir, ctl.state)
        saves.append(time.perf_counter() - t)
    state = ctl.state
    return {
        "ticks": ticks, "interval_s": interval_s, "gap_s": gap_s, "gap_at_tick": gap_at,
        "churned_names": ticks, "spikes_1e12": len(range(150, ticks, 150)), "overflow_samples": 1,
        "wall_s": time.perf_counter() - t0,
        "rss_mib": _rss_mib(),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "state_bytes": (state_dir / STATE_FILE).stat().st_size,
        "save_s_median": statistics.median(saves),
        "history_points": {m: len(p) for m, p in state.history.items()},
        "tracked_models": list(ctl.tracker.models),
        "plan_files": len(list((root / "plans").glob("plan-*.json"))),
        "tick_s_median": statistics.median(tick_s), "tick_s_max": max(tick_s),
        "counts": counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ticks", type=int, default=2000)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between ticks")
    parser.add_argument("--gap-at", type=int, default=1200, help="the tick after the outage")
    parser.add_argument("--gap-days", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = soak(Path(tmp), args.ticks, args.interval, args.gap_at, args.gap_days * DAY)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
