"""reinforge.tracing"""
