"""A training run's state on disk, so a run stopped part-way (a closed session, a killed job, a
machine restart) resumes where its last checkpoint left it instead of starting over.

PPO on a charged extended fleet takes hours on two cores (a simulated day is about a minute
per process there), longer than a working session. A checkpoint is taken at the start of a
rollout (after the previous PPO update) once ``every`` steps have passed since the last one,
and holds what the run needs to go on:

- the PPO model (policy, value network, Adam state, step count; SB3's ``model.zip``);
- the ``VecNormalize`` statistics (observation and return running means);
- the early stop's state (best score, its parameters and statistics, the scores so far, the
  evaluations without improvement) and the cloning's :class:`~atoll.training.cloning.CloneRecord`;
- the statistics gathered before PPO (``bootstrap_loss``, ``bootstrap_agreement``).

A checkpoint is keyed by the run's settings key (environment and PPO parameters,
:func:`atoll.training.tracking.settings_key`): only the same run resumes from it. It is written
into a fresh folder and made current by an atomic rename of its pointer file, so a run killed
while saving leaves the previous checkpoint whole.

- the random states of torch, numpy and Python (minibatch order, action sampling);
- when every env stands at an episode boundary (rollouts a whole number of episodes long, the
  default: 576 steps of 288-step days), how each env began its current episode
  (:class:`ReplayableResets`): the resumed run starts those episodes exactly as the stopped one
  did, so it is **bit-identical** to a run that was never stopped (``exact`` in the pointer).

A checkpoint taken mid-episode (rollouts that do not divide into episodes, or a run stopped early
inside a rollout) is ``exact: false``: the resumed envs reset with ``seed + i + steps done``, a
valid run of the same settings, deterministic for its checkpoint, but not the uninterrupted one.
The rollout under way when a run is killed is lost either way: at most ``every`` steps plus one
rollout.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.utils import seeding
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecNormalize

from atoll.solvers.errors import InputError
from atoll.solvers.files import atomic_write_text

POINTER = "latest.json"
FORMAT = 2


class ReplayableResets(gym.Wrapper[Any, Any, Any, Any]):
    """Remembers how its env began the current episode (the state of the env's generator just
    before the reset, and the reset options), so a stopped run can begin that episode again,
    exactly, in a fresh process (:meth:`replay_reset`).

    The env must draw all of a reset's randomness from ``np_random`` (FleetEnv does): then the
    generator's state and the options fix the episode's start. A reset with a seed is recorded as
    the state gymnasium seeds the generator with.
    """

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__(env)
        self._began: tuple[dict[str, Any], dict[str, Any] | None] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed is not None:
            generator, _ = seeding.np_random(seed)
        else:
            generator = self.env.unwrapped.np_random
        self._began = (dict(copy.deepcopy(generator.bit_generator.state)), copy.deepcopy(options))
        return self.env.reset(seed=seed, options=options)

    def episode_start(self) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
        """How the current episode began (None before the first reset)."""
        return self._began

    def replay_reset(self, began: tuple[dict[str, Any], dict[str, Any] | None]) -> Any:
        """Begin again the episode :meth:`episode_start` described; returns its first observation."""
        state, options = began
        generator = np.random.Generator(getattr(np.random, state["bit_generator"])())
        generator.bit_generator.state = copy.deepcopy(state)
        self.env.unwrapped.np_random = generator
        self._began = (copy.deepcopy(state), copy.deepcopy(options))
        observation, _ = self.env.reset(options=options)
        return observation


def random_states() -> dict[str, Any]:
    """The process's random states a PPO update draws from (torch: minibatch sampling of actions;
    numpy: the rollout buffer's minibatch order; Python's ``random``)."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_random_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often a training run saves its state.

    Attributes:
        folder: the run's checkpoint folder (one run per folder; created when missing).
        key: the run's settings key; a checkpoint taken under another key is refused.
        every: PPO steps between checkpoints (>= 1); checkpoints fall on rollout boundaries.
    """

    folder: Path
    key: str
    every: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "folder", Path(self.folder))  # a str is a path too
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1:
            raise InputError(f"CheckpointSpec: field 'every' must be PPO steps >= 1, got {self.every!r}")
        if not self.key:
            raise InputError("CheckpointSpec: field 'key' must be the run's settings key, got ''")


@dataclass(frozen=True)
class Resumed:
    """A checkpoint read back: the PPO steps it was taken at and what the run keeps beside the model."""

    steps: int
    model_path: Path
    obs_rms: Any
    ret_rms: Any
    stats: dict[str, float]
    stop: dict[str, Any] | None
    record: Any
    random: dict[str, Any] | None = None
    episodes: list[Any] | None = None  # per env, how its current episode began: exact resume

    @property
    def exact(self) -> bool:
        """Whether the run goes on bit-identically (every env was at an episode boundary)."""
        return self.episodes is not None and self.random is not None


def obs_stats(vec: VecNormalize) -> Any:
    """The observation statistics ``vec`` normalizes with (None when it passes observations
    through: SB3 keeps no ``obs_rms`` then)."""
    return vec.obs_rms if vec.norm_obs else None


def episode_starts(model: PPO, vec: VecNormalize) -> list[Any] | None:
    """How each env began its current episode, when every env stands at its start (the last step
    ended an episode everywhere) and is wrapped in :class:`ReplayableResets`; else None."""
    starts = getattr(model, "_last_episode_starts", None)
    if starts is None or not bool(np.all(starts)) or not vec.env_is_wrapped(ReplayableResets)[0]:
        return None
    began = vec.env_method("episode_start")
    return None if any(b is None for b in began) else list(began)


def save(spec: CheckpointSpec, model: PPO, vec: VecNormalize, *, stats: dict[str, float],
         stop: dict[str, Any] | None, record: Any) -> Path:
    """Write a checkpoint of the run at ``model.num_timesteps`` and make it current; returns its
    folder. Exact (:class:`Resumed.exact`) when every env stands at an episode's start."""
    spec.folder.mkdir(parents=True, exist_ok=True)
    steps = int(model.num_timesteps)
    target = spec.folder / f"steps-{steps:09d}"
    partial = spec.folder / f".partial-{steps:09d}-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    model.save(partial / "model.zip")
    episodes = episode_starts(model, vec)
    state = {"format": FORMAT, "key": spec.key, "steps": steps, "obs_rms": obs_stats(vec),
             "ret_rms": vec.ret_rms, "stats": dict(stats), "stop": stop, "record": record,
             "random": random_states(), "episodes": episodes}
    with open(partial / "state.pkl", "wb") as fh:
        pickle.dump(state, fh)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    # the checkpoint is current only once its pointer lands
    atomic_write_text(spec.folder / POINTER,
                      json.dumps({"format": FORMAT, "key": spec.key, "steps": steps, "folder": target.name,
                                  "exact": episodes is not None}))
    for old in spec.folder.glob("steps-*"):
        if old != target:
            shutil.rmtree(old, ignore_errors=True)
    return target


def load(spec: CheckpointSpec) -> Resumed | None:
    """The current checkpoint of ``spec``'s run, or None when the folder holds none; an InputError
    naming the folder when it holds another run's checkpoint or a damaged one."""
    pointer = spec.folder / POINTER
    if not pointer.is_file():
        return None
    fix = f"delete {spec.folder} to start the run over"
    try:
        head = json.loads(pointer.read_text())
        folder = spec.folder / str(head["folder"])
        if head.get("key") != spec.key:
            raise InputError(f"checkpoint {spec.folder}: taken by the run with settings key "
                             f"{head.get('key')!r}, not this run's {spec.key!r}; {fix}")
        with open(folder / "state.pkl", "rb") as fh:
            state = pickle.load(fh)
    except InputError:
        raise
    except (OSError, ValueError, KeyError, pickle.UnpicklingError, EOFError) as exc:
        raise InputError(f"checkpoint {spec.folder}: unreadable ({type(exc).__name__}: {exc}); "
                         f"{fix}") from exc
    if state.get("format") != FORMAT or state.get("key") != spec.key or not (folder / "model.zip").is_file():
        raise InputError(f"checkpoint {folder}: not a format-{FORMAT} checkpoint of settings key "
                         f"{spec.key!r} with its model.zip; {fix}")
    return Resumed(int(state["steps"]), folder / "model.zip", state["obs_rms"], state["ret_rms"],
                   dict(state["stats"]), state["stop"], state["record"], state.get("random"),
                   state.get("episodes"))


def pointer(folder: Path) -> dict[str, Any] | None:
    """The current checkpoint's pointer (format, key, steps, folder, exact), or None."""
    try:
        head = json.loads((folder / POINTER).read_text())
    except (OSError, ValueError):
        return None
    return head if isinstance(head, dict) else None


class Checkpointing(BaseCallback):
    """Calls ``save_now`` at the start of a rollout once ``every`` steps have passed since the
    last checkpoint (or since the run started or resumed)."""

    def __init__(self, save_now: Callable[[], None], every: int, start: int) -> None:
        super().__init__()
        self.save_now, self.every, self._last = save_now, every, start

    def _on_rollout_start(self) -> None:
        if self.num_timesteps - self._last >= self.every:
            self._last = self.num_timesteps
            self.save_now()

    def _on_step(self) -> bool:
        return True
