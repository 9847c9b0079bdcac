"""A user's request log for the fleet-file tests: two models with a daily cycle, seeded Poisson
arrivals per 5 minutes and gamma-distributed lengths (shared by tests/envs and tests/control)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def request_log(path: Path, days: int = 5, seed: int = 0, rates: tuple[float, float] = (0.1, 0.05)) -> Path:
    """One row per request (timestamp, model, input_tokens, output_tokens) for ``phi-4`` and
    ``acme-8b`` at mean ``rates`` req/s (each with a daily sine of +-60%), written to ``path``."""
    rng = np.random.default_rng(seed)
    rows = []
    t0 = 1714521600.0
    for (model, inp, out), base in zip((("phi-4", 900, 180), ("acme-8b", 400, 120)), rates, strict=True):
        for b in range(days * 24 * 12):
            t = b * 300.0
            rate = base * (1 + 0.6 * np.sin(2 * np.pi * (t / 86400 - 0.25)))
            for _ in range(rng.poisson(rate * 300)):
                rows.append((t0 + t + rng.uniform(0, 300), model, int(rng.gamma(4, inp / 4)) + 1,
                             int(rng.gamma(3, out / 3)) + 1))
    rows.sort()
    path.write_text("timestamp,model,input_tokens,output_tokens\n"
                    + "".join(f"{t:.3f},{m},{i},{o}\n" for t, m, i, o in rows))
    return path
