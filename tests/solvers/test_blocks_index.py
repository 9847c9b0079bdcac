"""``split_blocks`` reads each free template's demand rows and node entries from the library's
index arrays; its blocks must be those of one pass over the template objects (the reference
below), on random rounds with co-located templates, enforced rows and corrected libraries."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pytest
from alloc_instances import random_problem

from atoll.solvers.allocation.blocks import split_blocks
from atoll.solvers.allocation.reduction import RoundInstance


def _reference(inst: RoundInstance) -> list[tuple[list[str], list[str]]]:
    """(services, free keys) of each block, from the template objects."""
    p = inst.problem
    parent = {s: s for s in inst.services}

    def find(s: str) -> str:
        while parent[s] != s:
            s = parent[s]
        return s

    owner: dict[tuple[str, str], str] = {}
    service_of: dict[str, str] = {}
    served: set[str] = set()
    for key in inst.free:
        t = p.template(key)
        rows = [name for name, _ in t.covers if name in parent] or [t.service.name]
        served.update(rows)
        s = service_of[key] = rows[0]
        for other in rows[1:]:
            a, b = find(s), find(other)
            if a != b:
                parent[b] = a
        for c, _k in t.node_use:
            rc = (t.region, c)
            if rc in inst.rows:
                a, b = find(owner.setdefault(rc, s)), find(s)
                if a != b:
                    parent[b] = a
    if len(served & set(inst.services)) < len(inst.services):
        return [(list(inst.services), list(inst.free))]
    groups: dict[str, list[str]] = defaultdict(list)
    for s in inst.services:
        groups[find(s)].append(s)
    if len(groups) < 2:
        return [(list(inst.services), list(inst.free))]
    free_of: dict[str, list[str]] = defaultdict(list)
    for key in inst.free:
        free_of[find(service_of[key])].append(key)
    return [(services, free_of[root]) for root, services in groups.items()]


@pytest.mark.parametrize("colocated", [False, True])
@pytest.mark.parametrize("seed", range(16))
def test_blocks_from_the_index_are_the_blocks_of_the_templates(seed: int, colocated: bool) -> None:
    rng = random.Random(seed)
    problem = random_problem(900 + seed, n_models=rng.choice([2, 3, 4]), regions=("r1", "r2", "r3"),
                             max_templates=7, avail_max=3, with_running=seed % 2 == 0, colocated=colocated)
    if seed % 4 == 1:
        scale = np.asarray([rng.choice([1.0, 0.9, 1.2]) for _ in problem.templates])
        problem = problem.with_changes(templates=problem.index.rescaled(scale).templates)
    rows = frozenset(rng.sample(sorted(problem.prices), rng.randint(0, len(problem.prices))))
    for inst in (RoundInstance(problem, r) for r in (rows, frozenset(), None)):
        if not inst.free:
            continue
        blocks = split_blocks(inst)
        got = [(list(b.services), list(b.free)) for b in blocks]
        assert got == _reference(inst)
        for b in blocks:  # each block's positions are its own free templates'
            assert b.free_pos.tolist() == [problem.index.position[k] for k in b.free]


def test_built_entries_one_gather_equals_the_ragged_expansion() -> None:
    """A library whose templates each have one node entry takes one gather; it must give what
    the general (ragged) expansion gives, on every round."""
    fast = 0
    for seed in range(40):
        rng = random.Random(seed)
        problem = random_problem(300 + seed, n_models=2, regions=("r1", "r2"), max_templates=6, avail_max=3,
                                 with_running=True)
        if problem.index.one_entry_rc is None:
            continue
        fast += 1
        rows = frozenset(rng.sample(sorted(problem.prices), rng.randint(1, len(problem.prices))))
        for inst in (RoundInstance(problem, r) for r in (rows, None)):
            pos = np.asarray([problem.index.position[k] for k in inst.free], dtype=np.intp)
            gathered = inst.built_entries(pos)
            problem.index.__dict__["one_entry_rc"] = None  # the general path, on the same round
            try:
                ragged = inst.built_entries(pos)
            finally:
                del problem.index.__dict__["one_entry_rc"]
            assert all(np.array_equal(a, b) for a, b in zip(gathered, ragged, strict=True))
    assert fast >= 3
