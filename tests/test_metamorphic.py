"""The metamorphic suite: over a seeded request log and fleet, changes that mean nothing
to a user leave what solve and simulate get unchanged; corruptions give an error naming the
line or key, or the clean result — never a third figure (tests/metamorphic_targets.py)."""

from __future__ import annotations

import pytest
from metamorphic_targets import CORRUPT, NEUTRAL, MetamorphicTarget

TARGET = MetamorphicTarget()


@pytest.mark.parametrize("kind", NEUTRAL)
@pytest.mark.parametrize("seed", [0, 1])
def test_a_neutral_change_leaves_the_demand_unchanged(kind: str, seed: int) -> None:
    out = TARGET(seed, kind)
    assert out.result == "same", out.detail


@pytest.mark.parametrize("kind", CORRUPT)
@pytest.mark.parametrize("seed", [0, 1])
def test_a_corruption_is_an_error_or_the_clean_result(kind: str, seed: int) -> None:
    out = TARGET(seed, kind)
    assert out.result in ("same", "error"), out.detail
    if out.result == "error":
        assert "line" in out.detail or "field" in out.detail  # names the line or the key


def test_the_clean_plan_is_the_same_after_a_shuffle_and_a_stray_row(tmp_path: pytest.TempPathFactory) -> None:
    """One real solve per variant: the plan's cost and demand, not just its inputs."""
    import json
    from pathlib import Path

    import numpy as np
    from metamorphic_targets import _fleet_text, _log_rows, _write_log

    from atoll.control.cli import main

    rows = _log_rows(np.random.default_rng(5))
    docs = []
    shuffled = [rows[i] for i in np.random.default_rng(1).permutation(len(rows))]
    for name, variant in (("clean", rows), ("shuffled", shuffled), ("stray", [(0.0, "acme", 5, 5), *rows])):
        d = Path(str(tmp_path)) / name
        d.mkdir()
        _write_log(d / "log.csv", variant)
        (d / "fleet.yaml").write_text(_fleet_text("log.csv").replace("name: meta", f"name: meta-{name}"))
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["solve", "--fleet", str(d / "fleet.yaml"), "--json"]) == 0
        docs.append(json.loads(buf.getvalue()))
    for doc in docs[1:]:
        assert doc["cost_per_hour"] == pytest.approx(docs[0]["cost_per_hour"])
        demand = [s["demand"] for s in docs[0]["services"]]
        assert [s["demand"] for s in doc["services"]] == pytest.approx(demand)
