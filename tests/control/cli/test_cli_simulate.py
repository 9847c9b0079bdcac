"""``atoll simulate``: the JSON totals, the results table on stdout, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atoll.control.cli import main


def test_simulate_cli_json_totals(capsys: pytest.CaptureFixture[str], shared_data: object) -> None:
    code = main(["simulate", "--scenario", "core", "--days", "11", "--policy", "fixed:6", "--json",
                 "--forecaster", "naive"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(doc["totals"]) == {"cost_usd", "goodput_share", "slo_attainment", "usd_per_mtok",
                                  "reoptimizations", "solver_seconds"}
    assert doc["totals"]["reoptimizations"] == 47 * 3


def test_simulate_cli_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--days", "1-2", "--forecaster", "naive"]) == 2
    assert "days 1-2 are outside 4-14" in capsys.readouterr().err
    assert main(["simulate", "--policy", "sometimes", "--forecaster", "naive"]) == 2
    assert "unknown policy 'sometimes'" in capsys.readouterr().err


@pytest.mark.parametrize("policy", [",", "fixed:1,", ""])
def test_simulate_empty_policy_list_exits_2(capsys: pytest.CaptureFixture[str], policy: str) -> None:
    assert main(["simulate", "--policy", policy, "--forecaster", "naive"]) == 2
    captured = capsys.readouterr()
    assert "--policy" in captured.err and "empty name" in captured.err and captured.out == ""


def test_simulate_plot_with_an_unknown_format_exits_2_before_simulating(capsys: pytest.CaptureFixture[str],
                                                                        tmp_path: Path) -> None:
    assert main(["simulate", "--policy", "never", "--plot", str(tmp_path / "p.xyz")]) == 2
    assert "--plot" in capsys.readouterr().err and not any(tmp_path.iterdir())
