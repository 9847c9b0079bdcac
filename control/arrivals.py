"""What the live controller plans each phase from: its signals gated, its demand estimated.

Per tick and model with a fresh rate (:mod:`atoll.control.rates`), in order:

1. the plausibility gates (:mod:`atoll.control.plausibility`) remove the queue, latency and gauge
   readings no interval could produce, unless the served tokens confirm them;
2. a saturated phase (:func:`atoll.envs.saturation.saturated`: its mean latency at or past its
   mean at capacity) is planned from its estimated arrivals — served + the queue's growth +
   aborted requests, in the phase's tokens per request — bounded by the growth cap
   (:func:`atoll.envs.saturation.planning_demand`); any other phase from what it served.

The result is what the controller records in its history and forecasts from, so a model whose
prompts grow tenfold is planned for the tenfold demand within a few ticks instead of creeping up
on what its saturated servers managed to serve.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from atoll.control.plausibility import GateLimits, PlausibilityGate, Verdict, max_queue_growth
from atoll.control.rates import ModelRate, RateReport
from atoll.envs.latency import PREFILL_SCALE, ServiceLatency
from atoll.envs.saturation import estimate_arrivals, planning_demand, saturated


@dataclass(frozen=True)
class PhaseDemand:
    """One model's planning demand this tick: ``served`` and ``planned`` (prefill, decode)
    tokens/s, ``arrivals`` the estimate, ``saturated`` per phase."""

    served: tuple[float, float]
    arrivals: tuple[float, float]
    planned: tuple[float, float]
    saturated: tuple[bool, bool]

    def as_dict(self) -> dict[str, object]:
        return {"served_tokens_per_s": list(self.served), "arrivals_tokens_per_s": list(self.arrivals),
                "planned_tokens_per_s": list(self.planned), "saturated": list(self.saturated)}


class LiveArrivals:
    """The gates and the saturation estimate of a fleet's models (see the module docstring).
    ``latency``: (prefill, decode) latency constants per model (budgets); ``one_instance``:
    [M, 2] one instance's best tokens/s; ``shapes``: model -> profiled tokens per request."""

    def __init__(self, models: Sequence[str],
                 latency: tuple[Sequence[ServiceLatency], Sequence[ServiceLatency]],
                 one_instance: np.ndarray, shapes: Mapping[str, tuple[float, float]], *,
                 outlier_factor: float, growth_factor: float, growth_add: int) -> None:
        self.models = tuple(models)
        self.budgets = [(pre.budget_s, dec.budget_s) for pre, dec in zip(*latency, strict=True)]
        self.one_instance = np.asarray(one_instance, dtype=float)
        self.shapes = dict(shapes)
        self.outlier_factor, self.growth_factor, self.growth_add = outlier_factor, growth_factor, growth_add
        self.gate = PlausibilityGate()
        self._waiting: dict[str, float] = {}  # the last plausible waiting count (queue growth base)

    def _shape(self, r: ModelRate) -> tuple[float, float]:
        if r.prompt_tokens_per_request and r.generation_tokens_per_request:
            return r.prompt_tokens_per_request, r.generation_tokens_per_request
        return self.shapes[r.model]

    def gate_rates(self, rates: RateReport, time_scale: float,
                   planned: Mapping[str, tuple[float, float]]) -> tuple[RateReport, dict[str, Verdict]]:
        """``rates`` with implausible signals held (see the module docstring), and the verdicts
        of the models with any signal held or confirmed."""
        out: dict[str, ModelRate] = {}
        verdicts: dict[str, Verdict] = {}
        for name, r in rates.models.items():
            if not r.ok or name not in self.models or r.interval_s is None:
                out[name] = r
                continue
            i = self.models.index(name)
            interval = r.interval_s * time_scale  # the latencies' clock (the trace's, replayed)
            limits = GateLimits(interval, self.budgets[i],
                                max_queue_growth(r.requests_per_s, interval, self.outlier_factor),
                                planned.get(name),
                                (r.prompt_tokens_per_s or 0.0, r.generation_tokens_per_s or 0.0))
            out[name], verdict = self.gate.check(r, limits)
            if verdict.held or verdict.confirmed:
                verdicts[name] = verdict
        return RateReport(rates.time_s, out), verdicts

    def demand(self, rates: RateReport, fresh: Sequence[str], instances: np.ndarray,
               time_scale: float) -> dict[str, PhaseDemand]:
        """Per fresh model, what to plan each phase from (``instances`` [M, 2] ready over the
        interval; ``rates`` already gated and per trace second)."""
        out: dict[str, PhaseDemand] = {}
        for name in fresh:
            r = rates.models[name]
            i = self.models.index(name)
            served = np.array([[r.prompt_tokens_per_s or 0.0, r.generation_tokens_per_s or 0.0]])
            shape = np.array([self._shape(r)])
            interval = (r.interval_s or 0.0) * time_scale
            before = self._waiting.get(name)
            now = r.waiting
            if now is not None:
                self._waiting[name] = now
            grew = 0.0 if before is None or now is None else now - before
            aborted = (r.aborted_per_s or 0.0) * interval
            arrivals = estimate_arrivals(served, shape, [0.0], [grew], [aborted], interval)
            pre_b, dec_b = self.budgets[i]
            ratio = np.array([[np.nan if r.ttft_mean_s is None else r.ttft_mean_s / (PREFILL_SCALE * pre_b),
                               np.nan if r.itl_mean_s is None else r.itl_mean_s / dec_b]])
            busy = saturated(ratio, [max(grew, 0.0) + aborted])
            plan = planning_demand(served, arrivals, busy, instances[i:i + 1], self.growth_factor,
                                   self.growth_add)
            out[name] = PhaseDemand((float(served[0, 0]), float(served[0, 1])),
                                    (float(arrivals[0, 0]), float(arrivals[0, 1])),
                                    (float(plan[0, 0]), float(plan[0, 1])),
                                    (bool(busy[0, 0]), bool(busy[0, 1])))
        return out
