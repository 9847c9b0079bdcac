"""``atoll forecast backtest`` and ``atoll forecast plot``: JSON, unknown names, bad plot options."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from atoll.control.cli import main
from atoll.forecast.forecasters import DAY


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


@pytest.mark.parametrize(("argv", "message"), [
    (("--hours", "0"), "--hours 0 must be > 0"),
    (("--hours", "1e6"), "--hours 1e+06 must be > 0 and at most 168"),
    (("--hours", "nan"), "--hours nan must be > 0"),
    (("--hours", "0.01"), "shorter than one 5-minute step"),
    (("--origin-day", "nan"), "--origin-day nan must be a day of the data"),
    (("--origin-day", "2"), "must leave >= 2 days of history"),
    (("--out", "plot.xyz"), "unknown image format 'xyz'"),
    (("--out", "plot"), "unknown image format '(no extension)'"),
    (("--forecaster", "prophet"), "unknown forecaster 'prophet'"),
])
def test_plot_bad_options_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                 message: str) -> None:
    args = {"--out": str(tmp_path / "f.png"), **dict(zip(argv[::2], argv[1::2], strict=True))}
    if args["--out"] in ("plot.xyz", "plot"):
        args["--out"] = str(tmp_path / args["--out"])
    code = main(["forecast", "plot", "--forecaster", "naive", *[x for kv in args.items() for x in kv]])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and message in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())


def test_plot_writes_the_image(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               shared_data: object) -> None:
    out = tmp_path / "f.svg"
    code = main(["forecast", "plot", "--forecaster", "naive", "--hours", "2", "--out", str(out), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and out.stat().st_size > 0 and doc["horizon_steps"] == 24


def test_plot_origin_day_counts_from_day_1(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           shared_data: object) -> None:
    """Day 1 is the first day of the data, as in ``simulate --days``: day 3 starts at hour 48."""
    code = main(["forecast", "plot", "--forecaster", "naive", "--hours", "1", "--origin-day", "3",
                 "--out", str(tmp_path / "f.png"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["origin_hour"] == 48.0 and doc["origin_day"] == 3


def test_forecast_takes_a_fleets_models(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        shared_data: object) -> None:
    code = main(["forecast", "plot", "--fleet", "core", "--model", "Qwen3-32B", "--forecaster", "naive",
                 "--hours", "1", "--out", str(tmp_path / "f.png"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["series"] == "Qwen3-32B"
    assert main(["forecast", "plot", "--fleet", "core", "--out", str(tmp_path / "g.png")]) == 2
    assert "draws one series; pick one with --model" in capsys.readouterr().err
    assert main(["forecast", "backtest", "--fleet", "core", "--workload", "servegen:m-large"]) == 2
    assert "drop --workload" in capsys.readouterr().err
    code = main(["forecast", "backtest", "--fleet", "core", "--model", "Phi-4-14B", "--forecaster",
                 "naive", "--train-days", "12", "--json"])
    captured = capsys.readouterr()
    rows = json.loads(captured.out)["results"]
    assert code == 0 and {r["series"] for r in rows} == {"Phi-4-14B"} and rows[0]["chosen"] == "naive"
    assert "backtest Phi-4-14B naive: fitting on days 1-12" in captured.err


def _request_log(path: Path, days: int) -> Path:
    rng = np.random.default_rng(1)
    lines = ["timestamp,model,input_tokens,output_tokens"]
    for step in range(days * DAY):
        rate = 3 + 2 * np.sin(2 * np.pi * step / DAY)
        lines += [f"{step * 300 + k},m,100,10" for k in range(rng.poisson(rate))]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_forecast_train_writes_weights_a_card_and_an_mlflow_version(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from atoll.forecast.learned import load_net

    log = _request_log(tmp_path / "log.csv", 11)
    out = tmp_path / "w.npz"
    code = main(["forecast", "train", "--scenarios", "none", "--workload", f"csv:{log}", "--epochs", "2",
                 "--out", str(out), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    net = load_net(out)
    assert net.card["series"] == 1 and "atoll forecast train" in str(net.card["command"])
    assert doc["mlflow"]["registered"] == "models:/atoll-demand/1" and doc["epochs_run"] <= 2


@pytest.mark.parametrize(("argv", "message"), [
    (("--epochs", "0"), "field 'epochs' must be an integer >= 1"),
    (("--scenarios", "none"), "must not be empty without 'extra' series"),
    (("--scenarios", "huge", "--no-mlflow"), "unknown scenario 'huge'"),
])
def test_forecast_train_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          argv: tuple[str, ...], message: str) -> None:
    assert main(["forecast", "train", "--out", str(tmp_path / "w.npz"), *argv]) == 2
    assert message in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "w.npz").exists()


def test_forecast_train_refuses_a_series_shorter_than_two_days(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    log = _request_log(tmp_path / "short.csv", 1)
    assert main(["forecast", "train", "--scenarios", "none", "--workload", f"csv:{log}", "--out",
                 str(tmp_path / "w.npz")]) == 2
    assert "training needs at least two days" in capsys.readouterr().err.replace("\n", " ")
