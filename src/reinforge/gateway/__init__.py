"""reinforge.gateway"""
