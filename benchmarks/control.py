"""Figures of the live controller, as one JSON document on stdout (progress on stderr).

1. ``tick``: ticks of the controller on a scenario (default ``extended``) against the replay
   exporter serving the scenario's ServeGen demand from day 11, each tick advancing the trace
   by one interval on a scripted clock, so only the tick's own work is timed: read (HTTP
   scrape + parse), decide (rates, ETS forecast update, observation, policy), the warm-started
   exact solve, sink (JSON files) and the atomic state write. The policy is ``fixed:1`` (every
   model re-optimized every tick: the worst case). The state starts with three days of
   history, so the forecast is the seasonal ETS one, fitted at the first tick (reported apart).
3. ``bounds`` (``--bounds-only`` runs just this): one controller tick (scenario ``core``)
   against a 60 MB ``/metrics`` page and against a server trickling one byte every 2 s, with
   the default settings (``--timeout 5`` s total per request, 16 MiB cap, 3 attempts): the
   tick's seconds and the peak Python memory it allocated (tracemalloc), and the 60 MB page
   again with the cap raised to 64 MiB (read and parsed: only the vLLM lines are parsed).
2. ``replay``: a real-time run — the exporter replays one hour of the trace at 60x on the wall
   clock, the controller ticks every 60 trace-seconds (1 wall second) through ``run_loop``;
   reports ticks run, late and missed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

from atoll.control.controller import Controller, ControllerSettings  # noqa: E402
from atoll.control.live_fleet import LiveFleet  # noqa: E402
from atoll.control.loop import run_loop  # noqa: E402
from atoll.control.metrics import ScrapeSource  # noqa: E402
from atoll.control.replay import ReplayExporter  # noqa: E402
from atoll.control.sinks import make_sink  # noqa: E402
from atoll.control.state import ControllerState, HistoryPoint, save_state  # noqa: E402
from atoll.envs.demand import workload_series  # noqa: E402
from atoll.envs.policies import make_policy  # noqa: E402
from atoll.envs.vocabulary import parse_policy  # noqa: E402
from atoll.forecast.workloads import DemandSeries  # noqa: E402
from atoll.solvers.scenarios import SCENARIOS, model_shapes  # noqa: E402

DAY = 86400.0


def scenario_series(scenario: str, models: tuple[str, ...]) -> list[DemandSeries]:
    """The env's demand: ServeGen groups scaled to the scenario's req/s, with its request shapes."""
    spec = SCENARIOS[scenario]
    raw = workload_series("servegen", models, spec.req_per_s, 300.0)
    out = []
    for name, s, shape in zip(models, raw, model_shapes(spec, models), strict=True):
        n = len(s.requests_per_s)
        out.append(DemandSeries(name, s.step_s, s.requests_per_s, np.full(n, shape.input_tokens),
                                np.full(n, shape.output_tokens)))
    return out


def seed_history(series: list[DemandSeries], start_s: float, days: float
                 ) -> dict[str, tuple[HistoryPoint, ...]]:
    out = {}
    for s in series:
        first = int((start_s - days * DAY) / s.step_s)
        last = int(start_s / s.step_s)
        out[s.name] = tuple(HistoryPoint((k + 1) * s.step_s, float(s.requests_per_s[k] * s.input_tokens[k]),
                                         float(s.requests_per_s[k] * s.output_tokens[k]))
                            for k in range(first, last))
    return out


class TraceClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def bench_ticks(fleet: LiveFleet, series: list[DemandSeries], ticks: int, interval_s: float, policy: str,
                workdir: Path) -> dict[str, object]:
    start = 10 * DAY  # day 11
    clock = TraceClock()
    state_dir = workdir / "tick-state"
    save_state(state_dir, ControllerState(history=seed_history(series, start, 3.0), history_limit=10_000))
    with ReplayExporter(series, list(fleet.models), start_s=start, clock=clock) as exporter:
        controller = Controller(fleet, ScrapeSource(exporter.url, clock=exporter.trace_time),
                                make_policy(parse_policy(policy), len(fleet.models)),
                                make_sink(f"json:{workdir / 'plans'}"), state_dir,
                                settings=ControllerSettings(interval_s=interval_s),
                                clock=exporter.trace_time)
        totals, parts, changed, methods = [], [], 0, set()
        for i in range(ticks):
            report = controller.tick()
            totals.append(report.seconds["total"])
            parts.append(report.seconds)
            changed += report.plan_changed
            methods |= {f["method"] for f in report.forecast.values()}
            clock.now += interval_s
            print(f"tick {i}: {report.seconds['total'] * 1000:.0f} ms, chosen {len(report.decision.chosen)}, "
                  f"plan changed {report.plan_changed}", file=sys.stderr, flush=True)
    steady = totals[2:]  # tick 0 warms the rate baseline up, tick 1 fits ETS and plans from nothing
    keys = ("read", "decide", "solve", "sink", "persist")
    return {
        "scenario": fleet.scenario, "models": len(fleet.models), "templates": len(fleet.templates),
        "policy": policy, "ticks": ticks, "interval_s": interval_s, "plans_changed": changed,
        "forecast_methods": sorted(methods),
        "first_ticks_s": totals[:2], "median_s": statistics.median(steady),
        "p90_s": float(np.quantile(steady, 0.9)), "max_s": max(steady),
        "median_parts_s": {k: statistics.median(p.get(k, 0.0) for p in parts[2:]) for k in keys},
    }


def bench_replay(fleet: LiveFleet, series: list[DemandSeries], hours: float, speedup: float,
                 interval_s: float, policy: str, workdir: Path) -> dict[str, object]:
    with ReplayExporter(series, list(fleet.models), speedup=speedup, start_s=10 * DAY) as exporter:
        rule = make_policy(parse_policy(policy), len(fleet.models))
        controller = Controller(fleet, ScrapeSource(exporter.url), rule,
                                make_sink(f"json:{workdir / 'replay-plans'}"), workdir / "replay-state",
                                settings=ControllerSettings(interval_s=interval_s, time_scale=speedup),
                                clock=lambda: time.time() * speedup)
        n = int(hours * 3600 / interval_s)
        t = time.perf_counter()
        changed = [0]

        def on_tick(report: object) -> None:
            changed[0] += bool(getattr(report, "plan_changed", False))

        summary = run_loop(controller, wall_interval_s=interval_s / speedup, max_ticks=n,
                           stop=threading.Event(), on_tick=on_tick)
        wall = time.perf_counter() - t
    return {"trace_hours": hours, "speedup": speedup, "interval_trace_s": interval_s,
            "interval_wall_s": interval_s / speedup, "policy": policy, "wall_s": wall,
            "plans_changed": changed[0],
            **summary.as_dict()}


def _page_server(body: bytes, trickle_s: float | None) -> tuple[object, str]:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                if trickle_s is None:
                    self.wfile.write(body)
                    return
                for i in range(len(body)):
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                    time.sleep(trickle_s)
            except OSError:
                return

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def bench_bounds(workdir: Path) -> dict[str, object]:
    import tracemalloc

    fleet = LiveFleet("core")
    lines = [f'vllm:{n}{{model_name="{m}"}} {v}' for m in fleet.models
             for n, v in (("prompt_tokens_total", 1e6), ("generation_tokens_total", 1e5),
                          ("num_requests_waiting", 0), ("num_requests_running", 1))]
    filler = b"".join(f'other_metric{{le="{i}",path="/x/{i}"}} {i}\n'.encode() for i in range(60_000))
    big = ("\n".join(lines) + "\n").encode() + filler * max(1, (60 * 2**20) // len(filler))
    out: dict[str, object] = {"page_bytes": len(big)}
    for case, body, trickle, max_mb in (("page_60mb_cap_16mib", big, None, 16.0),
                                         ("page_60mb_cap_64mib", big, None, 64.0),
                                         ("trickle_1_byte_per_2s", b"#" * 1000, 2.0, 16.0)):
        server, url = _page_server(body, trickle)
        controller = Controller(fleet, ScrapeSource(url, timeout=5.0, max_bytes=int(max_mb * 2**20)),
                                make_policy(parse_policy("fixed:1"), len(fleet.models)),
                                make_sink(f"json:{workdir / case}"), workdir / f"{case}-state")
        tracemalloc.start()
        t = time.perf_counter()
        report = controller.tick()
        seconds = time.perf_counter() - t
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        server.shutdown()  # type: ignore[attr-defined]
        out[case] = {"tick_s": round(seconds, 2), "peak_mib": round(peak / 2**20, 1),
                     "metrics_ok": report.metrics.get("ok"), "error": report.metrics.get("error"),
                     "held": sorted(report.decision.held)}
        print(f"bounds {case}: {seconds:.1f} s, peak {peak / 2**20:.0f} MiB", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", default="extended")
    parser.add_argument("--ticks", type=int, default=40)
    parser.add_argument("--interval", type=float, default=300.0,
                        help="trace seconds per tick (tick benchmark)")
    parser.add_argument("--policy", default="fixed:1")
    parser.add_argument("--replay-hours", type=float, default=1.0)
    parser.add_argument("--speedup", type=float, default=60.0)
    parser.add_argument("--replay-interval", type=float, default=60.0, help="trace seconds per tick (replay)")
    parser.add_argument("--bounds-only", action="store_true", help="only the 60 MB page / trickle figures")
    args = parser.parse_args()
    if args.bounds_only:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps({"bounds": bench_bounds(Path(tmp))}, indent=2))
        return
    t = time.perf_counter()
    fleet = LiveFleet(args.scenario)
    build_s = time.perf_counter() - t
    series = scenario_series(args.scenario, fleet.models)
    with tempfile.TemporaryDirectory() as tmp:
        ticks = bench_ticks(fleet, series, args.ticks, args.interval, args.policy, Path(tmp))
        replay = bench_replay(fleet, series, args.replay_hours, args.speedup, args.replay_interval,
                              args.policy, Path(tmp))
        bounds = bench_bounds(Path(tmp))
    print(json.dumps({"fleet_build_s": build_s, "tick": ticks, "replay": replay, "bounds": bounds}, indent=2))


if __name__ == "__main__":
    main()
