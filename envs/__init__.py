"""Gymnasium environment of the heterogeneous fleet (``atoll/Fleet-v1``) and rule policies.

``atoll/Fleet-v4``: ``v3``'s charged world where each model's re-optimization also chooses the
risk its re-plan takes, a preset of the market's menu (``action="risk"``,
:mod:`atoll.envs.actions`).

``atoll/Fleet-v3``: the closed-loop world where a re-plan costs what a cluster charges
(``CHARGED``: start-up drawn by model size and cache state, zone-correlated preemptions, spot
acquisition that fails when the trace has no node) and the observation of risk (``v3``).

``atoll/Fleet-v2``: the closed-loop world — true capacities differ from the model
(``capacity_error="calibration"``), SLO attainment from the latency model, online capacity
correction, and the observation's closed-loop block (latency, queue, correction per model).
``atoll/Fleet-v1``: the MultiDiscrete re-optimization action (hold / grow / full at a planning
level, :mod:`atoll.envs.actions`); ``atoll/Fleet-v0``: the same world with the MultiBinary action.
"""

from typing import Any

from gymnasium.envs.registration import register, registry

ENV_ID = "atoll/Fleet-v1"
ENV_ID_V0 = "atoll/Fleet-v0"
ENV_ID_V2 = "atoll/Fleet-v2"
ENV_ID_V3 = "atoll/Fleet-v3"
ENV_ID_V4 = "atoll/Fleet-v4"
# the closed-loop world: capacities differ from the model by the calibration's spread,
# the SLO is latency-based, the planner corrects its capacities online, the policy sees the signals
CLOSED_LOOP = {"capacity_error": "calibration", "correction": True, "slo_model": "latency",
               "observation": "v2"}
# what a cluster charges for a re-plan, on top of the closed loop (FleetConfig's docstring has
# each setting and its public source); scale-down keeps its drain with a grace period
CHARGED = {**CLOSED_LOOP, "startup": "sampled", "preemption": "zone", "spot_acquisition": "trace",
           "observation": "v3"}
# the worlds a command runs in (``--world``), each with the env id a re-planning policy trains on
WORLDS: dict[str, dict[str, Any]] = {"exact": {}, "calibration": CLOSED_LOOP, "charged": CHARGED}
WORLD_ENV_IDS = {"exact": ENV_ID, "calibration": ENV_ID_V2, "charged": ENV_ID_V3}


def world_of(config: object) -> str:
    """The name of ``config``'s world: the first of :data:`WORLDS` whose every setting it has
    (its charges, not its observation), or ``custom``."""
    def has(settings: dict[str, object]) -> bool:
        return all(getattr(config, k) == v for k, v in settings.items() if k != "observation")

    named = [name for name in ("charged", "calibration") if has(WORLDS[name])]
    if named:
        return named[0]
    from atoll.envs.config import FleetConfig

    default = FleetConfig(scenario="core")
    exact = all(getattr(config, k) == getattr(default, k)
                for k in ("capacity_error", "correction", "slo_model", "startup", "preemption",
                          "spot_acquisition"))
    return "exact" if exact else "custom"

if ENV_ID not in registry:
    register(id=ENV_ID, entry_point="atoll.envs.fleet_env:FleetEnv", kwargs={"action": "reopt"})
if ENV_ID_V2 not in registry:
    register(id=ENV_ID_V2, entry_point="atoll.envs.fleet_env:FleetEnv",
             kwargs={"action": "reopt", **CLOSED_LOOP})
if ENV_ID_V3 not in registry:
    register(id=ENV_ID_V3, entry_point="atoll.envs.fleet_env:FleetEnv", kwargs={"action": "reopt", **CHARGED})
if ENV_ID_V4 not in registry:
    register(id=ENV_ID_V4, entry_point="atoll.envs.fleet_env:FleetEnv", kwargs={**CHARGED, "action": "risk"})
if ENV_ID_V0 not in registry:
    register(id=ENV_ID_V0, entry_point="atoll.envs.fleet_env:FleetEnv", kwargs={"action": "binary"})
