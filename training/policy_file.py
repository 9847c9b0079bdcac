"""A trained policy as a file: a folder that holds the SB3 model, its observation statistics and a
card saying what it acts on and how it was made.

Layout (``learned:file:PATH`` loads it; :func:`write_policy_file` writes it)::

    PATH/
      card.json           the card (:class:`PolicyCard`): env id, observation and action spec,
                          world, fleet, training data hash, steps, validation score, command
      model.zip           SB3's PPO save (policy and value networks, optimizer state)
      normalization.npz   VecNormalize's observation mean, var and count (only when the policy was
                          trained on standardized observations)

Nothing here needs MLflow: a policy file is evaluated, run by the live controller and shipped with
the code on its own. MLflow's registry indexes policies (``learned:atoll-trigger-<fleet>@champion``)
and keeps the same files as artifacts of the training run.

A folder is written complete or not at all: into a temporary sibling, then renamed into place.
"""

from __future__ import annotations

import ast
import json
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from atoll.solvers.errors import InputError
from atoll.solvers.problem import Risk

if TYPE_CHECKING:  # SB3 (and torch) load with a learned policy, not with every simulate: 1.2 s, 230 MB
    from stable_baselines3 import PPO

CARD = "card.json"
MODEL = "model.zip"
NORMALIZATION = "normalization.npz"
FORMAT = "atoll-policy/1"
FILE_PREFIX = "file:"


@dataclass(frozen=True)
class PolicyCard:
    """What a policy file acts on and how it was made.

    Attributes:
        env_id: the registered env it was trained on (``atoll/Fleet-v1``...): fixes the
            observation's layout and the action's meaning.
        observation: the observation version (``v1`` forecasts and fleet, ``v2`` with the closed
            loop's block, ``v3`` with the risk block).
        observation_size: features per observation (float32).
        action: ``reopt`` (one re-optimization code per model), ``risk`` (codes with a risk preset)
            or ``multibinary`` (``Fleet-v0``: hold or re-plan).
        action_codes: the name of every code per model, in order.
        fleet: the fleet's name (:func:`atoll.training.registry.fleet_name`); ``models`` its models.
        scenario, availability: the bundled scenario or fleet file, and the market.
        world: the env's settings (``env.<field>`` and ``reward.<field>`` as text), the world
            the policy met.
        train_days: first and last training day. ``demand_seeds``: demand realizations trained on.
        data_hash: sha256 (first 16 hex digits) of the training days' demand the env samples from.
        steps: PPO steps taken; ``bootstrap_steps``: behaviour-cloning observations before them.
        selected: ``best`` (the parameters of the best validation score) or ``last``.
        validation_score: the best validation score (lower is better), None without validation.
        command: the command that trained it. ``git_commit``: atoll's commit then.
        created: when it was written (ISO 8601, UTC).
        reset_options: env reset options the policy was trained with.
        planning_quantile, action_levels: the env's configured level and the levels its codes
            name; ``risk`` and ``risk_menu`` (labels) its configured risk and, for a ``risk``
            action, the presets: an env is configured with them to run the policy
            (:class:`FilePolicy` exposes them as a rule does).
    """

    env_id: str
    observation: str
    observation_size: int
    action: str
    action_codes: tuple[str, ...]
    fleet: str
    models: tuple[str, ...]
    scenario: str
    availability: str
    world: Mapping[str, str]
    train_days: tuple[int, int]
    demand_seeds: int
    data_hash: str
    steps: int
    bootstrap_steps: int
    selected: str
    validation_score: float | None
    command: str
    git_commit: str
    created: str
    reset_options: Mapping[str, Any] = field(default_factory=dict)
    planning_quantile: float | None = None
    action_levels: tuple[float, ...] = ()
    risk: str = "neutral"
    risk_menu: tuple[str, ...] = ()
    format: str = FORMAT

    def __post_init__(self) -> None:
        for name in ("env_id", "observation", "action", "fleet", "scenario", "availability", "selected"):
            if not (isinstance(getattr(self, name), str) and getattr(self, name)):
                raise InputError(f"PolicyCard: field {name!r} must be a non-empty string, "
                                 f"got {getattr(self, name)!r}")
        for name in ("observation_size", "demand_seeds"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise InputError(f"PolicyCard: field {name!r} must be an int >= 1, got {value!r}")
        for name in ("steps", "bootstrap_steps"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                raise InputError(f"PolicyCard: field {name!r} must be an int >= 0, got {value!r}")
        if len(self.action_codes) < 2:
            raise InputError(f"PolicyCard: field 'action_codes' must name at least 2 codes, "
                             f"got {self.action_codes!r}")
        if not self.models:
            raise InputError("PolicyCard: field 'models' is empty")
        if self.selected not in ("best", "last"):
            raise InputError(f"PolicyCard: field 'selected' must be 'best' or 'last', got {self.selected!r}")
        if self.format != FORMAT:
            raise InputError(f"PolicyCard: field 'format' is {self.format!r}; this atoll reads {FORMAT!r}")

    @property
    def n_models(self) -> int:
        return len(self.models)

    def metadata(self) -> dict[str, Any]:
        """The card in the keys :func:`atoll.training.registry.check_fits` reads (as MLflow's)."""
        doc = self.to_json()
        doc["n_models"] = self.n_models
        return doc

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["action_codes"], doc["models"] = list(self.action_codes), list(self.models)
        doc["train_days"], doc["world"] = list(self.train_days), dict(self.world)
        doc["reset_options"] = dict(self.reset_options)
        doc["action_levels"], doc["risk_menu"] = list(self.action_levels), list(self.risk_menu)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str) -> PolicyCard:
        known = set(cls.__dataclass_fields__)
        optional = {"reset_options", "format", "planning_quantile", "action_levels", "risk", "risk_menu"}
        missing = sorted(known - set(doc) - optional)
        if missing:
            raise InputError(f"{where}: the card lacks {', '.join(missing)}; write it again with "
                             f"'atoll train' (this atoll reads {FORMAT!r})")
        values = {k: doc[k] for k in known if k in doc}
        if "planning_quantile" not in doc:  # a card written before these fields: read off its world
            values.update(_action_facts(doc))
        try:
            values["action_codes"] = tuple(str(c) for c in values["action_codes"])
            values["models"] = tuple(str(m) for m in values["models"])
            first, last = values["train_days"]
            values["train_days"] = (int(first), int(last))
            values["world"] = {str(k): str(v) for k, v in dict(values["world"]).items()}
            values["action_levels"] = tuple(float(q) for q in values.get("action_levels", ()))
            values["risk_menu"] = tuple(str(r) for r in values.get("risk_menu", ()))
            if values.get("planning_quantile") is not None:
                values["planning_quantile"] = float(values["planning_quantile"])
            score = values["validation_score"]
            values["validation_score"] = None if score is None else float(score)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: malformed card ({exc}); write it again with 'atoll train'") from exc
        try:
            return cls(**values)
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from exc


def _action_facts(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The configured level, action levels, risk and risk menu of a card that lacks them, from the
    env settings it records (``world``) and the names of its action codes."""
    from atoll.envs.vocabulary import Reoptimization

    world = dict(doc.get("world") or {})
    try:
        quantile = float(world["env.planning_quantile"])
        levels = tuple(float(q) for q in ast.literal_eval(world["env.action_levels"]))
        risk = Risk(**ast.literal_eval(world["env.risk"])).label()
        menu: list[str] = []
        if doc.get("action") == "risk":
            for name in doc.get("action_codes", []):
                reopt = Reoptimization.parse(str(name))
                label = reopt.risk.label() if reopt.risk is not None else risk
                if reopt.kind == "full" and label not in menu:
                    menu.append(label)
    except (KeyError, ValueError, SyntaxError, TypeError) as exc:
        raise InputError(f"the card's world lacks the env's levels or risk ({exc}); write it again "
                         f"with 'atoll train'") from exc
    return {"planning_quantile": quantile, "action_levels": levels, "risk": risk, "risk_menu": tuple(menu)}


def write_policy_file(folder: Path, card: PolicyCard, *, model: PPO | None = None,
                      model_zip: Path | None = None, obs_rms: Any = None) -> Path:
    """Write a policy file at ``folder`` (replacing one there): the card, the model (``model``
    saved, or the ``model_zip`` of a checkpoint copied) and, when given, the observation
    statistics (a RunningMeanStd). Returns ``folder``."""
    if (model is None) == (model_zip is None):
        raise InputError("write_policy_file: give exactly one of 'model' and 'model_zip'")
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    if model is not None:
        model.save(partial / MODEL)
    else:
        shutil.copyfile(str(model_zip), partial / MODEL)
    if obs_rms is not None:
        np.savez(partial / NORMALIZATION, mean=np.asarray(obs_rms.mean, dtype=np.float64),
                 var=np.asarray(obs_rms.var, dtype=np.float64), count=np.float64(obs_rms.count))
    (partial / CARD).write_text(json.dumps(card.to_json(), indent=1) + "\n")
    old = folder.with_name(f".{folder.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    partial.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


def read_card(folder: Path) -> PolicyCard:
    """The card of the policy file at ``folder``; an InputError naming the path when it is not one."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"policy file {str(folder)!r}: no such folder; give the folder 'atoll train' "
                         f"wrote (its run folder's policy-best), or a shipped one under training/policies")
    path = folder / CARD
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise InputError(f"policy file {str(folder)!r}: no {CARD}; a policy file holds {CARD}, {MODEL} "
                         f"and (when normalized) {NORMALIZATION}") from exc
    except (OSError, ValueError) as exc:
        raise InputError(f"policy file {str(folder)!r}: {CARD} is unreadable ({exc})") from exc
    if not isinstance(doc, dict):
        raise InputError(f"policy file {str(folder)!r}: {CARD} must hold a JSON object")
    if doc.get("format") != FORMAT:
        raise InputError(f"policy file {str(folder)!r}: format {doc.get('format')!r}; this atoll reads "
                         f"{FORMAT!r}")
    return PolicyCard.from_json(doc, f"policy file {str(folder)!r}")


class FilePolicy:
    """A policy file with the rule policies' interface (``name``, ``act``, ``reset_options``):
    deterministic actions for raw observations, standardized as in training."""

    def __init__(self, folder: Path, name: str | None = None) -> None:
        self.folder = Path(folder)
        self.card = read_card(self.folder)
        self.uri = f"{FILE_PREFIX}{folder}"
        self.name = name or f"learned:{self.uri}"
        self.metadata = self.card.metadata()
        # What the env it runs on is configured with (read by atoll.training.evaluate.env_at_level,
        # as a rule's own level and risk are): its codes mean these levels and presets.
        card = self.card
        self.planning_quantile: float | None = card.planning_quantile
        self.action_levels: tuple[float, ...] | None = card.action_levels or None
        self.risk: Risk | None = Risk.parse(card.risk) if card.planning_quantile is not None else None
        self.risk_presets: tuple[Risk, ...] = (tuple(Risk.parse(r) for r in card.risk_menu)
                                               if card.action == "risk" else ())
        if not (self.folder / MODEL).is_file():
            raise InputError(f"policy file {str(self.folder)!r}: no {MODEL}")
        try:
            from stable_baselines3 import PPO

            self.model = PPO.load(self.folder / MODEL, device="cpu")
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise InputError(f"policy file {str(self.folder)!r}: {MODEL} does not load ({exc})") from exc
        shape = self.model.observation_space.shape
        if shape != (self.card.observation_size,):
            raise InputError(f"policy file {str(self.folder)!r}: the model takes observations of shape "
                             f"{shape}, its card says {self.card.observation_size} features")
        self._mean: np.ndarray | None = None
        self._std: np.ndarray | None = None
        stats = self.folder / NORMALIZATION
        if stats.is_file():
            with np.load(stats) as data:
                self._mean = np.asarray(data["mean"])
                self._std = np.sqrt(np.asarray(data["var"]) + 1e-8)  # VecNormalize's epsilon

    @property
    def n_models(self) -> int:
        return self.card.n_models

    @property
    def observation_size(self) -> int:
        """Features per observation: what the live controller builds for it (v1, v2 or v3's)."""
        return self.card.observation_size

    def normalize(self, observations: np.ndarray) -> np.ndarray:
        """What VecNormalize.normalize_obs does with the saved statistics (clip 10; identity without)."""
        if self._mean is None or self._std is None:
            return observations
        return np.clip((observations - self._mean) / self._std, -10.0, 10.0).astype(np.float32)

    def act(self, observation: Any, info: Mapping[str, Any] | None = None) -> np.ndarray:
        obs = np.asarray(observation, dtype=np.float32)
        single = obs.ndim == 1
        batch = obs.reshape(1, -1) if single else obs
        if batch.ndim != 2 or batch.shape[1] != self.card.observation_size:
            raise ValueError(f"policy file {str(self.folder)!r} takes {self.card.observation_size} features "
                             f"per observation, received shape {obs.shape}")
        actions, _ = self.model.predict(self.normalize(batch), deterministic=True)
        actions = np.asarray(actions, dtype=np.int8).reshape(batch.shape[0], self.n_models)
        return actions[0] if single else actions

    def reset_options(self) -> dict[str, Any]:
        return dict(self.card.reset_options)

    def __repr__(self) -> str:
        return f"FilePolicy({str(self.folder)!r}, fleet={self.card.fleet!r}, env_id={self.card.env_id!r})"
