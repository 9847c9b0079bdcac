"""The world that differs from the model: specs, seeded draws, families."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from atoll.envs.capacity_error import (
    FACTOR_MAX,
    FACTOR_MIN,
    CapacityError,
    calibration_sigmas,
    families_of,
    family_of,
)
from atoll.envs.config import FleetConfig
from atoll.solvers.errors import InputError
from atoll.solvers.types import Phase, Service, Stage, Template

FAMS = ("Phi-4-14B/decode/L4/pp1-tp1", "Phi-4-14B/prefill/H100/pp2-tp4", "Qwen3-32B/decode/A10G+L40S/pp2-tp4")


def test_parse_specs() -> None:
    assert CapacityError.parse(0).exact
    assert CapacityError.parse("none").exact
    assert CapacityError.parse(0.12) == CapacityError("sigma", 0.12)
    assert CapacityError.parse("sigma:0.2") == CapacityError("sigma", 0.2)
    assert CapacityError.parse("stress:0.25").label == "stress:0.25"
    assert CapacityError.parse("calibration").kind == "calibration"
    for bad in ("stress:1.5", "sigma:x", "wobble:0.1", "scale:9"):
        with pytest.raises(InputError, match="capacity_error|CapacityError"):
            CapacityError.parse(bad)
    with pytest.raises(InputError, match="field 'capacity_error'"):
        FleetConfig(capacity_error="stress:2")


def test_draws_reproduce_for_a_seed_and_differ_across_seeds() -> None:
    spec = CapacityError.parse("calibration")
    a = spec.draw(FAMS, np.random.default_rng(7))
    b = spec.draw(reversed(FAMS), np.random.default_rng(7))
    c = spec.draw(FAMS, np.random.default_rng(8))
    assert a == b and a != c
    assert all(FACTOR_MIN <= v <= FACTOR_MAX for v in a.values())


def test_stress_scale_and_exact() -> None:
    s = CapacityError.parse("stress:0.25").draw(FAMS, np.random.default_rng(0))
    assert set(s.values()) <= {0.75, 1.25}
    assert set(CapacityError.parse("scale:0.75").draw(FAMS, None).values()) == {0.75}
    assert set(CapacityError.parse(0).draw(FAMS, None).values()) == {1.0}


def test_calibration_spread_matches_the_reported_error() -> None:
    by_type, fallback = calibration_sigmas()
    # median |log f| of the draws ~ the held-out median APE of the type
    draws = CapacityError.parse("calibration").draw([f"m/decode/H100/pp1-tp{i}" for i in range(4000)],
                                                     np.random.default_rng(0))
    med = float(np.median(np.abs(np.log(list(draws.values())))))
    assert med == pytest.approx(by_type["H100"] * 0.6745, rel=0.08)
    assert 0.1 < fallback < 0.5


def test_file_factors(tmp_path: Path) -> None:
    p = tmp_path / "f.json"
    p.write_text(json.dumps({"Phi-4-14B/decode/*": 0.8, "*": 1.1}))
    got = CapacityError.parse(f"file:{p}").draw(FAMS, None)
    assert got[FAMS[0]] == 0.8 and got[FAMS[1]] == 1.1
    with pytest.raises(InputError, match="does not exist"):
        CapacityError.parse(f"file:{tmp_path / 'missing.json'}")
    p.write_text(json.dumps({"*": -1}))
    with pytest.raises(InputError, match="factor of '\\*'"):
        CapacityError.parse(f"file:{p}")


def test_family_of_a_template() -> None:
    t = Template(Service("Phi-4-14B", Phase.DECODE), "aws:us-east-2", (("1xL4", 1), ("4xL40S", 1)),
                 (Stage(10, ("1xL4",)), Stage(30, ("4xL40S",))), 100.0)
    assert family_of(t) == "Phi-4-14B/decode/L4+L40S/pp2-tp1/4"


@pytest.mark.parametrize("slices", [False, True])
def test_families_named_per_distinct_layout_are_each_templates_own(slices: bool) -> None:
    """families_of names each distinct (service, GPU types, GPUs per node, stages) once from the
    index; every template's family is still family_of's (a sliced library is named one by one)."""
    from atoll.solvers.problem import template_index
    from atoll.solvers.templates import LibrarySpec, build_library

    spec = LibrarySpec(models=("Qwen3-32B", "Phi-4-14B"), regions=("aws:us-east-2", "gcp:us-central1"),
                       gpu_types=("L4", "L40S", "A100-80GB"), n_max=3, pd="auto", runtime="vllm",
                       slices=slices)
    templates = build_library(spec, use_cache=False, workers=1, progress=False).templates
    assert len({family_of(t) for t in templates}) > 10
    assert families_of(templates, template_index(templates)) == [family_of(t) for t in templates]
