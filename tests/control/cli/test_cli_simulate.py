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


def test_ctrl_c_prints_the_partial_totals(shared_data: object, tmp_path: Path) -> None:
    """SIGINT to a real ``atoll simulate --json`` mid-run: exit 130, one JSON document with
    ``"partial": true`` and the totals of the steps that ran."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "atoll.control.cli", "simulate", "--scenario", "core",
                             "--days", "11-14", "--policy", "hindsight", "--forecaster", "naive", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                            # a suite started in the background (`make test &`) ignores SIGINT, the
                            # child inherits that and Python then installs no KeyboardInterrupt
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # progress lines off a terminal: the run is under way
        line = proc.stderr.readline()
        if "simulate hindsight" in line or not line:
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    doc = json.loads(out)
    assert doc["partial"] is True
    totals = doc["policies"]["hindsight"]["totals"]
    assert 0 < totals["reoptimizations"] < 4 * 288 * 3 and totals["cost_usd"] > 0
    assert "interrupted" in err


def test_a_rule_simulation_loads_no_learning_library() -> None:
    """simulate imports the policy resolver and the tune file reader; SB3 and torch (1.2 s and
    230 MB a process) load only when a learned policy is read."""
    import subprocess
    import sys

    code = ("import sys\nimport atoll.training.evaluate, atoll.training.tuning, atoll.control.cli.simulate\n"
            "print('HEAVY', [m for m in ('torch', 'stable_baselines3') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out
