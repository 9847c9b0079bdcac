"""A library's index stored beside it: the index made from the stored state is the scanned one."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atoll.solvers import problem as problem_module
from atoll.solvers.problem import (
    INDEX_STATE_VERSION,
    AllocationProblem,
    TemplateIndex,
    adopt_index,
    template_index,
)
from atoll.solvers.template_store import LibraryStore
from atoll.solvers.templates import LibrarySpec, build_library

# two models, co-located and per-phase templates, and slices: every kind of row an index holds
SPEC = LibrarySpec(models=("Qwen3-32B", "Phi-4-14B"), regions=("aws:us-east-2",), gpu_types=("L4", "L40S"),
                   n_max=2, pd="auto", runtime="vllm", slices=True)


@pytest.fixture(scope="module")
def library_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("templates")
    build_library(SPEC, cache_dir=directory, workers=1, progress=False)
    return directory


def _fields(ix: TemplateIndex) -> dict[str, Any]:
    skip = {"_state", "templates", "near", "_rescaled_from", "_scale", "_costs_memo"}
    return {k: v for k, v in vars(ix).items() if k not in skip}


def _assert_same(made: TemplateIndex, scanned: TemplateIndex) -> None:
    a, b = _fields(made), _fields(scanned)
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        if isinstance(y, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), name
            # numpy's own dtype instance: an unpickled copy sends np.maximum.at down a slow path
            assert x.dtype is np.dtype(y.dtype.type), name
        elif name in ("by_service", "by_key"):
            assert list(x.items()) == list(y.items()), name
        else:
            assert x == y, name


def test_a_stored_library_brings_its_index_and_it_equals_a_scan(library_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    lib = build_library(SPEC, cache_dir=library_dir, workers=1, progress=False)
    assert lib.from_cache
    # a problem over the loaded tuple finds the index made from the file, with no pass over it
    with monkeypatch.context() as m:
        m.setattr(problem_module, "_scan_templates", lambda _: pytest.fail("the library was scanned"))
        ix = template_index(lib.templates)
        prices = {rc: 1.0 for rc in ix.rcs}
        assert AllocationProblem(lib.templates, {}, None, prices).index is ix
    stored = LibraryStore(library_dir).load(lib.key)
    assert stored is not None
    templates, state = stored
    assert state is not None and state["version"] == INDEX_STATE_VERSION
    made = TemplateIndex(templates, pickle.loads(pickle.dumps(state)))
    scanned = TemplateIndex(templates)
    assert any(t.colocated for t in templates) and any(t.has_slices for t in templates)
    _assert_same(made, scanned)


def test_a_rescaled_index_of_a_made_index_equals_one_of_a_scan(library_dir: Path) -> None:
    lib = build_library(SPEC, cache_dir=library_dir, workers=1, progress=False)
    stored = LibraryStore(library_dir).load(lib.key)
    assert stored is not None
    made = TemplateIndex(lib.templates, pickle.loads(pickle.dumps(stored[1])))
    scanned = TemplateIndex(lib.templates)
    scale = np.random.default_rng(3).choice([0.9, 1.0, 1.1], size=len(lib.templates))
    a, b = made.rescaled(scale), scanned.rescaled(scale)
    assert a.templates == b.templates and np.array_equal(a.throughput, b.throughput)
    assert list(a.by_service.items()) == list(b.by_service.items())


def test_a_library_file_without_an_index_is_read_and_rewritten_with_one(
        library_dir: Path, tmp_path: Path) -> None:
    lib = build_library(SPEC, cache_dir=library_dir, workers=1, progress=False)
    for f in library_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    store = LibraryStore(tmp_path)
    store.save(lib.key, lib.templates)  # as a file written before indexes were stored
    stored = store.load(lib.key)
    assert stored is not None and stored[1] is None
    again = build_library(SPEC, cache_dir=tmp_path, workers=1, progress=False)
    assert again.from_cache and again.templates == lib.templates
    stored = store.load(lib.key)
    assert stored is not None and stored[1] is not None


def test_an_index_state_of_another_version_or_length_is_refused(
        library_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    lib = build_library(SPEC, cache_dir=library_dir, workers=1, progress=False)
    state = TemplateIndex(lib.templates).state()
    with pytest.raises(ValueError, match="stored state of version 0"):
        TemplateIndex(lib.templates, {**state, "version": 0})
    short = lib.templates[:-1]
    with pytest.raises(ValueError, match=f"for {len(lib.templates)} templates"):
        TemplateIndex(short, state)
    assert adopt_index(short, state) is None
    with caplog.at_level(logging.WARNING):
        assert adopt_index(lib.templates, {**state, "version": INDEX_STATE_VERSION + 1}) is None
