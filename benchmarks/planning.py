"""Figures of issue 24 (the planning target), as one JSON document on stdout (progress on stderr).

Target: per service the peak of the demand over the env's 15-min look-ahead (3 steps),
``max(y[g .. g + 2])``, forecast at step g having seen steps < g — what a re-plan sizes for.

Parts (``--parts``, comma-separated; default all):

- ``core``: the core scenario's sampled ServeGen demand (3 demand seeds). Forecasters fitted on
  days 1-3 (the env's warm-up) and updated step by step (the env's causal pass, through
  ``build_book``, so the closed-loop part reuses the cached books). Per forecaster and day set —
  **validation days 4-10, test days 11-14** — pinball loss of the 0.9 quantile of the peak
  (relative to today's ``ets``, per model and seed, then averaged), 0.9 coverage, the point
  forecast's MAPE, the pass's wall time (or the cache read's); ``peak:auto``'s choices per
  model. The forecaster the closed loop runs is the one with the lowest validation pinball
  ratio (chosen on days 4-10 only).
- ``robustness``: the same target on the forecasting robustness suite's series
  (``benchmarks/forecast.py``: the seeded synthetic shapes, ServeGen m-large/m-mid/m-small and
  the six client groups; the 1-day short-history traces are left out, their 1-hour season has
  no 3-day warm-up) with today's ``ets``, the trivial candidates and ``peak:auto`` (the other
  candidates run inside ``peak:auto``; today's ``auto`` is left out, its SARIMAX and UC fits take
  minutes per series). Fit on days 1-3;
  validation days 4-6, test days 7-10 (synthetic, 10 days)
  or validation days 4-10, test days 11-14 (14 days).
- ``loop``: ``fixed:1`` at levels 0.8/0.9/0.95 on core/spot, test days 11-14 (``--loop-days``),
  the same seeds,
  with today's ``ets`` and with the forecaster chosen above; ``oracle-rate`` and ``hindsight``.
  Cost at matched SLO: the chosen forecaster's cost interpolated (linearly in SLO attainment
  between its levels) at ``ets``'s SLO at each level.

- ``speed``: CPU seconds (``time.process_time``, so a busy machine does not inflate them) of
  one uncached causal forecast pass on core (seed 0, 3 models, days 4-14) per forecaster
  (``--speed-forecasters``, default ets, peak:blend, peak:auto).

``--seeds`` and ``--jobs`` shrink or spread the run; the document records what ran.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

from atoll.envs.actions import ActionCodec  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.demand import WARMUP_DAYS, build_book, workload_series  # noqa: E402
from atoll.forecast.forecasters import make_forecaster  # noqa: E402
from atoll.forecast.planning import PeakAuto, pinball  # noqa: E402
from atoll.forecast.synthetic import SYNTHETIC, synthetic_series  # noqa: E402
from atoll.forecast.workloads import load_workload, n_model_scenario  # noqa: E402
from atoll.solvers.scenarios import SCENARIOS  # noqa: E402

DAY = 288
H = 3  # the env's default look-ahead: 15 min at 5-min steps
LEVEL = 0.9
TODAY = ("ets", "auto")
NEW = ("peak:persistence", "peak:ewma", "peak:naive", "peak:ets", "peak:llt", "peak:blend", "peak:auto")
FORECASTERS = (*TODAY, *NEW)
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
def loop_run(args: tuple[int, str, str, float, tuple[int, ...]]) -> dict[str, Any]:
    from atoll.envs.fleet_env import FleetEnv
    from atoll.envs.policies import make_policy
    from atoll.envs.rollout import run_policy

    seed, forecaster, policy, level, days = args
    config = FleetConfig(scenario="core", availability="spot", days=(min(days), max(days)), demand_seed=seed,
                         forecaster=forecaster)
    env = FleetEnv(dataclasses.replace(config, planning_quantile=level))
    t = time.perf_counter()
    totals = run_policy(env, make_policy(policy, len(env.models)), days=list(days), seed=seed).totals()
    row = {"seed": seed, "forecaster": forecaster, "policy": policy, "level": level,
           "cost_usd": float(totals["cost_usd"]), "slo_attainment": float(totals["slo_attainment"]),
           "seconds": time.perf_counter() - t}
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
    """Mean over (seed, model) of pinball / today's ets pinball."""
    ratios = [r[split][m]["pinball_0.9"] / base[(r["seed"], m)] for r in rows for m in r[split]]
    return float(np.mean(ratios))


def loop_summary(rows: list[dict[str, Any]], chosen: str, days: tuple[int, ...]) -> dict[str, Any]:
    """Curves (mean SLO attainment and cost per level, over the seeds that ran), cost at matched
    SLO and the references; ``seeds`` per entry says how many seeds each mean is over."""
    def mean_of(f: str, p: str, q: float) -> dict[str, Any] | None:
        mine = [r for r in rows if r["forecaster"] == f and r["policy"] == p and r["level"] == q]
        if not mine:
            return None
        return {"slo_attainment": float(np.mean([r["slo_attainment"] for r in mine])),
                "cost_usd": float(np.mean([r["cost_usd"] for r in mine])),
                "seeds": sorted(int(r["seed"]) for r in mine)}

    curves = {f: {f"{q:g}": c for q in (0.8, 0.9, 0.95) if (c := mean_of(f, "fixed:1", q))}
              for f in ("ets", chosen)}
    matched = {}
    for q, c in curves["ets"].items():
        new = matched_cost([(v["slo_attainment"], v["cost_usd"]) for v in curves[chosen].values()],
                           c["slo_attainment"])
        matched[q] = {"ets_slo": c["slo_attainment"], "ets_cost": c["cost_usd"],
                      "chosen_cost_at_that_slo": new, "ratio": None if new is None else new / c["cost_usd"]}
    refs = {p: mean_of("ets", p, LEVEL) for p in ("oracle-rate", "hindsight")}
    return {"scenario": "core", "market": "spot", "days": f"{days[0]}-{days[-1]} (test)", "chosen": chosen,
            "curves": curves, "matched_slo": matched, "references": refs, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default="core,robustness,loop,speed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--loop-days", type=lambda t: tuple(map(int, t.split("-"))), default=(11, 14),
                        help="test days of the closed loop, FIRST-LAST (default 11-14)")
    parser.add_argument("--loop-runs", default="",
                        help="only these closed-loop runs: SEED/FORECASTER/POLICY/LEVEL, comma-separated")
    parser.add_argument("--loop-rows", nargs="*", type=Path,
                        help="files of earlier closed-loop rows (one JSON object a line) to summarize with")
    parser.add_argument("--speed-forecasters", default="ets,peak:blend,peak:auto")
    parser.add_argument("--chosen", default="peak:auto",
                        help="the loop's new forecaster when the core part (which chooses it) does not run")
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
            rows = list(pool.map(core_pass, [(s, f) for s in seeds for f in FORECASTERS]))
            base = {(r["seed"], m): {sp: r[sp][m]["pinball_0.9"] for sp in ("validation", "test")}
                    for r in rows if r["forecaster"] == "ets" for m in r["validation"]}
            summary: dict[str, Any] = {}
            for f in FORECASTERS:
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
            chosen = min(NEW, key=lambda f: summary[f]["validation"]["pinball_vs_ets"])
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
            log("robustness: " + "; ".join(
                f"{n} auto {t['peak:auto']['test_pinball_vs_ets']:.2f}xets "
                f"{t['peak:auto']['test_pinball_vs_best_trivial']:.2f}xtriv "
                f"cov {t['peak:auto']['test_coverage_0.9']:.2f}"
                for n, t in table.items()))
        if "loop" in parts:
            days = tuple(range(args.loop_days[0], args.loop_days[1] + 1))
            if args.loop_runs:  # SEED/FORECASTER/POLICY/LEVEL,...: only these (a shorter run)
                jobs = [(int(a), f, p, float(q), days)
                        for a, f, p, q in (r.split("/") for r in args.loop_runs.split(","))]
            else:
                jobs = [(s, f, "fixed:1", q, days) for f in ("ets", chosen) for q in (0.8, 0.9, 0.95)
                        for s in seeds]
                jobs += [(s, "ets", p, LEVEL, days) for p in ("oracle-rate", "hindsight") for s in seeds]
            rows = list(pool.map(loop_run, jobs))
            for path in args.loop_rows or ():  # rows of earlier runs (one JSON object a line)
                rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            doc["loop"] = loop_summary(rows, chosen, days)
            log(f"loop: {json.dumps({k: doc['loop'][k] for k in ('curves', 'matched_slo', 'references')})}")
        if "speed" in parts:
            doc["speed"] = list(pool.map(speed_pass, args.speed_forecasters.split(",")))
    doc["wall_seconds"] = time.perf_counter() - started
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
