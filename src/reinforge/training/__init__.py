"""reinforge.training"""
