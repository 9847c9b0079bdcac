"""The closed loop, live: a replayed fleet that serves its plan in a world off the model, and a
controller that learns the world from the replay's vLLM metrics.

:func:`run_live_loop` wires the two in-process on a shared fake clock — a
:class:`~atoll.control.replay.ReplayExporter` serving (``served=``) the plans the controller
delivers to a ``json:DIR`` sink, and a :class:`~atoll.control.controller.Controller` scraping it
every ``interval_s`` trace seconds — and returns, per tick, the learned planning factors against
the world's true ones and each phase's planning demand against its measured rate. It is what the
closed-loop benchmark measures and its test checks, so neither needs a network or a second
process; ``atoll replay --plans DIR --capacity-error S`` runs the same replay for real.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from atoll.control.controller import Controller, ControllerSettings
from atoll.control.live_fleet import LiveFleet
from atoll.control.metrics import ScrapeSource
from atoll.control.replay import ReplayExporter
from atoll.control.served import ServedFleet, latest_plan
from atoll.control.sinks import JsonDirSink
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import PolicySpec
from atoll.forecast.workloads import DemandSeries

EVERY_STEP = PolicySpec("fixed", every=1)  # the loop's default rule: re-plan every tick


@dataclass
class _Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class LiveLoopResult:
    """Per tick: the trace time, the largest relative error of a learned factor over the families
    that have served (``None`` before any), each factor's error, and per model and phase the
    planning demand / (measured rate x the forecast's headroom)."""

    ticks: list[dict[str, Any]]
    truth: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return {"ticks": self.ticks, "truth": self.truth}


def run_live_loop(fleet: LiveFleet, series: Sequence[DemandSeries], models: Sequence[str], workdir: Path, *,
                  capacity_error: str | float = 0.0, seed: int = 0, ticks: int = 24,
                  interval_s: float = 300.0, speedup: float = 60.0, start_day: int = 11,
                  policy: PolicySpec = EVERY_STEP) -> LiveLoopResult:
    """Run ``ticks`` controller ticks against a served replay (see the module docstring)."""
    wall = _Clock()
    plans = workdir / "plans"
    served = ServedFleet(fleet.model, latest_plan(plans), capacity_error=capacity_error, seed=seed)
    start_s = (start_day - 1) * 86400.0
    out: list[dict[str, Any]] = []
    with ReplayExporter(series, models, speedup=speedup, clock=wall, start_s=start_s,
                        served=served) as exporter:
        controller = Controller(fleet, ScrapeSource(exporter.url, clock=wall),
                                make_policy(policy, len(fleet.models)),
                                JsonDirSink(plans), workdir / "state",
                                settings=ControllerSettings(interval_s=interval_s, time_scale=speedup),
                                clock=lambda: start_s + speedup * wall(), sleep=lambda s: None)
        for _ in range(ticks):
            report = controller.tick()
            factors = controller.correction.factors()
            errors = {f: abs(k / served.truth.get(f, 1.0) - 1.0) for f, k in factors.items()}
            row: dict[str, Any] = {"time_s": report.time_s, "factors": factors, "errors": errors,
                                   "max_error": max(errors.values()) if errors else None, "phases": {}}
            if report.solve is not None:
                demand = report.solve.get("demand_tokens_per_s", {})
                for m in fleet.models:
                    rate, f = report.metrics["rates"].get(m), report.forecast.get(m)
                    if not rate or not f or f"{m}/prefill" not in demand:
                        continue
                    for phase, key in (("prefill", "prompt_tokens_per_s"),
                                       ("decode", "generation_tokens_per_s")):
                        mean, measured = f[f"{phase}_mean"], rate.get(key)
                        if mean and measured:
                            headroom = f[f"{phase}_upper"] / mean
                            row["phases"][f"{m}/{phase}"] = demand[f"{m}/{phase}"] / (measured * headroom)
            out.append(row)
            wall.now += interval_s / speedup
    return LiveLoopResult(out, dict(served.truth))


def family_error_after(result: LiveLoopResult, ticks: int) -> dict[str, float]:
    """Each family's relative error ``ticks`` ticks after it first appeared among the learned."""
    first: dict[str, int] = {}
    out: dict[str, float] = {}
    for i, row in enumerate(result.ticks):
        for f, e in row["errors"].items():
            first.setdefault(f, i)
            if i - first[f] == ticks:
                out[f] = e
    return out


def summary(result: LiveLoopResult, hour_ticks: int) -> dict[str, Any]:
    after = family_error_after(result, hour_ticks)
    ratios = [v for row in result.ticks[1:] for v in row["phases"].values()]
    return {"families_learned": len(result.ticks[-1]["factors"]) if result.ticks else 0,
            "families_after_1h": len(after),
            "max_error_after_1h": max(after.values()) if after else None,
            "within_5pct_after_1h": float(np.mean([e <= 0.05 for e in after.values()])) if after else None,
            "final_max_error": result.ticks[-1]["max_error"] if result.ticks else None,
            "planning_demand_over_measured_x_headroom": {
                "min": min(ratios) if ratios else None, "max": max(ratios) if ratios else None}}
