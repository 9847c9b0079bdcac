"""Slices in the simulator: a node holds several slices; a preemption withdraws nodes and takes
every slice on them; billing pays whole nodes."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.envs.config import FleetConfig
from atoll.envs.fleet import FleetState, node_hours_cost
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.fleet_model import FleetModel
from atoll.forecast.workloads import DemandSeries
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


# ---- the env over a library with slices ----

PHI = "Phi-4-14B"
SLICE = "1/4xL40S"
PRICE_4L40S = 10.49264  # on-demand $/node-hour of 4xL40S in aws:us-east-2 (catalog)


def _slice_config(**changes: object) -> FleetConfig:
    rates = np.full(6 * 288, 1.0)
    ones = np.ones(len(rates))
    templates = (Template(Service(PHI, Phase.PREFILL), REGION, ((SLICE, 1),), (Stage(40, (SLICE,)),), 800.0),
                 Template(Service(PHI, Phase.DECODE), REGION, ((SLICE, 1),), (Stage(40, (SLICE,)),), 20.0))
    base: dict[str, object] = dict(scenario="core", models=(PHI,), templates=templates,
                                   demand=(DemandSeries("flat", 300.0, rates, 2048 * ones, 28 * ones),),
                                   forecaster="naive", availability="ample", prices="on-demand", days=(4, 6))
    base.update(changes)
    return FleetConfig(**base)  # type: ignore[arg-type]


def test_env_bills_the_nodes_its_slices_share() -> None:
    model = FleetModel.from_config(_slice_config())
    keys = list(model.templates)
    state = FleetState(running={keys[0]: 1, keys[1]: 1})  # two 1-GPU slices: one 4xL40S node
    assert model.nodes_held(state) == {(REGION, "4xL40S"): 1}
    assert float(model.cost(state, 3600.0).sum()) == pytest.approx(PRICE_4L40S)
    state = FleetState(running={keys[0]: 3, keys[1]: 2})  # five slices: two nodes
    assert float(model.cost(state, 3600.0).sum()) == pytest.approx(2 * PRICE_4L40S)


def test_env_runs_a_sliced_fleet() -> None:
    env = FleetEnv(_slice_config())
    env.reset(seed=3)
    total = 0.0
    for _ in range(24):
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert np.isfinite(reward)
        total += sum(m["cost_usd"] for m in info["models"].values())
        held = env.fleet.nodes_held(env.state)
        assert all(isinstance(n, int) for n in held.values())
        if terminated or truncated:
            break
    assert total > 0
