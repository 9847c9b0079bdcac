"""Training ``peak:learned`` offline (``atoll forecast train``): one network on every bundled series.

**Data.** The demand every bundled scenario serves (core, extended, fleet20), from each of
ServeGen's halves (``servegen``, ``servegen-steady``, ``servegen-bursty``), sampled with demand
seeds ``FitSettings.demand_seeds``: the series the env's forecaster sees (requests/s per 5-min
step). Series with equal names in two scenarios are the same client group at another rate, and
both are kept: the rate changes the sampling noise relative to the level, which the network must
learn. ``hold_out`` leaves one ServeGen source out entirely (``m-small``: every series whose name
starts with it), so a figure can report a source the network never saw.

**Days.** Rows whose targets lie in days 2-7 fit (a row needs a day of history), rows of days
8-10 score the early stopping (the 0.9 pinball loss of the look-ahead-H peak), and the series are
cut at the end of day 10 before any row is built: days 11-14 are never read.

**Determinism.** Seeded torch on one CPU thread with deterministic algorithms: the same settings
give the same weights. The data hash (of every series' values and name) goes on the card.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from atoll.forecast.forecasters import DAY, ForecastError
from atoll.forecast.learned import HIDDEN, LAGS, RATIO_CAP, DemandNet, training_rows
from atoll.forecast.planning import DEFAULT_HORIZON, pinball

SCENARIOS = ("core", "extended", "fleet20")
WORKLOADS = ("servegen", "servegen-steady", "servegen-bursty")
FIT_DAYS = (2, 7)
VALIDATION_DAYS = (8, 10)
LAST_DAY_READ = 10  # the series are cut here: the test days 11-14 are never read


@dataclass(frozen=True)
class FitSettings:
    """What a training run depends on (all of it on the card)."""

    seed: int = 0
    demand_seeds: tuple[int, ...] = (0, 1)
    scenarios: tuple[str, ...] = SCENARIOS
    workloads: tuple[str, ...] = WORKLOADS
    hold_out: str | None = None
    epochs: int = 40
    patience: int = 5
    batch_size: int = 1024
    learning_rate: float = 1e-3
    hidden: int = HIDDEN
    horizon: int = DEFAULT_HORIZON
    # (name, values): a user's series beside the bundled ones
    extra: tuple[tuple[str, tuple[float, ...]], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "hidden", "horizon"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ForecastError(f"FitSettings: field {name!r} must be an integer >= 1, got {v!r}")
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 0:
            raise ForecastError(f"FitSettings: field 'patience' must be an integer >= 0, "
                                f"got {self.patience!r}")
        if not (isinstance(self.learning_rate, int | float) and 0 < self.learning_rate < 1):
            raise ForecastError(f"FitSettings: field 'learning_rate' must be in (0, 1), "
                                f"got {self.learning_rate!r}")
        if not self.extra and (not self.demand_seeds or not self.scenarios or not self.workloads):
            raise ForecastError("FitSettings: fields 'demand_seeds', 'scenarios' and 'workloads' "
                                "must not be empty without 'extra' series")


def training_series(st: FitSettings) -> list[tuple[str, np.ndarray]]:
    """(name, requests/s cut at the end of day LAST_DAY_READ) of every series the run reads."""
    from atoll.envs.demand import workload_series
    from atoll.solvers.scenarios import SCENARIOS as SPECS

    out: list[tuple[str, np.ndarray]] = []
    for scenario in st.scenarios if st.demand_seeds and st.workloads else ():
        if scenario not in SPECS:
            raise ForecastError(f"unknown scenario {scenario!r}; valid: {', '.join(SPECS)}")
        spec = SPECS[scenario]
        for workload in st.workloads:
            for seed in st.demand_seeds:
                for s in workload_series(workload, spec.models, spec.req_per_s, 300.0, resample="sampled",
                                         seed=seed):
                    if st.hold_out and s.name.startswith(st.hold_out):
                        continue
                    y = np.asarray(s.requests_per_s, dtype=float)[: LAST_DAY_READ * DAY]
                    out.append((f"{scenario}/{s.name}/seed{seed}", y))
    for name, values in st.extra:
        out.append((name, np.asarray(values, dtype=float)[: LAST_DAY_READ * DAY]))
    if not out:
        raise ForecastError(f"no series left to train on (hold_out {st.hold_out!r} removed every one)")
    return out


def data_hash(series: list[tuple[str, np.ndarray]]) -> str:
    h = hashlib.sha256()
    for name, y in series:
        h.update(name.encode())
        h.update(np.ascontiguousarray(y, dtype=np.float64).tobytes())
    return h.hexdigest()[:16]


def rows(series: list[tuple[str, np.ndarray]], days: tuple[int, int], horizon: int
         ) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets of every series' origins whose look-ahead lies in ``days``."""
    xs, ys = [], []
    for _, y in series:
        first = max((days[0] - 1) * DAY, DAY + LAGS)
        last = min(days[1] * DAY, len(y)) - horizon
        if last < first:
            continue
        x, t = training_rows(y, np.arange(first, last + 1), horizon)
        t = np.minimum(t, RATIO_CAP)  # see atoll.forecast.learned.RATIO_CAP
        keep = np.isfinite(x).all(axis=1) & np.isfinite(t).all(axis=1)
        xs.append(x[keep])
        ys.append(t[keep])
    if not xs:
        raise ForecastError(f"no series has days {days[0]}-{days[1]} with a day of history before them")
    return np.concatenate(xs), np.concatenate(ys)


def fit_net(st: FitSettings, *, note: Callable[[str], None] = lambda _: None,
            series: list[tuple[str, np.ndarray]] | None = None) -> tuple[DemandNet, dict[str, object]]:
    """Train the network (module docstring); the weights of the epoch with the least validation
    loss, and a report (losses per epoch, rows, seconds)."""
    import torch

    t0 = time.perf_counter()
    series = series if series is not None else training_series(st)
    xf, yf = rows(series, FIT_DAYS, st.horizon)
    xv, yv = rows(series, VALIDATION_DAYS, st.horizon)
    note(f"{len(series)} series: {len(xf)} fit rows (days {FIT_DAYS[0]}-{FIT_DAYS[1]}), {len(xv)} validation "
         f"rows (days {VALIDATION_DAYS[0]}-{VALIDATION_DAYS[1]})")
    layers, history = fit_arrays(xf, yf, xv, yv, st, note=note)
    settings = {k: v for k, v in asdict(st).items() if k != "extra"}
    settings["extra"] = [name for name, _ in st.extra]
    card: dict[str, object] = {
        "settings": settings, "data_hash": data_hash(series), "series": len(series),
        "fit_rows": int(len(xf)), "validation_rows": int(len(xv)), "fit_days": list(FIT_DAYS),
        "validation_days": list(VALIDATION_DAYS), "validation_pinball_0.9": min(history),
        "epochs_run": len(history), "best_epoch": int(np.argmin(history)) + 1, "torch": torch.__version__}
    report = {**card, "validation_history": history, "seconds": round(time.perf_counter() - t0, 1)}
    return DemandNet(layers, st.horizon, card, digest="unsaved"), report


Layers = tuple[tuple[np.ndarray, np.ndarray], ...]


def fit_arrays(xf: np.ndarray, yf: np.ndarray, xv: np.ndarray, yv: np.ndarray, st: FitSettings, *,
               note: Callable[[str], None] = lambda _: None) -> tuple[Layers, list[float]]:
    """The network's layers (numpy, ``x @ w + b``) fitted to inputs ``xf`` [N, F] and peak targets
    ``yf`` [N, horizon] (/ level), stopped early on the 0.9 pinball loss of ``xv``, ``yv`` at the
    look-ahead H; and that loss per epoch. Any input width F: the shipped network's features, or
    a variant's (benchmarks/demand_model.py measures which inputs help)."""
    import torch

    torch.manual_seed(st.seed)
    torch.use_deterministic_algorithms(True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        net = torch.nn.Sequential(torch.nn.Linear(xf.shape[1], st.hidden), torch.nn.ReLU(),
                                  torch.nn.Linear(st.hidden, st.hidden), torch.nn.ReLU(),
                                  torch.nn.Linear(st.hidden, 2 * st.horizon)).double()
        opt = torch.optim.Adam(net.parameters(), lr=st.learning_rate)
        xf_t, yf_t = torch.from_numpy(xf), torch.from_numpy(yf)
        xv_t = torch.from_numpy(xv)
        h = st.horizon

        def quantiles(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            med = out[:, :h]
            return med, med + torch.nn.functional.softplus(out[:, h:])

        def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            med, upper = quantiles(out)
            d5, d9 = y - med, y - upper
            return (torch.maximum(0.5 * d5, -0.5 * d5).mean() + torch.maximum(0.9 * d9, -0.1 * d9).mean())

        gen = torch.Generator().manual_seed(st.seed)
        best, best_state, stale, history = float("inf"), None, 0, []
        for epoch in range(1, st.epochs + 1):
            net.train()
            order = torch.randperm(len(xf_t), generator=gen)
            for i in range(0, len(order), st.batch_size):
                idx = order[i: i + st.batch_size]
                opt.zero_grad()
                loss_of(net(xf_t[idx]), yf_t[idx]).backward()
                opt.step()
            net.eval()
            with torch.no_grad():
                _, upper = quantiles(net(xv_t))
                score = pinball(yv[:, h - 1], upper[:, h - 1].numpy(), 0.9)
            history.append(round(score, 6))
            note(f"epoch {epoch}: validation 0.9 pinball {score:.5f} (x level)")
            if score < best - 1e-9:
                best, stale = score, 0
                best_state = {k: v.clone() for k, v in net.state_dict().items()}
            else:
                stale += 1
                if st.patience and stale >= st.patience:
                    break
        assert best_state is not None
        net.load_state_dict(best_state)
        linears = [m for m in net if isinstance(m, torch.nn.Linear)]
        layers = tuple((m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy()) for m in linears)
    finally:
        torch.set_num_threads(threads)
    return layers, history
