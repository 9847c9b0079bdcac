"""Registry names per fleet, and whether a logged policy fits a fleet.

A policy acts on one fleet's observation (its models' features, its GPU types, with or without
the closed-loop block of ``atoll/Fleet-v2``) and answers one code per model of that fleet: it
never crosses fleets. Each fleet therefore has its own registered model,
``atoll-trigger-<fleet>``, and its own ``champion`` alias; ``<fleet>`` is the scenario's name
(``core``, ``extended``, a fleet file's ``name``), or the scenario with a digest of the models
when a config narrows the scenario to other models.

``learned:champion`` and the spelling without a fleet (``learned:atoll-trigger@ALIAS``) resolve
to the fleet's own registered model where the fleet is known (the contest, the demo, the
controller). Loading a policy whose observation size or action space does not fit the fleet is an
:class:`InputError` naming both (:func:`check_fits`).

No MLflow here: the names are plain strings, the checks read the loaded policy's metadata.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from atoll.solvers.errors import InputError

PREFIX = "atoll-trigger"
CHAMPION = "champion"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def fleet_name(scenario: str, models: Sequence[str] | None = None, own: Sequence[str] | None = None) -> str:
    """The fleet a policy belongs to: the scenario's name, or ``<scenario>-m<digest>`` when
    ``models`` narrows it to models other than the scenario's own (in their order): ``own``, a
    fleet file's models, or by default the bundled scenario's."""
    from atoll.solvers.scenarios import SCENARIOS

    if not scenario:
        raise InputError("fleet_name: field 'scenario' is empty; give the scenario or fleet file name")
    if own is None and scenario in SCENARIOS:
        own = SCENARIOS[scenario].models
    own = tuple(own) if own is not None else None
    if models is None or tuple(models) == own:
        return scenario
    digest = hashlib.sha256("\n".join(models).encode()).hexdigest()[:8]
    return f"{scenario}-m{digest}"


def registered_name(fleet: str) -> str:
    """``atoll-trigger-<fleet>`` (characters MLflow's registry may refuse become ``-``)."""
    if not fleet:
        raise InputError("registered_name: field 'fleet' is empty; give the fleet's name (e.g. core)")
    return f"{PREFIX}-{_UNSAFE.sub('-', fleet)}"


def champion_uri(fleet: str) -> str:
    """``models:/atoll-trigger-<fleet>@champion``."""
    return f"models:/{registered_name(fleet)}@{CHAMPION}"


def fleet_policy_uri(uri: str, fleet: str | None) -> str:
    """A policy URI with the fleet made explicit: ``champion`` (or ``@ALIAS``) and the one-name
    ``atoll-trigger@ALIAS`` / ``atoll-trigger/N`` become ``atoll-trigger-<fleet>@ALIAS`` /
    ``.../N`` when ``fleet`` is known; any other URI is returned as given."""
    body = uri.removeprefix("models:/")
    if fleet is None:
        return uri
    if body == CHAMPION:
        return champion_uri(fleet)
    if body.startswith("@"):
        return f"models:/{registered_name(fleet)}{body}"
    for sep in ("@", "/"):
        if body.startswith(PREFIX + sep):
            return f"models:/{registered_name(fleet)}{body[len(PREFIX):]}"
    return uri


@dataclass(frozen=True)
class FleetSpaces:
    """What a policy must fit to act on a fleet: ``fleet`` its name (:func:`fleet_name`),
    ``n_models`` codes per action, ``observation_sizes`` the observation sizes the fleet can give
    (the env: its own; the controller: the ``Fleet-v1`` and ``Fleet-v2`` sizes), ``n_codes`` the
    codes per model (None: not checked, e.g. a controller that decodes any level), ``env_ids`` the
    registered envs whose policies it runs (empty: not checked)."""

    fleet: str
    n_models: int
    observation_sizes: tuple[int, ...]
    n_codes: int | None = None
    env_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.fleet:
            raise InputError("FleetSpaces: field 'fleet' is empty; give the fleet's name")
        if not (isinstance(self.n_models, int) and self.n_models >= 1):
            raise InputError(f"FleetSpaces: field 'n_models' must be an int >= 1, got {self.n_models!r}")
        sizes = self.observation_sizes
        if not sizes or not all(isinstance(n, int) and n >= 1 for n in sizes):
            raise InputError(f"FleetSpaces: field 'observation_sizes' must be sizes >= 1, "
                             f"got {self.observation_sizes!r}")
        if self.n_codes is not None and not (isinstance(self.n_codes, int) and self.n_codes >= 2):
            raise InputError(f"FleetSpaces: field 'n_codes' must be an int >= 2 or None, "
                             f"got {self.n_codes!r}")

    @classmethod
    def of_env(cls, env: Any) -> FleetSpaces:
        """The spaces of a :class:`~atoll.envs.fleet_env.FleetEnv`."""
        shape = env.observation_space.shape
        nvec = getattr(env.action_space, "nvec", None)
        c = env.config
        return cls(fleet_name(c.scenario, c.models, c.scenario_spec.models), len(env.models),
                   (int(shape[0]),), int(nvec[0]) if nvec is not None else 2, (env_id(c),))

    @classmethod
    def of_live_fleet(cls, fleet: Any) -> FleetSpaces:
        """The spaces of a controller's :class:`~atoll.control.live_fleet.LiveFleet`: any
        observation (``Fleet-v1``, ``Fleet-v2``, or ``-v3`` / ``-v4``'s with risk: the controller
        builds each); codes per model not checked (the controller decodes any level and preset)."""
        from atoll.envs.observation import observation_size

        m, g = len(fleet.models), len(fleet.gpu_types)
        from atoll.envs import ENV_ID, ENV_ID_V0, ENV_ID_V2, ENV_ID_V3, ENV_ID_V4

        return cls(fleet_name(fleet.scenario, fleet.models, fleet.config.scenario_spec.models), m,
                   (observation_size(m, g), observation_size(m, g, closed_loop=True),
                    observation_size(m, g, closed_loop=True, risk=True)),
                   env_ids=(ENV_ID_V0, ENV_ID, ENV_ID_V2, ENV_ID_V3, ENV_ID_V4))

    def describe(self) -> str:
        sizes = " or ".join(str(n) for n in self.observation_sizes)
        codes = f", {self.n_codes} action codes per model" if self.n_codes is not None else ""
        envs = f", {' or '.join(self.env_ids)}" if self.env_ids else ""
        return f"fleet {self.fleet!r} ({self.n_models} models, observations of {sizes} features{codes}{envs})"


def env_id(config: Any) -> str:
    """The registered env a :class:`~atoll.envs.config.FleetConfig` is: ``atoll/Fleet-v4`` (the
    action with a risk preset), ``atoll/Fleet-v3`` (the observation of risk), ``atoll/Fleet-v2``
    (the reopt action with the closed-loop observation), ``atoll/Fleet-v1`` or ``atoll/Fleet-v0``
    (MultiBinary)."""
    from atoll.envs import ENV_ID, ENV_ID_V0, ENV_ID_V2, ENV_ID_V3, ENV_ID_V4

    if config.action == "risk":
        return ENV_ID_V4
    if config.action != "reopt":
        return ENV_ID_V0
    if config.observation == "v3":
        return ENV_ID_V3
    return ENV_ID_V2 if config.observation == "v2" else ENV_ID


def describe_policy(uri: str, metadata: Mapping[str, Any]) -> str:
    """A loaded policy's fleet and spaces as its metadata records them."""
    codes = metadata.get("action_codes")
    fleet = metadata.get("fleet") or metadata.get("scenario", "?")
    return (f"policy {uri!r} (fleet {fleet!r}, {metadata.get('env_id') or 'an unknown env'}: "
            f"{metadata.get('n_models', '?')} models, observations of "
            f"{metadata.get('observation_size', '?')} features"
            + (f", {len(codes)} action codes per model" if codes else "") + ")")


def check_fits(uri: str, metadata: Mapping[str, Any], spaces: FleetSpaces) -> None:
    """Raise an :class:`InputError` naming the policy and the fleet when the policy's observation
    size, number of models or codes per model (from its metadata) does not fit ``spaces``."""
    size = metadata.get("observation_size")
    n_models = metadata.get("n_models")
    codes = metadata.get("action_codes")
    wrong = []
    if n_models is not None and int(n_models) != spaces.n_models:
        wrong.append("models")
    if size is not None and int(size) not in spaces.observation_sizes:
        wrong.append("observation size")
    if codes and spaces.n_codes is not None and len(codes) != spaces.n_codes:
        wrong.append("action codes per model")
    trained_on = metadata.get("env_id")
    if trained_on and spaces.env_ids and trained_on not in spaces.env_ids:
        wrong.append("env id")
    if wrong:
        raise InputError(f"{describe_policy(uri, metadata)} does not fit {spaces.describe()}: "
                         f"{', '.join(wrong)} differ; use the fleet's own policy "
                         f"(learned:{registered_name(spaces.fleet)}@{CHAMPION}, or one trained on "
                         f"this fleet with the same env version and action levels)")
