"""The node limit: where a hard re-plan stops is a count of HiGHS's branch-and-bound nodes, not
wall-clock seconds, so a simulation stays a function of its seed on any machine and load."""

from __future__ import annotations

from typing import Any

import pytest
from alloc_instances import random_problem

from atoll.envs.config import FleetConfig
from atoll.solvers.allocation import highs, solve_allocation
from atoll.solvers.allocation.direct import DirectRun
from atoll.solvers.allocation.model import build_model
from atoll.solvers.allocation.reduction import RoundInstance
from atoll.solvers.errors import InputError


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "100"])
def test_a_node_limit_is_a_whole_number_of_nodes(bad: object) -> None:
    p = random_problem(1)
    with pytest.raises(ValueError, match="node_limit"):
        p.with_changes(node_limit=bad)
    with pytest.raises(InputError, match="solver_node_limit"):
        FleetConfig(solver_node_limit=bad)  # type: ignore[arg-type]


def test_both_builders_hand_the_limit_to_highs(monkeypatch: pytest.MonkeyPatch) -> None:
    p = random_problem(3, n_models=3, regions=("r1", "r2"), max_templates=10).with_changes(node_limit=7)
    inst = RoundInstance(p, None)
    run = DirectRun(inst, None, None, p.gap, p.node_limit)
    assert run._highs(None, {}).getOptionValue("mip_max_nodes")[1] == 7  # noqa: SLF001
    seen: list[dict[str, Any]] = []
    real = highs.SolverRun._run_highs

    def spy(self: highs.SolverRun, prob: Any, start: Any, time_limit: Any, gap: float,
            extra: dict[str, Any]) -> None:
        seen.append(dict(extra))
        real(self, prob, start, time_limit, gap, extra)

    monkeypatch.setattr(highs.SolverRun, "_run_highs", spy)
    highs.SolverRun(build_model(inst, "cost", None).prob, "highs", None, p.gap, None, p.node_limit)
    assert seen and all(e["mip_max_nodes"] == 7 for e in seen)
    # a limit the solve never reaches changes nothing
    assert solve_allocation(p).allocation == solve_allocation(p.with_changes(node_limit=None)).allocation

