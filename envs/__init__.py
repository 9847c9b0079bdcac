"""atoll.envs"""
