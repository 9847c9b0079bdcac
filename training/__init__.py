"""atoll.training"""
