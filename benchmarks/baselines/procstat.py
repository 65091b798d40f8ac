"""CPU time a process (and its threads) has used, read from /proc, for "CPU ms per call" figures.

On a shared, loaded machine wall-clock latencies carry the scheduler's noise; the CPU a server burns
per request does not, so the benchmarks print both.
"""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of `pid` so far; None where /proc is not available."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command name: state is field 3, utime field 14, stime field 15 (1-based, man proc).
    return (int(fields[11]) + int(fields[12])) / _TICKS
