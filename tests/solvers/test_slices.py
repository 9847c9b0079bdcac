"""Slices of a node under the vllm runtime, the ILP that buys whole nodes, and the
packing (node -> slices) a plan carries."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from pathlib import Path

import numpy as np
import pytest

from atoll.solvers.allocation import evaluate_plan, solve_allocation
from atoll.solvers.catalog import load_catalog
from atoll.solvers.models import get_model
from atoll.solvers.packing import (
    PackedNode,
    Packing,
    PlacedSlice,
    check_packing,
    first_fit_decreasing,
    pack_plan,
)
from atoll.solvers.perf import RequestShape
from atoll.solvers.problem import Allocation, AllocationProblem, SolveStatus
from atoll.solvers.runtime import multiset_ok, template_problem, vllm_multisets, with_slices
from atoll.solvers.templates import LibrarySpec, build_library, enumerate_multisets
from atoll.solvers.types import (
    PHASES,
    NodeConfig,
    Phase,
    Service,
    Stage,
    Template,
    node_config_of,
    node_share,
)

REGION = "aws:us-east-2"
H100_ONLY = LibrarySpec(models=("Phi-4-14B", "GPT-OSS-20B"), regions=(REGION,), gpu_types=("H100",),
                        n_max=4, runtime="vllm", slices=True)


# ---- packing exactness: first-fit decreasing against brute-force bin packing ----

def _min_bins(sizes: list[int], capacity: int) -> int:
    """Fewest bins of ``capacity`` holding ``sizes`` (exhaustive: each item into every open bin
    or a new one)."""
    best = len(sizes)
    order = sorted(sizes, reverse=True)

    def place(i: int, fills: list[int]) -> None:
        nonlocal best
        if len(fills) >= best:
            return
        if i == len(order):
            best = len(fills)
            return
        for b in range(len(fills)):
            if fills[b] + order[i] <= capacity:
                fills[b] += order[i]
                place(i + 1, fills)
                fills[b] -= order[i]
        place(i + 1, [*fills, order[i]])

    place(0, [])
    return best


def test_ffd_packs_power_of_two_slices_into_ceil_of_their_gpus() -> None:
    rng = random.Random(28)
    for _ in range(400):
        cap = rng.choice([1, 2, 4, 8])
        sizes = [rng.choice([g for g in (1, 2, 4, 8) if g <= cap]) for _ in range(rng.randint(1, 9))]
        bins = first_fit_decreasing(sizes, cap)
        assert sorted(i for b in bins for i in b) == list(range(len(sizes)))
        assert all(sum(sizes[i] for i in b) <= cap for b in bins)
        need = math.ceil(sum(sizes) / cap)
        assert len(bins) == need == _min_bins(sizes, cap), (sizes, cap)


def test_aggregate_row_is_not_exact_without_powers_of_two() -> None:
    # the control: 3+3+2 GPUs on 4-GPU nodes total 8 = 2 nodes, yet no two of them share a node
    assert _min_bins([3, 3, 2], 4) == 3 == len(first_fit_decreasing([3, 3, 2], 4))


def test_ffd_rejects_items_larger_than_a_node() -> None:
    with pytest.raises(ValueError, match="item 1"):
        first_fit_decreasing([2, 16], 8)


# ---- slices in the vocabulary and the runtime rules ----

def test_slice_names_and_validation() -> None:
    h100 = load_catalog().gpus["H100"]
    s = NodeConfig(h100, 2, 8)
    assert s.name == "2/8xH100" and s.node.name == "8xH100" and s.memory_gb == 2 * h100.memory_gb
    assert NodeConfig(h100, 8, 8).name == "8xH100"  # a whole node is no slice
    assert load_catalog().config("2/8xH100") == s
    assert node_config_of("2/8xH100") == "8xH100" and node_share("2/8xH100") == 0.25
    with pytest.raises(ValueError, match="node_gpus"):
        NodeConfig(h100, 4, 2)
    with pytest.raises(ValueError, match="node_gpus"):
        NodeConfig(h100, 2, 6)


def test_vllm_multisets_equal_filtering_all_multisets() -> None:
    cat = load_catalog()
    configs = sorted(with_slices([cat.config(c) for c in ("1xL4", "4xL4", "8xL40S", "2xA10G")]),
                     key=lambda c: c.name)
    model = get_model("Qwen3-32B")
    for n_max in (1, 2, 4):
        brute = [ms for n in range(1, n_max + 1)
                 for ms in itertools.combinations_with_replacement(range(len(configs)), n)
                 if multiset_ok("vllm", model, [configs[i] for i in ms])]
        fast = [ms for ms in vllm_multisets(configs, n_max)
                if multiset_ok("vllm", model, [configs[i] for i in ms])]
        assert fast == brute


def test_rho_judges_the_slice_not_the_node(tmp_path: Path) -> None:
    """Phi-4 has 10 KV heads and is 28 GB: TP 8 does not split it and an 8xH100 node holds
    more than rho x its weights, so whole 8xH100 nodes serve nothing; slices of 1 or 2 GPUs do."""
    cat = load_catalog()
    phi = get_model("Phi-4-14B")
    node = [cat.config("8xH100")]
    assert enumerate_multisets(phi, node, 4, 12.0, RequestShape(), "vllm") == []
    sliced = with_slices(node)
    got = enumerate_multisets(phi, sliced, 4, 12.0, RequestShape(), "vllm")
    assert got and {sliced[i].count for ms in got for i in ms} <= {1, 2}
    lib = build_library(H100_ONLY, cache_dir=tmp_path, workers=1, progress=False)
    phi_eight = [t for t in lib.for_model("Phi-4-14B") if all(c == "8xH100" for c, _ in t.node_use)]
    assert phi_eight and all(template_problem("vllm", phi, t) is None for t in phi_eight)


def test_slice_template_rules_read_the_slice_gpus() -> None:
    """TP x PP inside one node: 4 stages of 2 GPUs of an 8xH100 run TP 2 (2 divides Phi-4's 40
    heads and 10 KV heads) and use one node; TP 4 on a slice is refused as on a whole node."""
    phi = get_model("Phi-4-14B")
    svc = Service(phi.name, Phase.DECODE)
    four = Template(svc, REGION, (("2/8xH100", 4),), tuple(Stage(10, ("2/8xH100",)) for _ in range(4)), 1.0)
    assert template_problem("vllm", phi, four) is None
    assert four.node_use == (("8xH100", 1.0),)
    tp4 = Template(svc, REGION, (("4/8xH100", 1),), (Stage(40, ("4/8xH100",)),), 1.0)
    assert "tensor-parallel size 4" in (template_problem("vllm", phi, tp4) or "")
    mixed = Template(svc, REGION, (("1/8xH100", 1), ("2/8xH100", 1)),
                     (Stage(20, ("1/8xH100",)), Stage(20, ("2/8xH100",))), 1.0)
    assert "different GPU counts" in (template_problem("vllm", phi, mixed) or "")


def test_slices_need_the_vllm_runtime() -> None:
    with pytest.raises(ValueError, match="'slices' needs runtime 'vllm'"):
        dataclasses.replace(H100_ONLY, runtime="any")


# ---- the ILP buys whole nodes: brute force on tiny seeded instances ----

def _synthetic(rng: random.Random) -> tuple[tuple[Template, ...], dict[str, float], dict, dict]:
    """Two services, three templates each, on slices and whole nodes of 8xH100 and 4xL4."""
    shapes = [(("2/8xH100", 1),), (("4/8xH100", 1),), (("8xH100", 1),), (("1/4xL4", 2),),
              (("2/4xL4", 1),), (("4xL4", 1),), (("1/8xH100", 1),)]
    templates = []
    demand = {}
    for phase in PHASES:
        svc = Service("Phi-4-14B", phase)
        for nodes in rng.sample(shapes, 3):
            stages = tuple(Stage(40 // nodes[0][1] + (40 % nodes[0][1] if j == 0 else 0), (nodes[0][0],))
                           for j in range(nodes[0][1]))
            templates.append(Template(svc, REGION, nodes, stages, rng.uniform(1.0, 4.0)))
        demand[svc.name] = rng.uniform(2.0, 9.0)
    prices = {(REGION, "8xH100"): 50.0 + rng.uniform(-5, 5), (REGION, "4xL4"): 8.0 + rng.uniform(-2, 2)}
    avail = {rc: rng.choice([1, 2, 3, 99]) for rc in prices}
    return tuple(templates), demand, prices, avail


def _brute_cost(problem: AllocationProblem, bound: int) -> float:
    """Cheapest plan with at most ``bound`` instances per template, every pool paying
    ceil(GPUs used / G) whole nodes (the packing's count, by brute-force-checked FFD exactness),
    within availability and meeting demand; inf when none is feasible."""
    ts = problem.templates
    grid = np.array(list(itertools.product(range(bound + 1), repeat=len(ts))), dtype=np.float64)
    pools = sorted(problem.prices)
    use = np.array([[dict(t.node_use).get(c, 0.0) if t.region == r else 0.0 for r, c in pools] for t in ts])
    nodes = np.ceil(grid @ use - 1e-9)
    ok = np.all(nodes <= np.array([problem.available(rc) for rc in pools]), axis=1)
    for s, d in problem.demand.items():
        thr = np.array([t.throughput if t.service.name == s else 0.0 for t in ts])
        ok &= grid @ thr >= d * (1 - 1e-9)
    cost = nodes @ np.array([problem.prices[rc] for rc in pools])
    return float(cost[ok].min()) if ok.any() else math.inf


def test_ilp_with_slices_equals_brute_force_node_cost() -> None:
    rng = random.Random(2028)
    for _ in range(25):
        templates, demand, prices, avail = _synthetic(rng)
        problem = AllocationProblem(templates, demand, avail, prices)
        res = solve_allocation(problem)
        best = _brute_cost(problem, 5)
        if math.isinf(best):
            assert res.status is SolveStatus.INFEASIBLE
            continue
        assert res.status is SolveStatus.OPTIMAL, res.message
        assert res.cost_per_hour == pytest.approx(best, rel=1e-6)
        ev = evaluate_plan(problem, res.allocation)
        assert ev.feasible and ev.cost_per_hour == pytest.approx(res.cost_per_hour)
        assert check_packing(problem, res.allocation, res.packing) == []


def test_whole_node_problems_are_unchanged() -> None:
    """Without slices no node variable appears and the reported cost is the templates' sum."""
    rng = random.Random(5)
    templates, demand, prices, avail = _synthetic(rng)
    whole = tuple(t for t in templates if not t.has_slices)
    whole = whole or (Template(Service("Phi-4-14B", Phase.PREFILL), REGION, (("8xH100", 1),),
                               (Stage(40, ("8xH100",)),), 3.0),)
    problem = AllocationProblem(whole, {t.service.name: 1.0 for t in whole}, None, prices)
    assert not problem.index.sliced_rcs
    res = solve_allocation(problem)
    assert res.packing is None
    plain = sum(n * problem.template_cost(k) for k, n in res.allocation.counts)
    assert res.cost_per_hour == pytest.approx(plain)


# ---- the plan carries the packing ----

def test_packed_plan_of_a_built_library(tmp_path: Path) -> None:
    lib = build_library(H100_ONLY, cache_dir=tmp_path, workers=1, progress=False)
    templates = tuple(t for t in lib.templates if all(c == "8xH100" for c, _ in t.node_use))
    price = load_catalog().offers_in(REGION)["8xH100"].on_demand_per_hour
    prices = {(REGION, "8xH100"): price}
    base = {"Phi-4-14B/prefill": 20000.0, "Phi-4-14B/decode": 2000.0,
            "GPT-OSS-20B/prefill": 20000.0, "GPT-OSS-20B/decode": 3000.0}
    for scale in (0.5, 2.0, 6.0):
        problem = AllocationProblem(templates, {s: d * scale for s, d in base.items()}, None, prices)
        res = solve_allocation(problem)
        assert res.status is SolveStatus.OPTIMAL
        packing = res.packing
        assert packing is not None and check_packing(problem, res.allocation, packing) == []
        assert all(n.used_gpus <= n.gpus == 8 for n in packing.nodes)
        nodes = len(packing.nodes)
        assert res.cost_per_hour == pytest.approx(nodes * price)
        assert Packing.from_json(packing.to_json()) == packing


def test_check_packing_finds_overfull_nodes_and_lost_slices() -> None:
    svc = Service("Phi-4-14B", Phase.DECODE)
    t = Template(svc, REGION, (("4/8xH100", 2),), (Stage(20, ("4/8xH100",)), Stage(20, ("4/8xH100",))), 5.0)
    problem = AllocationProblem((t,), {svc.name: 10.0}, {(REGION, "8xH100"): 2}, {(REGION, "8xH100"): 50.0})
    alloc = Allocation.of({t.key: 2})
    good = pack_plan(problem, alloc)
    assert check_packing(problem, alloc, good) == [] and len(good.nodes) == 2
    # each engine's two 4-GPU stages share one node (TP x PP inside a node)
    assert all(len({s.instance for s in n.slices}) == 1 for n in good.nodes)
    scarce = problem.with_changes(availability={(REGION, "8xH100"): 1})
    assert check_packing(scarce, alloc, good) == ["aws:us-east-2/8xH100: 2 nodes packed, 1 available"]
    slices = [s for n in good.nodes for s in n.slices]
    crowded = Packing((PackedNode(REGION, "8xH100", 8, tuple(slices[:3])),))
    found = check_packing(problem, alloc, crowded)
    assert any("holds 12 GPUs" in v for v in found)
    assert any("packed 0 times" in v for v in found)
    extra = Packing((*good.nodes, PackedNode(REGION, "8xH100", 8, (PlacedSlice(t.key, 0, 0, 4),))))
    assert any("packed 2 times" in v for v in check_packing(problem, alloc, extra))


def test_unlimited_availability_infeasible_names_the_service() -> None:
    """A service without templates under availability None: infeasible naming it, never an error
    status (the diagnosis divides by the availability, here infinite)."""
    svc = Service("Phi-4-14B", Phase.DECODE)
    t = Template(svc, REGION, (("2/8xH100", 1),), (Stage(40, ("2/8xH100",)),), 5.0)
    problem = AllocationProblem((t,), {svc.name: 10.0, "Phi-4-14B/prefill": 5.0}, None,
                                {(REGION, "8xH100"): 50.0})
    res = solve_allocation(problem)
    assert res.status is SolveStatus.INFEASIBLE and "Phi-4-14B/prefill" in res.message


def test_goodput_mode_with_slices_stays_within_whole_nodes() -> None:
    """Scarce nodes (one per pool), goodput mode: the plan's packing fits them, and no plan
    serves a larger share (brute force over up to 8 instances per template: a node holds at most
    8 slices)."""
    rng = random.Random(77)
    for _ in range(6):
        templates, demand, prices, _ = _synthetic(rng)
        demand = {s: d * 3 for s, d in demand.items()}
        avail = {rc: 1 for rc in prices}
        problem = AllocationProblem(templates, demand, avail, prices, mode="goodput")
        res = solve_allocation(problem)
        assert res.status is SolveStatus.OPTIMAL, res.message
        assert check_packing(problem, res.allocation, res.packing) == []
        grid = np.array(list(itertools.product(range(9), repeat=len(templates))), dtype=np.float64)
        pools = sorted(prices)
        use = np.array([[dict(t.node_use).get(c, 0.0) for _, c in pools] for t in templates])
        ok = np.all(np.ceil(grid @ use - 1e-9) <= 1, axis=1)
        share = np.ones(len(grid))
        for s, d in demand.items():  # one model: its share is its scarcer phase's
            thr = np.array([t.throughput if t.service.name == s else 0.0 for t in templates])
            share = np.minimum(share, np.minimum(grid @ thr / d, 1.0))
        assert res.goodput_fraction == pytest.approx(float(share[ok].max()), abs=1e-6)


def test_a_library_of_whole_node_multiples_of_slices_still_packs() -> None:
    """Four 2-GPU stages fill one 8xH100 exactly: no fractional use, still a sliced pool (its
    plan shows the packing)."""
    svc = Service("Phi-4-14B", Phase.DECODE)
    four = Template(svc, REGION, (("2/8xH100", 4),), tuple(Stage(10, ("2/8xH100",)) for _ in range(4)), 3.0)
    problem = AllocationProblem((four,), {svc.name: 5.0}, None, {(REGION, "8xH100"): 50.0})
    res = solve_allocation(problem)
    assert problem.index.sliced_rcs == {(REGION, "8xH100")}
    assert res.cost_per_hour == pytest.approx(100.0) and len(res.packing.nodes) == 2
    assert all(len(n.slices) == 4 and len({s.instance for s in n.slices}) == 1 for n in res.packing.nodes)


def test_a_cold_sliced_solve_starts_from_the_whole_node_plan() -> None:
    """Cold solves of a sliced library hand HiGHS the whole-node plan: accepted, and the sliced
    optimum is never above it (and still the brute-force optimum)."""
    rng = random.Random(77)
    started = 0
    for _ in range(20):
        templates, demand, prices, avail = _synthetic(rng)
        problem = AllocationProblem(templates, demand, avail, prices)
        whole = tuple(t for t in templates if not t.has_slices)
        res = solve_allocation(problem)
        if not whole or len(whole) == len(templates):
            assert res.warm_start_accepted is None
            continue
        sub = solve_allocation(problem.with_changes(templates=whole))
        if sub.allocation is None or not sub.allocation.counts:
            continue
        started += 1
        assert res.warm_start_accepted is True, res.message
        assert res.status is SolveStatus.OPTIMAL
        assert res.cost_per_hour <= sub.cost_per_hour + 1e-6
        assert res.cost_per_hour == pytest.approx(_brute_cost(problem, 5), rel=1e-6)
    assert started >= 3  # the path was exercised
