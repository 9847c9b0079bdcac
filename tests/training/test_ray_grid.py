"""``--ray``: the rule grid as Ray tasks on a local Ray instance gives the process pool's numbers.
Not skipped: `make test` installs the ray extra (as the template build's Ray test)."""

from __future__ import annotations

import dataclasses

import pytest
from test_contest import SETTINGS, config

from atoll.solvers.errors import InputError
from atoll.training.contest import ContestSettings, validation_grid


def _same(a: dict, b: dict) -> None:  # type: ignore[type-arg]
    assert a.keys() == b.keys()
    for name, rows in a.items():
        for x, y in zip(rows, b[name], strict=True):
            assert {k: v for k, v in x.items() if k != "solver_seconds"} == \
                {k: v for k, v in y.items() if k != "solver_seconds"}, name


def test_the_ray_grid_equals_the_process_pool_grid() -> None:
    try:
        import ray
    except ImportError:
        pytest.fail("Ray is not installed; `make test` installs it (pip install -e '.[dev,ray]')")
    settings = dataclasses.replace(SETTINGS, seeds=1, levels=(0.9,), bands=())
    pool, _ = validation_grid(config(), dataclasses.replace(settings, workers=2))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray, _ = validation_grid(config(), dataclasses.replace(settings, ray_address="auto"))
        assert ray.is_initialized()  # a Ray instance the caller started is left running
    finally:
        ray.shutdown()
    _same(pool, on_ray)
    assert any(k.startswith("model/1/") for k in pool["fixed:1@0.9"][0])  # with the per-model sums


def test_a_blank_ray_address_is_refused() -> None:
    with pytest.raises(InputError, match="field 'ray_address'"):
        ContestSettings(ray_address=" ")
