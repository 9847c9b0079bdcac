"""The controller's fleet file: a YAML fleet file narrows models and nodes, its errors name the
file and the entry, and the retired JSON format is refused with the YAML fleet file that plans
the same fleet (loaded here with the real loader)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from atoll.control.live_fleet import LiveFleet, load_fleet_file, yaml_of_json_fleet
from atoll.envs.fleet_file import read_fleet
from atoll.solvers.fleet import FleetFileError
from atoll.solvers.scenarios import trace_shape
from atoll.solvers.tiers import split_tier

NARROW: dict[str, Any] = {
    "name": "narrow-fleet", "slices": False, "models": ["Phi-4-14B"],
    "regions": [{"name": "aws:us-east-2", "catalog": True, "market": "spot", "gpu_types": ["L4", "L40S"]}],
    "availability": {"static": {"aws:us-east-2/1xL4": 3, "aws:us-east-2/1xL40S": 1}},
    "workloads": {"Phi-4-14B": {"source": "azure:code", "mean_rate": 10}}}


def _write(folder: Path, doc: object, name: str = "fleet.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False) if name.endswith(".yaml") else json.dumps(doc))
    return path


def _with(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(NARROW)
    doc.update(changes)
    return doc


def _plain(caps: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """The caps by untiered pool, without the pools that get no nodes."""
    return {(split_tier(r)[0], c): n for (r, c), n in caps.items() if n}


def test_fleet_file_narrows_models_and_nodes(tmp_path: Path) -> None:
    fleet = load_fleet_file(_write(tmp_path, NARROW))
    assert fleet.models == ("Phi-4-14B",)
    assert _plain(fleet.availability) == {("aws:us-east-2", "1xL4"): 3, ("aws:us-east-2", "1xL40S"): 1}
    assert all(t.service.model == "Phi-4-14B" for t in fleet.templates.values())
    assert {fleet.tier(k) for k in fleet.templates} == {"spot"}


@pytest.mark.parametrize(("doc", "message"), [
    ([], "top level: must be a mapping"),
    (_with(scenario="core"), "unknown key 'scenario'"),
    (_with(models=["GPT-5"]), "unknown model 'GPT-5'"),
    (_with(availability={"static": {"4xL4": 2}}), "'4xL4' is not an offered region/config"),
    (_with(availability={"static": {"aws:mars-1/4xL4": 2}}),
     "'aws:mars-1/4xL4' is not an offered region/config"),
    (_with(availability={"static": {"aws:us-east-2/4xL4": -1}}), "must be a whole number >= 0, got -1"),
    (_with(regions=[{"name": "aws:us-east-2", "catalog": True, "market": "cheap"}]),
     "field 'market' must be one of on-demand, spot, hedged"),
])
def test_fleet_file_errors_name_the_entry(tmp_path: Path, doc: object, message: str) -> None:
    path = _write(tmp_path, doc)
    with pytest.raises(FleetFileError) as info:
        load_fleet_file(path)
    assert str(path) in str(info.value) and message in str(info.value)


# a representative fleet of the retired format: every key, a narrowing of each kind
JSON_FLEET = {"scenario": "core", "models": ["Qwen3-32B", "Phi-4-14B"], "prices": "spot",
              "availability": {"aws:us-east-2/4xL4": 6, "aws:us-east-2/1xL40S": 2,
                               "aws:ap-northeast-2/1xL4": 4},
              "runtime": "vllm"}


def _printed_yaml(message: str) -> str:
    head, sep, rest = message.partition("fleet:\n\n")
    assert sep, message
    return rest.partition("\nWhere it differs from the JSON fleet:")[0]


def test_a_json_fleet_file_is_retired_with_the_yaml_that_plans_the_same_fleet(tmp_path: Path) -> None:
    path = _write(tmp_path, JSON_FLEET, "fleet.json")
    with pytest.raises(FleetFileError) as info:
        load_fleet_file(path)
    message = str(info.value)
    assert str(path) in message and "the JSON fleet format is retired" in message
    for note in ("- name:", "- workloads:", "- prices spot:", "(aws:us-east-2~spot/...)"):
        assert note in message
    printed = tmp_path / "pasted.yaml"  # the user's paste, as it was printed
    printed.write_text(_printed_yaml(message))
    assert read_fleet(printed).spec.model_names == ("Qwen3-32B", "Phi-4-14B")
    new = load_fleet_file(printed)
    # what the JSON format planned: the scenario narrowed by LiveFleet's own arguments
    old = LiveFleet("core", models=JSON_FLEET["models"], prices="spot", runtime="vllm",
                    availability={(c.rpartition("/")[0], c.rpartition("/")[2]): n
                                  for c, n in JSON_FLEET["availability"].items()})
    assert new.models == old.models and new.runtime == old.runtime == "vllm"
    assert _plain(new.availability) == _plain(old.availability)
    assert {new.tier(k) for k in new.templates} == {old.tier(k) for k in old.templates} == {"spot"}
    assert new.min_instances == old.min_instances and new.config.removal_weight == old.config.removal_weight
    for m in new.models:  # the same request shape (the scenario's Azure LLM 2023 trace means)
        assert new.shapes[m] == pytest.approx(old.shapes[m], rel=1e-9)
    code = trace_shape("code")
    assert new.shapes["Phi-4-14B"] == pytest.approx((code.input_tokens, code.output_tokens), rel=1e-9)

    def untiered(fleet: LiveFleet) -> dict[str, float]:
        return {k.replace("~spot", ""): t.throughput for k, t in fleet.templates.items()}

    assert untiered(new).keys() == untiered(old).keys()
    assert untiered(new) == pytest.approx(untiered(old), rel=1e-6)


def test_the_translation_of_the_defaults_and_of_on_demand(tmp_path: Path) -> None:
    text, notes = yaml_of_json_fleet({"scenario": "core"})
    doc = yaml.safe_load(text)
    assert doc["models"] == ["Phi-4-14B", "GPT-OSS-20B", "Qwen3-32B"] and doc["slices"] is False
    assert "availability" not in doc and all("market" not in r for r in doc["regions"])
    assert not any(n.startswith("prices") for n in notes)
    fleet = load_fleet_file(_write(tmp_path, doc))
    assert {fleet.tier(k) for k in fleet.templates} == {"on-demand"} and fleet.runtime == "vllm"
    empty = yaml.safe_load(yaml_of_json_fleet({"scenario": "core", "availability": {}, "runtime": "any"})[0])
    assert empty["availability"] == {"static": {}} and empty["runtime"] == "any"


@pytest.mark.parametrize(("content", "reason"), [
    ("[]", "it holds a list"),
    ("{not json", "cannot be translated"),
    ('{"scenario": "core", "gpus": 1}', "unknown key 'gpus'"),
    ('{"scenario": "mars"}', "'scenario' 'mars' is not a bundled scenario"),
    ('{"scenario": ["core"]}', "'scenario' ['core'] is not a bundled scenario"),
    ('{"scenario": "core", "models": ["GPT-5"]}', "not in scenario 'core'"),
    ('{"scenario": "core", "availability": {"4xL4": 2}}', "must look like 'aws:us-east-2/4xL4'"),
    ('{"scenario": "core", "availability": {"aws:mars-1/4xL4": 2}}', "which scenario 'core' does not offer"),
    ('{"scenario": "core", "availability": {"aws:us-east-2/4xL4": -1}}', "whole number of nodes >= 0"),
    ('{"scenario": "core", "prices": "cheap"}', "'on-demand' or 'spot'"),
])
def test_a_json_file_that_cannot_be_translated_is_still_retired(tmp_path: Path, content: str,
                                                                reason: str) -> None:
    path = tmp_path / "fleet.json"
    path.write_text(content)
    with pytest.raises(FleetFileError) as info:
        load_fleet_file(path)
    message = str(info.value)
    assert str(path) in message and "the JSON fleet format is retired" in message and reason in message
    assert "\n" not in message


def test_a_missing_json_file_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(FleetFileError, match="not found"):
        load_fleet_file(tmp_path / "none.json")
