"""A stopped training run resumes from its checkpoint: the same steps in all, the early stop's
and the cloning's state carried over, another run's or a damaged checkpoint refused by name.
Where the envs stand mid-episode at a checkpoint (32-step rollouts of 48-step episodes here)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from stable_baselines3 import PPO
from test_train import tiny_config

from atoll.solvers.errors import InputError
from atoll.training import checkpoint as ckpt
from atoll.training.checkpoint import CheckpointSpec
from atoll.training.train import TrainSettings, train_policy

# one env in this process, rollouts of 32 steps: 4 rollouts, checkpoints after the 1st, 2nd, 3rd
SETTINGS = TrainSettings(timesteps=128, n_steps=32, batch_size=16, n_epochs=1, n_envs=1, bootstrap_steps=48,
                         bootstrap_epochs=1, bootstrap_min_updates=20, eval_every=40, patience=50, seed=0)


class Stop(Exception):
    """What kills the run part-way (a closed session, in the tests an exception from the progress tick)."""


def _killer(after: int) -> object:
    seen = [0]

    def tick(n: int) -> None:
        seen[0] += n
        if seen[0] > after:
            raise Stop(f"stopped after {seen[0]} steps")
    return tick


def _score(policy: object) -> float:
    return 1.0  # never improves: the early stop's state is all scores and counts


def test_a_stopped_run_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    spec = CheckpointSpec(tmp_path / "run", "k1", every=32)
    with pytest.raises(Stop):  # bootstrap 48 ticks, then PPO: killed in its 3rd rollout
        train_policy(tiny_config(), SETTINGS, tick=_killer(48 + 80), validate=_score, checkpoint=spec)
    kept = ckpt.load(spec)
    assert kept is not None and kept.steps == 64  # taken at the starts of rollouts 2 and 3; the last kept
    assert "bootstrap_agreement" in kept.stats and kept.record is not None
    assert kept.stop is not None and [t for t, _ in kept.stop["scores"]] == [0, 40]
    assert len(list((tmp_path / "run").glob("steps-*"))) == 1  # older checkpoints are removed
    ticks: list[int] = []
    model, vec, stats = train_policy(tiny_config(), SETTINGS, tick=ticks.append, validate=_score,
                                     checkpoint=spec)
    assert stats["resumed_at"] == 64 and model.num_timesteps == SETTINGS.ppo_steps
    assert ticks[0] == SETTINGS.bootstrap_steps + 64 and sum(ticks) == SETTINGS.bootstrap_steps + 128
    assert stats["bootstrap_agreement"] == kept.stats["bootstrap_agreement"]  # cloned once, not again
    assert stats["validation_evaluations"] == 4  # 0 and 40 before the stop, 80 and 120 after
    assert "moved_from_clone" in stats  # measured against the checkpoint's clone record
    final = ckpt.load(spec)  # a finished run keeps its last state: a larger budget goes on from it
    assert final is not None and final.steps == SETTINGS.ppo_steps and not final.exact  # 32-step rollouts
    # of 48-step episodes: the envs stand mid-episode


def test_a_resumed_run_keeps_the_checkpoint_parameters_and_statistics(tmp_path: Path) -> None:
    spec = CheckpointSpec(tmp_path / "run", "k2", every=32)
    settings = dataclasses.replace(SETTINGS, eval_every=0, normalize_observations=True)
    with pytest.raises(Stop):
        train_policy(tiny_config(), settings, tick=_killer(48 + 40), checkpoint=spec)
    kept = ckpt.load(spec)
    assert kept is not None and kept.steps == 32
    saved = PPO.load(kept.model_path, device="cpu")
    stopped = dataclasses.replace(settings, timesteps=32)  # nothing left to learn: the checkpoint as it is
    model, vec, stats = train_policy(tiny_config(), stopped, checkpoint=spec)
    assert model.num_timesteps == 32 and stats["resumed_at"] == 32
    assert np.allclose(vec.obs_rms.mean, kept.obs_rms.mean) and np.allclose(vec.ret_rms.var, kept.ret_rms.var)
    for a, b in zip(model.policy.state_dict().values(), saved.policy.state_dict().values(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy())


def test_another_runs_or_a_damaged_checkpoint_is_refused_by_name(tmp_path: Path) -> None:
    spec = CheckpointSpec(tmp_path / "run", "mine", every=32)
    settings = dataclasses.replace(SETTINGS, eval_every=0, bootstrap_steps=0)
    with pytest.raises(Stop):
        train_policy(tiny_config(), settings, tick=_killer(40),
                     checkpoint=dataclasses.replace(spec, key="theirs"))
    with pytest.raises(InputError, match=r"settings key 'theirs', not this run's 'mine'; delete .*run"):
        train_policy(tiny_config(), settings, checkpoint=spec)
    pointer = tmp_path / "run" / ckpt.POINTER
    pointer.write_text("{not json")
    with pytest.raises(InputError, match=r"checkpoint .*run: unreadable .*; delete"):
        ckpt.load(dataclasses.replace(spec, key="theirs"))
    assert ckpt.load(CheckpointSpec(tmp_path / "empty", "mine", every=1)) is None
    with pytest.raises(InputError, match="field 'every'"):
        CheckpointSpec(tmp_path, "k", every=0)


def test_train_run_resumes_under_the_cache_folder_and_tags_the_run(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from atoll.training.run_folder import identity
    from atoll.training.tracking import settings_key
    from atoll.training.train_tracking import checkpoint_folder, train_params, train_run

    monkeypatch.setenv("ATOLL_CACHE_DIR", str(tmp_path / "cache"))
    settings = dataclasses.replace(SETTINGS, eval_every=0, timesteps=64)
    config = tiny_config()
    run_dir = checkpoint_folder(settings_key(identity(train_params(config, settings))))
    assert run_dir.parent == tmp_path / "cache" / "training"
    folder = run_dir / "checkpoints"
    with pytest.raises(Stop):
        train_run(config, settings, tick=_killer(48 + 40), checkpoint_every=32)
    assert (folder / ckpt.POINTER).is_file()
    out = train_run(config, settings, checkpoint_every=32)
    run = MlflowClient().get_run(out["run_id"])
    assert run.data.tags["atoll.resumed_at"] == "32" and out["resumed_at"] == 32
    assert out["run_dir"] == str(run_dir) and (run_dir / "policy-best" / "card.json").is_file()
    last = ckpt.load(CheckpointSpec(folder, out["run_dir"] and ckpt.pointer(folder)["key"], every=32))
    assert last is not None and last.steps == 64
