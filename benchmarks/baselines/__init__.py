"""Pieces the benchmarks share between reinforge's venv and the baseline's own venv.

Everything here is standard-library only: the same files are run by agentlightning's Python 3.12
venv (`.bench/agl-venv`) and by reinforge's `.venv`, so both sides measure the same workload.
"""
