"""Issue 28 in the simulator: a node holds several slices; a preemption withdraws nodes and takes
every slice on them; billing pays whole nodes."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.envs.fleet import FleetState, node_hours_cost
from atoll.solvers.types import Phase, Service, Stage, Template

REGION = "aws:us-east-2"
CELL = (REGION, "8xH100")


def _t(model: str, config: str, stages: int) -> Template:
    return Template(Service(model, Phase.DECODE), REGION, ((config, stages),),
                    tuple(Stage(8, (config,)) for _ in range(stages)), 1.0)


WIDE = _t("A", "4/8xH100", 1)  # one 4-GPU slice per instance
NARROW = _t("B", "2/8xH100", 1)  # one 2-GPU slice per instance
TEMPLATES = {WIDE.key: WIDE, NARROW.key: NARROW}


def test_nodes_held_are_the_packing_ceil() -> None:
    state = FleetState(running={WIDE.key: 2, NARROW.key: 3})  # 8 + 6 GPUs: 2 nodes
    assert state.nodes_held(TEMPLATES) == {CELL: 2}


def test_preemption_takes_every_slice_of_the_withdrawn_node() -> None:
    """FFD packs the two 4-GPU slices on one node and the four 2-GPU slices on the other: losing
    one node loses exactly the instances on it, both of them or all four, never a mix."""
    outcomes = set()
    for seed in range(12):
        state = FleetState(running={WIDE.key: 2, NARROW.key: 4})
        lost = state.preempt({CELL: 1}, TEMPLATES, np.random.default_rng(seed))
        assert lost in ({WIDE.key: 2}, {NARROW.key: 4})
        assert state.nodes_held(TEMPLATES) == {CELL: 1}
        outcomes.add(tuple(sorted(lost)))
    assert len(outcomes) == 2  # the generator picks the node


def test_preemption_to_zero_and_within_capacity() -> None:
    state = FleetState(running={WIDE.key: 1, NARROW.key: 1})
    assert state.preempt({CELL: 1}, TEMPLATES, np.random.default_rng(0)) == {}
    assert state.preempt({}, TEMPLATES, np.random.default_rng(0)) == {WIDE.key: 1, NARROW.key: 1}
    assert state.held(WIDE.key) == state.held(NARROW.key) == 0


def test_billing_pays_whole_nodes() -> None:
    state = FleetState(running={WIDE.key: 1, NARROW.key: 3})  # 10 GPUs: 2 nodes, 6 idle GPUs
    price = 80.0
    assert node_hours_cost(state, TEMPLATES, {CELL: price}, 3600.0) == pytest.approx(2 * price)
