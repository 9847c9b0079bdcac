"""The preset bandit: window sums checked by brute force, ridge heads that recover a known linear
gain, contexts read from the right entries, a policy that never departs is its reference rule to
the cent, one that always departs to an arm is that arm's rule, and a choice holds for its block."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from test_contest import config

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.observation import feature_names
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.errors import InputError
from atoll.solvers.problem import Risk
from atoll.training.evaluate import env_at_level, resolve_policy
from atoll.training.lever_oracle import preset_of, step_costs
from atoll.training.preset_bandit import (
    BanditData,
    LinearHeads,
    PresetBandit,
    collect,
    context_layout,
    fit,
    load,
    reference_options,
    save,
    window_sums,
)

REFERENCE, ARM = "fixed:1@0.9+h0.7", "fixed:1@0.9"


def test_window_sums_stop_at_the_end_of_each_day() -> None:
    rng = np.random.default_rng(0)
    costs = rng.uniform(0, 5, size=(2 * 7, 3))  # two days of 7 steps, 3 models
    got = window_sums(costs, 3, 7)
    for day in range(2):
        for t in range(7):
            row = day * 7 + t
            want = costs[row:day * 7 + min(t + 3, 7)].sum(axis=0)
            assert got[row] == pytest.approx(want)
    with pytest.raises(InputError, match="not whole days of 5"):
        window_sums(costs, 3, 5)


def test_ridge_heads_recover_a_linear_gain_and_survive_a_round_trip() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(2.0, 3.0, size=(4000, 3))
    x[:, 2] = 1.5  # a constant feature must not break the standardization
    y = np.stack([0.5 * x[:, 0] - 0.2 * x[:, 1] + 0.1, -x[:, 1] + rng.normal(0, 0.01, 4000)], axis=1)
    heads = fit(BanditData(x, y, ("a", "b", "c")), alpha=0.0)
    probe = np.array([[1.0, 0.0, 1.5], [0.0, 2.0, 1.5]])
    assert heads.predict(probe) == pytest.approx(np.array([[0.6, 0.0], [-0.3, -2.0]]), abs=0.01)
    again = LinearHeads.from_dict(json.loads(json.dumps(heads.to_dict())))
    assert np.array_equal(again.predict(probe), heads.predict(probe))
    with pytest.raises(InputError, match="lack the key 'weights'"):
        LinearHeads.from_dict({k: v for k, v in heads.to_dict().items() if k != "weights"})
    with pytest.raises(InputError, match="alpha must be >= 0"):
        fit(BanditData(x, y, ("a", "b", "c")), alpha=-1.0)
    with pytest.raises(InputError, match="names 2 columns"):
        BanditData(x, y, ("a", "b"))


def test_contexts_are_each_models_own_entries_and_the_shared_ones() -> None:
    names = feature_names(["m0", "m1"], ["A10G", "L4"], risk=True)
    cols, features = context_layout(names, ["m0", "m1"])
    assert "since_reopt" not in features and "since_preempt" in features and "spread" in features
    assert features[-4:] == ["preempted/A10G", "refused/A10G", "preempted/L4", "refused/L4"]
    for m, model in enumerate(["m0", "m1"]):
        for j, f in enumerate(features):
            want = f"{model}/{f}" if f"{model}/{f}" in names else f
            assert names[cols[m, j]] == want


def _env() -> FleetEnv:
    return FleetEnv(dataclasses.replace(config(), days=(4, 5), episode_steps=24))


def _bandit(env: FleetEnv, bias: float, margin: float = 0.0, hold: int = 1) -> PresetBandit:
    """Heads that predict ``bias`` for the one arm whatever the context."""
    cols, features = context_layout(env.feature_names, env.models)
    k = len(features)
    heads = LinearHeads(tuple(features), np.zeros(k), np.ones(k), np.zeros((k, 1)), np.array([bias]))
    ref = parse_policy(REFERENCE)
    return PresetBandit((preset_of(parse_policy(ARM)),), reference_options(ref, 2), heads, cols,
                        margin=margin, hold=hold, first=(0.9, Risk(headroom=0.7)))


def _costs(env: FleetEnv, policy: object) -> np.ndarray:
    return step_costs(env_at_level(env, policy, {}), policy, days=[4], seed=0, lost_usd_per_mtok=2.0)[0]


def test_never_departing_is_the_reference_and_always_departing_is_the_arm() -> None:
    env = _env()
    reference = _costs(env, make_policy(parse_policy(REFERENCE), 2))
    assert np.array_equal(_costs(env, _bandit(env, bias=0.5)), reference)  # to the cent
    # a predicted gain of 1% is not worth a departure at a 2% margin
    assert np.array_equal(_costs(env, _bandit(env, bias=-0.01, margin=0.02)), reference)
    # always departing, from the reference's first plan: the arm re-plans at its own risk each step
    always = _bandit(env, bias=-0.5)
    at = env_at_level(env, always, {})
    obs, _ = at.reset(seed=0, options={"day": 4})
    assert np.array_equal(always.act(obs, {"step": 0}), [0, 0])  # step 0 holds
    for code in always.act(obs, {"step": 3}):
        reopt = at.codec.decode(int(code))
        assert reopt.kind == "full" and (reopt.risk or at.config.risk) == Risk()
    assert not np.array_equal(_costs(env, _bandit(env, bias=-0.5)), reference)


def test_a_choice_holds_for_its_block() -> None:
    env = _env()
    policy = _bandit(env, bias=-0.5, hold=4)
    obs = np.zeros(env.observation_space.shape)
    policy.act(obs, {"step": 0})  # chooses the arm for steps 0-3
    policy.heads.bias[:] = 0.5  # the heads change their mind; the block's choice stands
    for s in (1, 2, 3):
        policy.act(obs, {"step": s})
    assert [int(c[0]) for c in policy.choices] == [1, 1, 1, 1]
    policy.act(obs, {"step": 4})
    assert int(policy.choices[-1][0]) == 0


def test_collect_gives_one_row_per_step_and_model_and_zero_gain_for_the_reference_itself(tmp_path) -> None:
    env = _env()
    ref = make_policy(parse_policy(REFERENCE), 2)
    arms = [make_policy(parse_policy(ARM), 2), make_policy(parse_policy(REFERENCE), 2)]
    cache: dict[object, FleetEnv] = {}
    contexts, gains = collect(env, ref, arms, days=[4], seed=0, horizon=6, lost_usd_per_mtok=2.0,
                              env_for=lambda p: env_at_level(env, p, cache))
    assert contexts.shape == (24 * 2, len(context_layout(env.feature_names, env.models)[1]))
    assert gains.shape == (48, 2) and np.all(gains[:, 1] == 0.0) and np.any(gains[:, 0] != 0.0)
    heads = fit(BanditData(contexts, gains, tuple(context_layout(env.feature_names, env.models)[1])))
    save(tmp_path / "bandit.json", heads, arms=[ARM, REFERENCE], reference=REFERENCE, margin=0.02, horizon=6,
         env=env, provenance={"days": [4]})
    doc = json.loads((tmp_path / "bandit.json").read_text())
    assert doc["kind"] == "atoll-preset-bandit" and doc["margin"] == 0.02
    assert LinearHeads.from_dict(doc["heads"]).weights.shape == (contexts.shape[1], 2)


def test_a_saved_chooser_runs_from_its_file_as_the_policy_it_was(tmp_path) -> None:
    env = _env()
    trained = _bandit(env, bias=-0.5, hold=6)
    path = tmp_path / "chooser.json"
    save(path, trained.heads, arms=[ARM], reference=REFERENCE, margin=0.0, horizon=6, env=env, provenance={})
    loaded = resolve_policy(parse_policy(f"learned:file:{path}"), 2)
    assert isinstance(loaded, PresetBandit) and loaded.name == f"learned:file:{path}"
    assert np.array_equal(loaded.columns, trained.columns) and loaded.hold == 6
    assert (loaded.planning_quantile, loaded.risk) == (trained.planning_quantile, trained.risk)
    assert np.array_equal(_costs(env, loaded), _costs(env, _bandit(env, bias=-0.5, hold=6)))  # to the cent
    with pytest.raises(InputError, match="was trained for 2 models"):
        load(path, 3)
    with pytest.raises(InputError, match="does not exist"):
        load(tmp_path / "none.json", 2)
    (tmp_path / "other.json").write_text(json.dumps({"kind": "something"}))
    with pytest.raises(InputError, match="is not a preset bandit file"):
        load(tmp_path / "other.json", 2)
    with pytest.raises(InputError, match="observations of 3 entries, its heads read"):
        loaded.act(np.zeros(3), {"step": 0})


def test_bad_shapes_are_named() -> None:
    env = _env()
    cols, features = context_layout(env.feature_names, env.models)
    k = len(features)
    heads = LinearHeads(tuple(features), np.zeros(k), np.ones(k), np.zeros((k, 2)), np.zeros(2))
    options = reference_options(parse_policy(REFERENCE), 2)
    with pytest.raises(InputError, match="predicts 2 arms"):
        PresetBandit(((1, 0.9),), options, heads, cols)
    with pytest.raises(InputError, match="field 'columns'"):
        PresetBandit(((1, 0.9), (1, 0.9)), options, heads, cols[:1])
    with pytest.raises(InputError, match="field 'hold'"):
        PresetBandit(((1, 0.9), (1, 0.9)), options, heads, cols, hold=0)
    with pytest.raises(InputError, match="gives 1 entries for 2 models"):
        reference_options(parse_policy("per-model:1@0.9"), 2)
