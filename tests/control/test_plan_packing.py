"""A plan record of a fleet with slices carries its packing (nodes per pool, node -> slices),
checked against the plan; the controller's state keeps the delivered one across a restart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atoll.control.plans import PlanRecord
from atoll.control.state import ControllerState
from atoll.solvers.packing import repack
from atoll.solvers.problem import Allocation
from atoll.solvers.types import Phase, Service, Stage, Template

R = "aws:us-east-2"
TP2 = Template(Service("Phi-4-14B", Phase.DECODE), R, (("2/8xH100", 1),), (Stage(40, ("2/8xH100",)),), 500.0)
PP2 = Template(Service("Qwen3-32B", Phase.PREFILL), R, (("2/8xH100", 2),),
               (Stage(32, ("2/8xH100",)), Stage(32, ("2/8xH100",))), 900.0)
LIB = {TP2.key: TP2, PP2.key: PP2}


def record(plan: dict[str, int], packing_plan: dict[str, int] | None = None) -> PlanRecord:
    packing = repack(LIB, plan if packing_plan is None else packing_plan)
    return PlanRecord.from_allocation(1, 0.0, Allocation.of(plan), None, LIB, {}, "test", packing=packing)


def test_a_packed_record_round_trips_and_says_its_nodes() -> None:
    r = record({TP2.key: 3, PP2.key: 1})  # 6 + 4 GPUs: two 8-GPU nodes
    assert r.nodes_per_pool == {f"{R}/8xH100": 2}
    assert sum(n["used_gpus"] for n in r.packing["nodes"]) == 10  # type: ignore[index]
    again = PlanRecord.from_dict(json.loads(json.dumps(r.as_dict())))
    assert again == r and again.packed() == repack(LIB, {TP2.key: 3, PP2.key: 1})


def test_a_whole_node_record_has_no_packing() -> None:
    r = PlanRecord.from_allocation(1, 0.0, Allocation.of({TP2.key: 1}), None, LIB, {}, "test")
    assert r.packing is None and r.nodes_per_pool is None and "packing" not in r.as_dict()


def test_a_packing_that_does_not_hold_the_plan_is_refused() -> None:
    with pytest.raises(ValueError, match=r"field 'packing' does not hold the plan .*instance 3 stage 0"):
        record({TP2.key: 4}, packing_plan={TP2.key: 3})
    doc = record({TP2.key: 2}).as_dict()
    doc["packing"]["nodes"][0]["slices"].append([TP2.key, 9, 0, 8])  # 12 GPUs on an 8-GPU node
    with pytest.raises(ValueError, match=r"holds 12 GPUs of slices, has 8"):
        PlanRecord.from_dict(doc)
    doc = record({TP2.key: 2}).as_dict()
    doc["packing"]["nodes_per_pool"] = {f"{R}/8xH100": 5}
    with pytest.raises(ValueError, match=r"says nodes_per_pool .*5.*its nodes hold"):
        PlanRecord.from_dict(doc)
    with pytest.raises(ValueError, match=r"field 'packing' must be a mapping with a 'nodes' list"):
        PlanRecord(1, 0.0, {}, {}, packing={"nodes_per_pool": {}})


def test_the_state_keeps_the_delivered_packing() -> None:
    r = record({TP2.key: 1, PP2.key: 2})
    state = ControllerState(running=dict(r.plan), packing=r.packing)
    assert ControllerState.from_dict(json.loads(json.dumps(state.as_dict()))).packing == r.packing
    assert "packing" not in ControllerState().as_dict()
    with pytest.raises(ValueError, match=r"ControllerState: field 'packing' must be a plan's packing"):
        ControllerState(packing={"nodes": "none"})


def test_floors_on_a_sliced_fleet_fill_the_nodes_it_can_have(tmp_path: Path) -> None:
    """min_instances on slices: four 1-GPU slices fit the one 4xL4 node the fleet may have (the
    floor counts a slice as its share of a node, not as a node of config '1/4xL4'); the record
    carries the node."""
    from live_harness import LAYERS, MODELS, Harness

    from atoll.control.live_fleet import LiveFleet

    lib = tuple(Template(Service(m, phase), R, (("1/4xL4", 1),), (Stage(LAYERS[m], ("1/4xL4",)),), thr)
                for m in MODELS for phase, thr in ((Phase.PREFILL, 800.0), (Phase.DECODE, 200.0)))
    fleet = LiveFleet("core", models=MODELS, templates=lib, request_shapes=[(100.0, 10.0)] * 2,
                      availability={(R, "4xL4"): 1})
    h = Harness(fleet, tmp_path, rates=dict.fromkeys(MODELS, 0.0))
    h.source.instances = {}
    reports = [h.tick() for _ in range(2)]
    added = reports[1].solve["guard_rails"]["floor_added"]  # type: ignore[index]
    assert all(v == {"floor": 1, "added": 1} for v in added.values()) and len(added) == 4
    assert h.controller.state.packing is not None
    assert h.controller.state.packing["nodes_per_pool"] == {f"{R}/4xL4": 1}
