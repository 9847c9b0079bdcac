"""``atoll evaluate --rules grid``: bad input exits 2 with a message naming the option, before any run."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from atoll.control.cli import main
from atoll.training.tracking import configure


@pytest.mark.parametrize(("argv", "message"), [
    (("--policies", "fixed:1"), "are not learned policies"),
    (("--levels", "0.9,0.42"), "planning level 0.42 is not forecast"),
    (("--levels", "high"), "--levels 'high' must be comma-separated numbers"),
    (("--validation-days", "11-12"), "overlap test days 11-14"),
    (("--workers", "0"), "field 'workers' must be >= 1"),
])
def test_contest_bad_input_exits_2_and_leaves_no_run(capsys: pytest.CaptureFixture[str],
                                                     argv: tuple[str, ...], message: str) -> None:
    code = main(["evaluate", "--rules", "grid", "--forecaster", "naive", "--json", *argv])
    captured = capsys.readouterr()
    assert code == 2 and message in json.loads(captured.out)["error"]["message"]
    assert "Traceback" not in captured.err
    assert list(MlflowClient().search_runs([configure()])) == []


def test_the_contest_takes_the_simulators_default_availability() -> None:
    """``atoll demo`` and ``evaluate --rules grid`` without --availability failed with
    "field 'availability' ... got None" after training (the option's default moved to make_env)."""
    from atoll.control.cli import build_parser
    from atoll.control.cli.evaluate import contest_config

    for argv in (["demo"], ["evaluate", "--rules", "grid"]):
        args = build_parser().parse_args(argv)
        assert contest_config(args).availability == "spot"
    args = build_parser().parse_args(["demo", "--availability", "hedged", "--solver-time-limit", "3"])
    config = contest_config(args)
    assert config.availability == "hedged" and config.solver_time_limit == 3


def test_the_contest_takes_a_fleet_files_own_series_and_market() -> None:
    # the env the simulator builds for the fleet file, over the validation and test days
    from atoll.control.cli import build_parser
    from atoll.control.cli.evaluate import contest_config
    from atoll.training.contest import ContestSettings

    args = build_parser().parse_args(["evaluate", "--rules", "grid", "--fleet", "core", "--world", "charged"])
    config = contest_config(args, ContestSettings(validation_days=(8, 9), test_days=(11, 12)))
    assert config.scenario == "core" and config.availability == "market" and config.days == (8, 12)
    assert config.startup == "sampled" and config.demand  # the charged world, the file's own series
