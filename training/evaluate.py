"""Evaluate trigger policies (rule and learned) on held-out days: same demand, same seeds.

Every policy runs on the same FleetEnv configuration (hence the same demand and forecasts) for
each seed; a seed fixes the spot-availability offsets and preemption draws, so policy A and
policy B meet the same availability in run ``seed``. Results are the totals of
``atoll.envs.rollout.Episode.totals`` per seed, summarized as mean and (population) std over seeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from atoll.envs import ENV_ID_V3, ENV_ID_V4
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.policies import Policy, make_policy
from atoll.envs.rollout import RESULT_COLUMNS, TOTAL_KEYS, Episode, result_cells, run_policy
from atoll.envs.vocabulary import PolicySpec
from atoll.solvers.errors import InputError
from atoll.training.per_model import PerModelRule
from atoll.training.policy_file import FILE_PREFIX, FilePolicy
from atoll.training.registry import FleetSpaces, check_fits, fleet_policy_uri

if TYPE_CHECKING:  # tuning imports the contest, which imports this module
    from atoll.training.tuning import TunedPolicy

SUMMARY_KEYS: tuple[str, ...] = (*TOTAL_KEYS, "solves", "preemptions", "goodput_tokens", "demand_tokens")


def seed_value(seed: int) -> int:
    """The env seed of evaluation seed ``seed`` (its days reset with seed_value + i)."""
    return 1000 * seed


def policy_name(spec: PolicySpec | TunedPolicy) -> str:
    """What results name a policy by: its spec's text (``str(spec)``), or the path an ``atoll
    tune`` file was read from."""
    return str(spec) if isinstance(spec, PolicySpec) else spec.source


def resolve_policy(spec: PolicySpec | TunedPolicy, n_models: int, *, fleet: FleetSpaces | None = None,
                   configurable: bool = False) -> Policy:
    """``learned:<model uri>`` loads a logged policy (``learned:atoll-trigger-core@champion`` and
    ``learned:atoll-trigger-core/3`` name registered versions: ``models:/...``), ``learned:file:PATH``
    a policy file (:mod:`atoll.training.policy_file`, no MLflow needed); anything else is a
    rule (atoll.envs.policies) or a per-model rule assignment (``per-model:K@q,...``,
    :mod:`atoll.training.per_model`). An ``atoll tune`` file
    (:class:`~atoll.training.tuning.TunedPolicy`) resolves to the policy it chose.

    ``configurable``: the caller runs the policy on the env configured with what it sets
    (:func:`env_at_level`: a policy file's action levels and risk presets) and checks the action's
    codes there, so only the observation and env id are checked here.

    ``fleet``: the spaces of the fleet the policy will act on. With it, ``learned:champion`` and
    the one-name ``learned:atoll-trigger@ALIAS`` resolve to the fleet's own registered model
    (``atoll-trigger-<fleet>``), and a policy whose observation or action space does not fit the
    fleet is an InputError naming both."""
    if not isinstance(spec, PolicySpec):  # an `atoll tune` file: the policy it chose
        policy = resolve_policy(spec.policy, n_models, fleet=fleet, configurable=configurable)
        if len(spec.models) != n_models:
            raise InputError(f"policy file {spec.source} was tuned for {len(spec.models)} models "
                             f"({', '.join(spec.models)}), this fleet has {n_models}")
        return policy
    if spec.is_learned and spec.uri.startswith(FILE_PREFIX):
        from atoll.training.preset_bandit import is_bandit_file, load

        path = Path(spec.uri.removeprefix(FILE_PREFIX))
        if is_bandit_file(path):  # a learned preset chooser (benchmarks/bandit.py), not a PPO folder
            return load(path, n_models, name=str(spec))
        policy_file = FilePolicy(path, name=str(spec))
        spaces = fleet or FleetSpaces(policy_file.card.fleet, n_models, (policy_file.card.observation_size,))
        if configurable and policy_file.action_levels is not None:
            # the caller configures the env with the policy's levels and presets (env_at_level) and
            # checks the codes then; the observation must fit as it is
            # (a Fleet-v3 env runs a Fleet-v4 policy once its action takes the presets)
            ids = spaces.env_ids + ((ENV_ID_V4,) if ENV_ID_V3 in spaces.env_ids else ())
            spaces = dataclasses.replace(spaces, n_codes=None, env_ids=ids)
        check_fits(spec.uri, policy_file.metadata, spaces)
        return policy_file
    if spec.is_learned:
        from atoll.training.policy_model import load_policy

        uri = spec.uri
        if ":/" not in uri:  # a registered model: name@alias or name/version
            uri = f"models:/{uri}"
        uri = fleet_policy_uri(uri, fleet.fleet if fleet is not None else None)
        policy = load_policy(uri, name=str(spec))
        if fleet is not None:
            check_fits(uri, policy.metadata, fleet)
        expected = int(policy.metadata.get("n_models", n_models))
        if expected != n_models:
            raise InputError(f"policy {str(spec)!r} was trained for {expected} models; "
                             f"this scenario has {n_models}")
        return policy
    if spec.is_per_model:
        return PerModelRule.parse(spec, n_models)
    return make_policy(spec, n_models)


def env_at_level(env: FleetEnv, policy: Policy, cache: dict[Any, FleetEnv] | None = None) -> FleetEnv:
    """The env a policy runs on: ``env`` itself, or the same configuration with what the policy
    sets — same demand, availability and seeds, and the same shared re-planner memo
    (atoll.envs.fleet_model.shared_replanner). A rule with its own planning level ``@q`` plans at
    q; a rule with a ``+RISK`` takes that risk (``FleetConfig.risk``). A per-model rule
    (:class:`~atoll.training.per_model.PerModelRule`) gets the configuration at its most common
    level with every level it uses among the action levels; with risks of its own, also at its
    most common risk with the ``risk`` action over every risk it uses (``FleetConfig.risk_menu``)."""
    c = env.config
    changes: dict[str, Any] = {}
    risk = getattr(policy, "risk", None)
    if risk is not None and risk != c.risk:
        changes["risk"] = risk
    q = getattr(policy, "planning_quantile", None)
    if q is not None and q != c.planning_quantile:
        changes["planning_quantile"] = q
    levels = getattr(policy, "action_levels", None)
    if levels is not None and q is not None and tuple(levels) != tuple(c.action_levels):
        changes["action_levels"] = tuple(levels)
    presets = tuple(getattr(policy, "risk_presets", ()))
    if presets and (c.action != "risk" or tuple(c.risk_menu) != presets):
        changes.update(action="risk", risk_menu=presets)
    if not changes:
        return env
    key = tuple(sorted(changes.items()))
    if cache is not None and key in cache:
        return cache[key]
    other = FleetEnv(dataclasses.replace(c, **changes))
    if cache is not None:
        cache[key] = other
    return other


@dataclass
class PolicyResult:
    name: str
    episodes: list[Episode]

    def per_seed(self) -> list[dict[str, float]]:
        return [e.totals() for e in self.episodes]

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per figure: the mean and std over the seeds, and each seed's value (``per_seed``, seed 0
        first), so ratios between policies can be paired seed by seed."""
        rows = self.per_seed()
        out: dict[str, dict[str, Any]] = {}
        for k in SUMMARY_KEYS:
            values = np.array([r[k] for r in rows], dtype=float)
            out[k] = {"mean": float(values.mean()), "std": float(values.std()),
                      "per_seed": [float(v) for v in values]}
        return out


def evaluate_policies(env: FleetEnv, specs: Sequence[PolicySpec | TunedPolicy], *, days: Sequence[int],
                      seeds: int, tick: Callable[[int], None] | None = None) -> list[PolicyResult]:
    """Run each policy over ``days`` for seeds 0..seeds-1 (each result named by :func:`policy_name`)."""
    if seeds < 1:
        raise InputError(f"seeds must be >= 1, got {seeds}")
    spaces = FleetSpaces.of_env(env)
    policies = [resolve_policy(s, len(env.models), fleet=spaces, configurable=True) for s in specs]
    results = []
    levels: dict[float, FleetEnv] = {}
    for spec, policy in zip(specs, policies, strict=True):
        at = env_at_level(env, policy, levels)
        if isinstance(policy, FilePolicy):  # configured with its levels and presets: now it must fit
            check_fits(policy.uri, policy.metadata, FleetSpaces.of_env(at))
        episodes = [run_policy(at, policy, days=days, seed=seed_value(seed), tick=tick)
                    for seed in range(seeds)]
        name = policy_name(spec)
        for e in episodes:
            e.policy = name
        results.append(PolicyResult(name, episodes))
    return results


def comparison_rows(results: Sequence[PolicyResult]) -> list[dict[str, object]]:
    rows = []
    for r in results:
        s = r.summary()
        rows.append({"policy": r.name, **{f"{k}_mean": s[k]["mean"] for k in SUMMARY_KEYS},
                     **{f"{k}_std": s[k]["std"] for k in SUMMARY_KEYS}})
    return rows


def markdown_table(results: Sequence[PolicyResult]) -> str:
    """The results table (``atoll.envs.rollout.RESULT_COLUMNS``) in markdown, mean ± std over seeds."""
    head = "| policy | " + " | ".join(h for _, h, _ in RESULT_COLUMNS) + " |\n"
    rule = "|---" * (len(RESULT_COLUMNS) + 1) + "|\n"
    lines = [f"| {r.name} | " + " | ".join(result_cells(r.summary())) + " |" for r in results]
    return head + rule + "\n".join(lines) + "\n"
