"""atoll.control"""
