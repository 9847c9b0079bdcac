"""The what-if catalog (hypothetical 2-GPU AWS nodes) is marked everywhere and never leaks into
default catalogs, libraries, problems or ladders."""

from __future__ import annotations

import pytest

from atoll.solvers.catalog import (
    HYPOTHETICAL_PREFIX,
    WHAT_IF_NOTE,
    catalog_for,
    is_hypothetical,
    load_catalog,
    what_if_two_gpu_nodes,
)
from atoll.solvers.scenarios import SCENARIOS, build_problem, scenario_prices
from atoll.solvers.templates import LibrarySpec, build_library

SPEC = LibrarySpec(models=("Phi-4-14B",), regions=("aws:us-east-2",), gpu_types=("L4",), n_max=2)


def _aws_two_gpu(offers) -> set[tuple[str, str]]:
    return {(o.region, o.config) for o in offers if o.region.startswith("aws:") and o.config.startswith("2x")}


def test_what_if_adds_only_marked_two_gpu_aws_nodes_at_twice_the_price():
    base = load_catalog()
    assert not _aws_two_gpu(base.offers)  # AWS sells no 2-GPU node of these types
    what_if = what_if_two_gpu_nodes(base)
    added = [o for o in what_if.offers if o not in base.offers]
    assert added and is_hypothetical(what_if) and not is_hypothetical(base)
    assert WHAT_IF_NOTE in what_if.notes
    for o in added:
        assert o.region.startswith("aws:") and o.config.startswith("2x")
        assert o.instance.startswith(HYPOTHETICAL_PREFIX)
        one = base.offer(o.region, "1x" + o.config[2:])
        assert one is not None and o.on_demand_per_hour == pytest.approx(2 * one.on_demand_per_hour)
    assert {o.config for o in added} >= {"2xL4", "2xA10G", "2xL40S"}


def test_what_if_never_leaks_into_the_default_catalog_or_prices():
    catalog_for(True)
    assert catalog_for(False) is load_catalog()
    assert not _aws_two_gpu(load_catalog().offers)
    assert not any(o.instance.startswith(HYPOTHETICAL_PREFIX) for o in load_catalog().offers)
    for spec in SCENARIOS.values():
        prices = scenario_prices(spec)
        assert not {rc for rc in prices if rc[0].startswith("aws:") and rc[1].startswith("2x")}
    assert ("aws:us-east-2", "2xL4") in scenario_prices(SCENARIOS["core"], catalog=catalog_for(True))


def test_what_if_library_is_cached_apart_and_default_library_unchanged(tmp_path):
    default = build_library(SPEC, cache_dir=tmp_path, workers=1, progress=False)
    what_if = build_library(SPEC, cache_dir=tmp_path, workers=1, progress=False, catalog=catalog_for(True))
    again = build_library(SPEC, cache_dir=tmp_path, workers=1, progress=False)
    assert what_if.key != default.key and again.key == default.key and again.from_cache
    assert again.templates == default.templates
    assert not any(c == "2xL4" for t in default.templates for c, _ in t.nodes)
    assert any(c == "2xL4" for t in what_if.templates for c, _ in t.nodes)


def test_what_if_problem_then_default_problem():
    core = SCENARIOS["core"]
    templates = ()  # prices and availability only: no library needed
    hypo = build_problem("core", templates=templates, what_if_2gpu=True)
    plain = build_problem("core", templates=templates)
    assert ("aws:us-east-2", "2xL4") in hypo.prices and ("aws:us-east-2", "2xL4") in hypo.availability
    assert ("aws:us-east-2", "2xL4") not in plain.prices
    assert plain.prices == scenario_prices(core)
