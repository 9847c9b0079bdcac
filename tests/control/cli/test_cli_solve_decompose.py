"""``atoll solve --decompose``: one JSON document with the ladder, monotone, every rung optimal."""

from __future__ import annotations

import json

from atoll.control.cli import main
from atoll.solvers.ladder import RUNGS, SIDE


def test_solve_decompose_json(capsys) -> None:
    code = main(["solve", "--scenario", "core", "--pd", "disaggregated", "--decompose", "--json"])
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


def test_solve_pd_auto_plans_colocated_replicas_and_the_ladder_shows_their_rung(capsys) -> None:
    from atoll.solvers.ladder import COLOCATED

    assert main(["solve", "--scenario", "extended", "--pd", "disaggregated", "--json"]) == 0
    apart = json.loads(capsys.readouterr().out)
    assert main(["solve", "--scenario", "extended", "--json"]) == 0  # auto, the default
    auto = json.loads(capsys.readouterr().out)
    assert apart["pd"] == "disaggregated" and auto["pd"] == "auto"
    assert auto["cost_per_hour"] <= apart["cost_per_hour"] + 1e-6
    both = [r for r in auto["plan"] if r["service"].endswith("/colocated")]
    assert both and all(r["decode_throughput"] > 0 for r in both)  # extended's even mix: GPT-OSS-20B
    assert main(["solve", "--scenario", "extended", "--decompose", "--json"]) == 0
    ladder = json.loads(capsys.readouterr().out)
    assert [r["rung"] for r in ladder["rungs"]] == [*RUNGS, COLOCATED]
    assert abs(ladder["rungs"][-1]["cost_per_hour"] - auto["cost_per_hour"]) < 1e-3  # rounded in the ladder
