"""The live-churn benchmark's hindsight bound (benchmarks/live_churn.py): a fleet re-solved every
tick for the true demand, through the controller's own ILP, on tiny synthetic days."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from atoll.forecast.workloads import DemandSeries

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def live_churn() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("live_churn")
    finally:  # the script drops its own folder from the path as it loads
        if str(BENCHMARKS) in sys.path:
            sys.path.remove(str(BENCHMARKS))


def _day(rates: np.ndarray) -> list[DemandSeries]:
    """Three models' one-day series at 5-minute steps, each ``rates`` x its own scale."""
    return [DemandSeries(f"m{i}", 300.0, rates * scale, np.full(288, 800.0), np.full(288, 200.0))
            for i, scale in enumerate((0.5, 1.0, 0.3))]


def test_a_flat_demand_has_no_churn(live_churn: ModuleType) -> None:
    out = live_churn.hindsight(1, 2.0, _day(np.full(288, 20.0)))
    assert out["mean_instances"] > 3  # every phase holds its demand's instances
    assert out["instances_added"] == out["instances_removed"] == 0
    assert out["churn_per_hour_over_fleet"] == 0.0


def test_a_swinging_demand_churns_and_a_look_ahead_covering_the_swing_does_not(
        live_churn: ModuleType) -> None:
    # two levels, a tick each: the follower resizes every tick; the peak over two ticks is flat
    rates = np.where(np.arange(288) % 2 == 0, 10.0, 30.0)
    follow = live_churn.hindsight(1, 2.0, _day(rates))
    held = live_churn.hindsight(1, 2.0, _day(rates), look_ahead_s=600.0)
    assert follow["churn_per_hour_over_fleet"] > 1.0  # a third of the fleet in and out every tick
    assert follow["instances_added"] > 0 and follow["instances_removed"] > 0
    assert held["churn_per_hour_over_fleet"] == 0.0
    # holding the peak costs what the dips would have saved
    assert held["cost_usd_per_h"] > follow["cost_usd_per_h"]
