"""Demand at step resolution sampled from ServeGen's own arrival processes.

ServeGen describes each client, per 600 s window, by a request rate and a fitted inter-arrival
distribution (Gamma or Weibull, with its shape and scale; ../shared/data/servegen/SOURCE.md).
ServeGen's generator (``servegen/construct.py``, ``_sample_iats``) makes a window's requests by
drawing ``rate x 600`` inter-arrival times from that distribution and rescaling them to fill
the window; this module does the same per client and window and counts the arrivals per step
(any step that divides 600 s, down to 60 s), with a seeded generator. Two deliberate changes:

- the number of requests in a window is ``rate x 600`` rounded *stochastically* (floor, plus one
  with the fractional part's probability) rather than up: once the rates are scaled down to a
  scenario's mean (10 req/s per model in ``core``), most clients have a fraction of a request per
  window and rounding up would add up to one request per client and window;
- a window whose rate is positive but whose distribution is missing arrives as Poisson
  (exponential inter-arrivals), the memoryless default.

The rates are scaled to the scenario's mean *before* sampling (ServeGen's ``target_rate``), so
the count noise is that of the scaled demand, not of the production volume. The request mix
(input / output lengths) stays the trace's per-window mean.
"""

from __future__ import annotations

import csv
import gzip
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from atoll.forecast.workloads import SERVEGEN_MODELS, SERVEGEN_WINDOW_S, WorkloadError
from atoll.solvers.paths import shared_data_dir

IDLE, GAMMA, WEIBULL = 0, 1, 2
_KINDS = {"": IDLE, "Gamma": GAMMA, "Weibull": WEIBULL}


@dataclass(frozen=True)
class ClientWindows:
    """Per client and 600 s window: rate (req/s), distribution kind and its shape and scale."""

    rate: np.ndarray  # [clients, windows]
    kind: np.ndarray
    shape: np.ndarray
    scale: np.ndarray


@lru_cache(maxsize=4)
def servegen_windows(model: str, data: Path | None = None) -> ClientWindows:
    """Every client's arrival process of one ServeGen model, from its ``chunk-*-trace.csv.gz``."""
    if model not in SERVEGEN_MODELS:
        raise WorkloadError(f"unknown ServeGen model {model!r}; valid: {', '.join(SERVEGEN_MODELS)}")
    folder = (data or shared_data_dir()) / "servegen" / "data" / SERVEGEN_MODELS[model] / model
    traces = sorted(folder.glob("chunk-*-trace.csv.gz"), key=lambda p: int(p.name.split("-")[1]))
    if not traces:
        raise FileNotFoundError(f"no ServeGen traces in {folder} — check ATOLL_SHARED_DATA")
    rows: list[list[list[str]]] = []
    for path in traces:
        with gzip.open(path, "rt") as fh:
            rows.append(list(csv.reader(fh)))
    rate = np.array([[float(r[1]) for r in client] for client in rows])
    kind = np.array([[_KINDS.get(r[3], IDLE) for r in client] for client in rows], dtype=np.int8)
    shape = np.array([[float(r[4] or 0) for r in client] for client in rows])
    scale = np.array([[float(r[5] or 0) for r in client] for client in rows])
    return ClientWindows(rate, kind, shape, scale)


def sample_counts(windows: ClientWindows, clients: np.ndarray | list[int], factor: float, step_s: float,
                  rng: np.random.Generator) -> np.ndarray:
    """Requests per ``step_s`` step summed over ``clients``, their rates x ``factor`` (one array
    over all windows, ``600 / step_s`` steps per window)."""
    per = SERVEGEN_WINDOW_S / step_s
    if per < 1 or abs(per - round(per)) > 1e-9:
        raise WorkloadError(f"step {step_s:g} s must divide the ServeGen window of {SERVEGEN_WINDOW_S} s "
                            f"(e.g. 60, 120, 300 or 600 s)")
    k = int(round(per))
    n_windows = windows.rate.shape[1]
    out = np.zeros(n_windows * k, dtype=np.int64)
    for c in np.asarray(clients, dtype=int):
        expected = windows.rate[c] * factor * SERVEGEN_WINDOW_S
        n = np.floor(expected).astype(np.int64)
        n += rng.random(n_windows) < (expected - n)
        if not n.any():
            continue
        kind = np.where((n > 0) & (windows.kind[c] == IDLE), -1, windows.kind[c])  # -1: Poisson
        w = np.repeat(np.arange(n_windows), n)
        iat = np.empty(len(w))
        for code in (GAMMA, WEIBULL, -1):
            sel = kind[w] == code
            if not sel.any():
                continue
            shp, scl = windows.shape[c][w[sel]], windows.scale[c][w[sel]]
            if code == GAMMA:
                iat[sel] = rng.gamma(np.maximum(shp, 1e-6), np.maximum(scl, 1e-12))
            elif code == WEIBULL:
                iat[sel] = np.maximum(scl, 1e-12) * rng.weibull(np.maximum(shp, 1e-6))
            else:
                iat[sel] = rng.exponential(1.0, int(sel.sum()))
        iat = np.clip(np.nan_to_num(iat, nan=1.0, posinf=1e200), 1e-300, 1e200)
        # rescale each window's gaps to fill it (ServeGen's generator): an arrival's place in the
        # window is its cumulative gap over the window's total; normalized first, so the running
        # sum over all windows stays exact (it grows by one per window)
        busy = n[n > 0]
        starts = np.concatenate([[0], np.cumsum(busy)[:-1]])
        iat /= np.repeat(np.add.reduceat(iat, starts), busy)
        cum = np.cumsum(iat)
        done = np.repeat(np.concatenate([[0.0], np.cumsum(np.add.reduceat(iat, starts))[:-1]]), busy)
        frac = np.clip(cum - done, 0.0, 1.0)
        bucket = np.minimum((frac * k).astype(np.int64), k - 1)
        out += np.bincount(w * k + bucket, minlength=n_windows * k)
    return out
