"""Fleet state: start-up delay, draining, preemption, billing."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.envs.fleet import FleetState, node_hours_cost, startup_seconds
from atoll.solvers.catalog import load_catalog
from atoll.solvers.models import get_model
from atoll.solvers.problem import Allocation
from atoll.solvers.types import Phase, Service, Stage, Template

SVC = Service("Phi-4-14B", Phase.DECODE)
A = Template(SVC, "r", (("1xL4", 2),), (Stage(20, ("1xL4",)), Stage(20, ("1xL4",))), 100.0)
B = Template(SVC, "r", (("1xL4", 1), ("4xL40S", 1)),
             (Stage(10, ("1xL4",)), Stage(30, ("4xL40S",))), 300.0)
TEMPLATES = {A.key: A, B.key: B}
PRICES = {("r", "1xL4"): 1.0, ("r", "4xL40S"): 10.0}
STARTUP = {A.key: 600.0, B.key: 300.0}


def test_added_instances_serve_only_after_startup() -> None:
    s = FleetState()
    assert s.apply_plan(Allocation.of({A.key: 2, B.key: 1}), STARTUP, drain_s=60) == 3
    assert s.ready() == {}
    s.advance(300)
    assert s.ready() == {B.key: 1}
    s.advance(299)
    assert s.ready() == {B.key: 1}
    s.advance(1)
    assert s.ready() == {A.key: 2, B.key: 1}
    assert s.planned() == Allocation.of({A.key: 2, B.key: 1})


def test_removal_cancels_starting_then_drains_running() -> None:
    s = FleetState(running={A.key: 2})
    s.apply_plan(Allocation.of({A.key: 3}), STARTUP, drain_s=60)
    s.apply_plan(Allocation.of({A.key: 1}), STARTUP, drain_s=60)
    # the starting one is cancelled, one running one drains
    assert s.starting_count(A.key) == 0 and s.running[A.key] == 1
    assert s.held(A.key) == 2
    # billing: 2 instances x 2 L4 nodes x $1 for 30 s while one drains
    assert node_hours_cost(s, TEMPLATES, PRICES, 30) == pytest.approx(4 * 30 / 3600)
    s.advance(60)
    assert s.held(A.key) == 1


def test_preemption_removes_capacity_at_once_and_is_seeded() -> None:
    def run(seed: int) -> tuple[dict[str, int], dict[str, int]]:
        s = FleetState(running={A.key: 2, B.key: 2})
        lost = s.preempt({("r", "1xL4"): 3, ("r", "4xL40S"): 5}, TEMPLATES, np.random.default_rng(seed))
        return lost, s.running

    lost, running = run(1)
    # 6 L4 nodes held, 3 available: at least 3 L4 nodes' worth of instances go
    held_l4 = 2 * running.get(A.key, 0) + running.get(B.key, 0)
    assert held_l4 <= 3 and sum(lost.values()) >= 2
    assert run(1) == (lost, running)


def test_preemption_takes_starting_instances_first() -> None:
    s = FleetState(running={B.key: 1})
    s.apply_plan(Allocation.of({B.key: 2}), STARTUP, drain_s=0)
    s.preempt({("r", "1xL4"): 1, ("r", "4xL40S"): 1}, TEMPLATES, np.random.default_rng(0))
    assert s.running == {B.key: 1} and s.starting_count(B.key) == 0


def test_startup_time_is_boot_plus_weight_load() -> None:
    cat = load_catalog()
    model = get_model("Phi-4-14B")
    configs = {c: cat.config(c) for c in ("1xL4", "4xL40S")}
    # slowest node loads 30 of 40 layers: 30 x 29.4 GB / 40 / 1 GB/s = 22.05 s after a 180 s boot
    assert startup_seconds(B, model, configs) == pytest.approx(180 + 0.75 * 29.4)


def test_draining_nodes_are_billed_only_until_their_drain_ends() -> None:
    s = FleetState(running={A.key: 2})
    s.apply_plan(Allocation.of({A.key: 1}), STARTUP, drain_s=60)
    # over 300 s: one instance (2 L4 nodes, $1/h each) runs 300 s, the other drains for 60 s
    assert node_hours_cost(s, TEMPLATES, PRICES, 300) == pytest.approx((2 * 300 + 2 * 60) / 3600)


def test_make_before_break_the_replaced_instance_serves_and_bills_until_its_replacement_is_ready() -> None:
    s = FleetState(running={A.key: 1})
    s.apply_plan(Allocation.of({B.key: 1}), STARTUP, drain_s=60, services_of=lambda k: (SVC,))
    # A (2 L4 nodes, $2/h) still serves; B (L4 + L40S, $11/h) starts for 300 s
    assert s.running == {A.key: 0} and s.replaced == {A.key: [[1.0, 300.0, 60.0]]} and s.held(A.key) == 1
    assert s.planned() == Allocation.of({B.key: 1})
    assert node_hours_cost(s, TEMPLATES, PRICES, 300) == pytest.approx((2 * 300 + 11 * 300) / 3600)
    s.advance(300)
    # B is ready: A drains for 60 s more, billed, not serving
    assert s.ready() == {B.key: 1} and s.draining[A.key] == [[1.0, 60.0]] and not s.replaced.get(A.key)
    assert node_hours_cost(s, TEMPLATES, PRICES, 300) == pytest.approx((2 * 60 + 11 * 300) / 3600)
    s.advance(60)
    assert s.held(A.key) == 0


def test_break_before_make_and_pure_scale_down_drain_at_once() -> None:
    s = FleetState(running={A.key: 1})
    s.apply_plan(Allocation.of({B.key: 1}), STARTUP, drain_s=60)  # no service_of: break-before-make
    assert s.draining == {A.key: [[1.0, 60.0]]} and not s.replaced
    t = FleetState(running={A.key: 2})
    t.apply_plan(Allocation.of({A.key: 1}), STARTUP, drain_s=60, services_of=lambda k: (SVC,))
    assert t.draining == {A.key: [[1.0, 60.0]]} and not t.replaced


def test_a_replaced_instance_comes_back_when_a_later_plan_wants_it_again() -> None:
    s = FleetState(running={A.key: 1})
    s.apply_plan(Allocation.of({B.key: 1}), STARTUP, drain_s=60, services_of=lambda k: (SVC,))
    s.apply_plan(Allocation.of({A.key: 1, B.key: 1}), STARTUP, drain_s=60, services_of=lambda k: (SVC,))
    assert s.running[A.key] == 1 and not s.replaced[A.key] and s.starting_count(B.key) == 1
