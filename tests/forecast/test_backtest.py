"""Backtest metrics on a series with a known answer, and the CLI's JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from atoll.control.cli import main
from atoll.forecast.backtest import backtest
from atoll.forecast.forecasters import DAY


def test_naive_on_a_repeating_series_is_perfect() -> None:
    day = 50 + 30 * np.sin(2 * np.pi * np.arange(DAY) / DAY)
    y = np.tile(day, 9)
    res, _ = backtest(y + 0.0, series="rep", forecaster="naive", train_steps=7 * DAY, horizons=(1, 6))
    for r in res:
        assert r.mase == 0.0 or r.mase < 1e-12
        assert r.series == "rep" and r.points > 0


def test_cli_backtest_json_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    lines = ["timestamp,model,input_tokens,output_tokens"]
    for step in range(9 * DAY):
        rate = 3 + 2 * np.sin(2 * np.pi * step / DAY)
        for k in range(rng.poisson(rate)):
            lines.append(f"{step * 300 + k},m,{rng.integers(50, 500)},{rng.integers(5, 50)}")
    log = tmp_path / "log.csv"
    log.write_text("\n".join(lines) + "\n")
    code = main(["forecast", "backtest", "--workload", f"csv:{log}", "--forecaster", "ets", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    keys = {"series", "forecaster", "horizon_min", "mase", "naive_mase", "coverage_80", "coverage_90"}
    assert keys <= set(doc["results"][0])
    assert {r["horizon_min"] for r in doc["results"]} == {5, 30, 60, 360}


def test_cli_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["forecast", "backtest", "--forecaster", "prophet"]) == 2
    assert "unknown forecaster 'prophet'" in capsys.readouterr().err
    assert main(["forecast", "backtest", "--workload", "servegen:m-huge"]) == 2
    assert "unknown ServeGen model 'm-huge'" in capsys.readouterr().err
