"""Figures of the planning target, as one JSON document on stdout (progress on stderr).

Target: per service the peak of the demand over the env's 15-min look-ahead (3 steps),
``max(y[g .. g + 2])``, forecast at step g having seen steps < g — what a re-plan sizes for.

Parts (``--parts``, comma-separated; default all):

- ``core``: the core scenario's sampled ServeGen demand (3 demand seeds). Forecasters fitted on
  days 1-3 (the env's warm-up) and updated step by step (the env's causal pass, through
  ``build_book``, so the closed-loop part reuses the cached books). Per forecaster and day set —
  **validation days 4-10, test days 11-14** — pinball loss of the 0.9 quantile of the peak
  (relative to the level forecaster ``ets``, per model and seed, then averaged), 0.9 coverage, the point
  forecast's MAPE, the pass's wall time (or the cache read's); ``peak:auto``'s choices per
  model. The forecaster the closed loop runs is the one with the lowest validation pinball
  ratio (chosen on days 4-10 only).
- ``robustness``: the same target on the forecasting robustness suite's series
  (``benchmarks/forecast.py``: the seeded synthetic shapes, ServeGen m-large/m-mid/m-small and
  the six client groups; the 1-day short-history traces are left out, their 1-hour season has
  no 3-day warm-up) with ``ets``, the trivial candidates and ``peak:auto`` (the other
  candidates run inside ``peak:auto``; the level forecaster ``auto`` is left out, its SARIMAX and UC fits take
  minutes per series). Fit on days 1-3;
  validation days 4-6, test days 7-10 (synthetic, 10 days)
  or validation days 4-10, test days 11-14 (14 days).
- ``loop``: ``fixed:1`` at levels 0.8/0.9/0.95 per scenario/market cell (``--loop-cells``, e.g.
  core/spot,core/hedged,extended/spot,extended/hedged), test days ``--loop-days``, the same seeds,
  with ``ets`` and with ``--chosen``; ``oracle-rate`` and ``hindsight``. Per cell the frontier
  cost ratio (:func:`loop_summary`): the chosen forecaster's cost over ``ets``'s at the same SLO
  attainment, read in both directions inside the other curve's range. Rows go to
  ``--loop-out`` as they finish (``os.getloadavg()`` before and after each run recorded).

- ``speed``: CPU seconds (``time.process_time``, so a busy machine does not inflate them) of
  one uncached causal forecast pass on core (seed 0, 3 models, days 4-14) per forecaster
  (``--speed-forecasters``, default ets, peak:blend, peak:auto).

``--seeds`` and ``--jobs`` shrink or spread the run; the document records what ran.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

from atoll.envs.actions import ActionCodec  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.demand import WARMUP_DAYS, build_book, workload_series  # noqa: E402
from atoll.forecast.planning import PeakAuto, pinball  # noqa: E402
from atoll.forecast.registry import make_forecaster  # noqa: E402
from atoll.forecast.synthetic import SYNTHETIC, synthetic_series  # noqa: E402
from atoll.forecast.workloads import load_workload, n_model_scenario  # noqa: E402
from atoll.solvers.scenarios import SCENARIOS  # noqa: E402

DAY = 288
H = 3  # the env's default look-ahead: 15 min at 5-min steps
LEVEL = 0.9
# forecasters of the next steps' level, and of the peak over the look-ahead
LEVEL_FORECASTERS = ("ets", "auto")
PEAK_FORECASTERS = ("peak:persistence", "peak:ewma", "peak:naive", "peak:ets", "peak:llt", "peak:blend",
                    "peak:auto")
FORECASTERS = (*LEVEL_FORECASTERS, *PEAK_FORECASTERS)
ROBUST = ("ets", "peak:persistence", "peak:naive", "peak:auto")
SERVEGEN = ("m-large", "m-mid", "m-small")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def target(rates: np.ndarray, g: np.ndarray) -> np.ndarray:
    """[..., len(g)] the realized peak over the look-ahead from each origin."""
    return np.stack([rates[..., g + k] for k in range(H)]).max(axis=0)


def metrics(upper: np.ndarray, point: np.ndarray, peak: np.ndarray) -> dict[str, float]:
    """Pinball loss and coverage of the 0.9 quantile of the peak, MAPE of the point forecast of
    the peak (the mean path's maximum over the look-ahead)."""
    ok = peak > 0
    return {"pinball_0.9": pinball(peak, upper, LEVEL), "coverage_0.9": float(np.mean(peak <= upper)),
            "point_mape": float(np.mean(np.abs(point[ok] - peak[ok]) / peak[ok])),
            "mean_peak": float(np.mean(peak)), "origins": int(len(peak))}


def day_origins(first: int, last: int, steps: int) -> np.ndarray:
    g = np.arange((first - 1) * DAY, last * DAY)
    return g[g + H <= steps]


# ----- core: the env's books ------------------------------------------------------------------
def core_levels() -> tuple[float, ...]:
    c = FleetConfig(scenario="core")
    return ActionCodec.for_config(c.planning_quantile, c.action_levels).levels


def core_pass(args: tuple[int, str]) -> dict[str, Any]:
    seed, forecaster = args
    spec = SCENARIOS["core"]
    series = workload_series("servegen", spec.models, spec.req_per_s, 300.0, resample="sampled", seed=seed)
    t = time.perf_counter()
    book = build_book(spec.models, series, forecaster=forecaster, horizon=H, quantile=LEVEL,
                      levels=core_levels(), use_cache=True)
    seconds = time.perf_counter() - t
    steps = book.rates.shape[1]
    out: dict[str, Any] = {"seed": seed, "forecaster": forecaster, "pass_seconds_or_cache": seconds}
    for split, (a, b) in (("validation", (4, 10)), ("test", (11, 14))):
        g = day_origins(a, b, steps)
        peak = target(book.rates, g)
        out[split] = {m: metrics(book.uppers[LEVEL][i, g].max(axis=1), book.mean[i, g].max(axis=1),
                                 peak[i]) for i, m in enumerate(book.models)}
    if forecaster == "peak:auto":  # the choices, re-run causally (the book stores forecasts only)
        out["choices"] = {}
        for i, m in enumerate(book.models):
            f = make_forecaster("peak:auto", DAY, horizon=H)
            assert isinstance(f, PeakAuto)
            f.fit(book.rates[i, : WARMUP_DAYS * DAY])
            f.update(book.rates[i, WARMUP_DAYS * DAY:])
            # (day the choice took effect from, base)
            out["choices"][m] = [(int(s) // DAY + 1, n) for s, n in f.selections]
    log(f"core seed {seed} {forecaster}: {seconds:.1f} s")
    return out


def core_peak_pass(seed: int) -> list[dict[str, Any]]:
    """Rows as :func:`core_pass`'s for every forecaster of ``PEAK_FORECASTERS`` from one causal
    ``peak:auto`` pass per model: its candidates are the standalone ``peak:<base>`` forecasters,
    fitted on the same warm-up and updated with the same steps, so their forecasts are theirs
    (one pass instead of seven; ``pass_seconds_or_cache`` is that pass's time for all)."""
    spec = SCENARIOS["core"]
    series = workload_series("servegen", spec.models, spec.req_per_s, 300.0, resample="sampled", seed=seed)
    rates = np.stack([np.asarray(s.requests_per_s, dtype=float) for s in series])
    rates = rates[:, : (rates.shape[1] // DAY) * DAY]
    steps, warm = rates.shape[1], WARMUP_DAYS * DAY
    t = time.perf_counter()
    upper = {f: np.full(rates.shape, np.nan) for f in PEAK_FORECASTERS}
    point = {f: np.full(rates.shape, np.nan) for f in PEAK_FORECASTERS}
    choices: dict[str, list[tuple[int, str]]] = {}
    for i, m in enumerate(spec.models):
        auto = make_forecaster("peak:auto", DAY, horizon=H)
        assert isinstance(auto, PeakAuto)
        auto.fit(rates[i, :warm])
        if set(auto._live) != {f.split(":")[1] for f in PEAK_FORECASTERS if f != "peak:auto"}:
            raise RuntimeError(f"seed {seed} {m}: peak:auto fitted {sorted(auto._live)}, not every base")
        for g in range(warm, steps):
            for name, f in (*((f"peak:{b}", c) for b, c in auto._live.items()), ("peak:auto", auto)):
                fc = f.forecast(H)
                upper[name][i, g], point[name][i, g] = fc.quantile(LEVEL).max(), fc.mean.max()
            auto.update(rates[i, g])
        choices[m] = [(int(s) // DAY + 1, n) for s, n in auto.selections]
    seconds = time.perf_counter() - t
    rows = []
    for f in PEAK_FORECASTERS:
        out: dict[str, Any] = {"seed": seed, "forecaster": f, "pass_seconds_or_cache": seconds,
                               "pass": "one peak:auto pass (its candidates)"}
        for split, (a, b) in (("validation", (4, 10)), ("test", (11, 14))):
            g = day_origins(a, b, steps)
            peak = target(rates, g)
            out[split] = {m: metrics(upper[f][i, g], point[f][i, g], peak[i])
                          for i, m in enumerate(spec.models)}
        if f == "peak:auto":
            out["choices"] = choices
        rows.append(out)
    log(f"core seed {seed} peak:*: {seconds:.1f} s")
    return rows


# ----- robustness suite -----------------------------------------------------------------------
def suite() -> list[tuple[str, str, np.ndarray]]:
    out = [(name, "synthetic", synthetic_series(name, days=10, seed=0)) for name in SYNTHETIC]
    out += [(m, "servegen", load_workload(f"servegen:{m}").requests_per_s) for m in SERVEGEN]
    out += [(s.name, "client-group", s.requests_per_s) for s in n_model_scenario(6)]
    return out


def series_pass(args: tuple[str, str, np.ndarray, str]) -> dict[str, Any]:
    name, kind, y, forecaster = args
    y = np.asarray(y, dtype=float)
    days = len(y) // DAY
    y = y[: days * DAY]
    warm = WARMUP_DAYS * DAY
    t = time.perf_counter()
    f = make_forecaster(forecaster, DAY, horizon=H).fit(y[:warm])
    upper = np.full(len(y), np.nan)
    point = np.full(len(y), np.nan)
    for g in range(warm, len(y)):
        fc = f.forecast(H)
        upper[g], point[g] = fc.quantile(LEVEL).max(), fc.mean.max()
        f.update(y[g])
    out: dict[str, Any] = {"series": name, "kind": kind, "forecaster": forecaster,
                           "seconds": time.perf_counter() - t}
    val_last = 6 if days <= 10 else 10
    for split, (a, b) in (("validation", (4, val_last)), ("test", (val_last + 1, days))):
        g = day_origins(a, b, len(y))
        out[split] = metrics(upper[g], point[g], target(y, g))
    if isinstance(f, PeakAuto):
        out["selections"] = [(int(s) // DAY + 1, n) for s, n in f.selections]
    log(f"robustness {name} {forecaster}: {out['seconds']:.1f} s, "
        f"test pinball {out['test']['pinball_0.9']:.4g}")
    return out


# ----- closed loop ----------------------------------------------------------------------------
LoopJob = tuple[int, str, str, float, tuple[int, ...], str, str]  # seed, forecaster, policy, level, days,
# scenario, market


def loop_run(args: LoopJob) -> dict[str, Any]:
    from atoll.envs.fleet_env import FleetEnv
    from atoll.envs.policies import make_policy
    from atoll.envs.rollout import run_policy
    from atoll.envs.vocabulary import parse_policy

    seed, forecaster, policy, level, days, scenario, market = args
    config = FleetConfig(scenario=scenario, availability=market, days=(min(days), max(days)),
                         demand_seed=seed, forecaster=forecaster)
    load_before = os.getloadavg()[0]
    t = time.perf_counter()
    env = FleetEnv(dataclasses.replace(config, planning_quantile=level))
    rule = make_policy(parse_policy(policy), len(env.models))
    totals = run_policy(env, rule, days=list(days), seed=seed).totals()
    row = {"scenario": scenario, "market": market, "days": list(days), "seed": seed, "forecaster": forecaster,
           "policy": policy, "level": level, "cost_usd": float(totals["cost_usd"]),
           "slo_attainment": float(totals["slo_attainment"]), "seconds": time.perf_counter() - t,
           "load_1min": [load_before, os.getloadavg()[0]]}
    log(f"loop {row}")
    return row


def speed_pass(forecaster: str) -> dict[str, Any]:
    from atoll.envs.demand import _forecast_pass

    spec = SCENARIOS["core"]
    series = workload_series("servegen", spec.models, spec.req_per_s, 300.0, resample="sampled", seed=0)
    rates = np.stack([np.asarray(s.requests_per_s[: 14 * DAY], dtype=float) for s in series])
    t = time.process_time()
    _forecast_pass(rates, DAY, forecaster, H, core_levels(), None)
    row = {"forecaster": forecaster, "cpu_seconds": time.process_time() - t}
    log(f"speed {row}")
    return row


def matched_cost(curve: list[tuple[float, float]], slo: float) -> float | None:
    """Cost at ``slo`` by linear interpolation on a (slo, cost) curve; None outside its range."""
    pts = sorted(curve)
    for (s0, c0), (s1, c1) in zip(pts, pts[1:], strict=False):
        if s0 <= slo <= s1:
            return c0 if s1 == s0 else c0 + (c1 - c0) * (slo - s0) / (s1 - s0)
    return None


def mean_ratio(rows: list[dict[str, Any]], split: str, base: dict[tuple[int, str], float]) -> float:
    """Mean over (seed, model) of pinball / ets's pinball."""
    ratios = [r[split][m]["pinball_0.9"] / base[(r["seed"], m)] for r in rows for m in r[split]]
    return float(np.mean(ratios))


LOOP_LEVELS = (0.8, 0.9, 0.95)


def loop_summary(rows: list[dict[str, Any]], chosen: str) -> dict[str, Any]:
    """Per cell (scenario, market, days): each forecaster's ``fixed:1`` curve over the planning
    levels (means over the seeds on which *both* forecasters ran that level, so the two curves
    are over the same demand), the frontier cost ratio and the references.

    - ``matched_slo``: at each of ``ets``'s points, the chosen forecaster's cost interpolated (in
      SLO attainment, between its levels) at ``ets``'s SLO attainment, over ``ets``'s cost; None
      where that SLO lies outside the chosen forecaster's curve.
    - ``at_new_points``: at each of the chosen forecaster's points, its cost over ``ets``'s
      frontier cost at its SLO attainment (:func:`atoll.training.frontier.frontier_cost_at`;
      ``position`` says whether the point lay inside ``ets``'s range or above / below it).
    - ``frontier_cost_ratio``: the mean of every reading inside the other curve's range, both
      directions (the ``matched_slo`` ratios that exist and the ``at_new_points`` ones
      ``inside``); None where the curves do not overlap in SLO attainment.
    - ``references``: ``oracle-rate`` and ``hindsight`` at 0.9 over ``ets``'s frontier cost at
      their SLO attainment (same seeds as the ratio where they ran)."""
    from atoll.training.frontier import Point, frontier_cost_at, select_frontier

    rows = [{"scenario": "core", "market": "spot", "days": [11, 12, 13, 14], **r} for r in rows]
    cells: dict[str, Any] = {}
    for key in sorted({(r["scenario"], r["market"], tuple(r["days"])) for r in rows}):
        scenario, market, days = key
        mine = [r for r in rows if (r["scenario"], r["market"], tuple(r["days"])) == key]

        def runs(f: str, p: str, q: float, rows_: list[dict[str, Any]] = mine) -> dict[int, dict[str, Any]]:
            return {int(r["seed"]): r for r in rows_ if r["forecaster"] == f and r["policy"] == p
                    and r["level"] == q}

        # the seeds both forecasters ran (at some level); a level enters a curve when it ran on
        # every one of them, so both curves are means over the same demand
        ran = {f: {int(r["seed"]) for r in mine if r["forecaster"] == f and r["policy"] == "fixed:1"}
               for f in ("ets", chosen)}
        common = sorted(ran["ets"] & ran[chosen])
        curves: dict[str, dict[str, Any]] = {"ets": {}, chosen: {}}
        for q in LOOP_LEVELS:
            for f in ("ets", chosen):
                rs = runs(f, "fixed:1", q)
                if common and all(s in rs for s in common):
                    curves[f][f"{q:g}"] = {
                        "slo_attainment": float(np.mean([rs[s]["slo_attainment"] for s in common])),
                        "cost_usd": float(np.mean([rs[s]["cost_usd"] for s in common])), "seeds": common}
        seeds_used = sorted({s for c in curves["ets"].values() for s in c["seeds"]})
        matched: dict[str, Any] = {}
        new_curve = [(v["slo_attainment"], v["cost_usd"]) for v in curves[chosen].values()]
        for q, c in curves["ets"].items():
            new = matched_cost(new_curve, c["slo_attainment"])
            matched[q] = {"ets_slo": c["slo_attainment"], "ets_cost": c["cost_usd"],
                          "chosen_cost_at_that_slo": new,
                          "ratio": None if new is None else new / c["cost_usd"]}
        line = select_frontier([Point(f"ets@{q}", c["cost_usd"], c["slo_attainment"])
                                for q, c in curves["ets"].items()]) if curves["ets"] else []
        at_new: dict[str, Any] = {}
        for q, c in curves[chosen].items():
            reading = frontier_cost_at(line, c["slo_attainment"])
            at_new[q] = {"ratio": c["cost_usd"] / reading.cost_usd, "position": reading.position}
        ratios = [m["ratio"] for m in matched.values() if m["ratio"] is not None]
        ratios += [v["ratio"] for v in at_new.values() if v["position"] == "inside"]
        refs: dict[str, Any] = {}
        for p in ("oracle-rate", "hindsight"):
            rs = runs("ets", p, LEVEL)
            use = [s for s in seeds_used if s in rs] or sorted(rs)
            if not use or not line:
                continue
            slo = float(np.mean([rs[s]["slo_attainment"] for s in use]))
            cost = float(np.mean([rs[s]["cost_usd"] for s in use]))
            reading = frontier_cost_at(line, slo)
            refs[p] = {"slo_attainment": slo, "cost_usd": cost, "seeds": use,
                       "ratio_to_ets_frontier": cost / reading.cost_usd, "position": reading.position}
        cells[f"{scenario}/{market}/days {days[0]}-{days[-1]}"] = {
            "scenario": scenario, "market": market, "days": list(days), "chosen": chosen, "seeds": seeds_used,
            "curves": curves, "matched_slo": matched, "at_new_points": at_new,
            "frontier_cost_ratio": float(np.mean(ratios)) if ratios else None, "references": refs}
    return {"cells": cells, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default="core,robustness,loop,speed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--loop-days", type=lambda t: tuple(map(int, t.split("-"))), default=(11, 14),
                        help="test days of the closed loop, FIRST-LAST (default 11-14)")
    parser.add_argument("--loop-runs", default="",
                        help="only these closed-loop runs: SEED/FORECASTER/POLICY/LEVEL, comma-separated")
    parser.add_argument("--loop-cells", default="core/spot",
                        help="SCENARIO/MARKET cells of the closed loop, comma-separated "
                             "(e.g. core/spot,core/hedged,extended/spot,extended/hedged)")
    parser.add_argument("--loop-out", type=Path,
                        help="append every closed-loop row to this file as it finishes (one JSON object a "
                             "line; --loop-rows reads it back), so a cut-short run keeps what ran")
    parser.add_argument("--loop-rows", nargs="*", type=Path,
                        help="files of earlier closed-loop rows (one JSON object a line) to summarize with")
    parser.add_argument("--speed-forecasters", default="ets,peak:blend,peak:auto")
    parser.add_argument("--carry", type=Path,
                        help="an earlier document whose core figures of the level forecasters not re-run "
                             "(--core-today) are carried over, marked as such")
    parser.add_argument("--core-today", default="ets,auto",
                        help="the level forecasters the core part runs (ets, the reference, must be one)")
    parser.add_argument("--chosen", default="peak:auto",
                        help="the loop's forecaster beside ets when the core part (which picks it) is off")
    args = parser.parse_args()
    parts = args.parts.split(",")
    seeds = list(range(args.seeds))
    doc: dict[str, Any] = {"target": f"peak over {H} steps (15 min), level {LEVEL}",
                           "split": "fit days 1-3; select on validation days; report test days",
                           "seeds": seeds}
    started = time.perf_counter()
    chosen = args.chosen
    with ProcessPoolExecutor(args.jobs) as pool:
        if "core" in parts:
            level = [f for f in args.core_today.split(",") if f]
            rows = list(pool.map(core_pass, [(s, f) for s in seeds for f in level]))
            rows += [r for rs in pool.map(core_peak_pass, seeds) for r in rs]
            base = {(r["seed"], m): {sp: r[sp][m]["pinball_0.9"] for sp in ("validation", "test")}
                    for r in rows if r["forecaster"] == "ets" for m in r["validation"]}
            core_base = base
            summary: dict[str, Any] = {}
            for f in (*level, *PEAK_FORECASTERS):
                mine = [r for r in rows if r["forecaster"] == f]
                summary[f] = {}
                for sp in ("validation", "test"):
                    b = {k: v[sp] for k, v in base.items()}
                    cov = [r[sp][m]["coverage_0.9"] for r in mine for m in r[sp]]
                    summary[f][sp] = {
                        "pinball_vs_ets": mean_ratio(mine, sp, b),
                        "coverage_0.9": float(np.mean(cov)), "coverage_0.9_min": float(np.min(cov)),
                        "coverage_0.9_max": float(np.max(cov)),
                        "point_mape": float(np.mean([r[sp][m]["point_mape"] for r in mine for m in r[sp]])),
                    }
                summary[f]["pass_seconds_max"] = float(max(r["pass_seconds_or_cache"] for r in mine))
            chosen = min(PEAK_FORECASTERS, key=lambda f: summary[f]["validation"]["pinball_vs_ets"])
            if args.carry:  # level forecasters not re-run (their code unchanged): the earlier figures
                earlier = json.loads(args.carry.read_text())["core"]["summary"]
                for f in LEVEL_FORECASTERS:
                    if f not in summary and f in earlier:
                        summary[f] = {**earlier[f], "carried_from": str(args.carry)}
            doc["core"] = {"summary": summary, "chosen_on_validation": chosen, "rows": rows}
            log(f"core: chosen on validation days 4-10: {chosen}; "
                + "; ".join(f"{f} val {s['validation']['pinball_vs_ets']:.3f} "
                            f"test {s['test']['pinball_vs_ets']:.3f} cov {s['test']['coverage_0.9']:.3f}"
                            for f, s in summary.items()))
        if "robustness" in parts:
            jobs = [(n, k, y, f) for n, k, y in suite() for f in ROBUST]
            rows = list(pool.map(series_pass, jobs))
            table: dict[str, Any] = {}
            for n, _, _ in suite():
                mine = {r["forecaster"]: r for r in rows if r["series"] == n}
                trivial = min(mine[f]["test"]["pinball_0.9"] for f in ("peak:persistence", "peak:naive"))
                table[n] = {f: {"kind": r["kind"],
                                **{f"{sp}_pinball_vs_ets":
                                   r[sp]["pinball_0.9"] / mine["ets"][sp]["pinball_0.9"]
                                   for sp in ("validation", "test")},
                                "test_pinball_vs_best_trivial": r["test"]["pinball_0.9"] / trivial,
                                "test_coverage_0.9": r["test"]["coverage_0.9"],
                                "seconds": r["seconds"],
                                **({"selections": r["selections"]} if "selections" in r else {})}
                            for f, r in mine.items()}
            doc["robustness"] = table
            if "core" in doc:
                # The env default: of the peak forecasters both parts ran, the lowest validation
                # pinball ratio to ets over every validation series (core's 9 and the suite's),
                # each series counted once — a default must hold on traces beyond core.
                both = [f for f in ROBUST if f in PEAK_FORECASTERS]
                per_series = {
                    f: [r["validation"][m]["pinball_0.9"] / core_base[(r["seed"], m)]["validation"]
                        for r in doc["core"]["rows"] if r["forecaster"] == f for m in r["validation"]]
                    + [t[f]["validation_pinball_vs_ets"] for t in table.values()] for f in both}
                means = {f: float(np.mean(v)) for f, v in per_series.items()}
                doc["default_chosen_on_validation"] = {
                    "chosen": min(means, key=means.__getitem__), "mean_validation_pinball_vs_ets": means,
                    "series": {f: len(v) for f, v in per_series.items()}}
                log(f"default chosen on validation: {doc['default_chosen_on_validation']}")
            log("robustness: " + "; ".join(
                f"{n} auto {t['peak:auto']['test_pinball_vs_ets']:.2f}xets "
                f"{t['peak:auto']['test_pinball_vs_best_trivial']:.2f}xtriv "
                f"cov {t['peak:auto']['test_coverage_0.9']:.2f}"
                for n, t in table.items()))
        if "loop" in parts:
            days = tuple(range(args.loop_days[0], args.loop_days[1] + 1))
            cells = sorted((tuple(c.split("/")) for c in args.loop_cells.split(",") if c),
                           key=lambda c: c[0] != "extended")
            jobs: list[LoopJob] = []
            # Seed-major, then cell (extended first: the longest runs start early), so a run cut
            # short has whole seeds of every cell; the references after the curves of a seed.
            for s in seeds:
                for sc, mk in cells:
                    if args.loop_runs:  # SEED/FORECASTER/POLICY/LEVEL,...: only these
                        continue
                    jobs += [(s, f, "fixed:1", q, days, sc, mk) for q in (0.9, 0.8, 0.95)
                             for f in ("ets", chosen)]
                    jobs += [(s, "ets", p, LEVEL, days, sc, mk) for p in ("oracle-rate", "hindsight")]
            if args.loop_runs:
                jobs = [(int(a), f, p, float(q), days, sc, mk) for sc, mk in cells
                        for a, f, p, q in (r.split("/") for r in args.loop_runs.split(","))]
            rows: list[dict[str, Any]] = []
            futures = [pool.submit(loop_run, j) for j in jobs]
            for fut in as_completed(futures):
                rows.append(fut.result())
                if args.loop_out:
                    with args.loop_out.open("a") as fh:
                        fh.write(json.dumps(rows[-1]) + "\n")
            for path in args.loop_rows or ():  # rows of earlier runs (one JSON object a line)
                rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            doc["frontier"] = loop_summary(rows, chosen)
            log("frontier: " + "; ".join(f"{k} {v['frontier_cost_ratio']}"
                                         for k, v in doc["frontier"]["cells"].items()))
        if "speed" in parts:
            doc["speed"] = list(pool.map(speed_pass, args.speed_forecasters.split(",")))
    doc["wall_seconds"] = time.perf_counter() - started
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
