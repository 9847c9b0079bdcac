"""PPO on FleetEnv: the learned re-planning trigger.

The loop is SB3's own: ``PPO("MlpPolicy")`` on a ``DummyVecEnv`` of FleetEnvs wrapped in
``VecNormalize`` (observations and rewards), on CPU with one torch thread. Metrics leave through
the SB3 logger the caller passes (``atoll.training.mlflow_output`` makes one that writes to MLflow), so
this module never imports MLflow.

Bootstrapping (optional, ``bootstrap_steps`` > 0): before PPO, the policy network is fitted by
behaviour cloning to a rule policy's actions (``bootstrap_rule``, default ``threshold``) on
observations from the training days
(binary cross-entropy on the MultiBinary logits). PPO then starts from a sensible trigger rather
than from coin flips, which on this task mostly pays for needless re-optimizations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from atoll.envs.config import FleetConfig
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import make_policy
from atoll.solvers.errors import InputError


@dataclass(frozen=True)
class TrainSettings:
    """PPO and bootstrapping settings; every field is logged as an MLflow parameter (``ppo.<field>``).

    Attributes:
        timesteps: PPO environment steps after bootstrapping (one step = one 5-minute interval of
            the fleet; a training day is 288 steps). >= 1.
        seed: seeds PPO (network initialization, action sampling), the vectorized envs (env ``i``
            is reset with ``seed + i``, which fixes its spot availability and preemptions) and the
            behaviour-cloning minibatch order. >= 0.
        n_envs: FleetEnv copies stepped together in one ``DummyVecEnv``; each PPO rollout holds
            ``n_steps x n_envs`` transitions. >= 1.
        learning_rate: Adam step size of the PPO updates (constant). > 0.
        n_steps: steps per env collected before each PPO update (576 = two days). >= 1.
        batch_size: minibatch size of the PPO updates; ``n_steps x n_envs`` should be a multiple
            of it. >= 1.
        n_epochs: passes over each rollout in a PPO update. >= 1.
        gamma: discount factor of the return, used by PPO's advantages and by ``VecNormalize``'s
            reward scaling (which divides rewards by the std of this same discounted return).
            0 < gamma <= 1; 0.98 weights about the next 50 steps (4 hours).
        gae_lambda: generalized advantage estimation's bias/variance trade-off. 0 <= . <= 1.
        ent_coef: weight of the entropy bonus in PPO's loss (keeps the trigger exploring). >= 0.
        net_arch: hidden layer sizes of the policy and value networks (separate networks of
            this shape). Each >= 1.
        bootstrap_steps: behaviour-cloning observations collected from ``bootstrap_rule`` on the
            training days before PPO; 0 skips bootstrapping. >= 0.
        bootstrap_epochs: passes over those observations when fitting the policy network to the
            rule's actions (binary cross-entropy on the logits). >= 1.
        bootstrap_rule: the rule imitated: a deployable rule spec of :mod:`atoll.envs.policies`
            (``fixed:K``, ``threshold[:LOW:HIGH]`` or ``never``; not ``hindsight``, which sees
            the future).
    """

    timesteps: int = 20_000
    seed: int = 0
    n_envs: int = 1
    learning_rate: float = 3e-4
    n_steps: int = 576
    batch_size: int = 96
    n_epochs: int = 5
    gamma: float = 0.98
    gae_lambda: float = 0.95
    ent_coef: float = 0.005
    net_arch: tuple[int, ...] = (64, 64)
    bootstrap_steps: int = 2_880
    bootstrap_epochs: int = 30
    bootstrap_rule: str = "threshold"

    def __post_init__(self) -> None:
        for name in ("timesteps", "n_envs", "n_steps", "batch_size", "n_epochs", "bootstrap_epochs"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise InputError(f"TrainSettings: field {name!r} must be an int >= 1, got {v!r}")
        for name in ("seed", "bootstrap_steps"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 0):
                raise InputError(f"TrainSettings: field {name!r} must be an int >= 0, got {v!r}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise InputError(f"TrainSettings: field 'learning_rate' must be > 0, got {self.learning_rate!r}")
        if not 0 < self.gamma <= 1:
            raise InputError(f"TrainSettings: field 'gamma' must be in (0, 1], got {self.gamma!r}")
        if not 0 <= self.gae_lambda <= 1:
            raise InputError(f"TrainSettings: field 'gae_lambda' must be in [0, 1], got {self.gae_lambda!r}")
        if not (math.isfinite(self.ent_coef) and self.ent_coef >= 0):
            raise InputError(f"TrainSettings: field 'ent_coef' must be >= 0, got {self.ent_coef!r}")
        if not (self.net_arch and all(isinstance(n, int) and n >= 1 for n in self.net_arch)):
            raise InputError(f"TrainSettings: field 'net_arch' must be layer sizes >= 1, "
                             f"got {self.net_arch!r}")
        if self.bootstrap_rule.split(":")[0] not in ("fixed", "threshold", "never"):
            raise InputError(f"TrainSettings: field 'bootstrap_rule' must be a deployable rule "
                             f"(fixed:K, threshold[:LOW:HIGH], never), got {self.bootstrap_rule!r}")


class _Progress(BaseCallback):
    def __init__(self, tick: Callable[[int], None]) -> None:
        super().__init__()
        self._tick = tick

    def _on_step(self) -> bool:
        self._tick(self.training_env.num_envs)
        return True


def make_vec_env(config: FleetConfig, n_envs: int, seed: int, gamma: float) -> VecNormalize:
    """``n_envs`` FleetEnvs, normalized; rewards are scaled by the std of the return discounted
    with ``gamma``, the same discount PPO optimizes."""
    def factory(i: int) -> Callable[[], Monitor]:
        def make() -> Monitor:
            env = FleetEnv(config)
            env.reset(seed=seed + i)
            return Monitor(env)
        return make

    vec = DummyVecEnv([factory(i) for i in range(n_envs)])
    vec.seed(seed)
    return VecNormalize(vec, norm_obs=True, norm_reward=True, gamma=gamma)


def _bootstrap(model: PPO, vec: VecNormalize, steps: int, epochs: int, rule_spec: str,
               tick: Callable[[int], None] | None) -> float:
    """Behaviour cloning of a rule policy; returns the final training loss."""
    env: FleetEnv = vec.venv.envs[0].unwrapped  # type: ignore[attr-defined]
    rule = make_policy(rule_spec, len(env.models))
    raw, acts = [], []
    obs, info = env.reset()
    for _ in range(steps):
        action = rule.act(obs, info)
        raw.append(obs)
        acts.append(action)
        vec.obs_rms.update(obs[None, :])  # the statistics PPO will normalize with start from these
        obs, _, term, trunc, info = env.step(action)
        if term or trunc:
            obs, info = env.reset()
        if tick is not None:
            tick(1)
    x = torch.as_tensor(vec.normalize_obs(np.asarray(raw, dtype=np.float32)))
    y = torch.as_tensor(np.asarray(acts, dtype=np.float32))
    policy = model.policy
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    loss = torch.tensor(0.0)
    gen = torch.Generator().manual_seed(model.seed or 0)
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(256):
            features = policy.extract_features(x[idx], policy.pi_features_extractor)
            assert isinstance(features, torch.Tensor)  # MlpPolicy shares one extractor
            latent_pi = policy.mlp_extractor.forward_actor(features)
            logits = policy.action_net(latent_pi)
            loss = loss_fn(logits, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return float(loss.detach())


def train_policy(config: FleetConfig, settings: TrainSettings, *, logger: Logger | None = None,
                 tick: Callable[[int], None] | None = None) -> tuple[PPO, VecNormalize, dict[str, float]]:
    """Train PPO on ``config``'s training days; returns the model, its VecNormalize and stats."""
    torch.set_num_threads(1)
    vec = make_vec_env(config, settings.n_envs, settings.seed, settings.gamma)
    model = PPO("MlpPolicy", vec, learning_rate=settings.learning_rate, n_steps=settings.n_steps,
                batch_size=settings.batch_size, n_epochs=settings.n_epochs, gamma=settings.gamma,
                gae_lambda=settings.gae_lambda, ent_coef=settings.ent_coef, device="cpu",
                seed=settings.seed, verbose=0,
                policy_kwargs={"net_arch": list(settings.net_arch)})
    if logger is not None:
        model.set_logger(logger)
    stats: dict[str, float] = {}
    if settings.bootstrap_steps:
        stats["bootstrap_loss"] = _bootstrap(model, vec, settings.bootstrap_steps, settings.bootstrap_epochs,
                                             settings.bootstrap_rule, tick)
        vec.reset()
    callback = _Progress(tick) if tick is not None else None
    model.learn(total_timesteps=settings.timesteps, callback=callback, progress_bar=False)
    vec.training = False  # frozen statistics from here on (evaluation, logging)
    return model, vec, stats
