"""A run folder outlives its process: a larger budget continues the run bit for bit, a run killed
with SIGKILL goes on from its last checkpoint as if never stopped, a changed setting is refused by
name, an early-stopped run stays stopped, and ``--status`` says where a run stands."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_train import tiny_config

from atoll.solvers.errors import InputError
from atoll.training import checkpoint as ckpt
from atoll.training.run_folder import RunFolder, run_status
from atoll.training.train import TrainSettings, train_policy

HERE = Path(__file__).resolve().parent
NEVER = 10**9  # checkpoints: only the last one
# one env in this process; 128-step rollouts of 64-step episodes: every rollout ends on episodes' ends
SETTINGS = TrainSettings(timesteps=512, n_steps=128, batch_size=64, n_epochs=2, n_envs=1, bootstrap_steps=32,
                         bootstrap_epochs=1, bootstrap_min_updates=5, seed=0)


def config():  # type: ignore[no-untyped-def]
    return tiny_config(episode_steps=64)


def _params(model) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    return {k: v.clone() for k, v in model.policy.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_larger_budget_continues_the_run_bit_for_bit(tmp_path: Path) -> None:
    spec = ckpt.CheckpointSpec(tmp_path / "a", "k", every=256)
    first, _, _ = train_policy(config(), SETTINGS, checkpoint=spec)
    at_512 = _params(first)
    assert ckpt.load(spec).steps == 512 and ckpt.load(spec).exact  # type: ignore[union-attr]
    more = dataclasses.replace(SETTINGS, timesteps=1024)
    ticks: list[int] = []
    resumed, _, stats = train_policy(config(), more, checkpoint=spec, tick=ticks.append)
    assert stats["resumed_at"] == 512 and stats["resumed_exact"] == 1.0
    assert sum(ticks) == SETTINGS.bootstrap_steps + 1024  # the checkpoint's work, then 512 more steps
    once, _, _ = train_policy(config(), more,
                              checkpoint=ckpt.CheckpointSpec(tmp_path / "b", "k", every=NEVER))
    assert resumed.num_timesteps == once.num_timesteps == 1024
    assert _same(_params(resumed), _params(once))  # the same rollouts, the same updates
    assert not _same(_params(resumed), at_512)  # and the 512 more steps did learn


_CHILD = """
import sys
sys.path.insert(0, {here!r})
from test_run_folder import SETTINGS, config
import dataclasses
from atoll.training import checkpoint as ckpt
from atoll.training.train import train_policy
spec = ckpt.CheckpointSpec({folder!r}, "k", every=128)
def tick(n):
    print(n, flush=True)
train_policy(config(), dataclasses.replace(SETTINGS, timesteps=1024), checkpoint=spec, tick=tick)
"""


def test_a_killed_run_goes_on_from_its_last_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    # a random point: after 300 to 900 of the 1,024 PPO steps (seeded, so the test is repeatable)
    kill_after = SETTINGS.bootstrap_steps + int(np.random.default_rng(7).integers(300, 900))
    child = subprocess.Popen([sys.executable, "-c", _CHILD.format(here=str(HERE), folder=str(folder))],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env={**os.environ, "PYTHONPATH": str(HERE)})
    done = 0
    assert child.stdout is not None
    deadline = time.monotonic() + 300
    for line in child.stdout:
        done += int(line)
        if done >= kill_after or time.monotonic() > deadline:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    kept = ckpt.load(ckpt.CheckpointSpec(folder, "k", every=128))
    assert kept is not None and kept.exact
    assert done - SETTINGS.bootstrap_steps - kept.steps <= 128  # at most checkpoint_every steps lost
    more = dataclasses.replace(SETTINGS, timesteps=1024)
    resumed, _, stats = train_policy(config(), more, checkpoint=ckpt.CheckpointSpec(folder, "k", every=128))
    assert stats["resumed_at"] == kept.steps
    once, _, _ = train_policy(config(), more,
                              checkpoint=ckpt.CheckpointSpec(tmp_path / "once", "k", every=NEVER))
    assert _same(_params(resumed), _params(once))


def test_a_changed_setting_is_refused_by_name_and_the_budget_may_grow(tmp_path: Path) -> None:
    params = {"env.availability": "spot", "ppo.timesteps": "512", "ppo.patience": "3", "ppo.seed": "0"}
    RunFolder.open(tmp_path / "r", params, "k", command="atoll train")
    grown = {**params, "ppo.timesteps": "1024", "ppo.patience": "5"}
    assert RunFolder.open(tmp_path / "r", grown, "k", command="atoll train").key == "k"
    with pytest.raises(InputError, match=r"env.availability: the run has 'spot', this command 'hedged'.*"
                                         r"another --run-dir"):
        RunFolder.open(tmp_path / "r", {**params, "env.availability": "hedged"}, "k2", command="x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=r"'.*other' exists and is not a run folder"):
        RunFolder.open(tmp_path / "other", params, "k", command="x")
    with pytest.raises(InputError, match=r"no run.json \(not a run folder\)"):
        run_status(tmp_path / "other")


def test_an_early_stopped_run_stays_stopped_until_its_patience_grows(tmp_path: Path) -> None:
    spec = ckpt.CheckpointSpec(tmp_path / "r", "k", every=128)
    settings = dataclasses.replace(SETTINGS, eval_every=128, patience=1, timesteps=1024)
    notes: list[str] = []
    _, _, stats = train_policy(config(), settings, checkpoint=spec, validate=lambda p: 1.0, note=notes.append)
    assert stats["stopped_early"] == 1.0 and stats["stopped_at"] < 1024
    stopped_at = stats["stopped_at"]
    _, _, again = train_policy(config(), settings, checkpoint=spec, validate=lambda p: 1.0, note=notes.append)
    assert again["stopped_at"] == stopped_at and any("nothing to continue" in n for n in notes)
    patient = dataclasses.replace(settings, patience=3)
    _, _, later = train_policy(config(), patient, checkpoint=spec, validate=lambda p: 1.0)
    assert later["stopped_at"] > stopped_at


def test_train_run_writes_the_folder_and_status_reads_it(tmp_path: Path) -> None:
    from atoll.training.policy_file import read_card
    from atoll.training.train_tracking import train_run

    out = train_run(config(), dataclasses.replace(SETTINGS, timesteps=128), run_dir=tmp_path / "run",
                    command="atoll train --timesteps 128", now=lambda: "2026-01-01T00:00:00+00:00")
    status = run_status(tmp_path / "run")
    assert status["state"] == "finished" and status["checkpoint_steps"] == 128 and status["checkpoint_exact"]
    assert status["mlflow_runs"] == [out["run_id"]] and set(status["policies"]) == {"best", "last"}
    card = read_card(tmp_path / "run" / "policy-best")
    assert card.steps == 128 and card.command == "atoll train --timesteps 128"
    assert card.env_id == "atoll/Fleet-v1"
    assert card.created == "2026-01-01T00:00:00+00:00" and len(card.data_hash) == 16
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert "ppo.timesteps" not in run["settings"] and run["settings"]["ppo.seed"] == "0"
    again = train_run(config(), dataclasses.replace(SETTINGS, timesteps=256), run_dir=tmp_path / "run")
    assert again["resumed_at"] == 128
    assert run_status(tmp_path / "run")["mlflow_runs"] == [out["run_id"], again["run_id"]]
