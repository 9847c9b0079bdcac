"""The controller's packing from one plan to the next (solvers/packing.repack): running slices
stay on their nodes, a node is released only when none of its slices is left, new slices fill
the room left before new nodes are bought."""

from __future__ import annotations

import random

import pytest

from atoll.solvers.packing import (
    Packing,
    PackingError,
    check_plan_packing,
    describe_packing,
    pack_plan,
    repack,
)
from atoll.solvers.problem import Allocation, AllocationProblem
from atoll.solvers.types import Phase, Service, Stage, Template

R = "aws:us-east-2"


def _t(model: str, configs: tuple[str, ...], thr: float = 100.0) -> Template:
    nodes: dict[str, int] = {}
    for c in configs:
        nodes[c] = nodes.get(c, 0) + 1
    layers = 40 // len(configs)
    stages = tuple(Stage(layers + (40 - layers * len(configs) if i == 0 else 0), (c,))
                   for i, c in enumerate(configs))
    return Template(Service(model, Phase.DECODE), R, tuple(sorted(nodes.items())), stages, thr)


LIB = {t.key: t for t in (_t("Phi-4-14B", ("4/8xH100",)), _t("Phi-4-14B", ("2/8xH100",)),
                          _t("Qwen3-32B", ("2/8xH100", "2/8xH100")), _t("Qwen3-32B", ("1/8xH100",)),
                          _t("Qwen3-32B", ("8xH100",)))}
A, B, C, D, E = LIB  # 4-GPU, 2-GPU, TP 2 x PP 2 inside a node, 1-GPU, whole node


def _where(p: Packing) -> dict[tuple[str, int, int], int]:
    """(template, instance, stage) -> the index of its node."""
    return {(s.template, s.instance, s.stage): i for i, n in enumerate(p.nodes) for s in n.slices}


def test_without_a_previous_packing_it_is_pack_plans() -> None:
    plan = {A: 3, B: 2, C: 1, D: 3, E: 1}
    problem = AllocationProblem(tuple(LIB.values()), {}, None, {(R, "8xH100"): 98.0})
    assert repack(LIB, plan) == pack_plan(problem, Allocation.of(plan))
    assert len(repack(LIB, plan).nodes) == 1 + 3  # the whole node, then 12 + 4 + 4 + 3 = 23 GPUs


def test_running_slices_stay_and_a_node_goes_only_when_empty() -> None:
    before = repack(LIB, {A: 2, B: 4})  # two nodes: [4, 4] and [2, 2, 2, 2]
    assert [n.used_gpus for n in before.nodes] == [8, 8]
    # drop one 2-GPU instance (the highest number): its node stays, the other slices do not move
    after = repack(LIB, {A: 2, B: 3}, before)
    assert [n.used_gpus for n in after.nodes] == [8, 6]
    kept = _where(after)
    assert all(kept[k] == i for k, i in _where(before).items() if k in kept)
    # a new 1-GPU instance fills the room left before a new node is bought
    grown = repack(LIB, {A: 2, B: 3, D: 1}, after)
    assert len(grown.nodes) == 2 and _where(grown)[(D, 0, 0)] == 1
    # every slice of the second node gone: the node is released
    shrunk = repack(LIB, {A: 2}, before)
    assert len(shrunk.nodes) == 1 and describe_packing(shrunk)["nodes_per_pool"] == {f"{R}/8xH100": 1}
    # half of each node left: 8 GPUs would fit one node, but running pods are not moved
    halves = repack(LIB, {A: 1, B: 2}, before)
    assert [n.used_gpus for n in halves.nodes] == [4, 4]
    assert describe_packing(halves)["extra_nodes"] == {f"{R}/8xH100": 1}


def test_fragmented_room_buys_a_node_and_says_so() -> None:
    before = repack(LIB, {B: 8})  # two full nodes of 2-GPU slices
    # one 2-GPU slice leaves each node: 2 + 2 GPUs free, but a 4-GPU slice needs one node's 4
    after = repack(LIB, {B: 6, A: 1}, repack(LIB, {B: 6}, _drop_one_per_node(before)))
    assert len(after.nodes) == 3
    assert describe_packing(after)["extra_nodes"] == {f"{R}/8xH100": 1}
    assert check_plan_packing(LIB, {B: 6, A: 1}, after) == []


def _drop_one_per_node(p: Packing) -> Packing:
    """The same nodes with instances renumbered so that the two highest are on different nodes."""
    from atoll.solvers.packing import PackedNode, PlacedSlice

    order = [s for n in p.nodes for s in n.slices]
    # node 0 holds instances 0-2 and 6, node 1 holds 3-5 and 7
    numbers = {id(s): k for k, s in zip([0, 1, 2, 6, 3, 4, 5, 7], order, strict=True)}
    return Packing(tuple(PackedNode(n.region, n.config, n.gpus,
                                    tuple(PlacedSlice(s.template, numbers[id(s)], s.stage, s.gpus)
                                          for s in n.slices)) for n in p.nodes))


def test_random_plan_sequences_keep_slices_and_never_overfill() -> None:
    rng = random.Random(7)
    keys = list(LIB)
    packing: Packing | None = None
    plan: dict[str, int] = {}
    for _ in range(60):
        new = {k: max(0, plan.get(k, 0) + rng.randint(-2, 2)) for k in keys}
        nxt = repack(LIB, new, packing)
        assert check_plan_packing(LIB, new, nxt) == []
        if packing is not None:
            was = _where(packing)
            for k, i in _where(nxt).items():
                if k in was:  # a slice that stays is on the node it was on (same slices around it)
                    old_node = packing.nodes[was[k]]
                    assert nxt.nodes[i].region == old_node.region
                    assert set(nxt.nodes[i].slices) <= set(old_node.slices) | {
                        s for s in nxt.nodes[i].slices if (s.template, s.instance, s.stage) not in was}
        need = sum(n.used_gpus for n in nxt.nodes)
        assert len(nxt.nodes) >= -(-need // 8)
        packing, plan = nxt, new


def test_check_plan_packing_finds_a_missing_slice_and_an_empty_node() -> None:
    good = repack(LIB, {A: 1, B: 1})
    assert check_plan_packing(LIB, {A: 1, B: 2}, good)[0].startswith(f"{B} instance 1 stage 0")
    from atoll.solvers.packing import PackedNode

    empty = Packing((*good.nodes, PackedNode(R, "8xH100", 8, ())))
    assert "holds no slice" in check_plan_packing(LIB, {A: 1, B: 1}, empty)[0]


def test_repack_names_an_unknown_template() -> None:
    with pytest.raises(PackingError, match="not in 'templates'"):
        repack(LIB, {"nope": 1})
