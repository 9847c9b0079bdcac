"""Exact placement vs brute force vs the Coral placement ILP, on seeded random small node sets."""

from __future__ import annotations

import itertools
import random
from functools import cache

import pytest
from placement_ilp import solve_placement

from atoll.solvers.catalog import load_catalog
from atoll.solvers.perf import PerfFactors, RequestShape, node_profile
from atoll.solvers.placement import best_placement
from atoll.solvers.types import PHASES, ModelSpec, NodeConfig, Phase, Slo

CATALOG = load_catalog()
FACTORS = PerfFactors()
SHAPE = RequestShape(512, 128)
# Heavy layers (7.5 GB bf16 each) so that memory binds: a 1xL4 holds 2, a 4xL40S about 22.
TOY = {
    layers: ModelSpec(name=f"toy{layers}", layers=layers, hidden=4096, heads=32, kv_heads=8,
                      head_dim=128, params_b=3.75 * layers, active_params_b=3.75 * layers,
                      bytes_per_param=2.0, slo=Slo(900, 60))
    for layers in range(4, 8)
}
POOL = [CATALOG.config(n) for n in ("1xL4", "1xA10G", "1xL40S", "4xL4", "4xA10G", "1xH100", "2xA100-80GB")]


@cache
def _prof(model: ModelSpec, cfg: NodeConfig, j: int, phase: Phase, budget: float, send: bool) -> float:
    return node_profile(model, cfg, j, phase, budget, shape=SHAPE, factors=FACTORS, send_activations=send)


def _compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    return [tuple(b - a for a, b in zip((0, *cuts), (*cuts, total), strict=True))
            for cuts in itertools.combinations(range(1, total), parts - 1)]


def brute_force(model: ModelSpec, nodes: list[NodeConfig], phase: Phase) -> float:
    """Every stage count, every ordered assignment of nodes to stages, every layer composition."""
    budget = model.slo.budget_ms(phase)
    best = 0.0
    for s in range(1, min(len(nodes), model.layers) + 1):
        for assign in itertools.product(range(s), repeat=len(nodes)):
            if len(set(assign)) < s:
                continue
            for comp in _compositions(model.layers, s):
                thr = min(
                    sum(_prof(model, nodes[i], comp[st], phase, budget / s, st < s - 1)
                        for i in range(len(nodes)) if assign[i] == st)
                    for st in range(s)
                )
                best = max(best, thr)
    return best


def _random_case(rng: random.Random) -> tuple[ModelSpec, list[NodeConfig], Phase]:
    n = rng.choice((1, 2, 2, 3, 3, 3, 4))
    return rng.choice(list(TOY.values())), [rng.choice(POOL) for _ in range(n)], rng.choice(list(PHASES))


def _recompute(model: ModelSpec, phase: Phase, stages: tuple) -> float:
    s = len(stages)
    return min(sum(_prof(model, CATALOG.config(c), st.layers, phase, model.slo.budget_ms(phase) / s,
                         k < s - 1) for c in st.nodes) for k, st in enumerate(stages))


def test_exact_equals_brute_force_and_ilp_on_200_random_sets() -> None:
    rng = random.Random(20240611)
    positive = 0
    for _ in range(200):
        model, nodes, phase = _random_case(rng)
        budget = model.slo.budget_ms(phase)
        exact, stages = best_placement(model, nodes, phase, budget, shape=SHAPE, factors=FACTORS)
        oracle = brute_force(model, nodes, phase)
        ilp, ilp_stages = solve_placement(model, nodes, phase, budget, shape=SHAPE, factors=FACTORS)
        assert exact == pytest.approx(oracle, rel=1e-9, abs=1e-9), (model.name, nodes, phase)
        assert ilp == pytest.approx(oracle, rel=1e-6, abs=1e-6), (model.name, nodes, phase)
        if exact > 0:
            positive += 1
            assert sum(st.layers for st in stages) == model.layers
            assert sorted(c for st in stages for c in st.nodes) == sorted(c.name for c in nodes)
            assert _recompute(model, phase, stages) == pytest.approx(exact, rel=1e-12)
            assert _recompute(model, phase, ilp_stages) == pytest.approx(ilp, rel=1e-12)
        else:
            assert stages == ()
    assert positive >= 100  # the cases must mostly be servable to test anything


def test_cbc_agrees_with_highs() -> None:
    model = TOY[6]
    nodes = [CATALOG.config("1xL40S"), CATALOG.config("1xL4"), CATALOG.config("4xA10G")]
    highs, _ = solve_placement(model, nodes, Phase.DECODE, 60.0, shape=SHAPE, factors=FACTORS)
    cbc, _ = solve_placement(model, nodes, Phase.DECODE, 60.0, shape=SHAPE, factors=FACTORS,
                             solver="cbc")
    assert highs > 0
    assert cbc == pytest.approx(highs, rel=1e-6)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="configs"):
        solve_placement(TOY[5], [], Phase.DECODE, 60.0)
    with pytest.raises(ValueError, match="valid solvers: highs, cbc"):
        solve_placement(TOY[5], POOL[:1], Phase.DECODE, 60.0, solver="gurobi")
