"""reinforge.engine"""
