"""reinforge.store"""
