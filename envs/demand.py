"""Demand the fleet sees, and what the forecaster said about it, for a whole trace.

A :class:`DemandBook` holds, per model, the request rate of every step of the trace and the
forecasts an online forecaster made of it: at step ``g`` (having seen steps ``< g``) the mean
and the planning quantile for steps ``g .. g + H - 1``; and per day the previous day's peak
rate (the ``never`` policy's static plan is made for it). The forecasts depend only on
the trace, never on the fleet's actions, so they are computed once in a single causal pass
(fit on the warm-up days, then update step by step) and shared by every episode; they are
cached on disk under ``<cache>/forecasts`` keyed by a hash of the rates and the settings.

Token demand per service = requests/s x the model's mean request shape (the Azure LLM 2023
lengths the scenario's templates were built for), so demand and template throughput measure
the same requests.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from atoll.envs.arrivals import SAMPLER_VERSION, sample_counts, servegen_windows
from atoll.envs.config import RESAMPLES
from atoll.forecast.forecasters import FORECAST_VERSION, QUANTILES, ForecastError
from atoll.forecast.registry import PLANNING_FORECASTERS, make_forecaster, planning_settings
from atoll.forecast.scaling import Scale, apply_scale, split_scale, with_scale
from atoll.forecast.workloads import (
    LANGUAGE_MODELS,
    SERVEGEN_MODELS,
    SERVEGEN_WORKLOADS,
    DemandSeries,
    load_workload,
    n_model_groups,
    n_model_scenario,
)
from atoll.solvers.errors import InputError
from atoll.solvers.files import atomic_write_bytes
from atoll.solvers.paths import cache_root, shared_data_dir

log = logging.getLogger(__name__)

WARMUP_DAYS = 3  # two seasons to fit, a third to calibrate the forecaster's intervals
FORMAT_VERSION = 5  # 4: files carry a checksum; 5: one upper array per planning level


class DemandError(InputError):
    """Bad demand settings; the message names the setting, its value and the fix."""


@dataclass(frozen=True)
class DemandBook:
    """Rates and forecasts of ``len(models)`` models over a trace of ``steps`` steps.

    ``rates[m, g]`` req/s; ``mean[m, g, h]`` and ``upper[m, g, h]`` the forecast made at step g
    for step g + h (NaN during warm-up), ``upper`` at ``quantile``; ``uppers[q]`` the same at
    every level q a re-optimization may plan at (``quantile`` included); ``day_peak[m, d]`` the
    peak rate of day d - 1 (0-based days; NaN for the first).
    """

    models: tuple[str, ...]
    step_s: float
    steps_per_day: int
    rates: np.ndarray
    mean: np.ndarray
    upper: np.ndarray
    day_peak: np.ndarray
    quantile: float
    forecaster: str
    uppers: dict[float, np.ndarray]

    @property
    def days(self) -> int:
        return self.rates.shape[1] // self.steps_per_day

    @property
    def horizon(self) -> int:
        return self.mean.shape[2]

    def first_day(self) -> int:
        """The first (1-based) day an episode may start on: the days before warm the forecaster up."""
        return WARMUP_DAYS + 1

    def check_days(self, first: int, last: int) -> None:
        if not self.first_day() <= first <= last <= self.days:
            raise DemandError(
                f"days {first}-{last} are outside {self.first_day()}-{self.days}: the workload has "
                f"{self.days} days and days 1-{WARMUP_DAYS} fit and calibrate the forecaster, so "
                f"episodes can start on days {self.first_day()}-{self.days}")


def _forecast_pass(rates: np.ndarray, steps_per_day: int, forecaster: str, horizon: int,
                   levels: Sequence[float], progress: Callable[[int], None] | None
                   ) -> tuple[np.ndarray, ...]:
    """(mean, peak, upper at each of ``levels``)."""
    n_models, steps = rates.shape
    warm = WARMUP_DAYS * steps_per_day
    days = steps // steps_per_day
    mean = np.full((n_models, steps, horizon), np.nan)
    uppers = [np.full((n_models, steps, horizon), np.nan) for _ in levels]
    # The day's peak for a static plan is the previous day's peak (a seasonal-naive forecast of
    # it): day-ahead quantiles of the step forecasters are far too wide to plan a fleet on (on
    # ServeGen their 90% day peak reached 5-25x the true one).
    peak = np.full((n_models, days), np.nan)
    for d in range(1, days):
        peak[:, d] = rates[:, (d - 1) * steps_per_day: d * steps_per_day].max(axis=1)
    for m in range(n_models):
        f = make_forecaster(forecaster, season=steps_per_day, horizon=horizon)
        f.fit(rates[m, :warm])
        for g in range(warm, steps):
            fc = f.forecast(horizon)
            mean[m, g] = fc.mean
            for upper, q in zip(uppers, levels, strict=True):
                upper[m, g] = fc.quantile(q)
            f.update(rates[m, g])
            if progress is not None:
                progress(1)
    return (mean, peak, *uppers)


def build_book(models: Sequence[str], series: Sequence[DemandSeries], *, forecaster: str,
               horizon: int, quantile: float, levels: Sequence[float] = (), use_cache: bool = True,
               progress: Callable[[int], None] | None = None) -> DemandBook:
    """Forecast every model's series in one causal pass (cached on disk), with the upper
    quantile at ``quantile`` and at every one of ``levels``."""
    if len(series) != len(models):
        raise DemandError(f"{len(series)} demand series for {len(models)} models; give one per model")
    for q in (quantile, *levels):
        if q not in QUANTILES:
            raise DemandError(f"planning quantile {q} is not forecast; use one of {list(QUANTILES)}")
    all_levels = tuple(sorted({float(quantile), *map(float, levels)}))
    step = series[0].step_s
    lengths = {len(s) for s in series}
    if any(s.step_s != step for s in series) or len(lengths) != 1:
        raise DemandError("every demand series must have the same step and length, got "
                          + ", ".join(f"{s.name}: {len(s)} x {s.step_s:g} s" for s in series))
    per_day = series[0].steps_per_day
    steps = (lengths.pop() // per_day) * per_day
    if steps < (WARMUP_DAYS + 1) * per_day:
        raise DemandError(f"the workload has {steps // per_day} whole days; at least {WARMUP_DAYS + 1} "
                          f"are needed ({WARMUP_DAYS} to warm the forecaster up, one to simulate)")
    rates = np.stack([np.asarray(s.requests_per_s[:steps], dtype=float) for s in series])
    digest = hashlib.sha256(rates.tobytes())
    key: tuple[object, ...] = (FORMAT_VERSION, FORECAST_VERSION, forecaster, horizon, all_levels, per_day)
    if forecaster in PLANNING_FORECASTERS:  # only these read the planning settings
        key = (*key, *planning_settings())
    digest.update(repr(key).encode())
    path = cache_root() / "forecasts" / f"{digest.hexdigest()[:24]}.npz"
    arrays: tuple[np.ndarray, ...] | None = None
    shapes = ((len(models), steps, horizon), (len(models), steps // per_day),
              *[(len(models), steps, horizon)] * len(all_levels))
    if use_cache and path.exists():
        arrays = _read_cache(path, shapes)
    if arrays is None:
        try:
            arrays = _forecast_pass(rates, per_day, forecaster, horizon, all_levels, progress)
        except ForecastError as exc:
            raise DemandError(f"forecaster {forecaster!r}: {exc}") from exc
        if use_cache:
            _write_arrays(path, arrays)
    elif progress is not None:
        progress(len(models) * (steps - WARMUP_DAYS * per_day))
    mean, peak, *upper_list = arrays
    for a in (rates, *arrays):
        a.setflags(write=False)
    uppers = dict(zip(all_levels, upper_list, strict=True))
    return DemandBook(tuple(models), step, per_day, rates, mean, uppers[float(quantile)], peak, quantile,
                      forecaster, uppers)


def _checksum(arrays: Sequence[np.ndarray]) -> bytes:
    """SHA-256 over the arrays' shapes and bytes (stored with them: a cache file is trusted only
    when it matches)."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(repr(a.shape).encode())
        h.update(np.ascontiguousarray(a, dtype=float).tobytes())
    return h.digest()


def _read_cache(path: os.PathLike[str] | str, shapes: Sequence[tuple[int, ...]]
                ) -> tuple[np.ndarray, ...] | None:
    """The cached (mean, peak, uppers...), or None — with a warning — when the file is truncated,
    corrupt, of another shape or fails its checksum; the caller then recomputes and rewrites it."""
    try:
        with np.load(path, allow_pickle=False) as doc:
            arrays = tuple(np.asarray(doc[f"a{i}"], dtype=float) for i in range(len(shapes)))
            stored = bytes(doc["checksum"].tobytes())
    except Exception as exc:  # noqa: BLE001 - zip, zlib, numpy and OS errors all mean "rebuild"
        log.warning("forecast cache %s unreadable (%s: %s); recomputing it", path, type(exc).__name__, exc)
        return None
    if tuple(a.shape for a in arrays) != tuple(shapes):
        log.warning("forecast cache %s holds arrays of another shape; recomputing it", path)
        return None
    if stored != _checksum(arrays):
        log.warning("forecast cache %s fails its checksum; recomputing it", path)
        return None
    return arrays


@lru_cache(maxsize=8)
def _named_series(workload: str, n_models: int, mean_rate: float, step_s: float, resample: str = "hold",
                  seed: int = 0) -> tuple[DemandSeries, ...]:
    head, spec = split_scale(workload.strip()) if "," not in workload else (workload, None)
    if head in SERVEGEN_WORKLOADS:
        # The scenario's definition: every client group at the scenario's mean rate, unless the
        # workload asks otherwise (servegen@mean:R, servegen@factor:F, servegen@none).
        asked = spec is not None
        spec = spec if spec is not None else Scale("mean", mean_rate)
        if spec.kind != "none":
            log.log(logging.WARNING if asked else logging.INFO,
                    "%s: %d client groups' requests/s scaled (%s%s)", head, n_models, spec,
                    "" if asked else ", the scenario's rate")
        return _servegen_series(n_models, spec, step_s, resample, seed, SERVEGEN_WORKLOADS[head])
    names = [w.strip() for w in workload.split(",") if w.strip()]
    if len(names) != n_models:
        raise DemandError(f"workload {workload!r} names {len(names)} series for {n_models} models; "
                          f"give one per model (comma-separated) or use one of "
                          f"{', '.join(SERVEGEN_WORKLOADS)}")
    out = []
    for name in names:
        base, own = split_scale(name)
        series = load_workload(base, step_s=step_s)
        if own is not None:  # asked for
            series = apply_scale(series, own, source=name)
        elif not base.startswith("csv:"):  # a bundled trace takes the scenario's rate
            series = apply_scale(series, Scale("mean", mean_rate), source=f"{name} (the scenario's rate)",
                                 level=logging.INFO)
        out.append(series)
    return tuple(out)


SERIES_FORMAT = 1  # layout of a cached scenario series file


def _servegen_series(n_models: int, spec: Scale, step_s: float, resample: str, seed: int, split: str = "all"
                     ) -> tuple[DemandSeries, ...]:
    """The ServeGen scenario's series, read from the sampled-demand cache when it holds them.

    The cache (``<cache>/demand``) keys on everything the series depend on: the settings, the
    seed, :data:`atoll.envs.arrivals.SAMPLER_VERSION`, the source of the modules that build them
    and the size and modification time of every ServeGen file read; so every worker of a grid, a
    training run or a contest loads what the first one sampled instead of parsing the traces and
    sampling again."""
    files = _servegen_files()
    key = (SERIES_FORMAT, SAMPLER_VERSION, _code_digest(), n_models, spec.kind, float(spec.value),
           float(step_s), resample, int(seed) if resample == "sampled" else 0, files, split)
    path = cache_root() / "demand" / f"{hashlib.sha256(repr(key).encode()).hexdigest()[:24]}.npz"
    cached = _read_series(path, n_models)
    if cached is not None:
        return cached
    out = _sample_servegen(n_models, spec, step_s, resample, seed, split)
    arrays = [a for srs in out for a in (srs.requests_per_s, srs.input_tokens, srs.output_tokens)]
    names = np.frombuffer("\n".join(srs.name for srs in out).encode(), dtype=np.uint8)
    _write_arrays(path, arrays, names=names, step_s=np.array([float(step_s)]))
    return out


@lru_cache(maxsize=1)
def _code_digest() -> str:
    """SHA-256 of the modules that turn the traces into series (grouping, scaling, sampling): an
    edit to any of them is a new cache key, whether or not a version was bumped."""
    import atoll.envs.arrivals
    import atoll.forecast.scaling
    import atoll.forecast.workloads

    h = hashlib.sha256()
    for module in (atoll.envs.arrivals, atoll.forecast.scaling, atoll.forecast.workloads):
        h.update(Path(str(module.__file__)).read_bytes())
    return h.hexdigest()


def _servegen_files() -> tuple[tuple[str, int, int], ...]:
    """(name, size, mtime) of every ServeGen language-model file the scenario reads."""
    root = shared_data_dir() / "servegen" / "data"
    out = []
    for model in LANGUAGE_MODELS:
        folder = root / SERVEGEN_MODELS[model] / model
        for f in sorted(folder.glob("chunk-*")):
            st = f.stat()
            out.append((f"{model}/{f.name}", st.st_size, st.st_mtime_ns))
    return tuple(out)


def _sample_servegen(n_models: int, spec: Scale, step_s: float, resample: str, seed: int, split: str = "all"
                     ) -> tuple[DemandSeries, ...]:
    raw = n_model_scenario(n_models, step_s=step_s, split=split)
    factors = [spec.factor_for(float(np.mean(s.requests_per_s))) for s in raw]
    if resample == "sampled":
        out = []
        groups = n_model_groups(n_models, split=split)
        for i, ((source, members, name), hold, factor) in enumerate(zip(groups, raw, factors, strict=True)):
            counts = sample_counts(servegen_windows(source), members, factor, step_s,
                                   np.random.default_rng([seed, i]))
            n = min(len(counts), len(hold))
            out.append(DemandSeries(name, step_s, counts[:n] / step_s, hold.input_tokens[:n],
                                    hold.output_tokens[:n]))
        return tuple(out)
    if spec.kind == "none":
        return tuple(raw)
    return tuple(replace(s, requests_per_s=s.requests_per_s * f) for s, f in zip(raw, factors, strict=True))


def _read_series(path: Path, n_models: int) -> tuple[DemandSeries, ...] | None:
    """The cached series, or None (a missing, damaged or foreign file: recomputed)."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as doc:
            arrays = [np.asarray(doc[f"a{i}"], dtype=float) for i in range(3 * n_models)]
            stored = bytes(doc["checksum"].tobytes())
            names = bytes(doc["names"].tobytes()).decode().split("\n")
            step = float(doc["step_s"][0])
    except Exception as exc:  # noqa: BLE001 - zip, zlib, numpy and OS errors all mean "rebuild"
        log.warning("demand cache %s unreadable (%s: %s); sampling again", path, type(exc).__name__, exc)
        return None
    if stored != _checksum(arrays) or len(names) != n_models:
        log.warning("demand cache %s fails its checksum; sampling again", path)
        return None
    return tuple(DemandSeries(names[i], step, arrays[3 * i], arrays[3 * i + 1], arrays[3 * i + 2])
                 for i in range(n_models))


def _write_arrays(path: Path, arrays: Sequence[np.ndarray], **extra: np.ndarray) -> None:
    """Write ``arrays`` (as a0, a1, ...) with their checksum, atomically; a cache that cannot be
    written costs time, never the result."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        payload: dict[str, Any] = {f"a{i}": a for i, a in enumerate(arrays)}
        payload["checksum"] = np.frombuffer(_checksum(arrays), dtype=np.uint8)
        payload.update(extra)
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **payload)
        atomic_write_bytes(path, buffer.getvalue())
    except OSError as exc:
        log.warning("cache %s not written (%s)", path, exc)


def workload_series(workload: str, models: Sequence[str], mean_rate: float, step_s: float, *,
                    resample: str = "sampled", seed: int = 0, scale: str | None = None
                    ) -> tuple[DemandSeries, ...]:
    """The scenario's demand: ``servegen`` = ServeGen client groups (one per model, see
    ``atoll.forecast.workloads.n_model_scenario``); ``servegen-steady`` / ``servegen-bursty`` the
    same groups from the steady or the bursty half of each source's request volume (clients
    ordered by their inter-arrival CV, :func:`atoll.forecast.workloads.split_clients`); or one
    workload name per model, comma-separated.

    Scaling: ``servegen`` and the bundled traces named in a list (``servegen:<model>``,
    ``azure:<trace>``) are scaled to ``mean_rate`` req/s over the whole trace — the scenario's
    definition (the Coral paper's 10 / 25 req/s), logged at INFO. A user's ``csv:`` file is
    served as recorded unless asked: a name's own ``@mean:R`` / ``@factor:F`` / ``@none`` suffix,
    else ``scale`` (the same spec for every name without one, as ``--scale`` passes it; it
    replaces the scenario's rate too); what is applied on request is logged at WARNING (see
    :mod:`atoll.forecast.scaling`).

    ``resample`` (``servegen`` only): ``sampled`` draws each step's requests from the clients'
    own arrival processes (:mod:`atoll.envs.arrivals`) with the generator seeded by ``seed``, at
    the scaled rates; ``hold`` repeats each 600 s window's rate in every step it covers.
    Request logs and counts files (Azure, CSV) are already counts per
    step: both give the same.
    """
    if resample not in RESAMPLES:
        raise DemandError(f"resample must be one of {', '.join(RESAMPLES)}, got {resample!r}")
    return _named_series(with_scale(workload, scale), len(models), float(mean_rate), float(step_s),
                         resample, int(seed))


QUANTILE_DRAWS = 16  # independent samples of the demand the rate's own quantiles are read from
QUANTILE_FIRST_SEED = 10_000  # their seeds: far from the demand seeds envs train and are tested on


def sampled_quantiles(workload: str, models: Sequence[str], mean_rate: float, step_s: float, *,
                      levels: Sequence[float], steps: int, draws: int = QUANTILE_DRAWS,
                      first_seed: int = QUANTILE_FIRST_SEED) -> dict[float, np.ndarray]:
    """{q: [M, steps]} each step's q quantile of the requests/s the scenario's demand is sampled
    as, over ``draws`` independent samples (seeds ``first_seed``, ``first_seed + 1``, ...): what a
    forecaster that knew the rate and its sampling noise, but not the realization, would plan for
    at level q (``oracle-quantile``). Only the sampled ServeGen workloads have a sampling model
    to draw from; anything else is a DemandError naming the workload."""
    if workload.strip().split("@")[0] not in SERVEGEN_WORKLOADS:
        raise DemandError(f"oracle-quantile draws the demand anew, which only the sampled ServeGen "
                          f"workloads ({', '.join(sorted(SERVEGEN_WORKLOADS))}) can; workload {workload!r} "
                          f"is given as counts — use oracle-rate or hindsight for it")
    if not (isinstance(draws, int) and draws >= 2):
        raise DemandError(f"sampled_quantiles: draws must be an integer >= 2, got {draws!r}")
    stack = np.stack([
        np.stack([np.asarray(s.requests_per_s[:steps], dtype=float)
                  for s in workload_series(workload, models, mean_rate, step_s, resample="sampled",
                                           seed=first_seed + k)])
        for k in range(draws)])
    return {float(q): np.quantile(stack, q, axis=0) for q in levels}


SMOOTH_STEPS = 7  # centered window (35 min at 5-min steps) of the smoothed rate of counts


def smoothed_rates(rates: np.ndarray, steps: int = SMOOTH_STEPS) -> np.ndarray:
    """[M, T] centered moving average of per-step rates over ``steps`` steps (shorter at the
    ends): the rate a request log's counts were drawn from, as well as counts tell it."""
    rates = np.asarray(rates, dtype=float)
    half = steps // 2
    padded = np.pad(rates, ((0, 0), (half, half)), constant_values=np.nan)
    windows = np.lib.stride_tricks.sliding_window_view(padded, steps, axis=1)
    return np.nanmean(windows, axis=2)


def underlying_rates(workload: str, models: Sequence[str], mean_rate: float, step_s: float, *,
                     resample: str, steps: int, demand: Sequence[DemandSeries] | None = None
                     ) -> np.ndarray:
    """[M, steps] the rate the demand is drawn from, never the sampled counts (``oracle-rate``
    plans on it): for ``servegen`` sampled per step, each 600 s window's rate at the scenario's
    scale (what the arrival processes are sampled at); otherwise — counts already, or a
    ``demand`` given as series — their :func:`smoothed_rates`."""
    if demand is None and resample == "sampled" and workload.strip().split("@")[0] in SERVEGEN_WORKLOADS:
        held = workload_series(workload, models, mean_rate, step_s, resample="hold")
        return np.stack([np.asarray(s.requests_per_s[:steps], dtype=float) for s in held])
    series = demand if demand is not None else workload_series(workload, models, mean_rate, step_s,
                                                              resample=resample)
    return smoothed_rates(np.stack([np.asarray(s.requests_per_s[:steps], dtype=float) for s in series]))
