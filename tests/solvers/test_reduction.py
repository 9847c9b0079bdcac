"""The memoized dominance pass of a round (``reduction._reduced``) against the full one."""

from __future__ import annotations

import random

import pytest
from alloc_instances import random_problem

from atoll.solvers.allocation import reduction
from atoll.solvers.allocation.reduction import RoundInstance
from atoll.solvers.problem import Allocation, AllocationProblem


def _full(problem: AllocationProblem, rows: frozenset[tuple[str, str]] | None, keep: frozenset[str],
          monkeypatch: pytest.MonkeyPatch) -> RoundInstance:
    with monkeypatch.context() as m:
        m.setattr(reduction, "_reduced", lambda *args: None)
        return RoundInstance(problem, rows, keep)


@pytest.mark.parametrize("seed", range(40))
def test_memoized_reduction_keeps_what_the_full_pass_keeps(seed: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    base = random_problem(seed, n_models=3, regions=("r1", "r2"), max_templates=14,
                          with_running=seed % 2 == 1)
    for step in range(8):  # a re-plan sequence: demand moves, sometimes to zero; availability too
        demand = {s: (0.0 if rng.random() < 0.15 else d * rng.uniform(0.5, 1.6) + rng.random())
                  for s, d in base.demand.items()}
        avail = {rc: (v if rng.random() < 0.7 else rng.randint(0, 4)) for rc, v in base.availability.items()}
        running = Allocation.of({k: rng.randint(0, 2) for k in rng.sample(list(base.index.keys), 2)}) \
            if step % 3 == 2 else base.running
        p = base.with_changes(demand=demand, availability=avail, running=running)
        keep = frozenset(rng.sample(list(p.index.keys), 1))
        # the same round at 1% more demand is a memo hit, and still the full pass's answer
        more = p.with_changes(demand={s: d * 1.01 for s, d in demand.items()})
        for q, rows in ((p, frozenset()), (p, None), (p, frozenset(list(p.prices)[:2])), (more, frozenset())):
            entries = sum(len(m) for m in reduction._PRUNED.values())
            got = RoundInstance(q, rows, keep)
            if q is more and any(d > 0 for d in demand.values()):
                assert sum(len(m) for m in reduction._PRUNED.values()) == entries
            want = _full(q, rows, keep, monkeypatch)
            assert got.free == want.free
            assert got.bound == want.bound
            assert got.services == want.services


def test_a_demand_too_small_for_a_bound_of_one_takes_the_full_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    p = random_problem(3, n_models=2, max_templates=8)
    tiny = {s: (1e-12 if d > 0 else 0.0) for s, d in p.demand.items()}
    q = p.with_changes(demand=tiny)
    calls: list[object] = []
    real = reduction._front
    monkeypatch.setattr(reduction, "_front", lambda *a: calls.append(a) or real(*a))
    got = RoundInstance(q, frozenset(), frozenset())
    assert got.free == _full(q, frozenset(), frozenset(), monkeypatch).free
    assert calls  # the full pass ran its front


@pytest.mark.parametrize("seed", range(12))
def test_a_correction_chain_ranks_and_rescales_as_a_fresh_pass_does(seed: int) -> None:
    """Each correction rescales from the previous one (``near``): its templates, groups and
    ranking equal those of a rescale from scratch and of a full sort."""
    import numpy as np

    from atoll.solvers.problem import Risk

    rng = np.random.default_rng(seed)
    base = random_problem(seed, n_models=3, regions=("r1", "r2"), max_templates=16)
    if seed % 3 == 0:  # a risk splits the groups by region
        base = base.with_changes(risk={base.models[0]: Risk(headroom=0.8)})
    scale = np.ones(len(base.templates))
    near = None
    for _ in range(6):
        moved = rng.random(len(scale)) < 0.3
        scale = np.where(moved, rng.choice([1.0, 0.9, 1.1, 1.2], len(scale)), scale)
        index = base.index.rescaled(scale, near=near)
        fresh = base.index.rescaled(scale)
        assert index.templates == fresh.templates and dict(index.by_key) == dict(fresh.by_key)
        assert dict(index.by_service) == dict(fresh.by_service)
        p = base.with_changes(templates=index.templates)
        assert p.index is index
        key = (tuple(p.prices[rc] for rc in index.rcs), tuple(sorted(p.risk)) if p.risk else ())
        ranked = reduction._ranking(p, *key)
        full = np.lexsort((np.arange(len(index.keys)), -index.throughput, p.costs, reduction._groups(p)))
        assert np.array_equal(ranked, full)
        near = index
