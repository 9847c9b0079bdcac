"""Which inputs help ``peak:learned``: its own history alone, or with the fleet's other series too.
One JSON document on stdout (progress on stderr), written to ``--out``.

The issue asks the global demand model to see "the other series of the fleet (aggregate or
attention; measure what helps)". This measures the aggregate, in two forms, against the shipped
inputs, with everything else equal (settings, seed, rows, early stopping):

- ``own``: the shipped features (:func:`atoll.forecast.learned.training_rows`): the series' last
  2 hours, yesterday's window and its level, all / its level;
- ``fleet``: those, and the same features of the fleet's total demand (the sum of every series of
  the scenario at that demand half and seed), scaled by the total's own level;
- ``others``: those, and the same features of the fleet's total without the series itself.

Each variant is fitted by :func:`atoll.forecast.learned_fit.fit_arrays` on the same series as
the shipped network (core, extended, fleet20 x the three ServeGen halves x demand seeds 0 and 1;
days 2-7 fit, 8-10 stop early, the series cut at day 10). Scored on **test days 11-14** at demand
seed ``--seed``: per series, the 0.9 pinball loss (req/s) of the raw network's 0.9 quantile of the
peak over the look-ahead (no conformal layer: the inputs' own effect), and the ratio of each
variant to ``own`` per series, the mean over series with a 95% t interval (a ratio whose interval
holds 1 is a tie).

    .venv/bin/python benchmarks/demand_inputs.py --out benchmarks/results/demand_inputs.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

from atoll.envs.demand import workload_series  # noqa: E402
from atoll.forecast.forecasters import DAY  # noqa: E402
from atoll.forecast.learned import LAGS, RATIO_CAP, forward, training_rows  # noqa: E402
from atoll.forecast.learned_fit import (  # noqa: E402
    FIT_DAYS,
    LAST_DAY_READ,
    SCENARIOS,
    VALIDATION_DAYS,
    WORKLOADS,
    FitSettings,
    fit_arrays,
)
from atoll.forecast.planning import pinball  # noqa: E402
from atoll.solvers.files import atomic_write_text  # noqa: E402
from atoll.solvers.scenarios import SCENARIOS as SPECS  # noqa: E402
from atoll.training.lever_oracle import paired_ratio  # noqa: E402

VARIANTS = ("own", "fleet", "others")
TEST = (11, 14)
LEVEL = 0.9


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


Fleet = tuple[str, list[tuple[str, np.ndarray]]]


def fleets(seeds: tuple[int, ...]) -> list[tuple[Fleet, int]]:
    """((scenario/workload, [(series name, requests/s over every day)]), demand seed) per fleet."""
    out = []
    for scenario in SCENARIOS:
        spec = SPECS[scenario]
        for workload in WORKLOADS:
            for seed in seeds:
                series = workload_series(workload, spec.models, spec.req_per_s, 300.0, resample="sampled",
                                         seed=seed)
                out.append(((f"{scenario}/{workload}",
                             [(s.name, np.asarray(s.requests_per_s, dtype=float)) for s in series]), seed))
    return out


def variant_rows(variant: str, fleet: list[tuple[str, np.ndarray]], days: tuple[int, int], horizon: int,
                 cut: int | None) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(series name, inputs, targets / level, level) of each series' origins whose look-ahead lies in
    ``days``, the series (and the fleet's total) cut at step ``cut`` first."""
    ys = [y[:cut] for _, y in fleet]
    total = np.sum(ys, axis=0)
    out = []
    for (name, _), y in zip(fleet, ys, strict=True):
        first = max((days[0] - 1) * DAY, DAY + LAGS)
        last = min(days[1] * DAY, len(y)) - horizon
        if last < first:
            continue
        origins = np.arange(first, last + 1)
        x, t = training_rows(y, origins, horizon)
        level = 10.0 ** x[:, -1]
        if variant != "own":
            context = total if variant == "fleet" else total - y
            x = np.concatenate([x, training_rows(context, origins, horizon)[0]], axis=1)
        t = np.minimum(t, RATIO_CAP)
        keep = np.isfinite(x).all(axis=1) & np.isfinite(t).all(axis=1)
        out.append((name, x[keep], t[keep], level[keep]))
    return out


def stacked(parts: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])


def run(seed: int) -> dict[str, Any]:
    st = FitSettings()
    t0 = time.perf_counter()
    all_fleets = fleets(tuple(sorted({*st.demand_seeds, seed})))
    log(f"{len(all_fleets)} fleets read in {time.perf_counter() - t0:.0f} s")
    cut = LAST_DAY_READ * DAY
    train = [f for f, s in all_fleets if s in st.demand_seeds]
    test = [f for f, s in all_fleets if s == seed]
    out: dict[str, Any] = {"test_days": list(TEST), "seed": seed, "variants": {}}
    scores: dict[str, dict[str, float]] = {}
    for variant in VARIANTS:
        t1 = time.perf_counter()
        fit = [p for _, fl in train for p in variant_rows(variant, fl, FIT_DAYS, st.horizon, cut)]
        val = [p for _, fl in train for p in variant_rows(variant, fl, VALIDATION_DAYS, st.horizon, cut)]
        (xf, yf), (xv, yv) = stacked(fit), stacked(val)
        layers, history = fit_arrays(xf, yf, xv, yv, st, note=log)
        per: dict[str, float] = {}
        for cell, fl in test:
            for name, x, t, level in variant_rows(variant, fl, TEST, st.horizon, None):
                upper = forward(layers, x, st.horizon)[:, -1, 1] * level  # the 0.9 quantile at H
                per[f"{cell}/{name}"] = pinball(t[:, -1] * level, upper, LEVEL)
        scores[variant] = per
        out["variants"][variant] = {"inputs": int(xf.shape[1]), "fit_rows": int(len(xf)),
                                    "validation_pinball_0.9": min(history), "epochs_run": len(history),
                                    "seconds": round(time.perf_counter() - t1, 1)}
        log(f"{variant}: {xf.shape[1]} inputs, validation {min(history):.5f}, "
            f"{time.perf_counter() - t1:.0f} s")
    names = [n for n in scores["own"] if scores["own"][n] > 0]  # a silent series has no ratio
    for variant in VARIANTS[1:]:
        ratios = np.array([scores[variant][n] / scores["own"][n] for n in names])
        out["variants"][variant]["test_pinball_ratio_over_own"] = paired_ratio(
            [scores[variant][n] for n in names], [scores["own"][n] for n in names])
        out["variants"][variant]["series_better_than_own"] = int((ratios < 1).sum())
        by_scenario = {}
        for scenario in SCENARIOS:
            keep = [n for n in names if n.startswith(scenario + "/")]
            by_scenario[scenario] = paired_ratio([scores[variant][n] for n in keep],
                                                 [scores["own"][n] for n in keep])
        out["variants"][variant]["by_scenario"] = by_scenario
    out["series_scored"] = len(names)
    out["per_series_pinball_0.9"] = scores
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="the demand seed of the test days")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/demand_inputs.json"))
    args = ap.parse_args()
    doc = {"load_at_start": list(os.getloadavg()), **run(args.seed), "load_at_end": list(os.getloadavg())}
    atomic_write_text(args.out, json.dumps(doc, indent=1, default=float) + "\n")
    shown = {k: v for k, v in doc.items() if k != "per_series_pinball_0.9"}  # those stay in the file
    print(json.dumps(shown, indent=1, default=float))


if __name__ == "__main__":
    main()
