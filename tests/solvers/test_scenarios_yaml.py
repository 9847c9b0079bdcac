"""The bundled scenarios are the fleet files under atoll/solvers/data/fleets: each one, read as a
scenario, is the ``ScenarioSpec`` the scenario was written as in Python before (copied here as that
constructor call, the guard that no field moved), and plans with the same template library."""

from __future__ import annotations

import dataclasses

import pytest

from atoll.solvers.catalog import DEFAULT_GPU_TYPES, DEFAULT_REGIONS
from atoll.solvers.models import DEFAULT_MODELS, fleet_model_names
from atoll.solvers.scenarios import SCENARIOS, ScenarioSpec, library_spec
from atoll.solvers.template_store import digest
from atoll.solvers.templates import CODE_VERSION

# The bundled scenarios as they were written in solvers/scenarios.py before they became YAML.
WRITTEN: dict[str, ScenarioSpec] = {
    "core": ScenarioSpec("core", ("Phi-4-14B", "GPT-OSS-20B", "Qwen3-32B"), ("L4", "A10G", "L40S"),
                         ("aws:us-east-2", "aws:ap-northeast-2"), 10.0, 0.25),
    "extended": ScenarioSpec("extended", DEFAULT_MODELS, DEFAULT_GPU_TYPES, DEFAULT_REGIONS, 25.0, 0.75),
    "fleet20": ScenarioSpec("fleet20", fleet_model_names(20), DEFAULT_GPU_TYPES, DEFAULT_REGIONS, 10.0, 0.75),
}


def test_the_bundled_scenarios_are_the_fleet_files() -> None:
    assert tuple(SCENARIOS) == ("core", "extended", "fleet20")


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_a_bundled_scenario_read_from_yaml_equals_the_written_one_field_for_field(name: str) -> None:
    loaded, written = SCENARIOS[name], WRITTEN[name]
    for f in dataclasses.fields(ScenarioSpec):
        assert getattr(loaded, f.name) == getattr(written, f.name), f.name
    assert loaded == written and hash(loaded) == hash(written)


def _library_key(spec: ScenarioSpec, **kwargs: object) -> str:
    """The key build_library files the scenario's library under (atoll.solvers.templates)."""
    jobs = library_spec(spec, **kwargs).jobs()  # type: ignore[arg-type]
    return digest({"code_version": CODE_VERSION, "jobs": [job.key for job in jobs]})


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_a_bundled_scenario_plans_with_the_same_template_library(name: str) -> None:
    loaded, written = SCENARIOS[name], WRITTEN[name]
    assert library_spec(loaded) == library_spec(written)
    assert _library_key(loaded) == _library_key(written)
    for settings in ({"runtime": "vllm"}, {"pd": "auto"}):
        assert _library_key(loaded, **settings) == _library_key(written, **settings)


@pytest.mark.parametrize("name", ["core", "extended"])
def test_the_benchmarks_scenario_libraries_cover_the_bundled_scenarios(name: str) -> None:
    """SCENARIO_LIBRARIES (the default-shape libraries benchmarks/templates.py builds) cannot drift
    from the scenario files."""
    from atoll.solvers.templates import SCENARIO_LIBRARIES

    lib, spec = SCENARIO_LIBRARIES[name], SCENARIOS[name]
    assert (lib.models, lib.regions, lib.gpu_types) == (spec.models, spec.regions, spec.gpu_types)
    assert (lib.n_max, lib.rho, lib.runtime) == (spec.n_max, spec.rho, spec.runtime)
