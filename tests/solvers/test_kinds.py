"""The sliced ILP over slice kinds equals the ILP over every placement (and brute force).

Instances: engines of one model on L4 slices and whole nodes of 1/2/4/8 L4s and 8xH100 slices,
every engine in every placement its kinds allow (complete groups), sometimes one placement
missing (an incomplete group keeps per-template columns). The plain model is the reference
(itself tested against brute force in test_slices), and brute force on the smallest ones.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from atoll.solvers.allocation import evaluate_plan, kinds, solve_allocation
from atoll.solvers.allocation.reduction import RoundInstance
from atoll.solvers.packing import check_packing
from atoll.solvers.problem import AllocationProblem, Risk, SolveStatus
from atoll.solvers.tiers import tiered_region
from atoll.solvers.types import PHASES, Service, Stage, Template

REGION = "aws:us-east-2"
MODEL = "Phi-4-14B"  # 40 layers


def _configs(gpu: str, g: int, sizes: list[int]) -> list[str]:
    return [f"{g}x{gpu}" if size == g else f"{g}/{size}x{gpu}" for size in sizes if size >= g]


def _engine(svc: Service, region: str, configs: list[str], throughput: float) -> Template:
    n = len(configs)
    stages = tuple(Stage(40 // n + (40 % n if j == 0 else 0), (c,)) for j, c in enumerate(configs))
    counts: dict[str, int] = {}
    for c in configs:
        counts[c] = counts.get(c, 0) + 1
    return Template(svc, region, tuple(sorted(counts.items())), stages, throughput)


def _library(rng: random.Random, regions: list[str], drop: float,
             per_service: int = 3) -> tuple[list[Template], dict]:
    """Engine shapes (kind of lead, kind of workers, stages) in every placement; with probability
    ``drop`` one placement of a group is left out."""
    l4_sizes = sorted(rng.sample([1, 2, 4, 8], rng.choice([2, 3])))
    shapes = [(("L4", 1), ("L4", 1), 1), (("L4", 2), ("L4", 2), 2), (("L4", 1), ("L4", 1), 3),
              (("H100", 2), ("H100", 2), 1), (("H100", 2), ("L4", 2), 2), (("H100", 4), ("H100", 4), 3)]
    templates: list[Template] = []
    prices: dict[tuple[str, str], float] = {}
    for region in regions:
        scale = rng.uniform(0.5, 1.0) if "spot" in region else 1.0
        for size in l4_sizes:
            prices[(region, f"{size}xL4")] = round(size * rng.uniform(0.7, 1.0) * scale, 3)
        prices[(region, "8xH100")] = round(rng.uniform(40, 60) * scale, 3)
        sizes = {"L4": l4_sizes, "H100": [8]}
        for phase in PHASES:
            svc = Service(MODEL, phase)
            for lead, worker, n in rng.sample(shapes, per_service):
                leads = _configs(lead[0], lead[1], sizes[lead[0]])
                workers = _configs(worker[0], worker[1], sizes[worker[0]])
                if not leads or not workers:
                    continue
                thr = rng.uniform(1.0, 4.0)
                seen: set[tuple[str, ...]] = set()
                group = []
                for la, w in itertools.product(leads, workers):
                    placement = [la] if n == 1 else [la] + [w] * (n - 1)
                    if tuple(sorted(placement)) in seen:
                        continue
                    seen.add(tuple(sorted(placement)))
                    group.append(_engine(svc, region, placement, thr))
                if len(group) > 1 and rng.random() < drop:
                    group.pop(rng.randrange(len(group)))
                templates.extend(group)
    return templates, prices


def _plain(problem: AllocationProblem, monkeypatch: pytest.MonkeyPatch, **kw: object) -> object:
    with monkeypatch.context() as m:
        m.setattr(kinds, "supports", lambda inst: False)
        return solve_allocation(problem, **kw)


def _demand(rng: random.Random) -> dict[str, float]:
    return {Service(MODEL, ph).name: rng.uniform(2.0, 12.0) for ph in PHASES}


def _check(problem: AllocationProblem, res: object) -> None:
    assert res.status is SolveStatus.OPTIMAL, res.message
    ev = evaluate_plan(problem, res.allocation)
    assert ev.feasible, ev.violations
    assert ev.cost_per_hour == pytest.approx(res.cost_per_hour)
    assert check_packing(problem, res.allocation, res.packing) == []


def _same_as_plain(problem: AllocationProblem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kinds model's plan is feasible, packed and as good as the plain model's (infeasible
    when it is; the same served share in goodput mode)."""
    ref = _plain(problem, monkeypatch)
    res = solve_allocation(problem)
    if ref.status is SolveStatus.INFEASIBLE:
        assert res.status is SolveStatus.INFEASIBLE
        return
    _check(problem, res)
    assert res.objective == pytest.approx(ref.objective, rel=1e-6, abs=1e-6)
    assert res.cost_per_hour == pytest.approx(ref.cost_per_hour, rel=1e-6, abs=1e-6)
    if problem.mode == "goodput":
        assert res.goodput_fraction == pytest.approx(ref.goodput_fraction, abs=1e-6)


def test_groups_fold_every_placement_of_an_engine() -> None:
    """A complete library folds to one column per engine shape (n >= 3: per worker config), and
    the columns' members are the library's templates."""
    rng = random.Random(3)
    templates, prices = _library(rng, [REGION], drop=0.0)
    problem = AllocationProblem(tuple(templates), _demand(rng), None, prices)
    inst = RoundInstance(problem, frozenset())
    groups, loose = kinds.group_templates(inst)
    assert loose == []
    assert sum(len(g.members) for g in groups) == len(templates)
    assert {k for g in groups for k in g.members.values()} == {t.key for t in templates}
    assert len(groups) < len(templates)


def test_kinds_equal_the_plain_sliced_ilp(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(2031)
    seen_loose = 0
    for _ in range(30):
        templates, prices = _library(rng, [REGION], drop=0.3)
        avail = {rc: rng.choice([1, 2, 3, None]) for rc in prices}
        avail = None if rng.random() < 0.3 else {rc: (99 if v is None else v) for rc, v in avail.items()}
        problem = AllocationProblem(tuple(templates), _demand(rng), avail, prices)
        seen_loose += bool(kinds.group_templates(RoundInstance(problem, frozenset()))[1])
        _same_as_plain(problem, monkeypatch)
    assert seen_loose >= 3  # incomplete groups were exercised


def test_kinds_equal_brute_force_on_small_libraries() -> None:
    rng = random.Random(44)
    checked = 0
    for _ in range(40):
        templates, prices = _library(rng, [REGION], drop=0.0, per_service=1)
        if len(templates) > 8:
            continue
        problem = AllocationProblem(tuple(templates), _demand(rng), {rc: 3 for rc in prices}, prices)
        res = solve_allocation(problem)
        top = max([4, *(n for _, n in res.allocation.counts)] if res.allocation else [4])
        if (top + 1) ** len(templates) > 2_000_000:
            continue
        grid = np.array(list(itertools.product(range(top + 1), repeat=len(templates))), dtype=np.float64)
        pools = sorted(prices)
        use = np.array([[dict(t.node_use).get(c, 0.0) for _, c in pools] for t in templates])
        nodes = np.ceil(grid @ use - 1e-9)
        ok = np.all(nodes <= 3, axis=1)
        for s, d in problem.demand.items():
            thr = np.array([t.throughput if t.service.name == s else 0.0 for t in templates])
            ok &= grid @ thr >= d * (1 - 1e-9)
        if not ok.any():
            assert res.status is SolveStatus.INFEASIBLE
            continue
        best = float((nodes @ np.array([prices[rc] for rc in pools]))[ok].min())
        _check(problem, res)
        assert res.cost_per_hour == pytest.approx(best, rel=1e-6)
        checked += 1
    assert checked >= 5


def test_kinds_equal_the_plain_ilp_from_a_running_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-plans: start-up weight, removal price, grow, a partial re-optimization, warm starts."""
    rng = random.Random(7)
    accepted = 0
    for case in range(24):
        templates, prices = _library(rng, [REGION], drop=0.2 if case % 2 else 0.0)
        first = AllocationProblem(tuple(templates), _demand(rng), None, prices)
        running = _plain(first, monkeypatch).allocation
        assert running is not None
        kw: dict[str, object] = {"running": running, "startup_weight": rng.choice([0.0, 0.3, 1.0]),
                                 "removal_weight": rng.choice([0.0, 0.25, 1.0])}
        if case % 3 == 1:
            kw["grow"] = frozenset({MODEL})
        problem = first.with_changes(demand={s: d * rng.uniform(0.4, 1.8) for s, d in first.demand.items()},
                                     **kw)
        ref = _plain(problem, monkeypatch, warm_start=running)
        cold = solve_allocation(problem)
        warm = solve_allocation(problem, warm_start=running)
        for res in (cold, warm):
            _check(problem, res)
            assert res.objective == pytest.approx(ref.objective, rel=1e-6, abs=1e-6)
        if evaluate_plan(problem, running).feasible:  # a start that meets the new demand is taken
            assert warm.warm_start_accepted is not False  # None: nothing was left to solve
            accepted += warm.warm_start_accepted is True
    assert accepted >= 3


def test_kinds_in_goodput_mode_and_with_risk(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(12)
    spot = tiered_region(REGION, "spot")
    other = "gcp:us-central1"
    for case in range(16):
        templates, prices = _library(rng, [REGION, spot, other], drop=0.2)
        if case % 2:
            problem = AllocationProblem(tuple(templates), {s: d * 4 for s, d in _demand(rng).items()},
                                        {rc: 1 for rc in prices}, prices, mode="goodput")
        else:
            risk = Risk(headroom=rng.choice([1.0, 0.8]), spread=rng.choice([1.0, 0.6]),
                        ondemand_floor=rng.choice([0.0, 0.3]))
            problem = AllocationProblem(tuple(templates), _demand(rng), None, prices).with_risk(risk)
        _same_as_plain(problem, monkeypatch)


def test_a_placement_that_does_not_add_up_is_reported_not_guessed() -> None:
    """values() returns None for a column whose slices were not all placed (extract then fails
    the round with a message instead of inventing a placement)."""
    rng = random.Random(3)
    templates, prices = _library(rng, [REGION], drop=0.0)
    problem = AllocationProblem(tuple(templates), _demand(rng), None, prices)
    inst = RoundInstance(problem, frozenset())
    km = kinds.build_kind_model(inst, "cost")
    for col in km.columns:
        col.var.varValue = 0.0
    for z in km.place.values():
        z.varValue = 0.0
    for v in km.count.values():
        v.varValue = 0.0
    km.columns[0].var.varValue = 1.0
    values = km.values()
    assert any(v is None for v in values.values())
    assert math.isclose(sum(v for v in values.values() if v is not None), 0.0)
