"""``--world``: one setting selects the world (its charges and env id) on every command that builds
a fleet env; ``--env`` names the same worlds and must agree with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from atoll.control.cli import build_parser, main
from atoll.control.cli.common import make_env, world_options
from atoll.envs import CHARGED, CLOSED_LOOP, WORLD_ENV_IDS, world_of
from atoll.training.registry import env_id


@pytest.mark.parametrize("command", ["simulate", "train", "evaluate", "demo"])
@pytest.mark.parametrize(("world", "settings"), [("exact", {}), ("calibration", CLOSED_LOOP),
                                                  ("charged", CHARGED)])
def test_the_world_sets_its_charges_and_env_id(command: str, world: str, settings: dict[str, object]) -> None:
    args = build_parser().parse_args([command, "--world", world, "--forecaster", "naive"])
    config = make_env(args, (11, 11)).config
    assert all(getattr(config, k) == v for k, v in settings.items())
    assert world_of(config) == world and env_id(config) == WORLD_ENV_IDS[world]


def test_an_option_given_with_the_world_wins() -> None:
    args = build_parser().parse_args(["simulate", "--world", "charged", "--capacity-error", "0.1"])
    assert world_options(args)["capacity_error"] == "0.1"
    config = make_env(args, (11, 11)).config
    assert config.startup == "sampled" and world_of(config) == "custom"


def test_env_and_world_must_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["train", "--env", "atoll/Fleet-v3"])
    assert world_options(args) == CHARGED
    code = main(["train", "--env", "atoll/Fleet-v2", "--world", "charged", "--run-dir", str(tmp_path / "r"),
                 "--json"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--env atoll/Fleet-v2 trains in the calibration world, but --world charged" in err
    assert not (tmp_path / "r").exists()


def test_fleet_v4_trains_in_the_charged_world_choosing_its_risk(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    from atoll.control.cli.train import train_config

    # the teacher's risks among the presets: behaviour cloning checks its codes on the env
    args = build_parser().parse_args(["train", "--env", "atoll/Fleet-v4", "--risk-menu", "h0.85;h0.7",
                                      "--forecaster", "naive", "--bootstrap-steps", "8",
                                      "--bootstrap-rule", "per-model:1@0.9+h0.7,1@0.9,1@0.9+h0.85"])
    config, _ = train_config(args, (4, 4), 64, 0)
    assert env_id(config) == "atoll/Fleet-v4" and world_of(config) == "charged"
    assert [r.label() for r in config.risk_menu] == ["h0.85", "h0.7"]
    assert {"full@0.9+h0.7", "grow@0.95+h0.85"} <= set(config.action_codec.names())
    for argv, message in ((["--risk-menu", "h0.7"], "give --env atoll/Fleet-v4"),
                          (["--env", "atoll/Fleet-v4", "--risk-menu", "h1.5"], "--risk-menu 'h1.5'")):
        assert main(["train", *argv, "--run-dir", str(tmp_path / "r"), "--json"]) == 2
        assert message in capsys.readouterr().out


def test_the_contests_grid_takes_intervals_and_the_risk_menu() -> None:
    from atoll.control.cli.evaluate import contest_settings

    args = build_parser().parse_args(["evaluate", "--rules", "grid", "--levels", "0.9", "--intervals", "1,3",
                                      "--risks", "neutral;h0.7"])
    st = contest_settings(args)
    assert st.intervals == (1, 3) and st.risks == ("neutral", "h0.7")
    assert {"fixed:1@0.9", "fixed:3@0.9+h0.7"} <= set(st.grid)
