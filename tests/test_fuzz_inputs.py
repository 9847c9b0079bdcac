"""Hypothesis: hostile catalog files, /metrics pages, Prometheus answers and fleet files give only
the project's own errors (a few hundred examples each; benchmarks/fuzz.py runs >= 20,000)."""

from __future__ import annotations

from typing import Any

from fuzz_targets import (
    CatalogTarget,
    FleetTarget,
    bodies,
    catalog_inputs,
    fleet_inputs,
    metrics_target,
    pages,
    prometheus_target,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atoll.solvers.errors import AtollError

FAST = settings(max_examples=300, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
CATALOG = CatalogTarget()
FLEET = FleetTarget()


@FAST
@given(catalog_inputs, st.sampled_from([".yaml", ".toml"]))
def test_user_catalog_files_raise_only_input_errors(item: tuple[str, Any], suffix: str) -> None:
    try:
        CATALOG(item, suffix)
    except AtollError:
        pass


@FAST
@given(st.lists(pages, min_size=1, max_size=3))
def test_metrics_pages_raise_only_metrics_unavailable(pages_: list[bytes]) -> None:
    try:
        metrics_target(pages_)
    except AtollError:
        pass


@FAST
@given(st.tuples(bodies, bodies, bodies))
def test_prometheus_answers_raise_only_metrics_unavailable(three: tuple[bytes, bytes, bytes]) -> None:
    try:
        prometheus_target(three)
    except AtollError:
        pass


@FAST
@given(fleet_inputs)
def test_fleet_files_raise_only_fleet_file_errors(item: tuple[str, Any]) -> None:
    """Mutated valid fleet files (the bundled ones, the README's and the docstring's examples),
    edited YAML text and random bytes through load_fleet; those that load and read request logs
    are also activated. Only project errors, and a loader error names the file."""
    try:
        FLEET(item)
    except AtollError:
        pass
