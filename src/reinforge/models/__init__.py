"""reinforge.models"""
