"""Gymnasium environment of the heterogeneous fleet (``atoll/Fleet-v1``) and rule policies.

``atoll/Fleet-v1``: the MultiDiscrete re-optimization action (hold / grow / full at a planning
level, :mod:`atoll.envs.actions`); ``atoll/Fleet-v0``: the same world with the MultiBinary action.
"""

from gymnasium.envs.registration import register, registry

ENV_ID = "atoll/Fleet-v1"
ENV_ID_V0 = "atoll/Fleet-v0"

if ENV_ID not in registry:
    register(id=ENV_ID, entry_point="atoll.envs.fleet_env:FleetEnv", kwargs={"action": "reopt"})
if ENV_ID_V0 not in registry:
    register(id=ENV_ID_V0, entry_point="atoll.envs.fleet_env:FleetEnv", kwargs={"action": "binary"})
