"""Fit the performance model's efficiency factors to measured public profiles.

Fit on part of the rows, measure on the held-out rest (split by configuration group, so repeated
measurements of one setup never sit on both sides), and a leave-one-GPU-out error: fit without a
GPU type, predict it with the factors of the relative named in :data:`LOGO_RELATIVE` — the same
borrowing the package does for GPUs no profile covers (A10G, L40S, H200).

Two stages: every factor but the decode synchronization terms is fitted to every row (those
terms held at 0); then ``decode_hop_us`` and ``decode_skew`` are fitted to Splitwise's per-token
(TBT) rows alone, the rest held (see :func:`atoll.solvers.perf.decode_sync_seconds`). The report
gives the held-out error per dataset, per GPU, and per phase and TP degree.

Where the result goes: ``atoll perf calibrate`` writes the user's own calibration under the cache
folder (:func:`atoll.solvers.paths.user_perf_factors_path`, or ``--out``), which the performance
model then reads instead of the package's table. The package's table changes only through the
maintainer command ``python -m atoll.solvers.calibrate --write-package-table``. Either file is
the same bytes for the same data and seed: every float is rounded to
:data:`SIGNIFICANT_DIGITS` (the fit's last digits vary with the BLAS build and are far below its
error) and keys are written in sorted order.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from atoll.solvers.catalog import load_catalog
from atoll.solvers.errors import InputError
from atoll.solvers.files import atomic_write_text
from atoll.solvers.paths import PERF_FACTORS_PATH, shared_data_dir, user_perf_factors_path
from atoll.solvers.perf import SIBLING, PerfFactors, step_terms
from atoll.solvers.profiles import DATASETS, Observation, load_observations
from atoll.solvers.types import PHASES, Phase

HELDOUT_FRACTION = 0.3
LOGO_RELATIVE = {"T4": "L4", "L4": "T4", "V100": "A100", "A100": "V100", "H100": "A100"}
_GLOBALS = ("t_layer_ms", "eta_link", "allreduce_latency_us")
_BOUNDS = {"eta": (1e-3, 1.0), "t_layer_ms": (1e-4, 1.0), "eta_link": (0.02, 1.0),
           "allreduce_latency_us": (1.0, 500.0)}
_SYNC_BOUNDS = ((1e-3, 500.0), (1e-5, 1.0))  # decode_hop_us, decode_skew
SIGNIFICANT_DIGITS = 6  # of every float written: the fit's error is percents, its noise ~1e-9


@dataclass
class _Design:
    """Observations flattened into arrays of step parts for a vectorized prediction."""

    flops: np.ndarray
    nbytes: np.ndarray
    msg: np.ndarray
    layers: np.ndarray
    n: np.ndarray
    peak: np.ndarray
    bw: np.ndarray
    link: np.ndarray
    key: np.ndarray
    decode: np.ndarray
    weight: np.ndarray
    obs: np.ndarray
    measured: np.ndarray


def _design(rows: Sequence[Observation], keys: Sequence[str]) -> _Design:
    index = {k: i for i, k in enumerate(keys)}
    cols: dict[str, list[float]] = {c: [] for c in
                                    ("flops", "nbytes", "msg", "layers", "n", "peak", "bw", "link",
                                     "key", "decode", "weight", "obs")}
    for i, o in enumerate(rows):
        for p in o.parts:
            f, b, m = step_terms(o.model, p.layers, p.phase, tokens=p.tokens, context=p.context)
            g = o.config.gpu
            for c, v in (("flops", f), ("nbytes", b), ("msg", m), ("layers", p.layers),
                         ("n", o.config.count), ("peak", g.bf16_tflops * 1e12),
                         ("bw", g.hbm_bandwidth_gbs * 1e9), ("link", g.link_gbs * 1e9),
                         ("key", index[SIBLING[o.gpu]]), ("decode", float(p.phase is Phase.DECODE)),
                         ("weight", p.weight), ("obs", i)):
                cols[c].append(v)
    arr = {c: np.asarray(v, dtype=float) for c, v in cols.items()}
    return _Design(**{**arr, "key": arr["key"].astype(int), "obs": arr["obs"].astype(int),
                      "decode": arr["decode"].astype(bool)},
                   measured=np.asarray([o.measured_s for o in rows]))


def predict_seconds(d: _Design, f: PerfFactors, keys: Sequence[str]) -> np.ndarray:
    """Vectorized twin of perf.step_seconds summed over each observation's parts."""
    eta_c = np.asarray([f.eta_c.get(k, f.eta_c.get("default", 0.5)) for k in keys])[d.key]
    eta_m = np.asarray([f.eta_m.get(k, f.eta_m.get("default", 0.5)) for k in keys])[d.key]
    stream = d.nbytes / (d.bw * eta_m)  # one GPU's HBM stream time
    step = np.maximum(d.flops / (d.n * d.peak * eta_c), stream / d.n)
    step = step + d.layers * f.t_layer_ms * 1e-3
    ar = 2 * (d.n - 1) / d.n * d.msg / (d.link * f.eta_link) + f.allreduce_latency_us * 1e-6
    step = step + np.where(d.n > 1, d.layers * 2 * ar, 0.0)
    sync = d.layers * (d.n - 1) * f.decode_hop_us * 1e-6 + f.decode_skew * np.log2(d.n) * stream
    step = step + np.where(d.decode & (d.n > 1), sync, 0.0)
    return np.bincount(d.obs, weights=d.weight * step, minlength=len(d.measured))


def _unpack(theta: np.ndarray, keys: Sequence[str]) -> PerfFactors:
    k = len(keys)
    vals = np.exp(theta)
    return PerfFactors(eta_c=dict(zip(keys, vals[:k], strict=True)),
                       eta_m=dict(zip(keys, vals[k:2 * k], strict=True)),
                       t_layer_ms=float(vals[2 * k]), eta_link=float(vals[2 * k + 1]),
                       allreduce_latency_us=float(vals[2 * k + 2]))


def fit(rows: Sequence[Observation]) -> PerfFactors:
    """Least squares on log(predicted / measured): the factors of the GPUs in ``rows`` and the
    globals on every row, then the decode synchronization terms on the Splitwise TBT rows
    (module docstring)."""
    base = _fit_base(rows)
    tbt = [o for o in rows if o.dataset == "splitwise" and _phase(o) is Phase.DECODE]
    if not tbt:
        return base
    keys = sorted({SIBLING[o.gpu] for o in rows})
    d = _design(tbt, keys)

    def with_sync(theta: np.ndarray) -> PerfFactors:
        hop, skew = np.exp(theta)
        return replace(base, decode_hop_us=float(hop), decode_skew=float(skew))

    def residual(theta: np.ndarray) -> np.ndarray:
        return np.log(predict_seconds(d, with_sync(theta), keys) / d.measured)

    lo = np.log([b[0] for b in _SYNC_BOUNDS])
    hi = np.log([b[1] for b in _SYNC_BOUNDS])
    sol = least_squares(residual, np.log([10.0, 0.01]), bounds=(lo, hi), loss="soft_l1", f_scale=0.1)
    return with_sync(sol.x)


def _fit_base(rows: Sequence[Observation]) -> PerfFactors:
    """Stage 1: every factor but the decode synchronization terms (held at 0)."""
    keys = sorted({SIBLING[o.gpu] for o in rows})
    d = _design(rows, keys)
    prior = PerfFactors()
    theta0 = np.log([0.5] * len(keys) + [0.7] * len(keys)
                    + [prior.t_layer_ms, prior.eta_link, prior.allreduce_latency_us])
    lo = np.log([_BOUNDS["eta"][0]] * 2 * len(keys) + [_BOUNDS[g][0] for g in _GLOBALS])
    hi = np.log([_BOUNDS["eta"][1]] * 2 * len(keys) + [_BOUNDS[g][1] for g in _GLOBALS])
    theta0 = np.clip(theta0, lo + 1e-9, hi - 1e-9)

    def residual(theta: np.ndarray) -> np.ndarray:
        return np.log(predict_seconds(d, _unpack(theta, keys), keys) / d.measured)

    sol = least_squares(residual, theta0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1)
    return _unpack(sol.x, keys)


def ape(rows: Sequence[Observation], f: PerfFactors) -> np.ndarray:
    """Absolute percentage errors (fractions) of the model on ``rows``."""
    keys = sorted({SIBLING[o.gpu] for o in rows} | set(f.eta_c))
    d = _design(rows, keys)
    return np.abs(predict_seconds(d, f, keys) / d.measured - 1.0)


def split(rows: Sequence[Observation],
          seed: int = 0) -> tuple[list[Observation], list[Observation]]:
    """Per dataset, a seeded share of configuration groups is held out."""
    rng = np.random.default_rng(seed)
    train: list[Observation] = []
    test: list[Observation] = []
    for ds in DATASETS:
        groups = sorted({o.group.rsplit("/", 1)[0] for o in rows if o.dataset == ds})
        held = set(rng.choice(groups, size=max(1, round(HELDOUT_FRACTION * len(groups))),
                              replace=False).tolist())
        for o in rows:
            if o.dataset == ds:
                (test if o.group.rsplit("/", 1)[0] in held else train).append(o)
    return train, test


def _phase(o: Observation) -> Phase | None:
    """The phase of a one-phase observation (Helix, Splitwise rows); None for whole requests."""
    phases = {p.phase for p in o.parts}
    return phases.pop() if len(phases) == 1 else None


def _median(values: np.ndarray) -> float:
    return float(np.median(values)) if len(values) else float("nan")


def calibrate(data: Path | None = None, *, seed: int = 0,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Fit, evaluate held-out and leave-one-GPU-out; returns the report (factors included)."""
    say = progress or (lambda _msg: None)
    rows = load_observations(data or shared_data_dir(), load_catalog())
    train, test = split(rows, seed)
    say(f"fitting on {len(train)} rows, holding out {len(test)}")
    factors = fit(train)
    errors = ape(test, factors)
    heldout = {ds: _median(errors[[o.dataset == ds for o in test]]) for ds in DATASETS}
    by_gpu: dict[str, dict[str, float]] = {}
    for ds in DATASETS:
        for gpu in sorted({o.gpu for o in test if o.dataset == ds}):
            mask = [o.dataset == ds and o.gpu == gpu for o in test]
            by_gpu.setdefault(ds, {})[gpu] = _median(errors[mask])
    by_phase_tp: dict[str, dict[str, dict[str, float]]] = {}
    for ds in DATASETS:
        for phase in PHASES:
            for tp in sorted({o.config.count for o in test if o.dataset == ds}):
                mask = [o.dataset == ds and o.config.count == tp and _phase(o) is phase for o in test]
                if any(mask):
                    cell = by_phase_tp.setdefault(ds, {}).setdefault(phase.value, {})
                    cell[str(tp)] = _median(errors[mask])
    logo: dict[str, float] = {}
    for key, relative in LOGO_RELATIVE.items():
        say(f"leave-one-GPU-out: {key}")
        others = [o for o in rows if SIBLING[o.gpu] != key]
        held = [o for o in rows if SIBLING[o.gpu] == key]
        f = fit(others)
        borrowed = PerfFactors(eta_c={**f.eta_c, key: f.eta_c[relative]},
                               eta_m={**f.eta_m, key: f.eta_m[relative]},
                               t_layer_ms=f.t_layer_ms, eta_link=f.eta_link,
                               allreduce_latency_us=f.allreduce_latency_us,
                               decode_hop_us=f.decode_hop_us, decode_skew=f.decode_skew)
        logo[key] = _median(ape(held, borrowed))
    # The shipped factors use every row: the held-out split only measures the method.
    say("final fit on all rows")
    final = fit(rows)
    return rounded({
        "factors": final.to_json(),
        "heldout_mape": heldout,
        "heldout_mape_by_gpu": by_gpu,
        "heldout_mape_by_phase_tp": by_phase_tp,
        "leave_one_gpu_out_mape": logo,
        "leave_one_gpu_out_relative": LOGO_RELATIVE,
        "borrowed_factors": {g: s for g, s in SIBLING.items() if s != g},
        "rows": {ds: sum(o.dataset == ds for o in rows) for ds in DATASETS},
        "heldout_rows": {ds: sum(o.dataset == ds for o in test) for ds in DATASETS},
        "seed": seed,
    })


def rounded(value: Any) -> Any:
    """``value`` with every float rounded to :data:`SIGNIFICANT_DIGITS` significant digits and
    every mapping's keys sorted (nested dicts, lists and tuples included)."""
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}") if math.isfinite(value) else value
    if isinstance(value, dict):
        return {str(k): rounded(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [rounded(v) for v in value]
    return value


def write_factors(report: dict[str, Any], path: Path | None = None, *, package: bool = False) -> Path:
    """Write ``report`` (rounded, keys sorted) atomically to ``path`` (default: the user's
    calibration file); returns the path written. The package's own table is written only with
    ``package=True`` (the maintainer command)."""
    target = Path(path) if path is not None else user_perf_factors_path()
    if not package and target.resolve() == PERF_FACTORS_PATH.resolve():
        raise InputError(f"{target} is the package's own efficiency-factor table; a calibration is "
                         f"written to {user_perf_factors_path()} (or --out elsewhere); maintainers refit "
                         f"the shipped table with `python -m atoll.solvers.calibrate --write-package-table`")
    text = json.dumps(rounded(report), indent=1, sort_keys=True, allow_nan=True) + "\n"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, text)
    except OSError as exc:
        raise InputError(f"cannot write the calibration to {target}: {exc}; pass --out with a "
                         f"writable file") from exc
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """Maintainer command: refit the package's shipped table (``solvers/data/perf_factors.json``)."""
    parser = argparse.ArgumentParser(
        prog="python -m atoll.solvers.calibrate",
        description="Refit the efficiency-factor table shipped inside the package (maintainers). "
                    "Users run `atoll perf calibrate`, which writes to their cache folder instead.")
    parser.add_argument("--write-package-table", action="store_true",
                        help=f"write {PERF_FACTORS_PATH} (without it: print the report, write nothing)")
    parser.add_argument("--data", type=Path, help="shared data folder (default ../shared/data)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out split")
    args = parser.parse_args(argv)
    report = calibrate(args.data, seed=args.seed, progress=lambda msg: print(msg, file=sys.stderr))
    if args.write_package_table:
        print(f"wrote {write_factors(report, PERF_FACTORS_PATH, package=True)}", file=sys.stderr)
    else:
        print("dry run: pass --write-package-table to write the package's table", file=sys.stderr)
    print(json.dumps(report, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
