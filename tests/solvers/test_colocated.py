"""Co-located templates (one replica serving a model's prefill and decode): the ILP chooses per
model between them and a replica per phase, exactly — against brute force on tiny seeded
instances in every mode the solver has — and the capacity model and library that make them."""

from __future__ import annotations

import math
import random

import pytest
from alloc_instances import brute_force, random_problem, template, with_spot_tier

from atoll.solvers.allocation import evaluate_plan, solve_allocation
from atoll.solvers.allocation.direct import DirectRun
from atoll.solvers.allocation.highs import SolverRun, status_of
from atoll.solvers.allocation.model import build_model, start_values
from atoll.solvers.allocation.reduction import RoundInstance
from atoll.solvers.catalog import load_catalog
from atoll.solvers.models import get_model
from atoll.solvers.perf import RequestShape, load_factors, mixed_step_seconds, node_profile, step_seconds
from atoll.solvers.problem import Allocation, AllocationProblem, Risk, SolveStatus
from atoll.solvers.templates import JobResult, LibrarySpec, TemplateJob, run_job
from atoll.solvers.types import Phase, Service, Stage, Template

R = "r1"


def _exact(problem: AllocationProblem, **kw: object) -> None:
    best = brute_force(problem)
    res = solve_allocation(problem, **kw)  # type: ignore[arg-type]
    if best is None:
        assert res.status is SolveStatus.INFEASIBLE, res.message
        return
    assert res.status is SolveStatus.OPTIMAL, res.message
    assert res.goodput_fraction == pytest.approx(best[0], abs=1e-6)
    assert res.objective == pytest.approx(best[1], abs=1e-6)
    assert evaluate_plan(problem, res.allocation).feasible


def _has_colocated(problem: AllocationProblem) -> bool:
    return any(t.colocated for t in problem.templates)


@pytest.mark.parametrize("decompose", [True, False])
@pytest.mark.parametrize("seed", range(16))
def test_cost_mode_with_colocated_columns_matches_brute_force(seed: int, decompose: bool) -> None:
    problem = random_problem(7000 + seed, n_models=2, max_templates=6, colocated=True)
    assert _has_colocated(problem) or seed % 4  # most seeds draw some
    _exact(problem, decompose=decompose)


@pytest.mark.parametrize("seed", range(8))
def test_goodput_mode_with_colocated_columns_matches_brute_force(seed: int) -> None:
    _exact(random_problem(7100 + seed, mode="goodput", max_templates=6, avail_max=3, colocated=True))


@pytest.mark.parametrize("seed", range(10))
def test_running_plans_grow_and_warm_starts_with_colocated_columns(seed: int) -> None:
    problem = random_problem(7200 + seed, n_models=2, max_templates=6, with_running=True, colocated=True)
    _exact(problem)
    if problem.free_models:
        grown = problem.with_changes(grow=frozenset(sorted(problem.free_models)[:1]))
        best = brute_force(grown)
        res = solve_allocation(grown, warm_start=problem.running)
        if best is None:
            assert res.status is SolveStatus.INFEASIBLE
        else:
            assert res.status is SolveStatus.OPTIMAL and res.objective == pytest.approx(best[1], abs=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_one_gpu_type_per_model_with_colocated_columns_matches_brute_force(seed: int) -> None:
    _exact(random_problem(7300 + seed, max_templates=6, one_type=True, colocated=True))


RISKS = [Risk(spread=0.5), Risk(ondemand_floor=0.3), Risk(headroom=0.8, spread=0.6, ondemand_floor=0.2)]


@pytest.mark.parametrize("risk", RISKS, ids=lambda r: r.label())
@pytest.mark.parametrize("seed", range(6))
def test_risk_rows_count_a_colocated_column_in_both_services(seed: int, risk: Risk) -> None:
    # 5 templates, pools of up to 3: half of these seeds' spread optima use a co-located column
    base = random_problem(7400 + seed, n_models=1, regions=("r1", "r2"), max_templates=5, avail_max=3,
                          demand_max=12, colocated=True)
    plain = with_spot_tier(base, random.Random(seed), discount=(0.3, 0.6))
    _exact(plain.with_changes(risk={plain.models[0]: risk}))


@pytest.mark.parametrize("seed", range(12))
def test_array_model_equals_pulp_model_with_colocated_columns(seed: int) -> None:
    problem = random_problem(7500 + seed, n_models=2, max_templates=7, with_running=seed % 2 == 0,
                             colocated=True)
    for inst in (RoundInstance(problem, None), RoundInstance(problem, frozenset())):
        if not inst.free:
            continue
        start = problem.running
        arrays = DirectRun(inst, start, None, problem.gap)
        model = build_model(inst, "cost")
        begin = start_values(inst, model, start) if start is not None else None
        pulp_run = SolverRun(model.prob, "highs", None, problem.gap, begin)
        assert status_of(arrays) is status_of(pulp_run)
        if status_of(pulp_run) is SolveStatus.OPTIMAL:
            assert arrays.column_objective == pytest.approx(pulp_run.column_objective, abs=1e-9)


def _one_model(colocated_cost_nodes: dict[str, int], demand: tuple[float, float]) -> AllocationProblem:
    prefill = template("m", Phase.PREFILL, R, {"1xA": 1}, 10.0)
    decode = template("m", Phase.DECODE, R, {"1xB": 1}, 5.0)
    both = template("m", Phase.COLOCATED, R, colocated_cost_nodes, 10.0, 5.0)
    return AllocationProblem((prefill, decode, both), {"m/prefill": demand[0], "m/decode": demand[1]},
                             None, {(R, "1xA"): 3.0, (R, "1xB"): 3.0, (R, "2xA"): 4.0, (R, "1xC"): 7.0},
                             gap=0.0)


def test_the_ilp_takes_the_colocated_replica_where_it_is_cheaper() -> None:
    cheap = solve_allocation(_one_model({"2xA": 1}, (10.0, 5.0)))  # $4 serves both; $6 apart
    assert cheap.cost_per_hour == pytest.approx(4.0)
    assert [k.split("@")[0] for k, _ in cheap.allocation.counts] == ["m/colocated"]
    assert cheap.capacity == {"m/prefill": 10.0, "m/decode": 5.0}
    dear = solve_allocation(_one_model({"1xC": 1}, (10.0, 5.0)))  # $7 for both; $6 apart
    assert dear.cost_per_hour == pytest.approx(6.0)
    assert sorted(k.split("@")[0] for k, _ in dear.allocation.counts) == ["m/decode", "m/prefill"]
    # decode-heavy demand: a co-located replica covers prefill twice over; one more decode is cheaper
    mixed = solve_allocation(_one_model({"2xA": 1}, (10.0, 10.0)))
    assert mixed.cost_per_hour == pytest.approx(7.0)  # colocated $4 + decode $3, against $4 x 2 or $9
    assert evaluate_plan(mixed_problem := _one_model({"2xA": 1}, (10.0, 10.0)), mixed.allocation).feasible
    assert mixed_problem.serving("m/decode")[-1][1] == 5.0


def test_a_model_served_only_colocated_is_infeasible_when_one_phase_is_short() -> None:
    both = template("m", Phase.COLOCATED, R, {"1xA": 1}, 10.0, 2.0)
    problem = AllocationProblem((both,), {"m/prefill": 10.0, "m/decode": 5.0}, {(R, "1xA"): 2},
                                {(R, "1xA"): 1.0}, gap=0.0)
    res = solve_allocation(problem)
    assert res.status is SolveStatus.INFEASIBLE
    assert "m/decode" in res.message and "at most 4" in res.message


def test_colocated_templates_of_one_model_must_share_a_ratio() -> None:
    a = template("m", Phase.COLOCATED, R, {"1xA": 1}, 10.0, 2.0)
    b = template("m", Phase.COLOCATED, R, {"1xB": 1}, 10.0, 3.0)
    with pytest.raises(ValueError, match="different ratios"):
        AllocationProblem((a, b), {"m/prefill": 1.0}, None, {(R, "1xA"): 1.0, (R, "1xB"): 1.0})


def test_template_fields_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="decode_throughput"):
        Template(Service("m", Phase.PREFILL), R, (("1xA", 1),), (Stage(4, ("1xA",)),), 5.0, 2.0)
    with pytest.raises(ValueError, match="decode_throughput"):
        Template(Service("m", Phase.COLOCATED), R, (("1xA", 1),), (Stage(4, ("1xA",)),), 5.0)
    t = template("m", Phase.COLOCATED, R, {"1xA": 1}, 5.0, 2.5)
    assert t.covers == (("m/prefill", 5.0), ("m/decode", 2.5))
    assert t.scaled(2.0).covers == (("m/prefill", 10.0), ("m/decode", 5.0))


def test_a_scaled_index_scales_both_rows_of_a_colocated_template() -> None:
    problem = _one_model({"2xA": 1}, (10.0, 5.0))
    import numpy as np

    scaled = problem.index.rescaled(np.asarray([1.0, 1.0, 0.5]))
    assert scaled.throughput2.tolist() == [0.0, 0.0, 2.5]
    assert scaled.templates[2].covers == (("m/prefill", 5.0), ("m/decode", 2.5))


# ---- the capacity model ----

QWEN = get_model("Qwen3-32B")
SHAPE = RequestShape(1155.0, 211.0)


def _config(name: str):  # noqa: ANN202 - a catalog NodeConfig
    return load_catalog().config(name)


def test_a_mixed_step_without_a_chunk_is_the_decode_step() -> None:
    f = load_factors()
    for cfg in ("1xH100", "4xL40S", "1xL4"):
        c = _config(cfg)
        mixed = mixed_step_seconds(QWEN, c, 16, sequences=8, chunk_tokens=0.0, shape=SHAPE, factors=f)
        alone = step_seconds(QWEN, c, 16, Phase.DECODE, tokens=8, context=SHAPE.mean_context, factors=f)
        assert mixed == pytest.approx(alone, rel=1e-12)
        # a chunk only adds work
        chunked = mixed_step_seconds(QWEN, c, 16, sequences=8, chunk_tokens=256.0, shape=SHAPE, factors=f)
        assert chunked > mixed


def test_separate_passes_are_the_two_steps_apart_and_bound_the_shared_pass() -> None:
    f = load_factors()
    for cfg in ("1xH100", "4xL40S", "1xL4"):
        c = _config(cfg)
        for b, chunk in ((1, 16.0), (8, 256.0), (64, 2048.0)):
            separate = mixed_step_seconds(QWEN, c, 16, sequences=b, chunk_tokens=chunk, shape=SHAPE,
                                          factors=f)
            shared = mixed_step_seconds(QWEN, c, 16, sequences=b, chunk_tokens=chunk, shape=SHAPE, factors=f,
                                        interference="shared")
            decode = mixed_step_seconds(QWEN, c, 16, sequences=b, chunk_tokens=0.0, shape=SHAPE, factors=f)
            prefill = mixed_step_seconds(QWEN, c, 16, sequences=0, chunk_tokens=chunk, shape=SHAPE, factors=f)
            assert separate == pytest.approx(decode + prefill, rel=1e-12)
            assert separate > shared  # the weights read twice: an upper bound on one fused pass
    with pytest.raises(ValueError, match="interference must be one of separate, shared"):
        mixed_step_seconds(QWEN, _config("1xL4"), 16, sequences=1, chunk_tokens=1.0, shape=SHAPE, factors=f,
                           interference="fused")


def test_the_colocated_profile_keeps_ttft_and_tpot_and_falls_with_layers() -> None:
    f = load_factors()
    c = _config("1xH100")
    slo = QWEN.slo
    chunk = SHAPE.input_tokens * slo.tpot_ms / slo.ttft_ms
    values = [node_profile(QWEN, c, j, Phase.COLOCATED, slo.tpot_ms, shape=SHAPE, factors=f,
                           min_chunk_tokens=chunk) for j in range(1, QWEN.layers + 1)]
    assert values[-1] > 0
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
    # a chunk so large that even one sequence misses TPOT leaves nothing
    assert node_profile(QWEN, c, QWEN.layers, Phase.COLOCATED, slo.tpot_ms, shape=SHAPE, factors=f,
                        min_chunk_tokens=1e6) == 0.0
    # less than the decode replica alone serves (a co-located replica's steps also carry prompts)
    decode = node_profile(QWEN, c, QWEN.layers, Phase.DECODE, slo.tpot_ms, shape=SHAPE, factors=f)
    assert values[-1] * SHAPE.output_tokens / SHAPE.input_tokens < decode


def _job(phase: Phase) -> TemplateJob:
    cat = load_catalog()
    configs = tuple(cat.config(n) for n in ("1xH100", "1xL40S", "4xL40S"))
    return TemplateJob(QWEN, phase, "aws:us-east-2", configs, 2, 12.0, SHAPE, load_factors())


def test_a_colocated_job_makes_templates_in_the_shape_s_ratio_and_round_trips() -> None:
    job = _job(Phase.COLOCATED)
    assert job.key != _job(Phase.DECODE).key
    assert job.min_chunk_tokens == pytest.approx(SHAPE.input_tokens * QWEN.slo.tpot_ms / QWEN.slo.ttft_ms)
    result = run_job(job)
    assert result.templates
    for t in result.templates:
        assert t.colocated and t.decode_throughput == pytest.approx(t.throughput * 211.0 / 1155.0)
    back = JobResult.from_json(result.to_json())
    assert [(t.key, t.throughput, t.decode_throughput) for t in back.templates] == \
        [(t.key, t.throughput, t.decode_throughput) for t in result.templates]


def test_library_spec_pd_modes() -> None:
    kw = dict(models=("Qwen3-32B", "Phi-4-14B"), regions=("aws:us-east-2",), gpu_types=("L4",))
    auto = {Phase.PREFILL, Phase.DECODE, Phase.COLOCATED}
    assert {j.phase for j in LibrarySpec(**kw).jobs()} == auto  # the default
    assert {j.phase for j in LibrarySpec(**kw, pd="disaggregated").jobs()} == {Phase.PREFILL, Phase.DECODE}
    assert {j.phase for j in LibrarySpec(**kw, pd="aggregated").jobs()} == {Phase.COLOCATED}
    mixed = LibrarySpec(**kw, pd="auto", model_pd=(("Phi-4-14B", "disaggregated"),))
    by_model = {(j.model.name, j.phase) for j in mixed.jobs()}
    assert ("Qwen3-32B", Phase.COLOCATED) in by_model and ("Phi-4-14B", Phase.COLOCATED) not in by_model
    assert LibrarySpec.from_json(mixed.to_json()) == mixed
    # disaggregated libraries keep their cache keys (a key without pd is one); auto names itself
    assert "pd" not in LibrarySpec(**kw, pd="disaggregated").to_json()
    assert LibrarySpec(**kw).to_json()["pd"] == "auto"
    with pytest.raises(ValueError, match="field 'pd'"):
        LibrarySpec(**kw, pd="split")
    with pytest.raises(ValueError, match="model_pd"):
        LibrarySpec(**kw, model_pd=(("Phi-4-14B", "both"),))


def test_auto_is_never_dearer_than_disaggregated_and_cheaper_at_low_load() -> None:
    """The one-model case of the issue (Qwen3-32B, Azure conversation lengths, one region): at 1
    req/s a replica serving both phases saves the idle half of a prefill-decode pair; at 64 req/s
    auto may only match or beat the disaggregated plan (it has every column that plan has)."""
    from atoll.solvers.scenarios import ScenarioSpec, build_problem

    for rate in (1.0, 64.0):
        spec = ScenarioSpec("one", ("Qwen3-32B",), ("L4", "L40S", "H100"), ("aws:us-east-2",), rate, 0.25,
                            traces=("conv",))
        cost = {}
        for pd in ("disaggregated", "auto"):
            res = solve_allocation(build_problem(spec, pd=pd))
            assert res.status is SolveStatus.OPTIMAL
            cost[pd] = res.cost_per_hour
        assert cost["auto"] <= cost["disaggregated"] + 1e-9
        if rate == 1.0:
            assert cost["auto"] <= 0.85 * cost["disaggregated"]


def test_a_plan_with_a_colocated_replica_is_checked_by_the_evaluator() -> None:
    problem = _one_model({"2xA": 1}, (10.0, 5.0))
    both = next(t.key for t in problem.templates if t.colocated)
    assert evaluate_plan(problem, Allocation.of({both: 1})).feasible
    short = problem.with_changes(demand={"m/prefill": 10.0, "m/decode": 6.0})
    ev = evaluate_plan(short, Allocation.of({both: 1}))
    assert not ev.feasible and any("m/decode" in v for v in ev.violations)
    assert math.isclose(ev.capacity["m/decode"], 5.0)


def test_the_ladder_gains_a_co_location_rung_below_joint() -> None:
    from atoll.solvers.ladder import COLOCATED, RUNGS, solve_ladder
    from atoll.solvers.scenarios import ScenarioSpec, build_problem

    spec = ScenarioSpec("one", ("Qwen3-32B", "Phi-4-14B"), ("L4", "L40S", "H100"), ("aws:us-east-2",), 1.0,
                        0.25, traces=("conv",))
    ladder = solve_ladder(build_problem(spec, pd="auto"))
    assert [r.name for r in ladder.rungs] == [*RUNGS, COLOCATED]
    joint, both = ladder.rung("joint"), ladder.rung(COLOCATED)
    assert not any(ladder.rung("joint").allocation and "colocated" in k for k, _ in joint.allocation.counts)
    assert both.cost_per_hour <= joint.cost_per_hour + 1e-9
    assert any("colocated" in k for k, _ in both.allocation.counts)
    # without co-located templates the ladder is the one it always was
    assert [r.name for r in solve_ladder(build_problem(spec, pd="disaggregated")).rungs] == list(RUNGS)


def test_a_sliced_library_with_colocated_templates_solves_and_packs() -> None:
    """vLLM slices (g of a node's G GPUs) and co-located templates together: the PuLP model
    (the slice-kind model does not take co-located columns) buys whole nodes for both."""
    from atoll.solvers.packing import check_packing, pack_plan
    from atoll.solvers.scenarios import ScenarioSpec, build_problem

    spec = ScenarioSpec("sliced", ("Phi-4-14B",), ("L4", "L40S"), ("aws:us-east-2",), 2.0, 0.25,
                        traces=("conv",), runtime="vllm", slices=True)
    cost = {}
    for pd in ("disaggregated", "auto"):
        problem = build_problem(spec, pd=pd, slices=True)
        assert problem.index.sliced_rcs
        res = solve_allocation(problem)
        assert res.status is SolveStatus.OPTIMAL, res.message
        assert evaluate_plan(problem, res.allocation).feasible
        assert check_packing(problem, res.allocation, pack_plan(problem, res.allocation)) == []
        cost[pd] = res.cost_per_hour
    assert cost["auto"] <= cost["disaggregated"] + 1e-9
