"""Plausibility gates: a signal is evidence, not truth.

Every signal the capacity correction and the saturation estimate read is a valid number that may
still be false: a waiting-requests gauge stuck at 40,000, a mean TTFT of ten minutes on a
five-minute interval, a negative gauge. Fed as they are, a lying queue reads as saturation
(:func:`atoll.envs.servers.implied_capacities` weighs it heavily) and drives the learned factors
down for good. So, per model and tick, before either reads them:

- **queue**: the waiting requests may have grown by at most what the interval's arrivals could
  build — ``outlier_factor`` (the rate guard's own bound, :mod:`atoll.control.rates`) x the
  requests served per second (at least one) over the interval;
- **latency**: a mean TTFT or inter-token latency longer than the interval itself, or more than
  ``LATENCY_FACTOR`` x its budget;
- **gauges**: a negative waiting or running count, a KV-cache use outside [0, 1].

A signal that fails is held as ``implausible`` (reported per model and tick, with why) and left
out: the correction sees no latency and no queue for the phase, the saturation estimate no queue
growth. It is used only when a second, independent signal confirms it — the phase's served tokens
below what the running plan was solved for (``CONFIRM_SHORTFALL``): servers that really queue
fall short of the demand they were planned for, while a lying gauge beside a plan that serves its
demand is a lie. Nothing held reaches the persisted state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from atoll.control.rates import ModelRate

LATENCY_FACTOR = 100.0  # a mean latency beyond this many budgets is no server's
CONFIRM_SHORTFALL = 0.1  # served this far (relative) below the planned demand confirms a signal
PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class Verdict:
    """One model's gate this tick: ``held`` what was left out and why; ``confirmed`` what failed a
    gate but was confirmed by the served tokens, and used."""

    model: str
    held: tuple[str, ...] = ()
    confirmed: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"held": list(self.held), "confirmed": list(self.confirmed)}


@dataclass(frozen=True)
class GateLimits:
    """The bounds of one model's signals this tick: ``interval_s`` in the servers' clock (the
    latencies' own), ``budgets_s`` (TTFT, inter-token), ``max_queue_growth`` requests, and
    ``planned_tps`` the (prefill, decode) tokens/s the running plan was solved for (None: no plan
    yet, nothing can confirm)."""

    interval_s: float
    budgets_s: tuple[float, float]
    max_queue_growth: float
    planned_tps: tuple[float, float] | None = None
    served_tps: tuple[float, float] = (0.0, 0.0)


@dataclass
class PlausibilityGate:
    """Gates each model's signals against its limits (see the module docstring); remembers the
    last plausible waiting count per model, the base a queue's growth is measured from."""

    last_waiting: dict[str, float] = field(default_factory=dict)

    def check(self, rate: ModelRate, limits: GateLimits) -> tuple[ModelRate, Verdict]:
        """The rate with its implausible, unconfirmed signals removed, and the verdict."""
        failed: dict[str, str] = {}  # signal -> why
        waiting, running, kv = rate.waiting, rate.running, rate.kv_usage
        if waiting is not None and waiting < 0:
            failed["waiting"] = f"waiting requests {waiting:g} < 0"
        elif waiting is not None:
            base = self.last_waiting.get(rate.model, 0.0)
            if waiting - base > limits.max_queue_growth:
                failed["waiting"] = (f"waiting requests grew {waiting - base:.4g} in "
                                     f"{limits.interval_s:.4g} s, "
                                     f"more than the interval's arrivals could build "
                                     f"({limits.max_queue_growth:.4g})")
        if running is not None and running < 0:
            failed["running"] = f"running requests {running:g} < 0"
        if kv is not None and not 0.0 <= kv <= 1.0:
            failed["kv_usage"] = f"KV-cache use {kv:g} outside [0, 1]"
        for name, value, budget in (("ttft", rate.ttft_mean_s, limits.budgets_s[0]),
                                    ("itl", rate.itl_mean_s, limits.budgets_s[1])):
            if value is None:
                continue
            if value > limits.interval_s:
                failed[name] = f"mean {name.upper()} {value:.4g} s is longer than the interval " \
                               f"({limits.interval_s:.4g} s)"
            elif value > LATENCY_FACTOR * budget:
                failed[name] = f"mean {name.upper()} {value:.4g} s is over {LATENCY_FACTOR:g} x its budget " \
                               f"({budget:.4g} s)"
        confirmed = self._confirmed(limits)
        held = {k: why for k, why in failed.items() if not (confirmed and k in ("waiting", "ttft", "itl"))}
        used = {k: why for k, why in failed.items() if k not in held}
        clean = rate
        if "waiting" in held or "running" in held:
            clean = replace(clean, waiting=None, running=None)
        if "kv_usage" in held:
            clean = replace(clean, kv_usage=None)
        if "ttft" in held:
            clean = replace(clean, ttft_mean_s=None, ttft_count=None, ttft_buckets=None)
        if "itl" in held:
            clean = replace(clean, itl_mean_s=None, itl_count=None, itl_buckets=None)
        if clean.waiting is not None and clean.waiting >= 0:
            self.last_waiting[rate.model] = clean.waiting
        note = " (confirmed: served below the planned demand)"
        return clean, Verdict(rate.model, tuple(held.values()), tuple(why + note for why in used.values()))

    @staticmethod
    def _confirmed(limits: GateLimits) -> bool:
        if limits.planned_tps is None:
            return False
        return any(plan > 0 and served < (1.0 - CONFIRM_SHORTFALL) * plan
                   for served, plan in zip(limits.served_tps, limits.planned_tps, strict=True))

    def forget(self, keep: Mapping[str, object]) -> None:
        self.last_waiting = {m: w for m, w in self.last_waiting.items() if m in keep}


def max_queue_growth(requests_per_s: float | None, interval_s: float, outlier_factor: float) -> float:
    """The most requests an interval's arrivals could add to a queue (see the module docstring)."""
    rps = requests_per_s if requests_per_s is not None and math.isfinite(requests_per_s) else 0.0
    return outlier_factor * max(rps, 1.0) * interval_s
