"""``peak:learned`` against ``peak:auto``: one JSON document on stdout (progress on stderr), written
to ``--out``.

Parts (``--parts``, comma-separated; default all):

- ``train``: ``atoll.forecast.learned_fit.fit_net`` with the default settings (every bundled
  series, days 2-7 fit, 8-10 stop early), its seconds and card; and the same with ``--hold-out``
  (default ``m-small``) left out, the network the held-out figures use. With ``--ship`` the first
  one's weights replace ``forecast/data/peak_learned.npz``.
- ``accuracy``: per series, on **test days 11-14** (never read by training), the planning target's
  0.9 pinball loss and 0.9 coverage of ``peak:learned`` and ``peak:auto``, through the env's own
  causal pass (``build_book``, the cached books the simulator plans from): core, extended and
  fleet20 x ``servegen``, ``servegen-steady``, ``servegen-bursty`` at demand seed ``--seed`` (the
  series fleet20 shares with core and extended at another rate are scored in each). Reported:
  the mean over series of the pinball ratio learned / auto with a 95% t interval, coverage
  ranges, and the same for the held-out source's series with the held-out network (run series by
  series, as the env's pass does).
- ``loop``: in the simulator, for a cell (``--loop-cell`` scenario/market/world/half) and
  ``--loop-seeds`` paired seeds on the test days, each rule of ``--loop-rules`` with both
  forecasters: effective cost (node $ + $2 per million tokens lost), node cost and SLO attainment,
  and the paired ratio learned / auto per rule with a 95% interval.

    .venv/bin/python benchmarks/demand_model.py --parts train,accuracy --ship \
        --out benchmarks/results/demand_model.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

from atoll.envs import WORLDS  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.demand import WARMUP_DAYS, build_book, workload_series  # noqa: E402
from atoll.forecast.forecasters import DAY  # noqa: E402
from atoll.forecast.learned import SHIPPED, PeakLearned  # noqa: E402
from atoll.forecast.learned_fit import SCENARIOS, WORKLOADS, FitSettings, fit_net  # noqa: E402
from atoll.forecast.planning import pinball  # noqa: E402
from atoll.solvers.files import atomic_write_text  # noqa: E402
from atoll.solvers.scenarios import SCENARIOS as SPECS  # noqa: E402
from atoll.training.lever_oracle import paired_ratio  # noqa: E402

H, LEVEL, TEST = 3, 0.9, (11, 14)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def target(rates: np.ndarray, g: np.ndarray) -> np.ndarray:
    return np.stack([rates[..., g + k] for k in range(H)]).max(axis=0)


def test_origins(steps: int) -> np.ndarray:
    g = np.arange((TEST[0] - 1) * DAY, TEST[1] * DAY)
    return g[g + H <= steps]


def part_train(hold_out: str, ship: bool) -> tuple[dict[str, Any], Any]:
    out: dict[str, Any] = {}
    net, report = fit_net(FitSettings(), note=log)
    out["shipped_settings"] = report
    if ship:
        net.save(SHIPPED)
        out["shipped_to"] = str(SHIPPED)
    held, held_report = fit_net(FitSettings(hold_out=hold_out), note=log)
    out["hold_out"] = {"source": hold_out, **held_report}
    return out, held


def cell_accuracy(scenario: str, workload: str, seed: int) -> list[dict[str, Any]]:
    spec = SPECS[scenario]
    series = workload_series(workload, spec.models, spec.req_per_s, 300.0, resample="sampled", seed=seed)
    rows: list[dict[str, Any]] = []
    books = {f: build_book(spec.models, series, forecaster=f, horizon=H, quantile=LEVEL, use_cache=True)
             for f in ("peak:auto", "peak:learned")}
    rates = books["peak:auto"].rates
    g = test_origins(rates.shape[1])
    peak = target(rates, g)
    for i, s in enumerate(series):
        row: dict[str, Any] = {"scenario": scenario, "workload": workload, "series": s.name}
        for f, book in books.items():
            upper = book.uppers[LEVEL][i, g].max(axis=1)
            row[f] = {"pinball_0.9": pinball(peak[i], upper, LEVEL),
                      "coverage_0.9": float(np.mean(peak[i] <= upper))}
        rows.append(row)
    log(f"accuracy {scenario}/{workload}: {len(rows)} series")
    return rows


def held_out_accuracy(net: Any, source: str, seed: int) -> list[dict[str, Any]]:
    """The held-out source's series (fleet20's groups of it, every half) through the network that
    never saw them, beside ``peak:auto``'s book figures."""
    spec = SPECS["fleet20"]
    out = []
    for workload in WORKLOADS:
        series = workload_series(workload, spec.models, spec.req_per_s, 300.0, resample="sampled", seed=seed)
        book = build_book(spec.models, series, forecaster="peak:auto", horizon=H, quantile=LEVEL,
                          use_cache=True)
        for i, s in enumerate(series):
            if not s.name.startswith(source):
                continue
            y = np.asarray(s.requests_per_s, dtype=float)
            warm = WARMUP_DAYS * DAY
            f = PeakLearned(DAY, H, net=net).fit(y[:warm])
            upper = np.full(len(y), np.nan)
            for t in range(warm, len(y)):
                upper[t] = f.forecast(H).quantile(LEVEL).max()
                f.update(y[t])
            g = test_origins(len(y))
            peak = target(y, g)
            auto = book.uppers[LEVEL][i, g].max(axis=1)
            out.append({"workload": workload, "series": s.name,
                        "peak:learned": {"pinball_0.9": pinball(peak, upper[g], LEVEL),
                                         "coverage_0.9": float(np.mean(peak <= upper[g]))},
                        "peak:auto": {"pinball_0.9": pinball(peak, auto, LEVEL),
                                      "coverage_0.9": float(np.mean(peak <= auto))}})
    log(f"held-out {source}: {len(out)} series")
    return out


def summary(all_rows: list[dict[str, Any]]) -> dict[str, Any]:
    # a series without demand on the test days scores 0 for both: no ratio to take
    rows = [r for r in all_rows if r["peak:auto"]["pinball_0.9"] > 0]
    ratio = paired_ratio([r["peak:learned"]["pinball_0.9"] for r in rows],
                         [r["peak:auto"]["pinball_0.9"] for r in rows])
    per = np.array([r["peak:learned"]["pinball_0.9"] / r["peak:auto"]["pinball_0.9"] for r in rows])
    cover = {f: [r[f]["coverage_0.9"] for r in rows] for f in ("peak:learned", "peak:auto")}
    return {"series": len(rows), "silent_series": len(all_rows) - len(rows),
            "pinball_ratio_learned_over_auto": ratio,
            "series_where_learned_is_better": int((per < 1).sum()),
            "coverage_0.9": {f: {"min": float(np.min(c)), "median": float(np.median(c)),
                                 "max": float(np.max(c)),
                                 "within_0.88_0.92": int(sum(0.88 <= v <= 0.92 for v in c))}
                             for f, c in cover.items()}}


def part_accuracy(seed: int, held: Any, source: str, workers: int) -> dict[str, Any]:
    jobs = [(s, w, seed) for s in SCENARIOS for w in WORKLOADS]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        rows = [r for part in pool.map(cell_accuracy, *zip(*jobs, strict=True)) for r in part]
    by_cell = {f"{s}/{w}": summary([r for r in rows if r["scenario"] == s and r["workload"] == w])
               for s in SCENARIOS for w in WORKLOADS}
    out: dict[str, Any] = {"test_days": list(TEST), "seed": seed, "all": summary(rows), "by_cell": by_cell,
                           "rows": rows}
    if held is not None:
        hrows = held_out_accuracy(held, source, seed)
        out["held_out"] = {"source": source, **summary(hrows), "rows": hrows}
    return out


def loop_run(config: FleetConfig, rule: str, seed: int, days: list[int]) -> dict[str, Any]:
    from atoll.envs.fleet_env import FleetEnv
    from atoll.envs.vocabulary import parse_policy
    from atoll.training.evaluate import env_at_level, resolve_policy, seed_value
    from atoll.training.lever_oracle import step_costs

    env = FleetEnv(config)
    policy = resolve_policy(parse_policy(rule), len(env.models))
    costs, episode = step_costs(env_at_level(env, policy, {}), policy, days=days, seed=seed_value(seed),
                                lost_usd_per_mtok=2.0)
    t = episode.totals()
    return {"forecaster": config.forecaster, "rule": rule, "seed": seed, "effective_usd": float(costs.sum()),
            "cost_usd": t["cost_usd"], "slo_attainment": t["slo_attainment"],
            "time_limited_solves": t["time_limited_solves"]}


def part_loop(cell: str, rules: list[str], seeds: int, workers: int) -> dict[str, Any]:
    scenario, market, world, *half = cell.split("/")
    workload = f"servegen-{half[0]}" if half else "servegen"
    days = list(range(TEST[0], TEST[1] + 1))
    configs = {f: FleetConfig(scenario=scenario, availability=market, workload=workload, forecaster=f,
                              days=(TEST[0], TEST[1]), action_levels=(0.9,), **WORLDS[world])
               for f in ("peak:auto", "peak:learned")}
    for c in configs.values():  # the demand and forecast caches, once, before the workers read them
        from atoll.envs.fleet_env import FleetEnv

        FleetEnv(c)
    t0 = time.perf_counter()
    jobs = [(configs[f], r, k, days) for r in rules for f in configs for k in range(seeds)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        runs = list(pool.map(loop_run, *zip(*jobs, strict=True)))
    ratios = {}
    for r in rules:
        get = {f: sorted((x for x in runs if x["rule"] == r and x["forecaster"] == f),
                         key=lambda x: x["seed"]) for f in configs}
        ratios[r] = paired_ratio([x["effective_usd"] for x in get["peak:learned"]],
                                 [x["effective_usd"] for x in get["peak:auto"]])
    log(f"loop {cell}: {time.perf_counter() - t0:.0f} s")
    return {"cell": cell, "test_days": days, "seeds": seeds, "runs": runs,
            "effective_cost_ratio_learned_over_auto": ratios, "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="train,accuracy,loop")
    ap.add_argument("--hold-out", default="m-small")
    ap.add_argument("--ship", action="store_true", help="write the trained weights to the shipped file")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--loop-cell", default="core/spot/charged/bursty")
    ap.add_argument("--loop-rules", default="fixed:1@0.9,fixed:1@0.9+h0.85,fixed:1@0.9+h0.7")
    ap.add_argument("--loop-seeds", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/demand_model.json"))
    args = ap.parse_args()
    parts = args.parts.split(",")
    doc: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    doc["load_at_start"] = list(os.getloadavg())
    held = None
    if "train" in parts:
        doc["train"], held = part_train(args.hold_out, args.ship)
    if "accuracy" in parts:
        if held is None:
            held, _ = fit_net(FitSettings(hold_out=args.hold_out), note=log)
        doc["accuracy"] = part_accuracy(args.seed, held, args.hold_out, args.workers)
    if "loop" in parts:
        doc.setdefault("loop", {})[args.loop_cell] = part_loop(args.loop_cell, args.loop_rules.split(","),
                                                               args.loop_seeds, args.workers)
    doc["load_at_end"] = list(os.getloadavg())
    doc["settings"] = {k: str(v) for k, v in vars(args).items()}
    text = json.dumps(doc, indent=1, default=float)
    atomic_write_text(args.out, text + "\n")
    shown = {k: v for k, v in doc.items() if k != "accuracy"}
    if "accuracy" in doc:  # the per-series rows stay in the file
        shown["accuracy"] = {k: v for k, v in doc["accuracy"].items() if k != "rows"}
    print(json.dumps(shown, indent=1, default=float))


if __name__ == "__main__":
    main()
