"""Gymnasium environment of the heterogeneous fleet (``atoll/Fleet-v0``) and rule policies."""

from gymnasium.envs.registration import register, registry

ENV_ID = "atoll/Fleet-v0"

if ENV_ID not in registry:
    register(id=ENV_ID, entry_point="atoll.envs.fleet_env:FleetEnv")
