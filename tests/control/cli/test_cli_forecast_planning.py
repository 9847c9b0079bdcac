"""``atoll forecast backtest --target planning``: the peak over the look-ahead."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from atoll.control.cli import main
from atoll.forecast.forecasters import DAY


def request_log(tmp_path: Path, days: int) -> Path:
    rng = np.random.default_rng(0)
    lines = ["timestamp,model,input_tokens,output_tokens"]
    for step in range(days * DAY):
        rate = 3 + 2 * np.sin(2 * np.pi * step / DAY)
        for k in range(rng.poisson(rate)):
            lines.append(f"{step * 300 + k},m,{rng.integers(50, 500)},{rng.integers(5, 50)}")
    log = tmp_path / "log.csv"
    log.write_text("\n".join(lines) + "\n")
    return log


def test_planning_target_backtest_reports_each_candidate(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    log = request_log(tmp_path, 4)
    code = main(["forecast", "backtest", "--workload", f"csv:{log}", "--target", "planning",
                 "--forecaster", "ets,peak:persistence,peak:auto", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["target"] == "planning" and doc["train_days"] == 3
    rows = {r["forecaster"]: r for r in doc["results"]}
    assert set(rows) == {"ets", "peak:persistence", "peak:auto"}
    assert rows["ets"]["pinball_vs_ets"] == 1.0
    assert rows["peak:auto"]["chosen"].startswith("peak:")
    for r in rows.values():
        assert r["points"] == DAY - 2 and 0 <= r["coverage"] <= 1 and r["pinball"] > 0


def test_planning_target_bad_look_ahead_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = request_log(tmp_path, 4)
    assert main(["forecast", "backtest", "--workload", f"csv:{log}", "--target", "planning",
                 "--look-ahead", "0"]) == 2
    assert "--look-ahead must be >= 1 step" in capsys.readouterr().err
