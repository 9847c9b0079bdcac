"""Runtime-aware templates: `vllm` keeps exactly the non-dominated pipelines stock vLLM can run."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
from library_oracle import kept_multisets, non_dominated

from atoll.solvers.errors import UnknownNameError
from atoll.solvers.models import get_model
from atoll.solvers.placement import ProfileTable, profile_table, solve
from atoll.solvers.runtime import check_runtime, template_problem, tp_problem
from atoll.solvers.templates import LibrarySpec, TemplateLibrary, build_library, enumerate_multisets
from atoll.solvers.types import Phase, Service, Stage, Template

VLLM = LibrarySpec(models=("Qwen3-32B", "Phi-4-14B"), regions=("aws:us-east-2",), gpu_types=("L4", "L40S"),
                   n_max=3, runtime="vllm", pd="disaggregated")  # the brute force below knows the phases


def _chain_brute(table: ProfileTable, nodes: list[int], lws: bool = False) -> float:
    """Best pipeline with one node per stage: every order of the nodes, every layer split;
    ``lws``: only orders a LeaderWorkerSet can run (every stage after the first one config)."""
    n, n_layers = len(nodes), table.layers
    if n > n_layers:
        return 0.0
    best = 0.0
    for order in set(itertools.permutations(nodes)):
        if lws and len(set(order[1:])) > 1:
            continue
        for cuts in itertools.combinations(range(1, n_layers), n - 1):
            comp = [b - a for a, b in zip((0, *cuts), (*cuts, n_layers), strict=True)]
            thr = min(float((table.last if k == n - 1 else table.send)[n - 1][c, comp[k] - 1])
                      for k, c in enumerate(order))
            best = max(best, thr)
    return best


def test_one_node_per_stage_matches_brute_force_on_random_tables() -> None:
    rng = np.random.default_rng(11)
    for _ in range(120):
        n_configs, layers, n = int(rng.integers(1, 4)), int(rng.integers(2, 8)), int(rng.integers(1, 5))
        arrs = [-np.sort(-rng.integers(0, 50, size=(n_configs, layers)).astype(float), axis=1)
                for _ in range(2 * n)]
        table = ProfileTable((), layers, tuple(arrs[:n]), tuple(arrs[n:]), True)
        nodes = sorted(int(c) for c in rng.integers(0, n_configs, size=n))
        placed = solve(table, nodes, one_node_per_stage=True)
        assert placed.throughput == _chain_brute(table, nodes), (table, nodes)
        if sorted(nodes.count(c) for c in set(nodes))[:1] == [1] and len(set(nodes)) == 2 and n >= 3:
            multi = frozenset(c for c in nodes if nodes.count(c) >= 2)
            lws = solve(table, nodes, one_node_per_stage=True, last_configs=multi)
            assert lws.throughput == _chain_brute(table, nodes, lws=True), (table, nodes)
        if placed.throughput > 0:
            assert len(placed.stages) == n and all(len(m) == 1 for _, m in placed.stages)


@pytest.fixture(scope="module")
def vllm_library(tmp_path_factory: pytest.TempPathFactory) -> TemplateLibrary:
    return build_library(VLLM, cache_dir=tmp_path_factory.mktemp("lib"), workers=1, progress=False)


def test_vllm_library_is_exactly_the_non_dominated_runnable_pipelines(vllm_library: TemplateLibrary) -> None:
    """Brute force over every multiset the full runtime would place: keep those vLLM can run
    (one GPU count, an accepted TP size), place them one node per stage by brute force, then keep
    what no sub-multiset matches (throughput can fall when a stage is added, so all subs count)."""
    assert vllm_library.templates
    for job in VLLM.jobs():
        everything: dict[tuple[str, ...], float] = {}
        full = enumerate_multisets(job.model, job.configs, job.n_max, job.rho, job.shape, "any")
        table = profile_table(job.model, job.configs, job.phase, job.budget_ms, max_stages=job.n_max,
                              shape=job.shape, factors=job.factors)
        for ms in full:
            configs = [job.configs[i] for i in ms]
            gpus = {c.count for c in configs}
            runnable = len(gpus) == 1 and tp_problem(job.model, gpus.pop()) is None
            everything[tuple(sorted(c.name for c in configs))] = (
                _chain_brute(table, list(ms), lws=True) if runnable else 0.0)
        got = kept_multisets(vllm_library, job)
        assert set(got) == non_dominated(everything), job.service
        for ms, thr in got.items():
            assert thr == pytest.approx(everything[ms], rel=1e-12)


def test_every_vllm_template_is_runnable_and_phi4_never_uses_tp4(vllm_library: TemplateLibrary) -> None:
    for t in vllm_library.templates:
        assert template_problem("vllm", get_model(t.service.model), t) is None
        assert all(len(s.nodes) == 1 for s in t.stages)
        assert len({s.nodes[0] for s in t.stages[1:]}) <= 1  # one worker config after the leader
    phi = {c for t in vllm_library.for_model("Phi-4-14B") for c, _ in t.nodes}
    assert phi and not any(c.startswith(("4x", "8x")) for c in phi)  # 10 KV heads: TP 4 and 8 fail
    assert tp_problem(get_model("Phi-4-14B"), 4) is not None
    assert tp_problem(get_model("Phi-4-14B"), 2) is None
    assert tp_problem(get_model("Qwen3-235B-A22B"), 8) is None  # 4 KV heads, replicated at TP 8


def test_template_problem_names_the_reason() -> None:
    model = get_model("Llama-3-70B")
    mixed_tp = Template(Service(model.name, Phase.DECODE), "aws:us-east-2", (("1xL4", 1), ("4xL40S", 1)),
                        (Stage(8, ("1xL4",)), Stage(72, ("4xL40S",))), 900.0)
    dp = Template(Service(model.name, Phase.DECODE), "aws:us-east-2", (("4xL40S", 3),),
                  (Stage(8, ("4xL40S",)), Stage(72, ("4xL40S", "4xL40S"))), 900.0)
    assert "tensor-parallel size" in (template_problem("vllm", model, mixed_tp) or "")
    assert "one node per pipeline stage" in (template_problem("vllm", model, dp) or "")
    three = Template(Service(model.name, Phase.DECODE), "aws:us-east-2",
                     (("4xA10G", 1), ("4xL4", 1), ("4xL40S", 1)),
                     (Stage(20, ("4xL40S",)), Stage(30, ("4xA10G",)), Stage(30, ("4xL4",))), 900.0)
    assert "one worker pod template" in (template_problem("vllm", model, three) or "")
    assert template_problem("any", model, dp) is None
    with pytest.raises(UnknownNameError, match="valid runtimes: vllm, any"):
        check_runtime("sglang")
    with pytest.raises(ValueError, match="field 'runtime'"):
        dataclasses.replace(VLLM, runtime="tgi")


def test_runtime_is_part_of_the_cache_key(tmp_path: Path, vllm_library: TemplateLibrary) -> None:
    any_spec = dataclasses.replace(VLLM, runtime="any")
    assert {j.key for j in any_spec.jobs()}.isdisjoint(j.key for j in VLLM.jobs())
    full = build_library(any_spec, cache_dir=tmp_path, workers=1, progress=False)
    assert not full.from_cache and full.key != vllm_library.key
    assert LibrarySpec.from_json(VLLM.to_json()) == VLLM
