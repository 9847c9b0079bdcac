"""atoll.forecast"""
