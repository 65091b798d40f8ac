"""reinforge.credit"""
