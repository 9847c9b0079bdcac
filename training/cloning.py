"""Behaviour cloning: a learned policy's start from a rule, and how far it stays its rule.

Before PPO, :func:`clone_rule` fits the policy network to a rule's actions on observations from
the training days (its teacher: :func:`bootstrap_teacher` maps the rule onto the env's own action
codes). Three figures say how faithful the clone is, and how far training moved it:

- ``bootstrap_agreement``: on the observations it was cloned on (:func:`clone_rule`);
- ``clone_validation_agreement``: on the observations of its own validation run, days it never
  saw (:class:`TeacherAgreement`, at no extra simulation). The first can be 100% while the
  second is not: a clone off its teacher on unseen days is no start from the teacher;
- ``moved_from_clone`` and ``teacher_agreement_after``: the trained policy against the clone and
  the teacher on the cloning's observations (:func:`moved_from_clone`, from the
  :class:`CloneRecord`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.vec_env import VecNormalize

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import Policy, make_policy
from atoll.envs.vocabulary import PolicySpec
from atoll.solvers.errors import InputError
from atoll.training.per_model import PerModelRule

# a rule as a function of (observation, info) returning the env's action codes
Teacher = Callable[[np.ndarray, Mapping[str, Any]], np.ndarray]


def bootstrap_teacher(rule_spec: PolicySpec, env: FleetEnv) -> Teacher:
    """The imitated rule as a function of (observation, info) returning ``env``'s action codes; an
    InputError when the rule does not fit ``env`` (a level outside its action levels, a per-model
    spec of another number of models)."""
    shown = str(rule_spec)  # the rule's text, as errors name it
    if rule_spec.is_per_model:
        per_model = PerModelRule.parse(rule_spec, len(env.models))
        if env.config.action == "binary":
            raise InputError(f"bootstrap rule {shown!r} needs a per-model action (atoll/Fleet-v1 to "
                             f"-v4), not MultiBinary")
        missing = sorted({q for q in per_model.levels if q not in env.codec.levels})
        if missing:
            raise InputError(f"bootstrap rule {shown!r} plans at {', '.join(f'{q:g}' for q in missing)}, "
                             f"not among the env's action levels "
                             f"{', '.join(f'{q:g}' for q in env.codec.levels)}; add them to action_levels")
        absent = sorted({r.label() for r in per_model.risks if r not in env.codec.risks})
        if absent:
            raise InputError(f"bootstrap rule {shown!r} takes risk {', '.join(absent)}, not among the "
                             f"env's risk presets {', '.join(r.label() for r in env.codec.risks)}; clone it "
                             f"on atoll/Fleet-v4 (action='risk') with a risk_menu that has it")
        risks = per_model.risks or (None,) * len(per_model.levels)
        codes = np.array([env.codec.encode("full", q, r)
                          for q, r in zip(per_model.levels, risks, strict=True)], dtype=np.int64)
        return lambda obs, info: np.where(per_model.act(obs, info) > 0, codes, 0)
    rule = make_policy(rule_spec, len(env.models))
    level = rule.planning_quantile
    risk = getattr(rule, "risk", None)
    if risk is not None and risk not in env.codec.risks:
        raise InputError(f"bootstrap rule {shown!r} takes risk {risk.label()!r}, not one of the env's "
                         f"risk presets {', '.join(r.label() for r in env.codec.risks)}; clone it on "
                         f"atoll/Fleet-v4 (action='risk'), whose menu has it")
    if risk is not None:
        return lambda obs, info: env.codec.relevel(rule.act(obs, info), level or env.codec.levels[0], risk)
    if level is not None and level not in env.codec.levels:
        raise InputError(f"bootstrap rule {shown!r} plans at {level:g}, not one of the env's action "
                         f"levels {', '.join(f'{q:g}' for q in env.codec.levels)}")
    if level is not None and env.config.action == "binary" and level != env.codec.levels[0]:
        raise InputError(f"bootstrap rule {shown!r}: a MultiBinary env plans at "
                         f"{env.codec.levels[0]:g} only; give the rule without @q")
    if level is not None and env.config.action == "reopt":
        return lambda obs, info: env.codec.relevel(rule.act(obs, info), level)
    return rule.act


def smoothed_targets(codes: np.ndarray, n_codes: int, smoothing: float) -> np.ndarray:
    """One distribution over the ``n_codes`` codes per entry of ``codes`` (any shape): the code
    itself with 1 - ``smoothing``, the same kind (full / grow) at each other (planning level, risk
    preset) pair of the action (:class:`~atoll.envs.actions.ActionCodec`'s layout) with an equal
    share of ``smoothing``; ``hold`` (0), or a code with no other pair, keeps all of it."""
    codes = np.asarray(codes, dtype=np.int64)
    target = np.zeros((*codes.shape, n_codes), dtype=np.float32)
    levels = (n_codes - 1) // 2
    flat, out = codes.reshape(-1), target.reshape(-1, n_codes)
    for row, code in enumerate(flat):
        if code == 0 or levels < 2 or smoothing == 0:
            out[row, code] = 1.0
            continue
        j, kind = divmod(int(code) - 1, 2)
        out[row, code] = 1.0 - smoothing
        for other in range(levels):
            if other != j:
                out[row, 1 + 2 * other + kind] = smoothing / (levels - 1)
    return target


@dataclass(frozen=True)
class CloneRecord:
    """What the cloning saw and did: its raw observations, the rule's codes on them and the
    clone's deterministic codes (what :func:`moved_from_clone` compares the trained policy with)."""

    observations: np.ndarray
    teacher: np.ndarray
    clone: np.ndarray


def _deterministic(model: BaseAlgorithm, vec: VecNormalize, raw: np.ndarray) -> np.ndarray:
    """[N, M] the policy's deterministic codes (MultiBinary: bits) on raw observations."""
    action, _ = model.predict(vec.normalize_obs(np.asarray(raw, dtype=np.float32)), deterministic=True)
    return np.asarray(action, dtype=np.int64).reshape(len(raw), -1)


def moved_from_clone(model: BaseAlgorithm, vec: VecNormalize, record: CloneRecord) -> dict[str, float]:
    """How far the trained policy moved from its clone, on the cloning's observations (each
    normalized with the statistics of its own time): the share of (observation, model) pairs
    where its deterministic code differs from the clone's, and its agreement with the teacher."""
    now = _deterministic(model, vec, record.observations)
    return {"moved_from_clone": float(np.mean(now != record.clone)),
            "teacher_agreement_after": float(np.mean(now == record.teacher))}


def clone_rule(model: PPO, vec: VecNormalize, env: FleetEnv, *, rule: PolicySpec, steps: int, epochs: int,
               min_updates: int, smoothing: float, tick: Callable[[int], None] | None = None
               ) -> tuple[float, float, CloneRecord]:
    """Behaviour cloning of ``rule`` on ``env`` (a training env in this process): ``steps``
    observations of the rule acting, then at least ``epochs`` passes and ``min_updates``
    minibatch updates of cross-entropy on each model's logits (targets smoothed by
    ``smoothing``, :func:`smoothed_targets`). Returns the final training loss, the clone's
    agreement (the share of (observation, model) pairs on which its deterministic action is the
    rule's) and its :class:`CloneRecord`. ``TrainSettings``' ``bootstrap_*`` fields say why each
    setting is what it is."""
    teacher = bootstrap_teacher(rule, env)
    discrete = isinstance(env.action_space, spaces.MultiDiscrete)
    if smoothing and not discrete:
        raise InputError("TrainSettings: field 'bootstrap_smoothing' needs the reopt action "
                         "(a MultiBinary env has one planning level)")
    raw, acts = [], []
    obs, info = env.reset()
    for _ in range(steps):
        action = teacher(obs, info)
        raw.append(obs)
        acts.append(action)
        if vec.norm_obs:  # the statistics PPO will normalize with start from these
            vec.obs_rms.update(obs[None, :])
        obs, _, term, trunc, info = env.step(action)
        if term or trunc:
            obs, info = env.reset()
        if tick is not None:
            tick(1)
    x = torch.as_tensor(vec.normalize_obs(np.asarray(raw, dtype=np.float32)))
    n_codes = int(env.action_space.nvec[0]) if isinstance(env.action_space, spaces.MultiDiscrete) else 2
    codes = np.asarray(acts, dtype=np.int64)
    y = torch.as_tensor(smoothed_targets(codes, n_codes, smoothing) if discrete
                        else codes.astype(np.float32))
    policy = model.policy
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    bce = torch.nn.BCEWithLogitsLoss()
    ce = torch.nn.CrossEntropyLoss()  # with class probabilities as targets: soft cross-entropy

    def logits_of(batch: torch.Tensor) -> torch.Tensor:
        features = policy.extract_features(batch, policy.pi_features_extractor)
        assert isinstance(features, torch.Tensor)  # MlpPolicy shares one extractor
        return policy.action_net(policy.mlp_extractor.forward_actor(features))

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if not discrete:
            return bce(logits, target)
        return ce(logits.reshape(-1, n_codes), target.reshape(-1, n_codes))  # one categorical per model

    batches = -(-len(x) // 256)
    epochs = max(epochs, -(-min_updates // batches))
    loss = torch.tensor(0.0)
    gen = torch.Generator().manual_seed(model.seed or 0)
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(256):
            loss = loss_fn(logits_of(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        logits = logits_of(x)
        chosen = (logits.reshape(len(x), -1, n_codes).argmax(-1).numpy() if discrete
                  else (logits > 0).numpy().astype(np.int64))
    record = CloneRecord(np.asarray(raw, dtype=np.float32), codes.reshape(len(x), -1),
                         np.asarray(chosen, dtype=np.int64).reshape(len(x), -1))
    return float(loss.detach()), float(np.mean(chosen == codes)), record


class TeacherAgreement:
    """``policy`` acting as itself, counting the (step, model) pairs on which its action is what
    ``teacher`` would do on the same observation: the clone's agreement on days it was not
    cloned on (the validation days), at no extra simulation."""

    def __init__(self, policy: Policy, teacher: Teacher) -> None:
        self.policy, self.teacher = policy, teacher
        self.name: str = policy.name
        self.planning_quantile: float | None = getattr(policy, "planning_quantile", None)
        self.same = self.pairs = 0

    def act(self, observation: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
        action = self.policy.act(observation, info)
        expected = np.asarray(self.teacher(observation, info)).reshape(action.shape)
        self.same += int(np.sum(action == expected))
        self.pairs += action.size
        return action

    def reset_options(self) -> dict[str, Any]:
        return self.policy.reset_options()

    @property
    def agreement(self) -> float:
        return self.same / self.pairs if self.pairs else float("nan")
