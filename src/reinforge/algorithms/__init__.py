"""reinforge.algorithms"""
