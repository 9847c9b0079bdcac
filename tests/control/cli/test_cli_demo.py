"""``atoll demo`` / ``evaluate --rules grid``: the table's title names the market the contest ran in
(it printed ``core / None`` when --availability was not given)."""

from __future__ import annotations

from typing import Any

import pytest

from atoll.control.cli import build_parser
from atoll.control.cli.evaluate import contest
from atoll.control.cli.output import Output


def canned(config: Any, learned: Any, settings: Any, **_: Any) -> dict[str, Any]:
    row = {k: {"mean": 1.0, "std": 0.0} for k in ("cost_usd", "goodput_share", "slo_attainment",
                                                  "usd_per_mtok", "reoptimizations", "solver_seconds")}
    return {"policies": {"fixed:1@0.9": row}, "headline": {}, "frontier": ["fixed:1@0.9"],
            "best_rule": "fixed:1@0.9", "lost_usd_per_mtok": 2.0, "grid_size": 1, "validation_seeds": 1,
            "grid_seconds": 0.0, "test_seconds": 0.0, "per_model": None, "config": config}


@pytest.mark.parametrize(("argv", "title"), [
    (["demo"], "core / spot / test days 11-12"),
    (["demo", "--availability", "hedged"], "core / hedged / test days 11-12"),
    (["evaluate", "--rules", "grid", "--scenario", "extended"], "extended / spot / test days 11-14"),
])
def test_the_contest_title_names_the_market(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str], argv: list[str],
                                            title: str) -> None:
    monkeypatch.setattr("atoll.training.contest_tracking.contest_run", canned)
    from atoll.training.contest import ContestSettings

    args = build_parser().parse_args(argv)
    days = (11, 12) if argv[0] == "demo" else (11, 14)
    contest(Output(json_mode=False), args, [], ContestSettings(test_days=days, seeds=1))
    out = capsys.readouterr().out
    assert title in out and "None" not in out


def test_env_fleet_v2_is_the_closed_loop_and_explicit_flags_win() -> None:
    from atoll.control.cli.evaluate import contest_config

    config = contest_config(build_parser().parse_args(["demo", "--env", "atoll/Fleet-v2"]))
    assert (config.capacity_error, config.correction, config.slo_model, config.observation) == \
        ("calibration", True, "latency", "v2")
    argv = ["evaluate", "--rules", "grid", "--env", "atoll/Fleet-v2", "--capacity-error", "stress:0.2"]
    config = contest_config(build_parser().parse_args(argv))
    assert config.capacity_error == "stress:0.2" and config.observation == "v2"
    assert contest_config(build_parser().parse_args(["demo"])).observation == "v1"
    from atoll.control.cli.common import make_env, world_options

    args = build_parser().parse_args(["evaluate", "--env", "atoll/Fleet-v2", "--forecaster", "naive"])
    assert world_options(args)["observation"] == "v2"  # what the listed evaluation passes to make_env
    assert make_env(args, (11, 11), **world_options(args)).config.slo_model == "latency"


def test_the_headline_gives_each_ratio_its_seeds_and_interval() -> None:
    import numpy as np

    from atoll.control.cli.evaluate import interval_text
    from atoll.training.lever_oracle import paired_ratio

    assert interval_text(0.95, 0.0, 1, ".3f") == "0.950 (1 seed)"  # one seed: no interval, said so
    ratios = [0.93, 0.97, 0.95, 0.99]
    want = paired_ratio(ratios, [1.0] * 4)  # the room's paired interval over the same seeds
    text = interval_text(float(np.mean(ratios)), float(np.std(ratios)), 4, ".3f")
    assert text == f"{want['mean']:.3f} [{want['low']:.3f}, {want['high']:.3f}]"
