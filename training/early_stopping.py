"""Early stopping of a PPO run on validation days (:func:`atoll.training.train.train_policy`).

Every ``every`` PPO steps :class:`ValidationStop` scores the deterministic policy being trained
(:class:`TrainingPolicy`: observations normalized with the current statistics) with ``validate``
(lower is better: the contest's validation-day score,
:func:`atoll.training.contest.validation_scorer`), keeps the best-scoring parameters and
normalization statistics, and stops the run after ``patience`` scores without improvement; its
state goes into the run's checkpoints (:mod:`atoll.training.checkpoint`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecNormalize

from atoll.envs.policies import Policy
from atoll.training import checkpoint as ckpt

__all__ = ["TrainingPolicy", "ValidationStop"]


class TrainingPolicy:
    """The policy being trained, with the rule policies' interface (deterministic actions on
    observations normalized with the current statistics)."""

    name = "learned (training)"
    planning_quantile: float | None = None

    def __init__(self, model: BaseAlgorithm, vec: VecNormalize) -> None:
        self.model, self.vec = model, vec

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        obs = self.vec.normalize_obs(np.asarray(observation, dtype=np.float32)[None, :])
        action, _ = self.model.predict(obs, deterministic=True)
        return np.asarray(action[0])

    def reset_options(self) -> dict[str, Any]:
        return {}


class ValidationStop(BaseCallback):
    """Scores the policy every ``every`` steps with ``validate`` (lower is better), keeps the best
    parameters and normalization statistics, stops after ``patience`` scores without improvement."""

    def __init__(self, validate: Callable[[Policy], float], vec: VecNormalize, every: int, patience: int,
                 note: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.validate, self.vec, self.every, self.patience, self.note = validate, vec, every, patience, note
        self.best = math.inf
        self.best_state: tuple[dict[str, Any], Any] | None = None
        self.scores: list[tuple[int, float]] = []
        self._last = 0
        self._bad = 0

    def _on_step(self) -> bool:
        if self.num_timesteps - self._last < self.every:
            return True
        self._last = self.num_timesteps
        score = float(self.validate(TrainingPolicy(self.model, self.vec)))
        self.scores.append((self.num_timesteps, score))
        self.logger.record("validation/score", score)
        if self.note is not None:
            best = min(self.best, score)
            self.note(f"validation score {score:.4f} at {self.num_timesteps} steps (best {best:.4f})")
        if score < self.best - 1e-9:
            self.best, self._bad = score, 0
            self.best_state = (copy.deepcopy(self.model.policy.state_dict()),
                               copy.deepcopy(ckpt.obs_stats(self.vec)))
        else:
            self._bad += 1
        return self._bad < self.patience

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the early stop (:mod:`atoll.training.checkpoint`)."""
        return {"best": self.best, "best_state": self.best_state, "scores": list(self.scores),
                "last": self._last, "bad": self._bad}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Go on from a checkpoint's :meth:`state`."""
        self.best, self.best_state = float(state["best"]), state["best_state"]
        self.scores = [(int(t), float(v)) for t, v in state["scores"]]
        self._last, self._bad = int(state["last"]), int(state["bad"])

    @property
    def stopped(self) -> bool:
        """Whether ``patience`` scores in a row did not improve (the run is over whatever its budget)."""
        return self._bad >= self.patience

    def restore_best(self) -> None:
        if self.best_state is not None:
            self.model.policy.load_state_dict(self.best_state[0])
            if self.best_state[1] is not None:
                self.vec.obs_rms = self.best_state[1]
