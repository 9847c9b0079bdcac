"""CLI of the closed loop: simulate's closed-loop flags, replay serving a plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atoll.control.cli import build_parser
from atoll.control.cli.common import make_env
from atoll.control.cli.output import UserError
from atoll.control.cli.replay import build_exporter


def test_simulate_flags_reach_the_env() -> None:
    args = build_parser().parse_args(["simulate", "--capacity-error", "stress:0.25", "--correction",
                                      "--slo-model", "latency", "--days", "11"])
    env = make_env(args, (11, 11))
    assert env.config.capacity_error == "stress:0.25" and env.config.correction
    assert env.config.slo_model == "latency" and env.config.closed_loop
    plain = make_env(build_parser().parse_args(["simulate", "--days", "11"]), (11, 11))
    assert not plain.config.closed_loop


def test_simulate_refuses_a_bad_capacity_error() -> None:
    args = build_parser().parse_args(["simulate", "--capacity-error", "stress:3", "--days", "11"])
    with pytest.raises(Exception, match="capacity_error"):
        make_env(args, (11, 11))


def test_replay_serves_the_plans_of_a_folder(tmp_path: Path) -> None:
    args = build_parser().parse_args(["replay", "--workload", "servegen:m-large", "--models", "Phi-4-14B",
                                      "--plans", str(tmp_path), "--capacity-error", "scale:0.75"])
    exporter = build_exporter(args)
    assert exporter.served is not None and set(exporter.served.truth.values()) == {0.75}
    # no plan yet: the servers serve nothing, and the page says so in vLLM's names
    with exporter:
        page = exporter.render().decode()
    assert "vllm:time_to_first_token_seconds_bucket" in page
    assert "vllm:inter_token_latency_seconds_sum" in page
    assert 'vllm:prompt_tokens_total{model_name="Phi-4-14B"} 0.0' in page
    # a plan delivered to the folder is what serves next
    key = next(k for k in exporter.served.model.templates if k.startswith("Phi-4-14B/prefill"))
    (tmp_path / "latest.json").write_text(json.dumps({"plan": {key: 1}}))
    exporter.served._follow()
    assert exporter.served.plan == {key: 1}


def test_replay_capacity_error_needs_plans() -> None:
    args = build_parser().parse_args(["replay", "--workload", "servegen:m-large", "--models", "Phi-4-14B",
                                      "--capacity-error", "scale:0.75"])
    with pytest.raises(UserError, match="needs --plans"):
        build_exporter(args)
