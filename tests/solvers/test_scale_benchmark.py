"""The fleet-scale benchmark's instance generator and its warm re-solve (benchmarks/scale.py), on
tiny instances: seeded, copies that plan like their source, and a warm re-solve with the optimum
of a cold one."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from tiny_fleet import two_model_templates

from atoll.forecast.workloads import DemandSeries
from atoll.solvers.allocation import solve_allocation
from atoll.solvers.problem import SolveStatus

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def scale() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # the benchmark imports its sibling ``emit``
    try:
        return importlib.import_module("scale")
    finally:
        sys.path.remove(str(BENCHMARKS))


def _series() -> tuple[DemandSeries, ...]:
    """Three daily shapes (flat, a midday peak, a night peak) at 5-minute steps."""
    t = np.arange(288)
    shapes = (np.ones(288), 1 + np.sin(np.pi * t / 288) ** 4, 1.5 + np.cos(2 * np.pi * t / 288))
    return tuple(DemandSeries(f"shape{i}", 300.0, s, np.full(288, 800.0), np.full(288, 200.0))
                 for i, s in enumerate(shapes))


def _instance(scale: ModuleType, n_models: int, seed: int, cap: float = 0.0):  # noqa: ANN202
    return scale.scale_instance(two_model_templates(), n_models, seed, step=144, cap=cap, series=_series(),
                                req_per_s=0.5)


def test_instance_is_seeded_and_copies_its_sources(scale: ModuleType) -> None:
    a, b, c = _instance(scale, 6, 1), _instance(scale, 6, 1), _instance(scale, 6, 2)
    assert dict(a.problem.demand) == dict(b.problem.demand) and a.source == b.source
    assert dict(a.problem.demand) != dict(c.problem.demand)
    assert len(a.problem.demand) == 12 and all(d > 0 for d in a.problem.demand.values())
    base = {(t.service.model, t.service.phase, t.region, t.nodes): t.throughput
            for t in two_model_templates()}
    for t in a.problem.templates:
        src = a.source[t.service.model]
        assert t.service.model.startswith(src + "#")
        assert base[(src, t.service.phase, t.region, t.nodes)] == t.throughput
    assert len(a.problem.templates) == 6 * len(two_model_templates()) // 2


def test_cap_scales_with_the_fleet(scale: ModuleType) -> None:
    unlimited, capped = _instance(scale, 4, 0), _instance(scale, 4, 0, cap=150.0)
    assert unlimited.problem.availability is None
    assert set(capped.problem.availability.values()) == {6}  # floor(150 x 4 / 100)


def test_changed_demand_moves_the_chosen_share_by_the_asked_amount(scale: ModuleType) -> None:
    problem = _instance(scale, 10, 3).problem
    demand, moved = scale.changed_demand(problem, 0.3, 0.05, seed=3)
    assert len(moved) == 3
    for s, d in problem.demand.items():
        ratio = demand[s] / d
        if s.rpartition("/")[0] in moved:
            assert 0.025 - 1e-12 <= abs(ratio - 1) <= 0.05 + 1e-12
        else:
            assert ratio == 1.0
    again, moved_again = scale.changed_demand(problem, 0.3, 0.05, seed=3)
    assert again == demand and moved_again == moved


@pytest.mark.parametrize(("seed", "cap"), [(0, 0.0), (1, 0.0), (2, 150.0)])
def test_warm_resolve_has_the_cold_optimum(scale: ModuleType, seed: int, cap: float) -> None:
    problem = _instance(scale, 5, seed, cap).problem
    cold = solve_allocation(problem)
    assert cold.status is SolveStatus.OPTIMAL and cold.allocation is not None
    # a bigger move than the benchmark's, so the plan must change
    demand, moved = scale.changed_demand(problem, 0.4, 0.6, seed)
    for reopt in (moved, None):
        warm, _, _ = scale.resolve(problem, cold.allocation, demand, reopt)
        ref, _, _ = scale.resolve(problem, cold.allocation, demand, reopt, warm=False)
        assert warm.status is SolveStatus.OPTIMAL and ref.status is SolveStatus.OPTIMAL
        assert warm.warm_start_accepted is not None
        assert math.isclose(warm.objective, ref.objective, rel_tol=problem.gap, abs_tol=1e-6)
        served = {s: c for s, c in warm.capacity.items()}
        for s, d in demand.items():
            if reopt is None or s.rpartition("/")[0] in reopt:
                assert served.get(s, 0.0) >= d - 1e-6
