"""What a FleetEnv re-plan plans for: the demand at a step, by forecast, by hindsight or by the
previous day's peak (FleetEnv's docstring, "Start state" and "Action").

:class:`PlanningDemand` answers ``[M, 2]`` tokens/s for a global step ``g`` and a way of planning:

- ``forecast`` — the forecast's maximum over the look-ahead at each model's planning level (the
  configured one, or the level the action chose);
- ``oracle`` — the true (sampled) demand's maximum over the look-ahead (the hindsight reference);
- ``oracle-rate`` — the maximum of the rate the demand is drawn from
  (:func:`atoll.envs.demand.underlying_rates`);
- ``oracle-quantile`` — the maximum of each step's quantile, at the re-plan's level, of the demand
  sampled anew from that rate (:func:`atoll.envs.demand.sampled_quantiles`);
- ``peak`` — the previous day's peak (the ``peak`` initial plan).

:func:`reset_options` reads an episode's day, initial plan and way of planning from ``reset``'s
options. The underlying rates and the quantiles are computed on first use (the quantiles' draws are cached
on disk by :func:`~atoll.envs.demand.sampled_quantiles`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atoll.envs.actions import ActionCodec
from atoll.envs.config import FleetConfig
from atoll.envs.demand import DemandBook, DemandError, sampled_quantiles, underlying_rates
from atoll.envs.fleet_model import FleetModel

__all__ = ["INITIAL_PLANS", "PLANNING", "PlanningDemand", "reset_options"]

INITIAL_PLANS = ("forecast", "peak")
PLANNING = ("forecast", "oracle", "oracle-rate", "oracle-quantile")


def reset_options(options: dict[str, Any] | None, book: DemandBook, days: tuple[int, int],
                  rng: np.random.Generator) -> tuple[int, str, str]:
    """(day, initial plan, planning) of an episode from ``reset``'s ``options``: the day given, or
    drawn uniformly from ``days`` with ``rng``; ValueError naming the valid options."""
    options = dict(options or {})
    first, last = days
    day = options.pop("day", None)
    if day is None:
        day = int(rng.integers(first, last + 1))
    book.check_days(int(day), int(day))
    initial = options.pop("initial_plan", "forecast")
    planning = options.pop("planning", "forecast")
    if initial not in INITIAL_PLANS or planning not in PLANNING or options:
        raise ValueError(f"reset options: initial_plan in {INITIAL_PLANS}, planning in {PLANNING}, "
                         f"day in {first}-{last}; got initial_plan={initial!r}, "
                         f"planning={planning!r}, unknown keys {sorted(options)}")
    return int(day), initial, planning


class PlanningDemand:
    """The planning demand of one env's demand book (see the module docstring)."""

    def __init__(self, config: FleetConfig, fleet: FleetModel, book: DemandBook, codec: ActionCodec) -> None:
        self.config, self.fleet, self.book, self.codec = config, fleet, book, codec
        self.underlying: np.ndarray | None = None  # [M, steps] req/s, on first use
        self.quantiles: dict[float, np.ndarray] | None = None  # {level: [M, steps]}, on first use

    def __call__(self, g: int, how: str, levels: list[float] | None = None) -> np.ndarray:
        """[M, 2] tokens/s to plan for at step g: the forecast's maximum over the look-ahead at
        each model's level (None: the configured one), the true demand (``oracle``), the rate it is
        drawn from (``oracle-rate``), its quantiles (``oracle-quantile``) or the previous day's
        peak (``peak``)."""
        book = self.book
        h = book.horizon
        if how == "oracle":
            rates = book.rates[:, g: g + h].max(axis=1)
        elif how == "oracle-rate":
            rates = self.underlying_rates[:, g: g + h].max(axis=1)
        elif how == "oracle-quantile":
            qs, at = self.rate_quantiles, levels or [self.config.planning_quantile] * len(self.fleet.models)
            rates = np.array([qs[q][i, g: g + h].max() for i, q in enumerate(at)])
        elif how == "peak":
            rates = book.day_peak[:, g // book.steps_per_day]
        elif levels is None:
            rates = book.upper[:, g, :].max(axis=1)
        else:
            rates = np.array([book.uppers[q][i, g, :].max() for i, q in enumerate(levels)])
        return self.fleet.tokens(np.nan_to_num(rates, nan=0.0))

    @property
    def underlying_rates(self) -> np.ndarray:
        """[M, steps] the rate the demand is drawn from (computed on first use)."""
        if self.underlying is None:
            c = self.config
            self.underlying = underlying_rates(
                c.workload, self.fleet.models, c.scenario_spec.req_per_s, c.step_s, resample=c.resample,
                steps=self.book.rates.shape[1], demand=c.demand)
        return self.underlying

    @property
    def rate_quantiles(self) -> dict[float, np.ndarray]:
        """{level: [M, steps]} the demand's own per-step quantiles at the action's levels and the
        configured one (``oracle-quantile``; sampled on first use, each draw cached on disk)."""
        if self.quantiles is None:
            c = self.config
            if c.demand is not None or c.resample != "sampled":
                raise DemandError(f"oracle-quantile needs demand sampled from a ServeGen workload "
                                  f"(resample='sampled', no demand series given); this env has "
                                  f"resample={c.resample!r}{' and its own demand series' if c.demand else ''}"
                                  f" — use oracle-rate or hindsight")
            self.quantiles = sampled_quantiles(
                c.workload, self.fleet.models, c.scenario_spec.req_per_s, c.step_s,
                levels=sorted({*self.codec.levels, c.planning_quantile}), steps=self.book.rates.shape[1])
        return self.quantiles
