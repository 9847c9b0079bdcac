"""CLI: atoll templates build (JSON document, cache reuse, scenario overrides, bad input)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atoll.control.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


SMALL = ("templates", "build", "--models", "Qwen3-32B", "--regions", "aws:us-east-2", "--gpus", "L40S",
         "--n-max", "3", "--workers", "1", "--json")


def test_build_json_then_cached(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, *SMALL, "--cache-dir", str(tmp_path))
    doc = json.loads(out)
    assert code == 0 and doc["scenario"] is None and not doc["from_cache"]
    # pd auto (the default): a replica per phase and one serving both
    assert set(doc["templates_per_service"]) == {"Qwen3-32B/prefill", "Qwen3-32B/decode",
                                                 "Qwen3-32B/colocated"}
    assert doc["total_templates"] == sum(doc["templates_per_service"].values()) > 0
    assert "Template library" in err
    code, out, _ = run(capsys, *SMALL, "--cache-dir", str(tmp_path))
    again = json.loads(out)
    assert code == 0 and again["from_cache"] and again["cache_key"] == doc["cache_key"]


def test_scenario_with_overrides(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "templates", "build", "--scenario", "core", "--models", "Phi-4-14B",
                       "--gpus", "L40S", "--regions", "aws:us-east-2", "--n-max", "2", "--workers", "1",
                       "--no-cache", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["scenario"] == "core"
    assert doc["spec"]["models"] == ["Phi-4-14B"] and doc["spec"]["n_max"] == 2
    assert not any(tmp_path.iterdir())


def test_every_bundled_scenario_builds_its_library_and_a_fine_tune_takes_its_base_entry(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    small = ("--gpus", "L40S", "--regions", "aws:us-east-2", "--n-max", "2", "--workers", "1",
             "--cache-dir", str(tmp_path), "--json")
    code, out, _ = run(capsys, "templates", "build", "--scenario", "fleet20", "--models", "Phi-4-14B", *small)
    base = json.loads(out)
    assert code == 0 and base["scenario"] == "fleet20" and not base["from_cache"]
    assert base["spec"]["model_shapes"]["Phi-4-14B"]  # the scenario's own request shape
    code, out, _ = run(capsys, "templates", "build", "--scenario", "fleet20", "--models", "Phi-4-14B-ft1",
                       *small)
    tuned = json.loads(out)
    assert code == 0 and tuned["from_cache"]  # no job ran: the base's entries answered
    assert tuned["total_templates"] == base["total_templates"] > 0
    assert set(tuned["templates_per_service"]) == {"Phi-4-14B-ft1/prefill", "Phi-4-14B-ft1/decode",
                                                   "Phi-4-14B-ft1/colocated"}


@pytest.mark.parametrize(("argv", "message"), [
    (("--scenario", "huge"), "valid scenarios: core, extended, fleet20"),
    (("--models", "gpt-9"), "unknown model 'gpt-9'"),
    (("--regions", "mars:1"), "valid regions"),
    (("--n-max", "0"), "field 'n_max'"),
    (("--workers", "0"), "--workers must be >= 1"),
    (("--input-tokens", "0"), "input_tokens"),
])
def test_bad_input_exits_2(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    code, out, err = run(capsys, "templates", "build", "--no-cache", *argv)
    assert code == 2 and out == "" and message in err
