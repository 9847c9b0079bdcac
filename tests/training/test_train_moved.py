"""How far PPO moved its clone: measured on the cloning's own observations, zero when PPO cannot
change the parameters, and a clone of a risky rule on Fleet-v4's action agreeing with it; a
Fleet-v4 policy logged with its own codes, fitting only its env."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_train import ONE_ENV, tiny_config

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.errors import InputError
from atoll.training.cloning import CloneRecord, moved_from_clone
from atoll.training.evaluate import resolve_policy
from atoll.training.registry import FleetSpaces
from atoll.training.train import train_policy
from atoll.training.train_tracking import train_run


def test_a_policy_ppo_cannot_change_has_not_moved() -> None:
    frozen = dataclasses.replace(ONE_ENV, learning_rate=1e-12,
                                 bootstrap_rule=parse_policy("fixed:1@0.9+h0.7"))
    model, vec, stats = train_policy(tiny_config(action="risk", days=(4, 4)), frozen)
    assert stats["moved_from_clone"] == 0.0
    assert stats["teacher_agreement_after"] == stats["bootstrap_agreement"] > 0.5
    # the measure itself: a record whose clone disagrees everywhere reads as fully moved
    raw = np.zeros((4, vec.observation_space.shape[0]), dtype=np.float32)
    now, _ = model.predict(vec.normalize_obs(raw), deterministic=True)
    other = (np.asarray(now) + 1) % 19
    record = CloneRecord(raw, np.asarray(now), other)
    assert moved_from_clone(model, vec, record) == {"moved_from_clone": 1.0, "teacher_agreement_after": 1.0}


def test_a_fleet_v4_policy_is_logged_with_its_codes_and_fits_only_its_env() -> None:
    out = train_run(tiny_config(action="risk", days=(4, 4)), ONE_ENV)
    env = FleetEnv(tiny_config(action="risk", days=(6, 6)))
    policy = resolve_policy(parse_policy(f"learned:{out['model_uri']}"), 2, fleet=FleetSpaces.of_env(env))
    assert policy.metadata["env_id"] == "atoll/Fleet-v4"  # type: ignore[attr-defined]
    assert policy.metadata["action_codes"] == env.codec.names()  # type: ignore[attr-defined]
    obs, info = env.reset(seed=0)
    assert all(0 <= c < env.codec.n for c in policy.act(obs, info))
    with pytest.raises(InputError, match="action codes per model, env id differ"):
        resolve_policy(parse_policy(f"learned:{out['model_uri']}"), 2,
                       fleet=FleetSpaces.of_env(FleetEnv(tiny_config(days=(6, 6)))))
