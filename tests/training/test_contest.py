"""The contest on a tiny fleet: selection sees only validation days, every policy meets the same demand
and seeds, worker processes give the same numbers, the rule family parses."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tiny_fleet import MODELS, two_model_templates

from atoll.envs.config import FleetConfig
from atoll.envs.policies import make_policy, rule_grid
from atoll.envs.vocabulary import PLANNING_LEVELS, parse_policy
from atoll.forecast.workloads import DemandSeries
from atoll.solvers.errors import InputError, UnknownNameError
from atoll.training.contest import ContestSettings, run_contest
from atoll.training.evaluate import seed_value

DAYS = 7  # 1-3 warm the forecaster up, 4-5 validation, 6-7 test


def series(rates: np.ndarray, name: str) -> DemandSeries:
    ones = np.ones(len(rates))
    return DemandSeries(name, 300.0, rates, 2048 * ones, 28 * ones)


def demand(test_factor: float = 1.0) -> tuple[DemandSeries, ...]:
    rng = np.random.default_rng(7)
    t = np.arange(DAYS * 288)
    shape = 1.0 + 0.6 * np.sin(2 * np.pi * t / 288)
    out = []
    for i in range(len(MODELS)):
        rates = np.maximum(shape * (2 + i) * (1 + 0.2 * rng.standard_normal(len(t))), 0.05)
        rates[5 * 288:] *= test_factor  # days 6-7 only
        out.append(series(rates, f"s{i}"))
    return tuple(out)


def config(test_factor: float = 1.0) -> FleetConfig:
    return FleetConfig(scenario="core", models=MODELS, templates=two_model_templates(),
                       demand=demand(test_factor), forecaster="naive", availability="spot", days=(4, DAYS),
                       episode_steps=96)


SETTINGS = ContestSettings(validation_days=(4, 5), test_days=(6, 7), seeds=2, levels=(0.5, 0.9),
                           intervals=(1, 6), bands=((0.5, 1.0),), workers=1)


@pytest.fixture(scope="module")
def contest():  # type: ignore[no-untyped-def]
    return run_contest(config(), [], SETTINGS)


def test_frontier_is_the_non_dominated_validation_rules(contest) -> None:  # type: ignore[no-untyped-def]
    points = {p.name: p for p in contest.validation_points()}
    assert set(points) == set(SETTINGS.grid) and len(points) == 6
    for name in contest.frontier:
        p = points[name]
        assert not any(q.cost_usd <= p.cost_usd and q.slo_attainment >= p.slo_attainment
                       and (q.cost_usd, q.slo_attainment) != (p.cost_usd, p.slo_attainment)
                       for q in points.values())
    for name in set(points) - set(contest.frontier):
        assert any(q.cost_usd <= points[name].cost_usd and q.slo_attainment >= points[name].slo_attainment
                   for n, q in points.items() if n != name)
    assert contest.best_rule in points
    assert {r.name for r in contest.test} == {*contest.frontier, contest.best_rule, "hindsight",
                                              *contest.per_model_frontier, contest.per_model_best}


def test_no_test_day_data_reaches_the_selection(contest) -> None:  # type: ignore[no-untyped-def]
    changed = run_contest(config(test_factor=3.0), [], SETTINGS)
    assert changed.frontier == contest.frontier and changed.best_rule == contest.best_rule
    assert [p.cost_usd for p in changed.validation_points()] == \
        [p.cost_usd for p in contest.validation_points()]
    # ... while the test days did change
    a, b = contest.result(contest.frontier[0]), changed.result(contest.frontier[0])
    assert a.summary()["cost_usd"]["mean"] != b.summary()["cost_usd"]["mean"]


def test_summary_keeps_each_seed_in_order(contest) -> None:  # type: ignore[no-untyped-def]
    result = contest.result(contest.frontier[0])
    figures = result.summary()
    for key, figure in figures.items():
        assert figure["per_seed"] == [float(e.totals()[key]) for e in result.episodes]
        assert np.isclose(np.mean(figure["per_seed"]), figure["mean"])
    assert [e.seed for e in result.episodes] == [seed_value(k) for k in range(SETTINGS.seeds)]


def test_every_policy_meets_the_same_demand_and_seeds(contest) -> None:  # type: ignore[no-untyped-def]
    demand_by_seed = None
    for r in contest.test:
        assert [e.seed for e in r.episodes] == [0, 1000]
        got = [[row["demand_tokens"] for row in e.steps] for e in r.episodes]
        demand_by_seed = demand_by_seed or got
        assert got == demand_by_seed, r.name


def test_worker_processes_give_the_same_numbers(contest) -> None:  # type: ignore[no-untyped-def]
    parallel = run_contest(config(), [], dataclasses.replace(SETTINGS, workers=2))
    assert parallel.frontier == contest.frontier
    for name, rows in contest.validation.items():
        for a, b in zip(rows, parallel.validation[name], strict=True):
            assert {k: v for k, v in a.items() if k != "solver_seconds"} == \
                {k: v for k, v in b.items() if k != "solver_seconds"}


def test_rule_family_names_and_aliases() -> None:
    assert len(rule_grid()) == len(PLANNING_LEVELS) * (5 + 3)
    p = make_policy(parse_policy("fixed:3@0.5"), 2)
    assert (p.name, p.planning_quantile, p.every) == ("fixed:3@0.5", 0.5, 3)  # type: ignore[attr-defined]
    t = make_policy(parse_policy("threshold:0.7:1@0.95"), 2)
    assert (t.low, t.high, t.planning_quantile) == (0.7, 1.0, 0.95)  # type: ignore[attr-defined]
    assert make_policy(parse_policy("fixed:1"), 2).planning_quantile is None  # without @q: the env's level
    for bad, err in (("fixed:1@0.42", InputError), ("fixed:1@x", InputError), ("hindsight@0.9", InputError),
                     ("fixed:2:3@0.9", InputError), ("sometimes@0.9", UnknownNameError)):
        with pytest.raises(err):
            make_policy(parse_policy(bad), 2)


def test_settings_refuse_overlapping_days() -> None:
    with pytest.raises(InputError, match="overlap"):
        ContestSettings(validation_days=(8, 11), test_days=(11, 14))


def test_contest_run_logs_headline_params_dataset_nested_runs_and_artifacts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import mlflow
    from mlflow.tracking import MlflowClient

    from atoll.training.contest_tracking import contest_run
    from atoll.training.train import TrainSettings
    from atoll.training.train_tracking import train_run

    cfg = dataclasses.replace(config(), days=(4, 5))
    trained = train_run(cfg, TrainSettings(timesteps=64, n_steps=64, batch_size=32, n_epochs=1, n_envs=1,
                                           bootstrap_steps=48, seed=0))
    spec = f"learned:{trained['model_uri']}"
    out = contest_run(config(), [parse_policy(spec)],
                      dataclasses.replace(SETTINGS, seeds=1, validation_seeds=1))
    head = out["headline"][spec]
    for key in ("frontier_cost_ratio", "effective_cost_ratio", "usd_per_mtok", "slo_attainment",
                "reoptimizations", "solver_seconds"):
        assert np.isfinite(head[key]["mean"]) and head[key]["std"] == 0.0
    # the ratios carry their paired interval (none with one seed)
    interval = head["effective_cost_ratio"]["interval95"]
    assert interval["seeds"] == 1 and interval["low"] is None
    assert interval["per_seed"] == [pytest.approx(head["effective_cost_ratio"]["mean"])]
    assert head["frontier_position"][0] in ("inside", "above", "below")
    client = MlflowClient()
    parent = client.get_run(out["parent_run_id"])
    ratio = parent.data.metrics["frontier_cost_ratio_mean"]
    assert ratio == pytest.approx(head["frontier_cost_ratio"]["mean"])
    for key in ("scenario", "workload", "validation_days", "test_days", "seeds", "availability",
                "git_commit"):
        assert key in parent.data.params
    assert parent.inputs.dataset_inputs, "the workload is logged as an input dataset"
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    names = {c.info.run_name for c in children}
    assert {f"val {r}" for r in SETTINGS.grid} <= names and "hindsight" in names
    learned_run = next(c for c in children if c.data.params.get("policy") == spec)
    assert len(learned_run.info.run_name) <= 20 and learned_run.info.run_name.startswith("learned m-")
    rule_run = next(c for c in children if c.data.params.get("policy") == out["frontier"][0])
    assert rule_run.data.params["policy.kind"] in ("fixed", "threshold")
    files = {f.path for f in client.list_artifacts(parent.info.run_id, "contest")}
    assert {"contest/frontier.png", "contest/policies.png", "contest/comparison.md",
            "contest/comparison.csv", "contest/validation_grid.csv"} <= files
    assert mlflow.get_tracking_uri().startswith("sqlite:")
