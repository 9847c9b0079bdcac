"""Demand at step resolution sampled from ServeGen's own arrival processes.

ServeGen describes each client, per 600 s window, by a request rate and a fitted inter-arrival
distribution (Gamma or Weibull, with its shape and scale; ../shared/data/servegen/SOURCE.md).
ServeGen's generator (``servegen/construct.py``, ``_sample_iats``) makes a window's requests by
drawing ``rate x 600`` inter-arrival times from that distribution and rescaling them to fill
the window; this module does the same per client and window and counts the arrivals per step
(any step that divides 600 s, down to 60 s), with a seeded generator. Only the steps' counts are
needed, so a window of Gamma (or Poisson) gaps is not drawn gap by gap: a gamma bridge places
each step boundary among its requests with a few Beta draws (:func:`_bridge_counts`), the same
distribution at a cost that grows with log(requests), not requests; Weibull gaps, which have no
such bridge, are drawn one by one. Two deliberate changes:

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

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from atoll.forecast.workloads import SERVEGEN_WINDOW_S, WorkloadError, servegen_traces

IDLE, GAMMA, WEIBULL = 0, 1, 2
# Bumped whenever the counts drawn for a seed change (the sampled-demand cache keys on it).
# 2: Gamma and Poisson windows placed by the gamma bridge (same distribution, other draws).
SAMPLER_VERSION = 2
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
    traces = servegen_traces(model, data)
    import pandas as pd

    frames = [pd.read_csv(path, header=None, usecols=[1, 3, 4, 5], names=["rate", "kind", "shape", "scale"],
                          dtype={"rate": float, "kind": str, "shape": float, "scale": float},
                          keep_default_na=False, na_values={"shape": [""], "scale": [""]})
              for path in traces]
    rate = np.array([f["rate"].to_numpy() for f in frames])
    kind = np.array([[_KINDS.get(v, IDLE) for v in f["kind"]] for f in frames], dtype=np.int8)
    shape = np.nan_to_num(np.array([f["shape"].to_numpy() for f in frames]), nan=0.0)
    scale = np.nan_to_num(np.array([f["scale"].to_numpy() for f in frames]), nan=0.0)
    return ClientWindows(rate, kind, shape, scale)


def steps_per_window(step_s: float) -> int:
    """How many ``step_s`` steps one 600 s ServeGen window holds (refused unless it divides it)."""
    per = SERVEGEN_WINDOW_S / step_s
    if per < 1 or abs(per - round(per)) > 1e-9:
        raise WorkloadError(f"step {step_s:g} s must divide the ServeGen window of {SERVEGEN_WINDOW_S} s "
                            f"(e.g. 60, 120, 300 or 600 s)")
    return int(round(per))


def sample_counts(windows: ClientWindows, clients: np.ndarray | list[int], factor: float, step_s: float,
                  rng: np.random.Generator) -> np.ndarray:
    """Requests per ``step_s`` step summed over ``clients``, their rates x ``factor`` (one array
    over all windows, ``600 / step_s`` steps per window).

    Vectorized over every (client, window) at once: each busy window's request count is drawn
    first, then where its requests fall — by the gamma bridge for Gamma and Poisson gaps
    (:func:`_bridge_counts`, a few draws per step boundary instead of one per request) and by
    drawing every gap for Weibull ones (:func:`_explicit_counts`, in bounded batches)."""
    k = steps_per_window(step_s)
    n_windows = windows.rate.shape[1]
    out = np.zeros((n_windows, k), dtype=np.int64)
    idx = np.asarray(clients, dtype=int)
    if idx.size == 0:
        return out.ravel()
    expected = windows.rate[idx] * factor * SERVEGEN_WINDOW_S
    n = np.floor(expected).astype(np.int64)
    n += rng.random(expected.shape) < (expected - n)
    client, window = np.nonzero(n > 0)  # busy cells, client-major
    if not len(client):
        return out.ravel()
    count = n[client, window]
    kind = windows.kind[idx][client, window]
    shape = windows.shape[idx][client, window]
    placed = np.zeros((len(count), k), dtype=np.int64)
    weibull = kind == WEIBULL
    # Gamma gaps of the fitted shape; a busy window without a fit is Poisson: Exp(1) = Gamma(1)
    a = np.where(kind == GAMMA, np.where(np.isfinite(shape), np.maximum(shape, 1e-6), 1.0), 1.0)
    placed[~weibull] = _bridge_counts(count[~weibull], a[~weibull], k, rng)
    placed[weibull] = _explicit_counts(count[weibull], shape[weibull], k, rng)
    np.add.at(out, window, placed)
    return out.ravel()


def _bridge_counts(n: np.ndarray, a: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """[cells, k] requests per step of windows whose ``n`` gaps are iid Gamma(``a``), rescaled to
    fill the window (the last request ends it).

    With S_i the sum of the first i gaps, the arrival positions are S_i / S_n, and for i < m < j
    (S_m - S_i) / (S_j - S_i) ~ Beta((m - i) a, (j - m) a), independent of the gaps outside
    (i, j) — the Dirichlet's aggregation property. So the number of arrivals before a step
    boundary b is found by bisection on the request index, one Beta draw per halving, drawing
    only the positions the search visits; the path between two visited positions stays an
    unconditioned bridge, so the next boundary's search starts from the first position found at
    or past this one. Exact in distribution; about (k - 1) log2(n) draws per window."""
    cells = len(n)
    below = np.zeros((cells, k + 1), dtype=np.int64)
    below[:, k] = n
    anchor = np.zeros(cells, dtype=np.int64)  # index and position of the last point found >= b
    anchor_pos = np.zeros(cells)  # (index 0 at 0: the window's start, not a request)
    for j in range(1, k):
        b = j / k
        settled = anchor_pos >= b  # the boundary falls in the gap the previous search ended in
        below[settled, j] = anchor[settled] - 1
        lo, lo_pos = anchor.copy(), anchor_pos.copy()
        hi, hi_pos = n.copy(), np.ones(cells)
        act = np.flatnonzero(~settled & (hi - lo > 1))
        while act.size:
            lo_a, hi_a = lo[act], hi[act]
            mid = (lo_a + hi_a) // 2
            x = rng.beta((mid - lo_a) * a[act], (hi_a - mid) * a[act])
            pos = lo_pos[act] + (hi_pos[act] - lo_pos[act]) * x
            left = pos < b
            lo[act[left]], lo_pos[act[left]] = mid[left], pos[left]
            hi[act[~left]], hi_pos[act[~left]] = mid[~left], pos[~left]
            act = act[hi[act] - lo[act] > 1]
        searched = ~settled
        below[searched, j] = lo[searched]
        anchor[searched], anchor_pos[searched] = hi[searched], hi_pos[searched]
    return np.diff(below, axis=1)


EXPLICIT_BATCH = 1 << 21  # requests per batch of explicitly drawn gaps: bounds the memory


def _explicit_counts(n: np.ndarray, shape: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """[cells, k] requests per step of windows whose ``n`` gaps are iid Weibull(``shape``), every
    gap drawn and rescaled to fill the window (ServeGen's generator)."""
    out = np.zeros((len(n), k), dtype=np.int64)
    total = np.cumsum(n)
    first = 0
    while first < len(n):
        # cells first..last-1 hold at most EXPLICIT_BATCH requests (one cell more if it alone is larger)
        done = total[first - 1] if first else 0
        last = max(int(np.searchsorted(total, done + EXPLICIT_BATCH, side="right")), first + 1)
        busy = n[first:last]
        cell = np.repeat(np.arange(last - first), busy)
        # Weibull(a) = Exp(1) ** (1 / a), numpy's own construction; the scale is left out, as
        # the rescaling to the window cancels it
        gaps = rng.standard_exponential(len(cell)) ** (1.0 / np.maximum(shape[first:last], 1e-6))[cell]
        iat = np.clip(gaps, 1e-300, 1e200)
        # an arrival's place in its window is its cumulative gap over the window's total;
        # normalized first, so the running sum over all windows stays exact (one per window)
        starts = np.concatenate([[0], np.cumsum(busy)[:-1]])
        iat /= np.repeat(np.add.reduceat(iat, starts), busy)
        cum = np.cumsum(iat)
        before = np.repeat(np.concatenate([[0.0], np.cumsum(np.add.reduceat(iat, starts))[:-1]]), busy)
        frac = np.clip(cum - before, 0.0, 1.0)
        bucket = np.minimum((frac * k).astype(np.int64), k - 1)
        out[first:last] = np.bincount(cell * k + bucket, minlength=(last - first) * k).reshape(-1, k)
        first = last
    return out
