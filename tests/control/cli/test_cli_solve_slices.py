"""``atoll solve --slices``: the plan document carries the packing and the evaluator's verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from atoll.control.cli.solve import solve_document
from atoll.solvers.baselines import run_method
from atoll.solvers.catalog import load_catalog
from atoll.solvers.problem import AllocationProblem
from atoll.solvers.templates import LibrarySpec, build_library

REGION = "aws:us-east-2"


def test_plan_document_carries_the_packing(tmp_path: Path) -> None:
    spec = LibrarySpec(models=("Phi-4-14B", "GPT-OSS-20B"), regions=(REGION,), gpu_types=("H100",),
                       n_max=4, runtime="vllm", slices=True)
    lib = build_library(spec, cache_dir=tmp_path, workers=1, progress=False)
    templates = tuple(t for t in lib.templates if all(c == "8xH100" for c, _ in t.node_use))
    price = load_catalog().offers_in(REGION)["8xH100"].on_demand_per_hour
    demand = {"Phi-4-14B/prefill": 30000.0, "Phi-4-14B/decode": 3000.0,
              "GPT-OSS-20B/prefill": 30000.0, "GPT-OSS-20B/decode": 4000.0}
    problem = AllocationProblem(templates, demand, {(REGION, "8xH100"): 4}, {(REGION, "8xH100"): price})
    result = run_method(problem, "ilp")
    doc = solve_document(problem, result, scenario="test")
    assert doc["status"] == "optimal" and doc["packing_violations"] == []
    nodes = doc["packing"]["nodes"]
    assert doc["packing"]["nodes_per_pool"] == {f"{REGION}/8xH100": len(nodes)}
    assert all(n["used_gpus"] <= n["gpus"] == 8 for n in nodes)
    placed = sorted((s[0], s[1], s[2]) for n in nodes for s in n["slices"])
    assert len(placed) == len(set(placed)) == sum(
        n * len(problem.template(k).stages) for k, n in result.allocation.counts)
    assert doc["cost_per_hour"] == pytest.approx(len(nodes) * price)


def test_whole_node_documents_have_no_packing(tmp_path: Path) -> None:
    spec = LibrarySpec(models=("GPT-OSS-20B",), regions=(REGION,), gpu_types=("H100",), n_max=2,
                       runtime="vllm")
    lib = build_library(spec, cache_dir=tmp_path, workers=1, progress=False)
    prices = {(REGION, c): o.on_demand_per_hour for c, o in load_catalog().offers_in(REGION).items()}
    problem = AllocationProblem(lib.templates, {"GPT-OSS-20B/decode": 100.0}, None, prices)
    doc = solve_document(problem, run_method(problem, "ilp"), scenario="test")
    assert "packing" not in doc and doc["status"] == "optimal"


def test_templates_build_slices_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from atoll.control.cli import main

    argv = ["templates", "build", "--models", "Phi-4-14B", "--regions", REGION, "--gpus", "H100",
            "--n-max", "2", "--workers", "1", "--cache-dir", str(tmp_path), "--json"]
    assert main([*argv, "--runtime", "vllm", "--no-slices"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main([*argv, "--runtime", "vllm"]) == 0  # slices are vllm's default
    sliced = json.loads(capsys.readouterr().out)
    assert sliced["spec"]["slices"] is True and "slices" not in whole["spec"]
    assert sliced["total_templates"] > whole["total_templates"]
    assert main([*argv, "--runtime", "any"]) == 0  # never under the research runtime
    assert "slices" not in json.loads(capsys.readouterr().out)["spec"]
    assert main([*argv, "--runtime", "any", "--slices"]) == 2
    assert "needs runtime 'vllm'" in capsys.readouterr().err


def test_slices_are_the_vllm_default_and_false_opts_out(tmp_path: Path) -> None:
    from atoll.solvers.fleet import load_fleet

    doc = {"name": "lab", "models": ["Phi-4-14B"],
           "regions": [{"name": "lab:rack-1", "offers": [{"config": "8xH100", "on_demand": 55.04}]}],
           "workloads": {"Phi-4-14B": {"source": "servegen:m-small", "mean_rate": 2.0}}}
    got = {}
    for label, extra in (("default", {}), ("off", {"slices": False}), ("any", {"runtime": "any"})):
        path = tmp_path / f"{label}.yaml"
        path.write_text(yaml.safe_dump({**doc, **extra}))
        got[label] = load_fleet(path).slices
    assert got == {"default": True, "off": False, "any": False}


def test_an_unservable_whole_node_fleet_names_slices_as_the_fix(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Phi-4's 10 KV heads do not split over 8 GPUs: on 8xH100 nodes it needs slices."""
    from atoll.control.cli import main

    doc = {"name": "lab", "models": ["Phi-4-14B"], "slices": False,
           "regions": [{"name": "lab:rack-1", "offers": [{"config": "8xH100", "on_demand": 55.04}]}],
           "workloads": {"Phi-4-14B": {"source": "servegen:m-small", "mean_rate": 2.0}}}
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(doc))
    main(["solve", "--fleet", str(path), "--json"])
    whole = json.loads(capsys.readouterr().out)
    assert "Phi-4-14B" in whole["message"] and "slices" in whole["message"]
    assert main(["solve", "--fleet", str(path), "--slices", "--json"]) == 0
    sliced = json.loads(capsys.readouterr().out)
    assert sliced["status"] == "optimal" and sliced["packing_violations"] == []
