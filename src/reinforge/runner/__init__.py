"""reinforge.runner"""
