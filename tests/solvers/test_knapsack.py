"""The covering search answers a block of one demand row exactly: on random seeded instances its
plan covers the demand within each template's bound, its cost is the plan's own, its bound is at
most brute force's optimum and within the gap of its cost; a start within the gap stands; past
its node limit it gives up (HiGHS answers instead); through DirectRun it equals HiGHS."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from alloc_instances import random_problem

from atoll.solvers.allocation import direct
from atoll.solvers.allocation.blocks import split_blocks
from atoll.solvers.allocation.direct import DirectRun
from atoll.solvers.allocation.highs import status_of
from atoll.solvers.allocation.knapsack import cover
from atoll.solvers.allocation.reduction import RoundInstance
from atoll.solvers.problem import SolveStatus


def _instance(seed: int) -> dict:
    rng = random.Random(seed)
    n = rng.randint(1, 5)
    costs = [float(rng.randint(0, 6)) * rng.choice([1.0, 0.37]) for _ in range(n)]
    k = rng.choice([0.0, 0.5, 2.0])
    return {
        "costs": costs, "extra": [c * (1 + k) for c in costs],
        "held": [rng.randint(0, 2) for _ in range(n)], "units": [rng.randint(0, 3) for _ in range(n)],
        "widths": [float(rng.choice([0, 1, 2, 3, 5, 7])) * rng.choice([1.0, 1.5]) for _ in range(n)],
        "demand": float(rng.choice([0, rng.randint(1, 20)])) + rng.choice([0.0, 0.25]),
        "gap": rng.choice([0.0, 1e-4, 0.2]),
        "start": [rng.randint(0, 3) for _ in range(n)] if rng.random() < 0.5 else None,
    }


def _cost(inst: dict, x: tuple[int, ...] | list[int]) -> float:
    return sum(c * min(q, h) + e * max(q - h, 0)
               for c, e, h, q in zip(inst["costs"], inst["extra"], inst["held"], x, strict=True))


def _covers(inst: dict, x: tuple[int, ...] | list[int]) -> bool:
    return sum(w * q for w, q in zip(inst["widths"], x, strict=True)) >= inst["demand"] - 1e-9


@pytest.mark.parametrize("seed", range(400))
def test_the_search_equals_brute_force(seed: int) -> None:
    inst = _instance(seed)
    plans = [x for x in itertools.product(*[range(u + 1) for u in inst["units"]]) if _covers(inst, x)]
    optimum = min((_cost(inst, x) for x in plans), default=math.inf)
    found = cover(inst["costs"], inst["extra"], inst["held"], inst["units"], inst["widths"], inst["demand"],
                  gap=inst["gap"], start=inst["start"])
    assert found is not None
    if optimum == math.inf:
        assert found.counts is None
        return
    x = found.counts
    assert x is not None and _covers(inst, x)
    assert all(0 <= q <= u for q, u in zip(x, inst["units"], strict=True))
    assert found.objective == pytest.approx(_cost(inst, x), abs=1e-9)
    assert found.bound <= optimum + 1e-9
    assert found.objective - found.bound <= inst["gap"] * found.objective + 1e-9
    if inst["gap"] == 0:
        assert found.objective == pytest.approx(optimum, abs=1e-9)


def test_a_start_within_the_gap_stands_and_a_worse_one_does_not() -> None:
    # two templates of equal throughput; the start runs the dearer one
    args = ([1.0, 1.05], [2.0, 2.1], [1, 1], [2, 2], [10.0, 10.0], 10.0)
    kept = cover(*args, gap=0.1, start=[0, 1])
    assert kept is not None and kept.counts == (0, 1)
    moved = cover(*args, gap=0.01, start=[0, 1])
    assert moved is not None and moved.counts == (1, 0)


def test_past_its_node_limit_the_search_gives_up() -> None:
    rng = random.Random(5)
    n = 12
    widths = [rng.uniform(1, 3) for _ in range(n)]
    costs = [w * rng.uniform(0.99, 1.01) for w in widths]  # near-equal ratios: a wide tree
    args = (costs, costs, [0] * n, [5] * n, widths, 40.0)
    assert cover(*args, gap=0.0, node_limit=50) is None
    full = cover(*args, gap=0.0, node_limit=10**7)
    assert full is not None and full.counts is not None and full.nodes > 50


def test_a_negative_cost_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="costs must be >= 0 and extra >= costs"):
        cover([-1.0], [-1.0], [0], [1], [1.0], 1.0, gap=0.0)


@pytest.mark.parametrize("seed", range(30))
def test_through_the_array_path_the_search_equals_highs(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    problem = random_problem(900 + seed, n_models=2, max_templates=8, avail_max=4, with_running=True)
    inst = RoundInstance(problem, frozenset(), frozenset(k for k, _ in problem.running.counts)
                         if problem.running else frozenset())
    for block in split_blocks(inst) if inst.free else []:
        monkeypatch.setattr(direct, "_ANSWERS", type(direct._ANSWERS)())
        ours = DirectRun(block, problem.running, None, problem.gap)
        monkeypatch.setattr(direct, "_ANSWERS", type(direct._ANSWERS)())
        monkeypatch.setattr(direct, "cover", lambda *a, **k: None)
        theirs = DirectRun(block, problem.running, None, problem.gap)
        monkeypatch.undo()
        assert theirs.engine == "highs"
        # a block of one demand row and no availability row is the search's (tiny: no limit hit)
        assert (ours.engine == "search") == (ours._knapsack is not None)
        assert status_of(ours) is status_of(theirs)
        if status_of(theirs) is SolveStatus.OPTIMAL:
            assert ours.column_objective == pytest.approx(theirs.column_objective, abs=1e-9)
            assert ours.bound is not None and ours.bound <= theirs.column_objective + 1e-9
    with pytest.raises(ValueError, match="extra >= costs"):
        cover([2.0], [1.0], [1], [2], [1.0], 2.0, gap=0.0)
