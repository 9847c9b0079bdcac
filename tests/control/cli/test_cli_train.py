"""``atoll train`` and ``atoll evaluate``: bad input exits 2 before any MLflow run is left behind."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from atoll.control.cli import main
from atoll.training.tracking import configure


def _runs() -> list[object]:
    experiment = configure()
    return list(MlflowClient().search_runs([experiment]))


@pytest.mark.parametrize(("argv", "message"), [
    (("--seed", "-1"), "field 'seed' must be >= 0, got -1"),
    (("--timesteps", "0"), "field 'timesteps' must be >= 1, got 0"),
    (("--bootstrap-rule", "hindsight"), "field 'bootstrap_rule' must be a deployable rule"),
    (("--bootstrap-smoothing", "0.7"), "field 'bootstrap_smoothing' must be in [0, 0.5), got 0.7"),
    (("--checkpoint-every", "-5"), "--checkpoint-every: PPO steps between checkpoints must be >= 0 "
                                   "(0: only at the end), got -5"),
])
def test_train_bad_settings_exit_2_and_leave_no_run(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                                    message: str) -> None:
    code = main(["train", "--forecaster", "naive", "--json", *argv])
    captured = capsys.readouterr()
    assert code == 2 and message in json.loads(captured.out)["error"]["message"]
    assert "Traceback" not in captured.err
    assert _runs() == []


@pytest.mark.parametrize(("rule", "message"), [
    ("per-model:1@0.9,1@0.95", "gives 2 K@q entries for 3 models"),
    ("per-model:1@0.8,1@0.9,1@0.9", "plans at 0.8, not among the env's action levels 0.9, 0.7, 0.95"),
    ("fixed:1@0.8", "plans at 0.8, not one of the env's action levels"),
])
def test_train_a_teacher_that_does_not_fit_the_fleet_exits_2_and_leaves_no_run(
        capsys: pytest.CaptureFixture[str], shared_data: object, rule: str, message: str) -> None:
    code = main(["train", "--forecaster", "naive", "--train-days", "4-4", "--bootstrap-rule", rule, "--json"])
    captured = capsys.readouterr()
    assert code == 2 and message in json.loads(captured.out)["error"]["message"]
    assert "Traceback" not in captured.err
    assert _runs() == []


def test_evaluate_unknown_learned_uri_exits_2(capsys: pytest.CaptureFixture[str],
                                              shared_data: object) -> None:
    code = main(["evaluate", "--forecaster", "naive", "--eval-days", "11", "--seeds", "1",
                 "--policies", "learned:runs:/0123456789abcdef/policy,never", "--json"])
    captured = capsys.readouterr()
    error = json.loads(captured.out)["error"]
    assert code == 2 and error["type"] == "InputError"
    assert "learned policy 'runs:/0123456789abcdef/policy' cannot be loaded" in error["message"]
    assert "MLFLOW_TRACKING_URI" in error["message"] and "Traceback" not in captured.err
    assert _runs() == []


def test_train_standardizes_observations_only_when_asked(shared_data: object) -> None:
    from atoll.control.cli import build_parser
    from atoll.control.cli.train import train_config

    for argv, expected in (((), False), (("--normalize-observations",), True)):
        args = build_parser("train").parse_args(["train", "--forecaster", "naive", "--bootstrap-steps", "0",
                                                 *argv])
        _, settings = train_config(args, (4, 4), 64, 0)
        assert settings.normalize_observations is expected


def test_train_status_and_a_policy_file_through_the_cli(capsys: pytest.CaptureFixture[str],
                                                        shared_data: object, tmp_path: object) -> None:
    run_dir = f"{tmp_path}/run"
    base = ["--forecaster", "naive", "--train-days", "4-4", "--n-envs", "1", "--bootstrap-steps", "0"]
    assert main(["train", *base, "--timesteps", "64", "--run-dir", run_dir, "--json"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert trained["run_dir"] == run_dir and trained["policy_file"] == f"{run_dir}/policy-best"
    assert main(["train", "--status", run_dir, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["state"] == "finished" and status["checkpoint_steps"] == 576 and status["checkpoint_exact"]
    assert status["command"].startswith("atoll ")
    code = main(["train", *base, "--train-days", "4-5", "--timesteps", "64", "--run-dir", run_dir, "--json"])
    error = json.loads(capsys.readouterr().out)["error"]["message"]
    assert code == 2 and "env.days: the run has '(4, 4)', this command '(4, 5)'" in error
    code = main(["evaluate", "--forecaster", "naive", "--eval-days", "11", "--seeds", "1",
                 "--env", "atoll/Fleet-v2", "--policies", f"learned:file:{run_dir}/policy-best", "--json"])
    error = json.loads(capsys.readouterr().out)["error"]["message"]
    assert code == 2 and "atoll/Fleet-v1" in error
    assert "atoll/Fleet-v2): observation size, env id differ" in error
    assert main(["train", "--status", f"{tmp_path}", "--json"]) == 2
    assert "no run.json (not a run folder)" in json.loads(capsys.readouterr().out)["error"]["message"]
