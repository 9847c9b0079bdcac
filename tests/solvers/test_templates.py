"""Template library: exact placement on synthetic tables, dominance, library build, cache, workers."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
from library_oracle import kept_multisets, non_dominated

from atoll.solvers.catalog import load_catalog
from atoll.solvers.models import get_model
from atoll.solvers.perf import PerfFactors, RequestShape, load_factors, node_profile
from atoll.solvers.placement import ProfileTable, solve
from atoll.solvers.template_store import default_cache_dir
from atoll.solvers.templates import (
    SCENARIO_LIBRARIES,
    LibrarySpec,
    TemplateLibrary,
    best_placement,
    build_library,
    enumerate_multisets,
    remove_dominated,
)
from atoll.solvers.types import Phase, Service, Template

CATALOG = load_catalog()
# A small library that still has pipelines, data parallelism and dominated multisets.
# a replica per phase: the brute force below recomputes the phases' profiles (test_colocated
# checks the co-located kind)
SMALL = LibrarySpec(models=("Qwen3-32B",), regions=("aws:us-east-2",), gpu_types=("L40S",), n_max=3,
                    pd="disaggregated")


# --- exact placement on synthetic profile tables -------------------------------------------------

def _table(rng: np.random.Generator, n_configs: int, layers: int, stages: int,
           monotone: bool) -> ProfileTable:
    def arr() -> np.ndarray:
        a = rng.integers(0, 50, size=(n_configs, layers)).astype(float)
        if monotone:
            a = -np.sort(-a, axis=1)
        return a

    last = tuple(arr() for _ in range(stages))
    send = tuple(arr() for _ in range(stages))
    flat = all(bool(np.all(np.diff(a, axis=1) <= 0)) for a in (*last, *send))
    return ProfileTable(configs=(), layers=layers, last=last, send=send, monotone=flat)


def _brute(table: ProfileTable, nodes: list[int]) -> float:
    best, n, n_layers = 0.0, len(nodes), table.layers
    for s in range(1, min(n, n_layers, table.max_stages) + 1):
        for assign in itertools.product(range(s), repeat=n):
            if len(set(assign)) < s:
                continue
            for cuts in itertools.combinations(range(1, n_layers), s - 1):
                comp = [b - a for a, b in zip((0, *cuts), (*cuts, n_layers), strict=True)]
                rows = [(table.last if st == s - 1 else table.send)[s - 1] for st in range(s)]
                thr = min(sum(float(rows[st][nodes[i], comp[st] - 1]) for i in range(n) if assign[i] == st)
                          for st in range(s))
                best = max(best, thr)
    return best


def _check_placement(table: ProfileTable, nodes: list[int], got_thr: float,
                     stages: tuple[tuple[int, tuple[int, ...]], ...]) -> None:
    if got_thr == 0:
        assert stages == ()
        return
    s = len(stages)
    assert sum(j for j, _ in stages) == table.layers
    assert sorted(c for _, members in stages for c in members) == sorted(nodes)
    recomputed = min(sum(float((table.last if k == s - 1 else table.send)[s - 1][c, j - 1]) for c in members)
                     for k, (j, members) in enumerate(stages))
    assert recomputed == got_thr


@pytest.mark.parametrize("monotone", [True, False])
def test_solve_matches_brute_force_on_random_tables(monotone: bool) -> None:
    rng = np.random.default_rng(7 if monotone else 8)
    for _ in range(150 if monotone else 60):
        n_configs, layers = int(rng.integers(1, 4)), int(rng.integers(2, 7))
        n = int(rng.integers(1, 6 if monotone else 5))
        table = _table(rng, n_configs, layers, n, monotone)
        nodes = sorted(int(c) for c in rng.integers(0, n_configs, size=n))  # repeats stress dedupe
        placed = solve(table, nodes)
        assert placed.throughput == _brute(table, nodes), (table, nodes)
        _check_placement(table, nodes, placed.throughput, placed.stages)


def test_solve_by_hand() -> None:
    one = np.array([[40.0, 30.0, 20.0, 10.0], [25.0, 12.0, 8.0, 0.0]])  # S=1 (last) rows
    send2 = np.array([[50.0, 40.0, 30.0, 5.0], [45.0, 35.0, 0.0, 0.0]])  # S=2, first stage
    last2 = np.array([[60.0, 45.0, 35.0, 6.0], [25.0, 20.0, 0.0, 0.0]])  # S=2, last stage
    table = ProfileTable((), 4, (one, last2), (np.zeros((2, 4)), send2), True)
    placed = solve(table, [0, 1])
    # S=1: 10 + 0 = 10. Config 0 first: j=1..3 -> min(50, 0), min(40, 20), min(30, 25): 25.
    # Config 1 first: min(45, 35), min(35, 45), min(0, 60): 35 at 1+3 or 2+2 layers. The
    # water-filling split gives the next layer to the larger next value, ties to the earlier stage.
    assert placed.throughput == 35.0
    assert placed.stages == ((2, (1,)), (2, (0,)))


# --- dominance ------------------------------------------------------------------------------

def test_remove_dominated_keeps_smaller_of_ties_and_treats_missing_as_zero() -> None:
    values = {(0,): 10.0, (1,): 0.0, (0, 0): 10.0, (0, 1): 15.0, (1, 1): 4.0, (0, 0, 1): 15.0}
    assert remove_dominated(values) == [(0,), (0, 1), (1, 1)]


# --- the library ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_library(tmp_path_factory: pytest.TempPathFactory) -> TemplateLibrary:
    return build_library(SMALL, cache_dir=tmp_path_factory.mktemp("lib"), workers=1, progress=False)


def _recompute(t: Template, factors: PerfFactors, shape: RequestShape) -> float:
    model = get_model(t.service.model)
    budget = model.slo.budget_ms(t.service.phase) / len(t.stages)
    return min(math.fsum(node_profile(model, CATALOG.config(c), st.layers, t.service.phase, budget,
                                      shape=shape, factors=factors, send_activations=k < len(t.stages) - 1)
                         for c in st.nodes)
               for k, st in enumerate(t.stages))


def test_templates_are_consistent_with_their_multisets(small_library: TemplateLibrary) -> None:
    assert any(len(t.stages) > 1 for t in small_library.templates)  # pipelines
    assert any(len(st.nodes) > 1 for t in small_library.templates for st in t.stages)  # data parallel
    for t in small_library.templates:
        model = get_model(t.service.model)
        assert sum(st.layers for st in t.stages) == model.layers
        multiset = sorted(c for c, k in t.nodes for _ in range(k))
        assert sorted(c for st in t.stages for c in st.nodes) == multiset
        assert _recompute(t, load_factors(), SMALL.shape) == t.throughput
        assert t.node_count <= SMALL.n_max
        memory = sum(CATALOG.config(c).memory_gb * 1e9 * k for c, k in t.nodes)
        assert model.weight_bytes <= memory < SMALL.rho * model.weight_bytes


def test_library_is_exactly_the_non_dominated_multisets(small_library: TemplateLibrary) -> None:
    """Brute force: place every eligible multiset, then keep what no other multiset dominates."""
    factors = load_factors()
    for job in SMALL.jobs():
        everything = {}
        for ms in enumerate_multisets(job.model, job.configs, job.n_max, job.rho, job.shape):
            configs = [job.configs[i] for i in ms]
            thr, _ = best_placement(job.model, configs, job.phase, job.budget_ms, shape=job.shape,
                                    factors=factors)
            everything[tuple(sorted(c.name for c in configs))] = thr
        got = kept_multisets(small_library, job)
        assert set(got) == non_dominated(everything)
        for ms, thr in got.items():
            assert thr == everything[ms]
    assert 0 < len(small_library.templates) < sum(
        len(enumerate_multisets(j.model, j.configs, j.n_max, j.rho, j.shape)) for j in SMALL.jobs())


def test_library_queries_and_json_round_trip(small_library: TemplateLibrary) -> None:
    counts = small_library.counts()
    assert set(counts) == {"Qwen3-32B/prefill", "Qwen3-32B/decode"}
    assert sum(counts.values()) == len(small_library.templates)
    decode = small_library.for_service(Service("Qwen3-32B", Phase.DECODE))
    assert len(decode) == counts["Qwen3-32B/decode"]
    assert len(small_library.for_model("qwen3-32b")) == len(small_library.templates)
    back = TemplateLibrary.from_json(json.loads(json.dumps(small_library.to_json())))
    assert back == small_library
    with pytest.raises(ValueError, match="format"):
        TemplateLibrary.from_json({"templates": []})


# --- cache ----------------------------------------------------------------------------------

def test_cache_hit_then_corrupt_tampered_and_stale_files_are_rebuilt(
        tmp_path: Path, small_library: TemplateLibrary, caplog: pytest.LogCaptureFixture) -> None:
    spec = dataclasses.replace(SMALL, gpu_types=("L4",))
    cold = build_library(spec, cache_dir=tmp_path, workers=1, progress=False)
    warm = build_library(spec, cache_dir=tmp_path, workers=1, progress=False)
    assert not cold.from_cache and warm.from_cache
    assert warm.templates == cold.templates and warm.key == cold.key
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == len(spec.jobs())

    def parts(path: Path) -> tuple[dict, dict]:
        head, _, body = path.read_text().partition("\n")
        return json.loads(head), json.loads(body)

    def damage(path: Path, how: str) -> None:
        header, payload = parts(path)
        if how == "garbage":
            path.write_text("{not json")
        elif how == "tampered":
            payload["rows"][0][2] *= 2  # a throughput
            path.write_text(json.dumps(header) + "\n" + json.dumps(payload))
        else:  # stale: an entry written for other inputs under this name
            header["key"] = "0" * 64
            path.write_text(json.dumps(header) + "\n" + json.dumps(payload))

    target = next(f for f in files if parts(f)[1]["rows"])
    for how, reason in (("garbage", "unreadable"), ("tampered", "checksum mismatch"), ("stale", "stale")):
        damage(target, how)
        for whole in tmp_path.glob("*.lib"):  # the whole-library file would answer first
            whole.unlink()
        with caplog.at_level(logging.WARNING, logger="atoll.solvers.template_store"):
            again = build_library(spec, cache_dir=tmp_path, workers=1, progress=False)
        assert not again.from_cache and again.templates == cold.templates
        assert reason in caplog.text
        assert build_library(spec, cache_dir=tmp_path, workers=1, progress=False).from_cache  # repaired
        caplog.clear()


def test_library_file_answers_a_warm_load_and_a_damaged_one_is_rebuilt_from_the_jobs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec = dataclasses.replace(SMALL, gpu_types=("L4",))
    cold = build_library(spec, cache_dir=tmp_path, workers=1, progress=False)
    (whole,) = tmp_path.glob("*.lib")
    assert whole.name == f"{cold.key}.lib"
    for job in tmp_path.glob("*.json"):  # a warm load reads the library file alone
        job.rename(job.with_suffix(".moved"))
    warm = build_library(spec, cache_dir=tmp_path, workers=1, progress=False)
    assert warm.from_cache and warm.templates == cold.templates
    assert [t.key for t in warm.templates] == [t.key for t in cold.templates]
    for job in tmp_path.glob("*.moved"):
        job.rename(job.with_suffix(".json"))
    good = whole.read_bytes()
    head, _, body = good.partition(b"\n")
    header = json.loads(head)
    for damaged, reason in ((b"{not json", "template library cache"),
                            (head + b"\n" + body[:-1] + bytes([body[-1] ^ 1]), "checksum mismatch"),
                            (json.dumps({**header, "key": "0" * 64}).encode() + b"\n" + body, "stale"),
                            (json.dumps({**header, "layout": "0" * 64}).encode() + b"\n" + body, "stale")):
        whole.write_bytes(damaged)
        with caplog.at_level(logging.WARNING, logger="atoll.solvers.template_store"):
            again = build_library(spec, cache_dir=tmp_path, workers=1, progress=False)
        assert again.templates == cold.templates and reason in caplog.text
        assert whole.read_bytes() != damaged  # rewritten from the job entries
        caplog.clear()


def test_cache_key_covers_inputs_and_no_cache_writes_nothing(tmp_path: Path) -> None:
    base = build_library(dataclasses.replace(SMALL, gpu_types=("L4",)), cache_dir=tmp_path, workers=1,
                         progress=False)
    for change in ({"rho": 6.0}, {"n_max": 2}, {"shape": RequestShape(2048, 256)},
                   {"model_shapes": (("Qwen3-32B", RequestShape(512, 512)),)}):
        other = build_library(dataclasses.replace(SMALL, gpu_types=("L4",), **change), cache_dir=tmp_path,
                              workers=1, progress=False)
        assert other.key != base.key and not other.from_cache, change
    empty = tmp_path / "unused"
    build_library(dataclasses.replace(SMALL, gpu_types=("L4",)), cache_dir=empty, workers=1, progress=False,
                  use_cache=False)
    assert not empty.exists()


def test_default_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATOLL_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "templates"
    monkeypatch.delenv("ATOLL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "atoll" / "templates"


# --- workers ----------------------------------------------------------------------------------

def test_process_pool_gives_the_same_library(small_library: TemplateLibrary) -> None:
    pooled = build_library(SMALL, workers=2, progress=False, use_cache=False)
    assert pooled.templates == small_library.templates
    assert pooled.key == small_library.key


def test_ray_gives_the_same_library(small_library: TemplateLibrary) -> None:
    """A local Ray instance with 2 CPUs builds the same library as the process pool, for both
    runtimes. Not skipped: `make test` installs the `ray` extra."""
    try:
        import ray
    except ImportError:  # pragma: no cover - the Makefile installs it
        pytest.fail("Ray is not installed; `make test` installs it (pip install -e '.[dev,ray]')")
    vllm = dataclasses.replace(SMALL, runtime="vllm")
    pooled = {spec.runtime: build_library(spec, workers=2, progress=False, use_cache=False)
              for spec in (SMALL, vllm)}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = {spec.runtime: build_library(spec, ray_address="auto", progress=False, use_cache=False)
                  for spec in (SMALL, vllm)}
    finally:
        ray.shutdown()
    assert remote["any"].templates == pooled["any"].templates == small_library.templates
    assert remote["vllm"].templates == pooled["vllm"].templates
    assert remote["vllm"].key == pooled["vllm"].key != remote["any"].key


# --- spec validation ----------------------------------------------------------------------------

def test_spec_canonicalizes_names() -> None:
    spec = LibrarySpec(models=["phi4"], regions=["aws:us-east-2"], gpu_types=["l40s"])  # type: ignore[arg-type]
    assert spec.models == ("Phi-4-14B",) and spec.gpu_types == ("L40S",)
    assert spec.regions == ("aws:us-east-2",)
    assert SCENARIO_LIBRARIES["core"].models == ("Phi-4-14B", "GPT-OSS-20B", "Qwen3-32B")
    assert len(SCENARIO_LIBRARIES["extended"].models) == 6


@pytest.mark.parametrize(("change", "message"), [
    ({"models": ("GPT-5",)}, r"field 'models'.*valid models: .*Qwen3-32B"),
    ({"regions": ("mars:1",)}, r"field 'regions'.*valid regions: .*aws:us-east-2"),
    ({"gpu_types": ("TPU",)}, r"field 'gpu_types'.*valid GPU types: .*L40S"),
    ({"models": ()}, "field 'models' must name at least one"),
    ({"models": ("Phi-4-14B", "phi4")}, "lists 'Phi-4-14B' twice"),
    ({"n_max": 0}, "field 'n_max'"),
    ({"n_max": 9}, "field 'n_max'"),
    ({"rho": -1.0}, "field 'rho'"),
    ({"rho": float("nan")}, "field 'rho'"),
    ({"model_shapes": (("GPT-OSS-20B", RequestShape()),)}, "not in 'models'"),
])
def test_spec_rejects_bad_input(change: dict, message: str) -> None:
    base = {"models": ("Phi-4-14B",), "regions": ("aws:us-east-2",), "gpu_types": ("L4",)}
    with pytest.raises(ValueError, match=message):
        LibrarySpec(**{**base, **change})


def test_build_rejects_bad_workers() -> None:
    with pytest.raises(ValueError, match="workers"):
        build_library(SMALL, workers=0, use_cache=False)


@pytest.mark.parametrize(("edit", "reason"), [
    ("negative", "throughput -"),
    ("nope", "node config '9xNOPE' is not one of the job's"),
    ("layers", "layers, the model has"),
])
def test_an_edited_entry_with_a_recomputed_checksum_is_validated_and_rebuilt(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, edit: str, reason: str) -> None:
    import hashlib

    spec = dataclasses.replace(SMALL, gpu_types=("L4",))
    cold = build_library(spec, cache_dir=tmp_path, workers=1, progress=False)
    target = next(f for f in sorted(tmp_path.glob("*.json"))
                  if json.loads(f.read_text().partition("\n")[2])["rows"])
    head, _, body = target.read_text().partition("\n")
    header, payload = json.loads(head), json.loads(body)
    row = payload["rows"][0]
    if edit == "negative":
        row[2] = -abs(row[2])
    elif edit == "nope":
        row[0][0][0] = "9xNOPE"
        row[1][0][1] = ["9xNOPE"]
    else:
        row[1][0][0] += 1
    new_body = json.dumps(payload).encode()
    header["checksum"] = hashlib.sha256(new_body).hexdigest()  # edited by hand, checksum redone
    target.write_bytes(json.dumps(header).encode() + b"\n" + new_body)
    for whole in tmp_path.glob("*.lib"):  # the job entries are read when the library file is gone
        whole.unlink()
    with caplog.at_level(logging.WARNING):
        again = build_library(spec, cache_dir=tmp_path, workers=1, progress=False)
    assert not again.from_cache and again.templates == cold.templates
    assert reason in caplog.text and "rebuilding" in caplog.text


def test_a_fine_tune_shares_its_base_entry_and_run(tmp_path: Path) -> None:
    # a fine-tune has its base's architecture, SLO and (here) request shape: one run, one entry
    spec = dataclasses.replace(SMALL, models=("Qwen3-32B", "Qwen3-32B-ft1"), gpu_types=("L4",))
    built = build_library(spec, cache_dir=tmp_path, workers=1, progress=False)
    jobs = spec.jobs()
    assert len({j.key for j in jobs}) == 4 and len({j.entry_key for j in jobs}) == 2
    assert len(list(tmp_path.glob("*.json"))) == 2
    base, tuned = built.for_model("Qwen3-32B"), built.for_model("Qwen3-32B-ft1")
    assert base and len(base) == len(tuned)
    assert all(t.service.model == "Qwen3-32B-ft1" and t.service.phase == b.service.phase for b, t in zip(
        base, tuned, strict=True))
    assert [(t.nodes, t.stages, t.throughput) for t in tuned] == [
        (b.nodes, b.stages, b.throughput) for b in base]
    # the fine-tune alone, from that cache: no job runs, and its templates name it
    alone = build_library(dataclasses.replace(spec, models=("Qwen3-32B-ft1",)), cache_dir=tmp_path, workers=1,
                          progress=False)
    assert alone.from_cache and alone.templates == tuple(tuned)
    # a different request shape is a different entry
    other = dataclasses.replace(spec, model_shapes=(("Qwen3-32B-ft1", RequestShape(512, 512)),))
    assert len({j.entry_key for j in other.jobs()}) == 4
