"""atoll.solvers"""
