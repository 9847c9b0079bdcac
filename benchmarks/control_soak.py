"""Soak of the live controller, as one JSON document on stdout (progress on stderr).

2,000 ticks at ``--interval 5s`` on a scripted clock (no real waiting: only the controller's
own work runs) against vLLM counters of the ``core`` scenario's three models, with:

- **churned names**: every read also carries a model the fleet does not have, a new name each
  tick (a cluster where other teams' servers come and go);
- **spikes**: every 150 ticks one model's prompt counter reads 1e12 for one scrape, and at
  tick 400 a counter of 1.7e308 (an overflow over a 5 s interval);
- **lying signals**: every 200 ticks (from tick 50) one model's waiting gauge reads 1e6 for two
  scrapes, and (from tick 120) -5 for one: valid numbers, false;
- **clock jumps**: the wall clock steps back 5 minutes at tick 600 and forward 10 hours at tick
  900 while the controller runs (its clock is :class:`atoll.control.clock.SteadyClock`, and the
  samples are dated by it, as ``atoll control --scrape`` does);
- **a gap**: at tick 1,200 the controller is down for 30 days (both clocks move on), then the
  process restarts from its state folder, as after an outage;
- **a fleet change**: at tick 1,500 the controller restarts with a fleet whose library lacks
  every template it runs; the running instances must keep serving until their replacements are
  ready (make-before-break, reported as retiring), never dropped at once.

The demand is a daily pattern (the ``core`` scenario's mean rates x 0.5..1.5) so the history
and forecasts see real variation; policy ``threshold``; sink ``json:DIR``. At the end it
reports the process's RSS (current and peak), the state file's size, the median of 20 timed
saves of the final state, history points kept, plan files kept, tick seconds, the guard
rails' counts (outliers held, invalid samples, implausible signals held, growth capped), the
largest planning demand over the true demand while a signal lied, the largest rate error after
a clock jump, what the fleet change kept and how long its retirement took, the churn (instances
added + removed per hour over the fleet) after the first hour, and the machine's load; a tick
raising would end the run with the traceback.

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

from atoll.control.clock import SteadyClock  # noqa: E402
from atoll.control.controller import Controller, ControllerSettings  # noqa: E402
from atoll.control.live_fleet import LiveFleet  # noqa: E402
from atoll.control.metrics import GENERATION, PROMPT, RUNNING, WAITING, MetricsSnapshot, assemble  # noqa: E402
from atoll.control.sinks import JsonDirSink  # noqa: E402
from atoll.control.state import STATE_FILE, save_state  # noqa: E402
from atoll.envs.policies import make_policy  # noqa: E402
from atoll.envs.vocabulary import parse_policy  # noqa: E402

DAY = 86400.0


class Clocks:
    """The soak's time: ``mono`` the true elapsed seconds (what the servers' counters follow),
    ``wall`` the wall clock (stepped by the clock-jump faults)."""

    def __init__(self, start_s: float) -> None:
        self.mono, self.wall = start_s, start_s

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


class SoakSource:
    """Cumulative vLLM counters per model on the soak's clock, with the faults above; samples
    are dated by ``date`` (the controller's steady clock)."""

    url = "soak://metrics"

    def __init__(self, fleet: LiveFleet, base_rps: dict[str, float], clocks: Clocks) -> None:
        self.fleet, self.base, self.clocks = fleet, base_rps, clocks
        self.counters = {m: [1e6, 1e5] for m in fleet.models}
        self.override: dict[str, float] = {}
        self.waiting: dict[str, float] = {}
        self.extra = ""
        self.date = lambda: clocks.mono

    def rate(self, model: str, t: float) -> float:
        return self.base[model] * (1.0 + 0.5 * math.sin(2 * math.pi * t / DAY))

    def advance(self, seconds: float) -> None:
        shapes = self.fleet.shapes
        for m in self.fleet.models:
            r = self.rate(m, self.clocks.mono)
            self.counters[m][0] += r * shapes[m][0] * seconds
            self.counters[m][1] += r * shapes[m][1] * seconds
        self.clocks.advance(seconds)

    def read(self) -> MetricsSnapshot:
        raw = []
        for m, (p, g) in self.counters.items():
            raw += [(m, "r0", PROMPT, self.override.pop(m, p)), (m, "r0", GENERATION, g),
                    (m, "r0", WAITING, self.waiting.pop(m, 0.0)), (m, "r0", RUNNING, 1.0)]
        if self.extra:
            raw += [(self.extra, "r0", PROMPT, 1.0), (self.extra, "r0", GENERATION, 1.0)]
        return assemble(raw, {}, float(self.date()), self.url)


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def soak(root: Path, ticks: int, interval_s: float, gap_at: int, gap_s: float, fleet_change_at: int,
         jumps: dict[int, float]) -> dict[str, object]:
    fleet = LiveFleet("core")
    base = {m: 2.0 + i for i, m in enumerate(fleet.models)}
    clocks = Clocks(10 * DAY)
    source = SoakSource(fleet, base, clocks)
    settings = ControllerSettings(interval_s=interval_s)
    state_dir, sink = root / "state", JsonDirSink(root / "plans")

    def controller(on: LiveFleet) -> Controller:
        steady = SteadyClock(lambda: clocks.wall, lambda: clocks.mono)
        source.date = steady.metrics_clock()
        return Controller(on, source, make_policy(parse_policy("threshold"), len(on.models)), sink, state_dir,
                          settings=settings, clock=steady, sleep=lambda s: None, wall=lambda: clocks.wall)

    ctl = controller(fleet)
    counts = {"outlier": 0, "invalid": 0, "implausible_held": 0, "growth_capped": 0, "plans": 0}
    tick_s: list[float] = []
    lie_ratio: list[float] = []
    jump_errors: list[float] = []
    jump_seen: dict[int, float] = {}
    churn: list[float] = []
    added = removed = 0
    change: dict[str, object] = {}
    first_tick_s = None
    t0 = time.perf_counter()
    for i in range(ticks):
        source.extra = f"churn-{i}"
        if i and i % 150 == 0:
            source.override[fleet.models[i % len(fleet.models)]] = 1e12
        if i == 400:
            source.override[fleet.models[0]] = 1.7e308
        lying = i % 200 in (50, 51, 120)
        if lying:
            source.waiting[fleet.models[1]] = -5.0 if i % 200 == 120 else 1e6
        if i in jumps:
            clocks.wall += jumps[i]
        if i == gap_at:
            source.advance(gap_s)  # down for gap_s: the counters kept rising
            ctl = controller(fleet)  # the restart after the outage
        if i == fleet_change_at:
            running = dict(ctl.state.running)
            lacking = [t for k, t in fleet.templates.items() if k not in running]
            fleet = LiveFleet("core", templates=lacking)  # the new fleet file: none of them
            ctl = controller(fleet)
            change = {"at_tick": i, "running_instances": sum(running.values()),
                      "retiring_instances": sum(ctl.retiring.values())}
        report = ctl.tick()
        first_tick_s = report.time_s if first_tick_s is None else first_tick_s
        tick_s.append(report.seconds.get("total", 0.0))
        for r in report.metrics.get("rates", {}).values():
            if r["status"] in counts:
                counts[r["status"]] += 1
        counts["implausible_held"] += sum(1 for v in report.metrics.get("implausible", {}).values()
                                          if v["held"])
        if report.solve and report.solve.get("guard_rails", {}).get("growth_capped"):
            counts["growth_capped"] += 1
        counts["plans"] += int(report.plan_changed)
        if report.clock.get("wall_jump_s"):
            jump_seen[i] = report.clock["wall_jump_s"]
        model = fleet.models[1]
        rate = report.metrics.get("rates", {}).get(model, {})
        true = source.rate(model, clocks.mono - interval_s / 2) * fleet.shapes[model][0]
        measured = rate.get("prompt_tokens_per_s")
        if lying and measured:
            row = report.metrics.get("demand", {}).get(model, {})
            planned = row.get("planned_tokens_per_s", [measured])[0]
            lie_ratio.append(planned / true)
        if measured and any(0 <= i - j < 3 for j in jumps):
            jump_errors.append(abs(measured / true - 1.0))
        if change and "kept_in_first_delivery" not in change and report.plan_changed:
            latest = json.loads((root / "plans" / "latest.json").read_text())["plan"]
            kept = {k: n for k, n in running.items() if latest.get(k) == n}
            change["kept_in_first_delivery"] = sum(kept.values())
            change["dropped_at_once"] = change["running_instances"] - change["kept_in_first_delivery"]
        if change and "retired_after_ticks" not in change and not ctl.retiring:
            change["retired_after_ticks"] = i - fleet_change_at
            change["retired_after_s"] = (i - fleet_change_at) * interval_s
        fig = report.churn
        if report.time_s - first_tick_s > 3600.0 and fig.get("per_hour_over_fleet") is not None \
                and i < gap_at:
            churn.append(fig["per_hour_over_fleet"])
        source.advance(interval_s)
        if (i + 1) % 250 == 0:
            print(f"tick {i + 1}/{ticks}: {time.perf_counter() - t0:.0f} s, RSS {_rss_mib():.0f} MiB",
                  file=sys.stderr)
    for _, a, r in ctl.state.churn:
        added, removed = added + a, removed + r
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
        "load_avg_1_5_15": list(os.getloadavg()),
        "rss_mib": _rss_mib(),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "state_bytes": (state_dir / STATE_FILE).stat().st_size,
        "save_s_median": statistics.median(saves),
        "history_points": {m: len(p) for m, p in state.history.items()},
        "tracked_models": list(ctl.tracker.models),
        "plan_files": len(list((root / "plans").glob("plan-*.json"))),
        "tick_s_median": statistics.median(tick_s), "tick_s_max": max(tick_s),
        "counts": counts,
        "lying_signals": {"ticks_lied": sum(1 for i in range(ticks) if i % 200 in (50, 51, 120)),
                          "max_planned_over_true_demand": max(lie_ratio) if lie_ratio else None},
        "clock_jumps": {"steps_s": {str(k): v for k, v in jumps.items()},
                        "reported": {str(k): v for k, v in jump_seen.items()},
                        "max_rate_error_after": max(jump_errors) if jump_errors else None},
        "fleet_change": change,
        "churn": {"per_hour_over_fleet_after_first_hour": {
            "median": statistics.median(churn) if churn else None, "max": max(churn) if churn else None},
            "instances_added_last_day": added, "instances_removed_last_day": removed},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ticks", type=int, default=2000)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between ticks")
    parser.add_argument("--gap-at", type=int, default=1200, help="the tick after the outage")
    parser.add_argument("--gap-days", type=float, default=30.0)
    parser.add_argument("--fleet-change-at", type=int, default=1500, help="the restart on a changed fleet")
    args = parser.parse_args()
    jumps = {600: -300.0, 900: 36000.0}
    with tempfile.TemporaryDirectory() as tmp:
        out = soak(Path(tmp), args.ticks, args.interval, args.gap_at, args.gap_days * DAY,
                   args.fleet_change_at, jumps)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
