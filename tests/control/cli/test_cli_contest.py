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
