"""PPO on FleetEnv: the learned re-planning trigger.

The loop is SB3's own: ``PPO("MlpPolicy")`` on a ``SubprocVecEnv`` of FleetEnvs (one process
per env: both cores of the target machine; ``DummyVecEnv`` with one env) wrapped in
``VecNormalize`` (rewards; observations only with ``normalize_observations``), on CPU with one
torch thread. Env ``i`` meets demand realization ``demand_seed + i mod demand_seeds`` and days
drawn from the training days, so the policy cannot memorize one day's demand.

Any FleetEnv config trains, ``atoll/Fleet-v2`` included (``atoll.envs.CLOSED_LOOP``: the world's
capacities off the model, online correction, latency SLO and the observation's closed-loop block
— latency, queue and correction per model — which a forecast-based rule never reads). There
the world is drawn anew at every reset from the env's generator (seed ``seed + i`` for env ``i``,
then its own stream), so a run meets ``n_envs`` + one per finished episode capacity-error draws
(``capacity_error_draws`` in the stats) as well as ``demand_seeds`` demand realizations: the
policy cannot memorize one world either. Metrics leave through the SB3 logger the caller passes
(``atoll.training.mlflow_output`` makes one that writes to MLflow), so this module never imports
MLflow.

Bootstrapping (optional, ``bootstrap_steps`` > 0): before PPO, the policy network is fitted by
behaviour cloning to a rule policy's actions (``bootstrap_rule``, default ``fixed:1``: re-plan
fully every step at the configured level, the frontier's reference rule; chosen on validation
days 8-10 of core/spot, where a clone of ``grow:12@0.7`` scored 1.22 against the frontier and
one of ``fixed:1`` 1.00) on observations from the training days (cross-entropy on each model's
action logits; :mod:`atoll.training.cloning`). PPO then starts from a policy on the frontier
rather than from uniform codes.

Early stopping (optional, ``validate`` given and ``eval_every`` > 0): every ``eval_every`` steps
the deterministic policy is scored by ``validate`` (lower is better: the contest's validation-day
score, :func:`atoll.training.contest.validation_scorer`); the best-scoring parameters and
normalization statistics are kept and restored at the end, and training stops after
``patience`` evaluations without improvement.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

from atoll.envs.config import FleetConfig
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import Policy
from atoll.envs.vocabulary import PolicySpec
from atoll.solvers.errors import InputError
from atoll.solvers.validation import check_flag, check_fraction, check_integer, check_number
from atoll.training import checkpoint as ckpt
from atoll.training.checkpoint import CheckpointSpec, ReplayableResets
from atoll.training.cloning import (
    CloneRecord,
    Teacher,
    TeacherAgreement,
    bootstrap_teacher,
    clone_rule,
    moved_from_clone,
)
from atoll.training.early_stopping import TrainingPolicy, ValidationStop

DEPLOYABLE_RULES = ("fixed", "threshold", "grow", "never")


def bootstrap_rule_error(given: object) -> InputError:
    """The error of a bootstrap rule that is not a deployable rule or a per-model assignment
    (``given``: its spec, or the text that names none)."""
    text = str(given) if isinstance(given, PolicySpec) else given
    return InputError(f"TrainSettings: field 'bootstrap_rule' must be a deployable rule "
                      f"(fixed:K, threshold[:LOW:HIGH], grow:K, never, per-model:K1@q1,...), "
                      f"got {text!r}")


@dataclass(frozen=True)
class TrainSettings:
    """PPO and bootstrapping settings; every field is logged as an MLflow parameter (``ppo.<field>``).

    Attributes:
        timesteps: PPO environment steps after bootstrapping (one step = one 5-minute interval of
            the fleet; a training day is 288 steps). >= 1.
        seed: seeds PPO (network initialization, action sampling), the vectorized envs (env ``i``
            is reset with ``seed + i``, which fixes its spot availability and preemptions) and the
            behaviour-cloning minibatch order. >= 0.
        n_envs: FleetEnv copies stepped together, each in its own process (``SubprocVecEnv``; one
            env runs in this process); each PPO rollout holds
            ``n_steps x n_envs`` transitions. >= 1.
        demand_seeds: demand realizations trained on: env ``i`` uses the config's ``demand_seed``
            + (i mod demand_seeds). >= 1.
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
            rule's actions (cross-entropy on each model's logits). >= 1.
        bootstrap_rule: the rule imitated: a deployable rule's spec (:mod:`atoll.envs.policies`)
            (``fixed:K``, ``threshold[:LOW:HIGH]``, ``grow:K`` or ``never``; not ``hindsight``,
            which sees the future) or a per-model assignment ``per-model:K1@q1,...``
            (:mod:`atoll.training.per_model`; its levels must be among the env's action levels).
        bootstrap_min_updates: the fewest minibatch updates the cloning makes, whatever
            ``bootstrap_epochs`` gives (30 passes over 576 observations are 90 Adam steps from
            SB3's near-uniform start: on extended that clone of ``fixed:1@0.9`` agreed with it
            on too few observations and scored 2.82 on the validation days). >= 1.
        bootstrap_smoothing: label smoothing of the clone toward the other options of the
            imitated kind (``full``/``grow`` at level q taking risk preset r: this share of the
            target spread over the same kind at every other (level, risk preset) pair of the
            action; ``hold`` is not smoothed). The clone's argmax stays the rule's action while
            PPO's sampled actions try other levels and risks, not ``hold``. 0 <= . < 0.5.
        eval_every: PPO steps between validation scores (early stopping); 0 never scores. >= 0.
        patience: validation scores without improvement before training stops. >= 1.
        normalize_observations: standardize each observation entry by its running mean and std
            (``VecNormalize``'s ``norm_obs``, clipped at 10 std). Off by default: every entry is
            already scaled to its stated bounds (:mod:`atoll.envs.observation`), and a std taken
            over a short cloning set makes a feature it saw rarely (a node still starting, a GPU
            type's headroom on another day's spot trace) 10 std wide on days it never saw. On
            extended / spot in the charged world, the clone of the per-model reference agreed
            with its teacher on all of its 576 observations either way, but on the validation days
            on 92.4% of (step, model) pairs with standardization (it held every model at 66 of 864
            steps) and on 100% without. Rewards are scaled by the return's std either way.
    """

    timesteps: int = 20_000
    seed: int = 0
    n_envs: int = 2
    demand_seeds: int = 2
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
    bootstrap_rule: PolicySpec = PolicySpec("fixed", every=1)
    bootstrap_min_updates: int = 1_000
    bootstrap_smoothing: float = 0.0
    eval_every: int = 0
    patience: int = 3
    normalize_observations: bool = False

    @property
    def ppo_steps(self) -> int:
        """Env steps PPO takes: ``timesteps`` rounded up to whole rollouts of ``n_steps x n_envs``."""
        rollout = self.n_steps * self.n_envs
        return -(-self.timesteps // rollout) * rollout

    def __post_init__(self) -> None:
        for name in ("timesteps", "n_envs", "n_steps", "batch_size", "n_epochs", "bootstrap_epochs",
                     "bootstrap_min_updates", "demand_seeds", "patience"):
            check_integer("TrainSettings", name, getattr(self, name), minimum=1)
        for name in ("seed", "bootstrap_steps", "eval_every"):
            check_integer("TrainSettings", name, getattr(self, name), minimum=0)
        check_number("TrainSettings", "learning_rate", self.learning_rate)
        check_fraction("TrainSettings", "gamma", self.gamma, low_open=True)
        check_fraction("TrainSettings", "gae_lambda", self.gae_lambda)
        check_number("TrainSettings", "ent_coef", self.ent_coef, allow_zero=True)
        if not (self.net_arch and all(isinstance(n, int) and n >= 1 for n in self.net_arch)):
            raise InputError(f"TrainSettings: field 'net_arch' must be layer sizes >= 1, "
                             f"got {self.net_arch!r}")
        rule = self.bootstrap_rule
        if not (isinstance(rule, PolicySpec) and rule.kind in (*DEPLOYABLE_RULES, "per-model")):
            raise bootstrap_rule_error(rule)
        check_flag("TrainSettings", "normalize_observations", self.normalize_observations)
        if not (math.isfinite(self.bootstrap_smoothing) and 0 <= self.bootstrap_smoothing < 0.5):
            raise InputError(f"TrainSettings: field 'bootstrap_smoothing' must be in [0, 0.5), "
                             f"got {self.bootstrap_smoothing!r}")


class _Progress(BaseCallback):
    def __init__(self, tick: Callable[[int], None]) -> None:
        super().__init__()
        self._tick = tick

    def _on_step(self) -> bool:
        self._tick(self.training_env.num_envs)
        return True


def env_config(config: FleetConfig, i: int, demand_seeds: int) -> FleetConfig:
    """The config of training env ``i``: its own demand realization."""
    return dataclasses.replace(config, demand_seed=config.demand_seed + i % demand_seeds)


def warm_caches(config: FleetConfig, n_envs: int, demand_seeds: int = 1) -> None:
    """Build each distinct training env once here, one after another, so its template library,
    sampled demand and forecast pass are on disk before the worker processes start: every worker
    then loads them, where cold workers would each compute the same ones side by side."""
    seen: set[int] = set()
    for i in range(n_envs):
        cfg = env_config(config, i, demand_seeds)
        if cfg.demand_seed not in seen:
            seen.add(cfg.demand_seed)
            FleetEnv(cfg)


def make_vec_env(config: FleetConfig, n_envs: int, seed: int, gamma: float, demand_seeds: int = 1, *,
                 normalize_observations: bool = False) -> VecNormalize:
    """``n_envs`` FleetEnvs (one process each when more than one); rewards are scaled by the std
    of the return discounted with ``gamma``, the same discount PPO optimizes; observations are
    standardized only with ``normalize_observations`` (:class:`TrainSettings` says why not)."""
    def factory(i: int) -> Callable[[], gym.Env[Any, Any]]:
        cfg = env_config(config, i, demand_seeds)

        def make() -> gym.Env[Any, Any]:
            torch.set_num_threads(1)
            env = FleetEnv(cfg)
            env.reset(seed=seed + i)
            # outermost, so a checkpoint can read and replay how each episode began
            return ReplayableResets(Monitor(env))
        return make

    factories = [factory(i) for i in range(n_envs)]
    # every env gets a process of its own; a fleet file's scenario travels inside the config
    subprocess = n_envs > 1
    if subprocess:
        warm_caches(config, n_envs, demand_seeds)
    vec = SubprocVecEnv(factories, start_method="spawn") if subprocess else DummyVecEnv(factories)
    vec.seed(seed)
    return VecNormalize(vec, norm_obs=normalize_observations, norm_reward=True, gamma=gamma)


def train_policy(config: FleetConfig, settings: TrainSettings, *, logger: Logger | None = None,
                 tick: Callable[[int], None] | None = None,
                 validate: Callable[[Policy], float] | None = None,
                 note: Callable[[str], None] | None = None,
                 checkpoint: CheckpointSpec | None = None) -> tuple[PPO, VecNormalize, dict[str, float]]:
    """Train PPO on ``config``'s training days; returns the model, its VecNormalize and stats
    (``bootstrap_loss``, ``episodes``, in a world off the model ``capacity_error_draws``; with early
    stopping ``validation_best`` (and ``validation_best_at``, the steps its parameters had taken),
    ``validation_evaluations`` and ``stopped_at``; after cloning,
    ``bootstrap_agreement`` and :func:`moved_from_clone`'s ``moved_from_clone`` and
    ``teacher_agreement_after``, read after the best parameters are restored; after cloning with
    early stopping, ``clone_validation_agreement``: the clone's agreement with its teacher on the
    observations of its own validation run, days it was not cloned on).

    With ``checkpoint``, the run saves its state every ``checkpoint.every`` PPO steps and once more
    at its end and, when the folder holds a checkpoint of this run, goes on from it (``resumed_at``:
    the PPO steps it had done; ``resumed_exact``: 1 when it went on bit-identically,
    :mod:`atoll.training.checkpoint`; ``episodes`` then counts the episodes since). The last
    checkpoint stays: the same run with a larger ``timesteps`` continues from it. A run that stopped
    early (``stopped_early``) is over: a larger budget does not continue it, a larger ``patience``
    does."""
    torch.set_num_threads(1)
    resumed = ckpt.load(checkpoint) if checkpoint is not None else None
    done = resumed.steps if resumed is not None else 0
    model, vec = _ppo(config, settings, resumed, done)
    if logger is not None:
        model.set_logger(logger)
    stats: dict[str, float] = dict(resumed.stats) if resumed is not None else {}
    record: CloneRecord | None = resumed.record if resumed is not None else None
    teacher = None
    if settings.bootstrap_steps and resumed is None:
        teacher, record = _bootstrap(model, vec, config, settings, stats, tick)
    elif resumed is not None and tick is not None:
        tick(settings.bootstrap_steps + done)  # the work the checkpoint holds
    callbacks: list[BaseCallback] = [_Progress(tick)] if tick is not None else []
    stop = None
    if validate is not None and settings.eval_every:
        stop = _validation_stop(model, vec, settings, validate, note, resumed, teacher, stats)
        callbacks.append(stop)
    saver = None
    if checkpoint is not None:
        saver = _Saver(checkpoint, model, vec, dict(stats), stop, record, done, note)
        callbacks.append(ckpt.Checkpointing(saver.save, checkpoint.every, done))
        if resumed is not None:
            stats["resumed_at"] = float(done)
            stats["resumed_exact"] = float(resumed.exact)
            if note is not None:
                note(f"resumed from {resumed.model_path.parent} at {done} PPO steps "
                     f"({'exactly' if resumed.exact else 'mid-episode: the envs reset afresh'})")
    stopped_before = stop is not None and stop.stopped
    if stopped_before and note is not None:
        note(f"the run stopped early at {done} PPO steps ({settings.patience} validation scores without "
             f"improvement): nothing to continue; raise --patience to go on")
    if settings.timesteps > done and not stopped_before:
        model.learn(total_timesteps=settings.timesteps - done, callback=callbacks or None, progress_bar=False,
                    reset_num_timesteps=resumed is None)
    if saver is not None and model.num_timesteps > saver.saved:
        # the last state, before the best parameters are restored: a larger budget goes on from it
        saver.save()
    _final_stats(stats, model, vec, config, settings, stop, record)
    return model, vec, stats


def _ppo(config: FleetConfig, settings: TrainSettings, resumed: ckpt.Resumed | None, done: int
         ) -> tuple[PPO, VecNormalize]:
    """The training envs and a new PPO, or the checkpoint's (``resumed``, ``done`` PPO steps in)."""
    # a resumed run's envs start afresh: seeded past the steps done, they do not replay its first episodes
    vec = make_vec_env(config, settings.n_envs, settings.seed + done, settings.gamma, settings.demand_seeds,
                       normalize_observations=settings.normalize_observations)
    if resumed is None:
        model = PPO("MlpPolicy", vec, learning_rate=settings.learning_rate, n_steps=settings.n_steps,
                    batch_size=settings.batch_size, n_epochs=settings.n_epochs, gamma=settings.gamma,
                    gae_lambda=settings.gae_lambda, ent_coef=settings.ent_coef, device="cpu",
                    seed=settings.seed, verbose=0,
                    policy_kwargs={"net_arch": list(settings.net_arch)})
        return model, vec
    model = PPO.load(resumed.model_path, env=vec, device="cpu")
    vec.ret_rms = resumed.ret_rms
    if resumed.obs_rms is not None:
        vec.obs_rms = resumed.obs_rms
    if resumed.exact:
        # every env begins the episode it was at the start of, with the stopped run's random
        # states: the rest of the run is the one that was never stopped
        assert resumed.random is not None and resumed.episodes is not None
        ckpt.set_random_states(resumed.random)
        first = [vec.env_method("replay_reset", began, indices=[i])[0]
                 for i, began in enumerate(resumed.episodes)]
        model._last_obs = vec.normalize_obs(np.stack(first))
        model._last_episode_starts = np.ones((settings.n_envs,), dtype=bool)
    else:
        # the envs reset afresh, seeded past the steps done (make_vec_env)
        model.set_random_seed(settings.seed + done)
        model._last_obs = None
    return model, vec


def _bootstrap(model: PPO, vec: VecNormalize, config: FleetConfig, settings: TrainSettings,
               stats: dict[str, float], tick: Callable[[int], None] | None) -> tuple[Teacher, CloneRecord]:
    """Clone the bootstrap rule into ``model`` (its loss and agreement into ``stats``); the rule as
    a teacher, and the clone's record."""
    local = FleetEnv(env_config(config, 0, settings.demand_seeds))
    local.reset(seed=settings.seed)
    teacher = bootstrap_teacher(settings.bootstrap_rule, local)
    loss, agreement, record = clone_rule(model, vec, local, rule=settings.bootstrap_rule,
                                         steps=settings.bootstrap_steps, epochs=settings.bootstrap_epochs,
                                         min_updates=settings.bootstrap_min_updates,
                                         smoothing=settings.bootstrap_smoothing, tick=tick)
    stats["bootstrap_loss"], stats["bootstrap_agreement"] = loss, agreement
    vec.reset()
    return teacher, record


def _validation_stop(model: PPO, vec: VecNormalize, settings: TrainSettings,
                     validate: Callable[[Policy], float], note: Callable[[str], None] | None,
                     resumed: ckpt.Resumed | None, teacher: Teacher | None,
                     stats: dict[str, float]) -> ValidationStop:
    """The early stop: the checkpoint's, or new with the cloned policy scored as its first candidate."""
    stop = ValidationStop(validate, vec, settings.eval_every, settings.patience, note)
    stop.init_callback(model)  # learn() sets it again; a run with nothing left to learn needs it too
    if resumed is not None and resumed.stop is not None:
        stop.restore(resumed.stop)
    elif teacher is not None:  # the cloned policy is a candidate too
        vec.training = False
        clone = TeacherAgreement(TrainingPolicy(model, vec), teacher)
        stop.best = float(validate(clone))
        stats["clone_validation_agreement"] = clone.agreement
        stop.best_state = (copy.deepcopy(model.policy.state_dict()), copy.deepcopy(ckpt.obs_stats(vec)))
        stop.scores.append((0, stop.best))
        vec.training = True
        if note is not None:
            note(f"validation score {stop.best:.4f} after bootstrapping; the clone agrees with its "
                 f"teacher on {clone.agreement:.1%} of (step, model) pairs there")
    return stop


class _Saver:
    """Saves the run's checkpoint (with the stats it began with, the early stop and the clone's
    record); ``saved``: the PPO steps of the last one."""

    def __init__(self, spec: CheckpointSpec, model: PPO, vec: VecNormalize, stats: dict[str, float],
                 stop: ValidationStop | None, record: CloneRecord | None, done: int,
                 note: Callable[[str], None] | None) -> None:
        self.spec, self.model, self.vec, self.stats = spec, model, vec, stats
        self.stop, self.record, self.saved, self.note = stop, record, done, note

    def save(self) -> None:
        model = self.model
        where = ckpt.save(self.spec, model, self.vec, stats=self.stats,
                          stop=self.stop.state() if self.stop is not None else None, record=self.record)
        self.saved = int(model.num_timesteps)
        if self.note is not None:
            self.note(f"checkpoint at {model.num_timesteps} PPO steps: {where}")


def _final_stats(stats: dict[str, float], model: PPO, vec: VecNormalize, config: FleetConfig,
                 settings: TrainSettings, stop: ValidationStop | None, record: CloneRecord | None) -> None:
    """Freeze the statistics, count the episodes, restore the best parameters; the run's figures
    into ``stats``."""
    if stop is not None:
        stats["stopped_early"] = float(stop.stopped)
    vec.training = False  # frozen statistics from here on (evaluation, logging)
    episodes = sum(len(r) for r in vec.env_method("get_episode_rewards"))
    stats["episodes"] = float(episodes)
    if not config.capacity_error_spec.exact:  # every reset draws the world anew
        stats["capacity_error_draws"] = float(episodes + settings.n_envs)
    if stop is not None:
        stop.restore_best()
        stats["validation_best"] = stop.best
        # the PPO steps the kept parameters had taken (0: the clone)
        stats["validation_best_at"] = float(min((t for t, v in stop.scores if v <= stop.best + 1e-9),
                                                default=model.num_timesteps))
        stats["stopped_at"] = float(model.num_timesteps)
        stats["validation_evaluations"] = float(len(stop.scores))
    if record is not None:
        stats.update(moved_from_clone(model, vec, record))
