"""Small seeded random allocation instances and a brute-force oracle (shared by the tests)."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator

import pytest

from atoll.solvers.allocation.evaluate import evaluate_plan
from atoll.solvers.problem import Allocation, AllocationProblem, AllocationResult, SolveStatus
from atoll.solvers.types import PHASES, Phase, Service, Stage, Template

CONFIGS = ("1xA", "2xA", "1xB")
AVAILABILITY_TOL = 1e-6  # evaluate_plan's tolerance on a pool's node count


def template(model: str, phase: Phase, region: str, nodes: dict[str, int], throughput: float,
             decode_throughput: float = 0.0) -> Template:
    pairs = tuple(sorted(nodes.items()))
    flat = tuple(c for c, k in pairs for _ in range(k))
    return Template(Service(model, phase), region, pairs, (Stage(4, flat),), throughput, decode_throughput)


def random_problem(seed: int, *, n_models: int = 2, regions: tuple[str, ...] = ("r1",),
                   max_templates: int = 6, avail_max: int = 4, demand_max: float = 10.0,
                   mode: str = "cost", with_running: bool = False,
                   one_type: bool = False, colocated: bool = False) -> AllocationProblem:
    """``colocated``: templates may also be co-located (serving both services of their model, the
    decode row at a seeded ratio per model)."""
    rng = random.Random(seed)
    models = [f"m{i}" for i in range(n_models)]
    services = [Service(m, p) for m in models for p in PHASES]
    ratio: dict[str, float] = {}
    if colocated:
        services += [Service(m, Phase.COLOCATED) for m in models]
        ratio = {m: rng.choice([0.25, 0.5, 1.0, 2.0]) for m in models}
    templates: dict[str, Template] = {}
    order = iter(services)  # every service gets a template before any gets a second
    while len(templates) < max_templates:
        s = next(order, None) or rng.choice(services)
        mix: dict[str, int] = {}
        for _ in range(rng.randint(1, 2)):
            c = rng.choice(CONFIGS)
            mix[c] = mix.get(c, 0) + 1
        region = rng.choice(regions)  # drawn in this order: the seeds' instances stay as they were
        thr = float(rng.randint(2, 12))
        t = template(s.model, s.phase, region, mix, thr,
                     thr * ratio[s.model] if s.phase is Phase.COLOCATED else 0.0)
        templates.setdefault(t.key, t)
    prices = {(r, c): float(rng.randint(1, 6)) for r in regions for c in CONFIGS}
    avail = {(r, c): rng.randint(1, avail_max) for r in regions for c in CONFIGS}
    demand = {s.name: float(rng.choice([0, rng.randint(1, int(demand_max))])) for s in services
              if s.phase is not Phase.COLOCATED}
    running = None
    reopt = None
    k = 0.0
    if with_running:
        running = Allocation.of({key: rng.randint(0, 1) for key in templates})
        reopt = frozenset(rng.sample(models, rng.randint(1, n_models)))
        k = rng.choice([0.0, 0.5, 2.0])
    return AllocationProblem(tuple(templates.values()), demand, avail, prices, running=running,
                             startup_weight=k, reoptimize=reopt, mode=mode, gap=0.0,
                             one_gpu_type_per_model=one_type)


def _within_availability(problem: AllocationProblem, ranges: list[range]) -> Iterator[tuple[int, ...]]:
    """Every combination of counts from ``ranges`` whose node use fits each (region, config)'s
    availability: depth first, a branch cut as soon as a pool is over. A cut combination is one
    evaluate_plan refuses anyway (its pool check, at the same tolerance), so the enumeration stays
    exhaustive over the feasible ones; most of the product never gets to evaluate_plan."""
    uses = [[((t.region, c), k) for c, k in t.node_use] for t in problem.templates]
    usage: dict[tuple[str, str], float] = defaultdict(float)
    combo = [0] * len(ranges)

    def go(i: int) -> Iterator[tuple[int, ...]]:
        if i == len(ranges):
            yield tuple(combo)
            return
        for n in ranges[i]:
            if any(usage[rc] + n * k > problem.available(rc) + AVAILABILITY_TOL for rc, k in uses[i]):
                break  # more of this template only uses more
            for rc, k in uses[i]:
                usage[rc] += n * k
            combo[i] = n
            yield from go(i + 1)
            for rc, k in uses[i]:
                usage[rc] -= n * k
        combo[i] = 0

    yield from go(0)


def brute_force(problem: AllocationProblem) -> tuple[float, float] | None:
    """(best goodput fraction, least objective at it) over every integer allocation within
    availability (availability bounds every count, so the enumeration is exhaustive)."""
    keys = [t.key for t in problem.templates]
    ranges = []
    for t in problem.templates:
        ub = min(int(problem.available((t.region, c)) // k) for c, k in t.nodes)
        ranges.append(range(ub + 1))
    best: tuple[float, float] | None = None
    for combo in _within_availability(problem, ranges):
        ev = evaluate_plan(problem, dict(zip(keys, combo, strict=True)))
        if not ev.feasible:
            continue
        score = (-round(ev.goodput_fraction, 9), ev.objective)
        if best is None or score < (-round(best[0], 9), best[1]):
            best = (ev.goodput_fraction, ev.objective)
    return best


def with_spot_tier(base: AllocationProblem, rng: random.Random, *, discount: tuple[float, float] = (0.3, 0.7),
                   pool_max: int = 2) -> AllocationProblem:
    """``base`` with each template also in its region's spot tier, at a seeded discount and with a
    seeded spot pool (0..pool_max nodes) per (region, config); gap 0 for brute-force checks."""
    from atoll.solvers.tiers import spot_twins, tiered_region

    prices = dict(base.prices)
    avail = dict(base.availability or {})
    for (r, c), p in base.prices.items():
        prices[(tiered_region(r, "spot"), c)] = round(p * rng.uniform(*discount), 3)
        avail[(tiered_region(r, "spot"), c)] = rng.randint(0, pool_max)
    return AllocationProblem(base.templates + spot_twins(base.templates), base.demand, avail, prices,
                             gap=0.0)


def matches_brute_force(problem: AllocationProblem, res: AllocationResult) -> tuple[float, float] | None:
    """Assert that ``res`` is what exhaustive search finds — INFEASIBLE when no allocation is
    feasible, else OPTIMAL at the best goodput fraction and the least objective there — and
    return that (goodput fraction, objective), or None."""
    best = brute_force(problem)
    if best is None:
        assert res.status is SolveStatus.INFEASIBLE, res.message
        return None
    assert res.status is SolveStatus.OPTIMAL, res.message
    assert res.goodput_fraction == pytest.approx(best[0], abs=1e-6)
    assert res.objective == pytest.approx(best[1], abs=1e-6)
    return best
