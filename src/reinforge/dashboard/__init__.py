"""reinforge.dashboard"""
