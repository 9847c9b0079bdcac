"""A picture of a forecast: history, the held-out truth, the forecast and its 80%/90% intervals."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from atoll.forecast.registry import make_forecaster
from atoll.forecast.workloads import DemandSeries


def plot_forecast(series: DemandSeries, *, forecaster: str, origin_step: int, horizon: int,
                  history_steps: int, out: Path) -> dict[str, float]:
    """Fit on everything before ``origin_step`` and draw ``horizon`` steps ahead."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    y = series.requests_per_s
    f = make_forecaster(forecaster).fit(y[:origin_step])
    fc = f.forecast(horizon)
    hours = np.arange(len(y)) * series.step_s / 3600.0
    lo = max(0, origin_step - history_steps)
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot(hours[lo:origin_step], y[lo:origin_step], color="black", lw=1, label="history")
    end = min(len(y), origin_step + horizon)
    ax.plot(hours[origin_step:end], y[origin_step:end], color="grey", lw=1, label="actual")
    fh = hours[origin_step] + np.arange(horizon) * series.step_s / 3600.0
    if fc.quantiles:
        ax.fill_between(fh, fc.quantiles[0.05], fc.quantiles[0.95], alpha=0.2, color="C0", label="90%")
        ax.fill_between(fh, fc.quantiles[0.1], fc.quantiles[0.9], alpha=0.3, color="C0", label="80%")
    ax.plot(fh, fc.mean, color="C0", lw=1.5, label=f"{forecaster} forecast")
    ax.set_xlabel("hours since trace start")
    ax.set_ylabel("requests/s")
    ax.set_title(f"{series.name}: {forecaster} forecast from hour {hours[origin_step]:.1f}")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return {"origin_hour": float(hours[origin_step]), "horizon_steps": horizon}
