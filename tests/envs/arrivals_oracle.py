"""The reference arrival sampler the package's vectorized one is tested against.

It draws every inter-arrival gap of every window explicitly (ServeGen's own generator, one client
at a time), so its distribution is the definition; :func:`atoll.envs.arrivals.sample_counts` must
match it in distribution, not draw for draw.
"""

from __future__ import annotations

import numpy as np

from atoll.envs.arrivals import GAMMA, IDLE, WEIBULL, ClientWindows
from atoll.forecast.workloads import SERVEGEN_WINDOW_S


def oracle_counts(windows: ClientWindows, clients: np.ndarray | list[int], factor: float, step_s: float,
                  rng: np.random.Generator) -> np.ndarray:
    """Requests per ``step_s`` step summed over ``clients``, every gap drawn."""
    k = int(round(SERVEGEN_WINDOW_S / step_s))
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
        busy = n[n > 0]
        starts = np.concatenate([[0], np.cumsum(busy)[:-1]])
        iat /= np.repeat(np.add.reduceat(iat, starts), busy)
        cum = np.cumsum(iat)
        done = np.repeat(np.concatenate([[0.0], np.cumsum(np.add.reduceat(iat, starts))[:-1]]), busy)
        frac = np.clip(cum - done, 0.0, 1.0)
        bucket = np.minimum((frac * k).astype(np.int64), k - 1)
        out += np.bincount(w * k + bucket, minlength=n_windows * k)
    return out
