"""benchmarks/policy.py's --withdraw: a cell whose policy is lost moves under 'withdrawn' with its reason."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _policy_script() -> ModuleType:
    """The script as a module of its own name (it strips its folder from sys.path as it loads)."""
    spec = importlib.util.spec_from_file_location("policy_benchmark", BENCHMARKS / "policy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


def test_withdrawn_cells_move_with_their_reason_and_the_rest_stay(tmp_path: Path) -> None:
    script = _policy_script()
    into = tmp_path / "policy.json"
    cells = {"core/spot": {"headline": {"effective_cost_ratio": {"mean": 1.0}}, "seeds": 3},
             "core/spot/charged": {"headline": {"effective_cost_ratio": {"mean": 0.99}}}}
    into.write_text(json.dumps(cells))
    out = script.withdraw_cells(into, ["core/spot=its policy was lost with its MLflow store"])
    assert out == {"core/spot": "its policy was lost with its MLflow store"}
    doc = json.loads(into.read_text())
    assert set(doc) == {"core/spot/charged", "withdrawn"}
    assert doc["withdrawn"]["core/spot"]["withdrawn_because"] == "its policy was lost with its MLflow store"
    assert doc["withdrawn"]["core/spot"]["seeds"] == 3
    with pytest.raises(SystemExit, match="'core/hedged' is not a cell of .*cells: core/spot/charged"):
        script.withdraw_cells(into, ["core/hedged=lost"])
    with pytest.raises(SystemExit, match="give KEY=REASON"):
        script.withdraw_cells(into, ["core/spot/charged"])
    assert json.loads(into.read_text()) == doc  # a refused call changes nothing
