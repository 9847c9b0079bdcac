"""The forecaster registry: every name, in one order, whichever forecast module is imported first;
and a plain import graph in forecast/ (no module imports after its first statement)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import atoll.forecast
from atoll.forecast.forecasters import ForecastError
from atoll.forecast.registry import FORECASTERS, PLANNING_FORECASTERS, make_forecaster

# The names in the order errors and --help list them (the order before the registry existed, when
# forecasters.py was imported first).
NAMES = ["naive", "ets", "sarimax", "uc", "ses", "persistence", "median", "auto", "peak:persistence",
         "peak:ewma", "peak:naive", "peak:ets", "peak:llt", "peak:blend", "peak:auto", "llt", "peak:learned"]
PLANNING_NAMES = ["peak:persistence", "peak:ewma", "peak:naive", "peak:ets", "peak:llt", "peak:blend",
                  "peak:auto", "peak:learned"]
# what each name makes (class), at the default look-ahead and at a given one
KINDS = {"naive": "SeasonalNaive", "ets": "HoltWinters", "sarimax": "FourierSarimax",
         "uc": "UnobservedComponentsF", "ses": "SimpleSmoothing", "persistence": "Persistence",
         "median": "RollingMedian", "auto": "AutoForecaster", "llt": "LocalLinearTrend",
         "peak:auto": "PeakAuto", "peak:learned": "PeakLearned",
         **{f"peak:{b}": "PeakForecaster" for b in ("persistence", "ewma", "naive", "ets", "llt", "blend")}}

PROBE = """
import json, sys
import {module}
from atoll.forecast.registry import FORECASTERS, PLANNING_FORECASTERS, make_forecaster
made = {{n: [type(make_forecaster(n, 288)).__name__, getattr(make_forecaster(n, 288), "horizon", None),
            getattr(make_forecaster(n, 288, horizon=2), "horizon", None)] for n in FORECASTERS}}
print(json.dumps({{"names": list(FORECASTERS), "planning": list(PLANNING_FORECASTERS), "made": made}}))
"""


@pytest.mark.parametrize("module", [f"atoll.forecast.{m}" for m in (
    "registry", "forecasters", "auto", "planning", "learned", "backtest")])
def test_the_table_is_whole_whichever_module_is_imported_first(module: str) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["names"] == NAMES and got["planning"] == PLANNING_NAMES
    for name, (kind, default_h, given_h) in got["made"].items():
        assert kind == KINDS[name], name
        if name in PLANNING_NAMES:  # made for the default look-ahead (3 steps), or the one asked for
            assert (default_h, given_h) == (3, 2), name
        else:
            assert given_h == default_h, name  # the others ignore the look-ahead


def test_this_interpreter_sees_the_same_table_and_errors_list_it_in_order() -> None:
    assert list(FORECASTERS) == NAMES and list(PLANNING_FORECASTERS) == PLANNING_NAMES
    with pytest.raises(ForecastError) as info:
        make_forecaster("prophet")
    assert str(info.value) == f"unknown forecaster 'prophet'; valid: {', '.join(NAMES)}"


def _import_lines_after_code(path: Path) -> list[int]:
    """Lines of imports at module level (outside functions) that follow the module's first
    statement that is not an import (a docstring and ``if TYPE_CHECKING:`` imports count as the head)."""

    def imports_only(node: ast.stmt) -> bool:
        if isinstance(node, ast.Import | ast.ImportFrom):
            return True
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return all(imports_only(n) for n in node.body + node.orelse)
        return False

    def nested_imports(node: ast.AST) -> list[int]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return []
        if isinstance(node, ast.Import | ast.ImportFrom):
            return [node.lineno]
        return [line for child in ast.iter_child_nodes(node) for line in nested_imports(child)]

    body = ast.parse(path.read_text(encoding="utf-8")).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    late: list[int] = []
    code_seen = False
    for node in body:
        if imports_only(node):
            if code_seen:
                late.append(node.lineno)
        else:
            code_seen = True
            late += nested_imports(node)
    return late


def test_no_forecast_module_imports_after_its_first_statement() -> None:
    folder = Path(atoll.forecast.__file__).parent
    files = sorted(folder.glob("*.py"))
    names = {p.name for p in files}
    assert {"registry.py", "forecasters.py", "planning.py", "auto.py", "learned.py"} <= names
    late = {p.name: lines for p in files if (lines := _import_lines_after_code(p))}
    assert late == {}


def test_the_check_finds_a_late_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('"""doc."""\nimport os\n\nX = 1\nimport sys\n\n\ndef f():\n    import json\n')
    assert _import_lines_after_code(bad) == [5]
