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
  and the paired ratio learned / auto per rule with a 95% interval; with several rules, the
  frontier at matched SLO (learned's rule line read at each auto rule's SLO, seed by seed). Each
  finished run is a file under ``--run-dir`` (resumed from; refused if another solver version,
  other weights or other settings made it).
- ``choose``: each forecaster's own rule, chosen on validation days 8-10 (``--validation-seeds``)
  among ``--choose-grid`` (planning levels x headroom), then both chosen rules with both
  forecasters on the test days (``--loop-seeds``): learned at its rule over auto at its rule.
- ``tail``: per series, pinball, coverage, shortfall and spare (shares of the mean peak) at the
  levels 0.9, 0.95 and 0.99, on the test days and on the validation days.
- ``frontier``: the matched-SLO ratios again from every stored ``loop`` cell's runs (nothing run).

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
from atoll.forecast.learned import SHIPPED, PeakLearned, shipped_digest  # noqa: E402
from atoll.forecast.learned_fit import SCENARIOS, WORKLOADS, FitSettings, fit_net  # noqa: E402
from atoll.forecast.planning import pinball  # noqa: E402
from atoll.solvers.files import atomic_write_text  # noqa: E402
from atoll.solvers.scenarios import SCENARIOS as SPECS  # noqa: E402
from atoll.training.lever_oracle import paired_ratio  # noqa: E402

H, LEVEL, TEST, VALIDATION = 3, 0.9, (11, 14), (8, 10)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def target(rates: np.ndarray, g: np.ndarray) -> np.ndarray:
    return np.stack([rates[..., g + k] for k in range(H)]).max(axis=0)


def test_origins(steps: int, days: tuple[int, int] = TEST) -> np.ndarray:
    g = np.arange((days[0] - 1) * DAY, days[1] * DAY)
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


TAIL_LEVELS = (0.9, 0.95, 0.99)


def cell_tail(scenario: str, workload: str, seed: int, days: tuple[int, int] = TEST) -> list[dict[str, Any]]:
    """Per series on ``days`` (the test days by default), each forecaster's look-ahead-peak
    quantile at every level of ``TAIL_LEVELS`` (the env's causal pass, conformal layer included):
    pinball, coverage, and
    the shortfall and spare as shares of the mean peak. The effective cost prices a lost token
    far above a spare one's share of a node, so the tail is where a forecast earns its keep."""
    spec = SPECS[scenario]
    series = workload_series(workload, spec.models, spec.req_per_s, 300.0, resample="sampled", seed=seed)
    books = {f: build_book(spec.models, series, forecaster=f, horizon=H, quantile=LEVEL,
                           levels=TAIL_LEVELS, use_cache=True) for f in ("peak:auto", "peak:learned")}
    rates = books["peak:auto"].rates
    g = test_origins(rates.shape[1], days)
    peak = target(rates, g)
    rows: list[dict[str, Any]] = []
    for i, s in enumerate(series):
        scale = float(peak[i].mean())
        if scale <= 0:
            continue
        row: dict[str, Any] = {"scenario": scenario, "workload": workload, "series": s.name}
        for f, book in books.items():
            row[f] = {}
            for q in TAIL_LEVELS:
                upper = book.uppers[q][i, g].max(axis=1)
                row[f][str(q)] = {"pinball": pinball(peak[i], upper, q),
                                  "coverage": float(np.mean(peak[i] <= upper)),
                                  "shortfall": float(np.maximum(peak[i] - upper, 0).mean() / scale),
                                  "spare": float(np.maximum(upper - peak[i], 0).mean() / scale)}
        rows.append(row)
    log(f"tail {scenario}/{workload}: {len(rows)} series")
    return rows


def part_tail(seed: int, workers: int, days: tuple[int, int] = TEST) -> dict[str, Any]:
    """:func:`cell_tail` over every scenario and half; per level and scope, learned / auto as the
    mean of per-series ratios with a 95% interval (pinball, shortfall, spare)."""
    jobs = [(s, w, seed, days) for s in SCENARIOS for w in WORKLOADS]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        rows = [r for part in pool.map(cell_tail, *zip(*jobs, strict=True)) for r in part]
    out: dict[str, Any] = {"days": list(days), "seed": seed, "levels": list(TAIL_LEVELS), "rows": rows}
    scopes = {"all": rows, **{s: [r for r in rows if r["scenario"] == s] for s in SCENARIOS},
              "bursty": [r for r in rows if r["workload"] == "servegen-bursty"]}
    for name, part in scopes.items():
        out[name] = {}
        for q in map(str, TAIL_LEVELS):
            out[name][q] = {}
            for m in ("pinball", "shortfall", "spare"):
                kept = [r for r in part if r["peak:auto"][q][m] > 0]
                out[name][q][m] = (paired_ratio([r["peak:learned"][q][m] for r in kept],
                                                [r["peak:auto"][q][m] for r in kept]) if kept else None)
            out[name][q]["coverage_median"] = {f: float(np.median([r[f][q]["coverage"] for r in part]))
                                               for f in ("peak:learned", "peak:auto")}
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


def matched_slo(runs: list[dict[str, Any]], rules: list[str]) -> dict[str, Any] | None:
    """``peak:learned``'s rule frontier (node $ against SLO attainment, piecewise-linear between its
    rules' points) read at each of ``peak:auto``'s rule points, seed by seed: node $ of learned at
    auto's SLO / auto's node $, paired over the seeds whose auto SLO lies inside learned's line
    (outside it the line is clamped, which flatters one side; those seeds are counted, not used).
    None for one rule: a line needs two points."""
    from atoll.training.frontier import Point, frontier_cost_at

    if len(rules) < 2:
        return None
    seeds = sorted({x["seed"] for x in runs})
    out: dict[str, Any] = {}
    for r in rules:
        num, den, outside = [], [], 0
        for k in seeds:
            line = [Point(x["rule"], x["cost_usd"], x["slo_attainment"]) for x in runs
                    if x["seed"] == k and x["forecaster"] == "peak:learned"]
            auto = next(x for x in runs
                        if x["seed"] == k and x["forecaster"] == "peak:auto" and x["rule"] == r)
            reading = frontier_cost_at(line, auto["slo_attainment"])
            if reading.position != "inside":
                outside += 1
                continue
            num.append(reading.cost_usd)
            den.append(auto["cost_usd"])
        out[r] = {**(paired_ratio(num, den) if num else {"seeds": 0}), "seeds_outside": outside}
    return out


def cell_configs(cell: str, levels: tuple[float, ...], days: tuple[int, int]) -> dict[str, FleetConfig]:
    """Both forecasters' configs of a cell (scenario/market/world[/half]). A replica per phase, as
    the room's and the risk contest's cells were measured, so the rules' rows are theirs (pd auto
    is the default since)."""
    scenario, market, world, *half = cell.split("/")
    workload = f"servegen-{half[0]}" if half else "servegen"
    return {f: FleetConfig(scenario=scenario, availability=market, workload=workload, forecaster=f, days=days,
                           action_levels=levels, pd="disaggregated", **WORLDS[world])
            for f in ("peak:auto", "peak:learned")}


def open_folder(run_dir: Path | None, name: str, params: dict[str, str], command: str) -> Path | None:
    """The runs/ folder of a cell's run folder (in git): a stopped benchmark resumes from it, and
    a folder made by another solver version, other weights or other settings is refused."""
    from atoll.solvers.allocation.direct import SOLVER_VERSION
    from atoll.training.run_folder import RunFolder

    if run_dir is None:
        return None
    params = {**params, "solver_version": str(SOLVER_VERSION), "pd": "disaggregated",
              "weights": shipped_digest()}
    folder = RunFolder.open(run_dir / name, params, name, command=command).path / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def run_jobs(folder: Path | None, jobs: list[tuple[str, FleetConfig, str, int, list[int]]], workers: int,
             label: str) -> list[dict[str, Any]]:
    """Each job (file prefix, config, rule, seed, days) read from ``folder`` if it ran before, else
    run (on ``workers`` processes) and written there as it finishes."""
    from concurrent.futures import as_completed

    from atoll.envs.fleet_env import FleetEnv

    def run_file(prefix: str, f: str, r: str, k: int) -> Path | None:
        name = f"{prefix}{f.replace(':', '_')}--{r.replace(':', '_')}--{k}.json"
        return None if folder is None else folder / name

    runs: list[dict[str, Any]] = []
    todo = []
    for prefix, config, r, k, days in jobs:
        done = run_file(prefix, config.forecaster, r, k)
        if done is not None and done.exists():
            runs.append(json.loads(done.read_text()))
        else:
            todo.append((prefix, config, r, k, days))
    log(f"{label}: {len(runs)} runs read from {folder}, {len(todo)} to run")
    for c in {job[1] for job in todo}:  # the demand and forecast caches, once, before the workers read them
        FleetEnv(c)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(loop_run, c, r, k, days): prefix for prefix, c, r, k, days in todo}
        for i, fut in enumerate(as_completed(futures)):
            run = fut.result()
            runs.append(run)
            out = run_file(futures[fut], run["forecaster"], run["rule"], run["seed"])
            if out is not None:
                atomic_write_text(out, json.dumps(run, indent=1) + "\n")
            log(f"{label}: {i + 1}/{len(todo)} {run['forecaster']} {run['rule']} seed {run['seed']}: "
                f"${run['effective_usd']:,.0f} ({time.perf_counter() - t0:.0f} s)")
    return runs


def values_of(runs: list[dict[str, Any]], forecaster: str, rule: str,
              key: str = "effective_usd") -> list[float]:
    """``key`` (effective $ by default) of one forecaster's rule, in seed order."""
    return [x[key] for x in sorted(runs, key=lambda x: x["seed"])
            if x["forecaster"] == forecaster and x["rule"] == rule]


def learned_over_auto(runs: list[dict[str, Any]], rules: list[str]) -> dict[str, Any]:
    """Per rule, learned / auto effective cost paired by seed."""
    return {r: paired_ratio(values_of(runs, "peak:learned", r), values_of(runs, "peak:auto", r))
            for r in rules}


def part_loop(cell: str, rules: list[str], seeds: int, workers: int, run_dir: Path | None) -> dict[str, Any]:
    days = list(range(TEST[0], TEST[1] + 1))
    configs = cell_configs(cell, (0.9,), TEST)
    folder = open_folder(run_dir, cell.replace("/", "-"), {"cell": cell, "test_days": str(days)},
                         "benchmarks/demand_model.py --parts loop")
    t0 = time.perf_counter()
    # seed by seed, both forecasters together: a stopped run leaves whole pairs
    jobs = [("", configs[f], r, k, days) for r in rules for k in range(seeds) for f in configs]
    runs = run_jobs(folder, jobs, workers, f"loop {cell}")
    log(f"loop {cell}: {time.perf_counter() - t0:.0f} s")
    return {"cell": cell, "test_days": days, "seeds": seeds, "pd": "disaggregated", "runs": runs,
            "effective_cost_ratio_learned_over_auto": learned_over_auto(runs, rules),
            "node_cost_ratio_at_matched_slo": matched_slo(runs, rules),
            "seconds": round(time.perf_counter() - t0, 1)}


def level_of(rule: str) -> float:
    from atoll.envs.vocabulary import parse_policy

    level = parse_policy(rule).level
    if level is None:
        raise SystemExit(f"demand_model: rule {rule!r} names no planning level (write it as fixed:1@0.9...)")
    return float(level)


def part_choose(cell: str, grid: list[str], seeds: int, validation_seeds: int, workers: int,
                run_dir: Path | None) -> dict[str, Any]:
    """Each forecaster's own rule, chosen on validation days 8-10 (``validation_seeds`` seeds, least
    mean effective cost over ``grid``: planning levels and headrooms), then both chosen rules with
    both forecasters on the test days, ``seeds`` paired seeds. Learned with its rule against auto
    with its rule is the issue's comparison: each forecaster at the rule that suits it."""
    vdays, tdays = list(range(VALIDATION[0], VALIDATION[1] + 1)), list(range(TEST[0], TEST[1] + 1))
    levels = tuple(sorted({level_of(r) for r in grid}))
    configs = cell_configs(cell, levels, (VALIDATION[0], TEST[1]))
    folder = open_folder(run_dir, cell.replace("/", "-") + "-choose",
                         {"cell": cell, "grid": ";".join(grid), "validation_days": str(vdays),
                          "validation_seeds": str(validation_seeds), "test_days": str(tdays)},
                         "benchmarks/demand_model.py --parts choose")
    t0 = time.perf_counter()
    vruns = run_jobs(folder, [("validation--", configs[f], r, k, vdays) for r in grid for f in configs
                              for k in range(validation_seeds)], workers, f"choose {cell} validation")
    mean = {(f, r): float(np.mean(values_of(vruns, f, r))) for f in configs for r in grid}
    chosen = {f: min((mean[(f, r)], i, r) for i, r in enumerate(grid))[2] for f in configs}
    log(f"choose {cell}: chosen on days {vdays}: {chosen}")
    rules = list(dict.fromkeys(chosen.values()))
    jobs = [("", configs[f], r, k, tdays) for r in rules for f in configs for k in range(seeds)]
    truns = run_jobs(folder, jobs, workers, f"choose {cell} test")
    means = {f"{f} {r}": {m: float(np.mean(values_of(truns, f, r, m)))
                          for m in ("effective_usd", "cost_usd", "slo_attainment")}
             for f in configs for r in rules}
    return {"cell": cell, "grid": grid, "validation_days": vdays, "validation_seeds": validation_seeds,
            "validation_effective_usd": {f"{f} {r}": v for (f, r), v in mean.items()}, "chosen": chosen,
            "test_days": tdays, "seeds": seeds, "test_means": means,
            "learned_own_rule_over_auto_own_rule": paired_ratio(
                values_of(truns, "peak:learned", chosen["peak:learned"]),
                values_of(truns, "peak:auto", chosen["peak:auto"])),
            "effective_cost_ratio_learned_over_auto": learned_over_auto(truns, rules),
            "validation_runs": vruns, "runs": truns, "seconds": round(time.perf_counter() - t0, 1)}


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
    ap.add_argument("--choose-grid", default="fixed:1@0.9,fixed:1@0.95,fixed:1@0.99,fixed:1@0.9+h0.85,"
                    "fixed:1@0.95+h0.85,fixed:1@0.99+h0.85", help="the rules each forecaster chooses among")
    ap.add_argument("--validation-seeds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/demand_model.json"))
    ap.add_argument("--run-dir", type=Path, default=Path("benchmarks/runs/demand_model"),
                    help="each finished loop run as a file here (resumed from); '' for none")
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
    if "tail" in parts:  # the test days' figures, and the validation days' (where a level is chosen)
        doc["tail"] = part_tail(args.seed, args.workers)
        doc["tail_validation"] = part_tail(args.seed, args.workers, VALIDATION)
    if "frontier" in parts:  # the matched-SLO ratios again from every stored cell's runs, nothing run
        for c in doc.get("loop", {}).values():
            rules = list(dict.fromkeys(x["rule"] for x in c["runs"]))
            c["node_cost_ratio_at_matched_slo"] = matched_slo(c["runs"], rules)
    if "choose" in parts:
        doc.setdefault("choose", {})[args.loop_cell] = part_choose(
            args.loop_cell, args.choose_grid.split(","), args.loop_seeds, args.validation_seeds, args.workers,
            args.run_dir if str(args.run_dir) else None)
    if "loop" in parts:
        doc.setdefault("loop", {})[args.loop_cell] = part_loop(args.loop_cell, args.loop_rules.split(","),
                                                               args.loop_seeds, args.workers,
                                                               args.run_dir if str(args.run_dir) else None)
    doc["load_at_end"] = list(os.getloadavg())
    doc["settings"] = {k: str(v) for k, v in vars(args).items()}
    text = json.dumps(doc, indent=1, default=float)
    atomic_write_text(args.out, text + "\n")
    shown = {k: v for k, v in doc.items() if k != "accuracy"}
    for k in ("tail", "tail_validation"):
        if k in doc:
            shown[k] = {kk: v for kk, v in doc[k].items() if kk != "rows"}
    if "accuracy" in doc:  # the per-series rows stay in the file
        shown["accuracy"] = {k: v for k, v in doc["accuracy"].items() if k != "rows"}
    print(json.dumps(shown, indent=1, default=float))


if __name__ == "__main__":
    main()
