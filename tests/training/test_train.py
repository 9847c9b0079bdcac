"""Training and evaluation end to end on a tiny FleetEnv, logging to a temporary MLflow store."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import mlflow
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from atoll.envs.config import FleetConfig
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.vocabulary import parse_policy
from atoll.forecast.workloads import DemandSeries
from atoll.solvers.types import Phase, Service, Stage, Template
from atoll.training.evaluate import evaluate_policies, resolve_policy
from atoll.training.evaluate_tracking import evaluate_run
from atoll.training.train import TrainSettings
from atoll.training.train_tracking import train_run

MODELS = ("Phi-4-14B", "GPT-OSS-20B")


def tiny_config(**changes: object) -> FleetConfig:
    rng = np.random.default_rng(3)
    t = np.arange(6 * 288)
    templates = []
    for model, layers in zip(MODELS, (40, 24), strict=True):
        for region in ("aws:us-east-2", "aws:ap-northeast-2"):
            for cfg, thr_p, thr_d in (("1xL4", 700.0, 15.0), ("1xL40S", 1500.0, 40.0)):
                for phase, thr in ((Phase.PREFILL, thr_p), (Phase.DECODE, thr_d)):
                    templates.append(Template(Service(model, phase), region, ((cfg, 1),),
                                              (Stage(layers, (cfg,)),), thr))
    ones = np.ones(len(t))
    demand = tuple(DemandSeries(f"s{i}", 300.0, np.maximum((2 + i) * (1 + 0.5 * np.sin(2 * np.pi * t / 288))
                                                           * (1 + 0.2 * rng.standard_normal(len(t))), 0.05),
                                2048 * ones, 28 * ones) for i in range(2))
    base: dict[str, object] = dict(scenario="core", models=MODELS, templates=tuple(templates), demand=demand,
                                   forecaster="naive", availability="spot", days=(4, 5), episode_steps=48)
    base.update(changes)
    return FleetConfig(**base)  # type: ignore[arg-type]


SETTINGS = TrainSettings(timesteps=256, n_steps=64, batch_size=32, n_epochs=2, bootstrap_steps=48,
                         bootstrap_epochs=3, seed=0)
# One env in this process and one rollout: for tests of what is logged and looked up, not of the
# worker processes (each spawned worker imports torch and atoll anew, seconds apiece).
ONE_ENV = dataclasses.replace(SETTINGS, n_envs=1, timesteps=64)


def test_tiny_training_logs_a_policy_that_loads_and_acts() -> None:
    out = train_run(tiny_config(), SETTINGS)
    client = MlflowClient()
    run = client.get_run(out["run_id"])
    assert run.data.params["env.scenario"] == "core" and run.data.params["ppo.timesteps"] == "256"
    assert any(k.startswith("train/") for k in run.data.metrics)  # SB3 metrics through the KVWriter
    assert client.get_metric_history(out["run_id"], "time/total_timesteps")
    policy = resolve_policy(parse_policy(f"learned:{out['model_uri']}"), 2)
    env = FleetEnv(tiny_config(days=(6, 6)))
    obs, info = env.reset(seed=0)
    action = policy.act(obs, info)
    assert action.shape == (2,) and set(np.unique(action)) <= set(range(env.codec.n))
    batch = mlflow.pyfunc.load_model(out["model_uri"]).predict(np.stack([obs, obs]))
    assert batch.shape == (2, 2) and np.array_equal(batch[0], action)


def test_evaluation_is_seeded_and_every_policy_sees_the_same_demand() -> None:
    env = FleetEnv(tiny_config(days=(6, 6)))
    specs = [parse_policy(s) for s in ("fixed:1", "fixed:6", "threshold", "never")]
    a = evaluate_policies(env, specs, days=[6], seeds=2)
    b = evaluate_policies(FleetEnv(tiny_config(days=(6, 6))), specs, days=[6], seeds=2)
    # everything but solver seconds, which are wall-clock measurements
    def numbers(results: list) -> list:
        return [[{k: v for k, v in t.items() if k != "solver_seconds"} for t in r.per_seed()]
                for r in results]

    assert numbers(a) == numbers(b)
    demand = {(r.name, i): e.totals()["demand_tokens"] for r in a for i, e in enumerate(r.episodes)}
    assert len(set(demand.values())) == 1
    steps = [[row["requests"] for row in r.episodes[0].steps] for r in a]
    assert all(s == steps[0] for s in steps)


def test_evaluate_run_logs_parent_nested_runs_and_artifacts() -> None:
    env = FleetEnv(tiny_config(days=(6, 6)))
    out = evaluate_run(env, [parse_policy("fixed:1"), parse_policy("never")], days=[6], seeds=1)
    client = MlflowClient()
    parent = client.get_run(out["parent_run_id"])
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{out['parent_run_id']}'")
    assert sorted(c.data.params["policy"] for c in children) == ["fixed:1", "never"]
    for c in children:
        assert "usd_per_mtok_mean" in c.data.metrics and "cost_usd_std" in c.data.metrics
        assert len(client.get_metric_history(c.info.run_id, "step/cost_usd")) == 48
    names = {f.path for f in client.list_artifacts(out["parent_run_id"], "comparison")}
    assert {"comparison/comparison.md", "comparison/comparison.csv", "comparison/policies.png"} <= names
    assert set(out["policies"]["never"]) >= {"cost_usd", "goodput_share", "slo_attainment", "usd_per_mtok",
                                             "reoptimizations", "solver_seconds"}


def test_learned_policy_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="learned:<uri> needs"):
        resolve_policy(parse_policy("learned:"), 2)


def test_bootstrap_rule_is_cloned_and_validated() -> None:
    from atoll.training.train import train_policy

    with pytest.raises(ValueError, match="bootstrap_rule.*deployable rule.*'hindsight'"):
        TrainSettings(bootstrap_rule=parse_policy("hindsight"))
    # cloning fixed:1 (every model, every step): the cloned network re-optimizes nearly always
    settings = TrainSettings(timesteps=64, n_steps=64, batch_size=32, n_epochs=1, n_envs=1,
                             bootstrap_steps=96, bootstrap_epochs=300,
                             bootstrap_rule=parse_policy("fixed:1"), learning_rate=1e-9, seed=0)
    model, vec, stats = train_policy(tiny_config(), settings)
    env = FleetEnv(tiny_config(days=(6, 6)))
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(np.ones(2, dtype=np.int8))  # fixed:1 holds at step 0 and re-optimizes after
    actions = [model.predict(vec.normalize_obs(obs), deterministic=True)[0] for _ in range(3)]
    assert stats["bootstrap_loss"] < 0.1
    assert all(np.array_equal(a, [1, 1]) for a in actions)


def test_smoothed_targets_spread_over_the_same_kind_at_other_levels() -> None:
    from atoll.training.cloning import smoothed_targets

    # 3 levels: codes 0 hold, 1/2 full/grow at level 0, 3/4 at level 1, 5/6 at level 2
    t = smoothed_targets(np.array([[0, 1], [4, 5]]), 7, 0.2)
    assert t.shape == (2, 2, 7)
    assert np.allclose(t.sum(-1), 1.0)
    assert np.allclose(t[0, 0], [1, 0, 0, 0, 0, 0, 0])  # hold is never smoothed
    assert np.allclose(t[0, 1], [0, 0.8, 0, 0.1, 0, 0.1, 0])  # full: the other fulls
    assert np.allclose(t[1, 0], [0, 0, 0.1, 0, 0.8, 0, 0.1])  # grow: the other grows
    assert np.allclose(smoothed_targets(np.array([3]), 7, 0.0)[0], np.eye(7)[3])


def test_a_per_model_teacher_is_cloned_in_the_envs_codes() -> None:
    from atoll.training.train import train_policy

    # codec levels (0.9, 0.7, 0.95): model 0 full at 0.9 is code 1, model 1 full at 0.95 code 5
    settings = TrainSettings(timesteps=64, n_steps=64, batch_size=32, n_epochs=1, n_envs=1,
                             bootstrap_steps=96, bootstrap_epochs=1, bootstrap_min_updates=1_000,
                             bootstrap_rule=parse_policy("per-model:1@0.9,1@0.95"), learning_rate=1e-9,
                             seed=0)
    model, vec, stats = train_policy(tiny_config(), settings)
    # all but at most the two episodes' first steps (the rule holds there: the reset just planned)
    assert stats["bootstrap_agreement"] >= 1 - 2 / 96
    env = FleetEnv(tiny_config(days=(6, 6)))
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(np.array([1, 5]))
    assert np.array_equal(model.predict(vec.normalize_obs(obs), deterministic=True)[0], [1, 5])
    # smoothing keeps the argmax and leaves the other levels of the same kind to PPO's sampling
    smooth = dataclasses.replace(settings, bootstrap_smoothing=0.2)
    model, vec, stats = train_policy(tiny_config(), smooth)
    assert stats["bootstrap_agreement"] >= 1 - 2 / 96
    dist = model.policy.get_distribution(model.policy.obs_to_tensor(vec.normalize_obs(obs))[0])
    probs = np.stack([d.probs.detach().numpy()[0] for d in dist.distribution])
    assert probs[0, 1] == pytest.approx(0.8, abs=0.05)
    assert probs[0, 3] + probs[0, 5] == pytest.approx(0.2, abs=0.05)
    assert probs[1, 5] == pytest.approx(0.8, abs=0.05) and probs[:, 0].max() < 0.05  # hold: not explored
    with pytest.raises(ValueError, match="plans at 0.8, not among the env's action levels 0.9, 0.7, 0.95"):
        train_policy(tiny_config(),
                     dataclasses.replace(settings, bootstrap_rule=parse_policy("per-model:1@0.8,1@0.9")))
    with pytest.raises(ValueError, match="bootstrap_smoothing"):
        TrainSettings(bootstrap_smoothing=0.5)


def test_the_clones_agreement_is_measured_on_days_it_was_not_cloned_on() -> None:
    from atoll.training.train import train_policy

    settings = TrainSettings(timesteps=32, n_steps=32, batch_size=16, n_epochs=1, n_envs=1,
                             bootstrap_steps=96, bootstrap_epochs=1, bootstrap_min_updates=1_000,
                             learning_rate=1e-9, bootstrap_rule=parse_policy("per-model:1@0.9,1@0.95"),
                             eval_every=1_000, patience=1, seed=0)
    env = FleetEnv(tiny_config(days=(6, 6)))
    actions: list[np.ndarray] = []

    def validate(policy: object) -> float:  # the clone's own trajectory on day 6 (cloned on days 4-5)
        obs, info = env.reset(seed=0)
        for _ in range(20):
            action = policy.act(obs, info)  # type: ignore[attr-defined]
            actions.append(action)
            obs, _, terminated, truncated, info = env.step(action)
        return 1.0

    _, _, stats = train_policy(tiny_config(), settings, validate=validate)
    teacher = [np.array([0, 0]) if t == 0 else np.array([1, 5]) for t in range(len(actions))]  # step 0 holds
    expected = np.mean([a == b for a, b in zip(actions, teacher, strict=True)])
    assert len(actions) == 20 and stats["clone_validation_agreement"] == pytest.approx(expected)
    assert expected >= 0.9


def test_vecnormalize_discounts_with_the_settings_gamma() -> None:
    from atoll.training.train import train_policy

    settings = TrainSettings(timesteps=32, n_steps=32, batch_size=16, n_epochs=1, n_envs=1, bootstrap_steps=0,
                             gamma=0.9)
    model, vec, _ = train_policy(tiny_config(), settings)
    assert model.gamma == 0.9 and vec.gamma == 0.9  # reward scaling uses the return PPO discounts
    # observations reach the network as the env scales them, unless standardization is asked for
    obs = FleetEnv(tiny_config()).reset(seed=0)[0]
    assert vec.norm_reward and not vec.norm_obs and np.array_equal(vec.normalize_obs(obs), obs)
    _, normalized, _ = train_policy(tiny_config(), dataclasses.replace(settings, normalize_observations=True))
    assert normalized.norm_obs and not np.array_equal(normalized.normalize_obs(obs), obs)


def test_train_settings_fields_are_documented_and_validated() -> None:
    import dataclasses

    doc = TrainSettings.__doc__ or ""
    for field in dataclasses.fields(TrainSettings):
        assert f"        {field.name}: " in doc, f"TrainSettings.{field.name} is not documented"
    for bad in ({"seed": -1}, {"gamma": 0.0}, {"gamma": 1.5}, {"gae_lambda": -0.1}, {"learning_rate": 0.0},
                {"ent_coef": -1.0}, {"net_arch": ()}, {"bootstrap_epochs": 0}, {"normalize_observations": 1}):
        name = next(iter(bad))
        with pytest.raises(ValueError, match=f"field '{name}'"):
            TrainSettings(**bad)  # type: ignore[arg-type]


def test_train_or_reuse_finds_the_run_with_the_same_settings() -> None:
    from atoll.training.train_tracking import train_or_reuse

    first = train_or_reuse(tiny_config(), ONE_ENV)
    again = train_or_reuse(tiny_config(), ONE_ENV)
    assert not first["reused"] and again["reused"]
    assert (again["model_uri"], again["run_id"]) == (first["model_uri"], first["run_id"])
    other_seed = train_or_reuse(tiny_config(), dataclasses.replace(ONE_ENV, seed=1))
    forced = train_or_reuse(tiny_config(), ONE_ENV, retrain=True)
    assert not other_seed["reused"] and not forced["reused"]
    assert len({first["run_id"], other_seed["run_id"], forced["run_id"]}) == 3
    assert train_or_reuse(tiny_config(), ONE_ENV)["run_id"] == forced["run_id"]  # the newest one


def test_evaluate_run_logs_the_learned_capacity_factors() -> None:
    env = FleetEnv(tiny_config(days=(6, 6), capacity_error="scale:0.7", correction=True, slo_model="latency"))
    out = evaluate_run(env, [parse_policy("fixed:1")], days=[6], seeds=1)
    client = MlflowClient()
    parent = client.get_run(out["parent_run_id"])
    assert parent.data.params["env.capacity_error"] == "scale:0.7"
    (child,) = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{out['parent_run_id']}'")
    assert child.data.metrics["correction_families"] >= 1
    # every learned factor moved from the prior toward the world's 0.7
    assert child.data.metrics["correction_factor_max"] < 1.0
    assert child.data.metrics["correction_factor_min"] == pytest.approx(0.7, rel=0.05)
    assert "correction_factors.json" in {f.path for f in client.list_artifacts(child.info.run_id)}


def _cache_files(root: Path) -> dict[str, tuple[int, int]]:
    """Every cache file with its inode and modification time (a rewrite changes both)."""
    return {str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_training_workers_load_the_caches_the_parent_warmed(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from atoll.training.train import make_vec_env, warm_caches

    monkeypatch.setenv("ATOLL_CACHE_DIR", str(tmp_path))  # the spawned workers inherit it
    config = tiny_config()
    warm_caches(config, 2)
    warmed = _cache_files(tmp_path)
    assert any(name.startswith("forecasts/") for name in warmed)
    vec = make_vec_env(config, 2, seed=0, gamma=0.99)
    try:
        assert isinstance(vec.venv, SubprocVecEnv) and vec.num_envs == 2
        obs = vec.reset()
        assert obs.shape[0] == 2 and np.all(np.isfinite(obs))
    finally:
        vec.close()
    # two workers built their envs, and neither recomputed (and so rewrote) a cached file
    assert _cache_files(tmp_path) == warmed
