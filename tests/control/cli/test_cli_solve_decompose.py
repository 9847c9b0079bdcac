"""``atoll solve --decompose``: one JSON document with the ladder, monotone, every rung optimal."""

from __future__ import annotations

import json

from atoll.control.cli import main
from atoll.solvers.ladder import RUNGS, SIDE


def test_solve_decompose_json(capsys) -> None:
    code = main(["solve", "--scenario", "core", "--decompose", "--json"])
    out = capsys.readouterr().out
    doc = json.loads(out)  # exactly one document on stdout
    assert code == 0 and doc["all_ilp_rungs_optimal"] is True
    assert doc["catalog"] == "default" and "warning" not in doc
    assert [r["rung"] for r in doc["rungs"]] == list(RUNGS)
    assert [r["rung"] for r in doc["side"]] == list(SIDE)
    costs = [r["cost_per_hour"] for r in doc["rungs"]]
    assert all(a >= b - 1e-6 for a, b in zip(costs, costs[1:], strict=False))
    assert [s["step"] for s in doc["steps"]] == [f"{a}/{b}" for a, b in zip(RUNGS, RUNGS[1:], strict=False)]
    for step in doc["steps"]:
        assert set(step["per_model"]) == set(doc["models"])
    assert doc["over_joint"]["joint"] == 1.0
