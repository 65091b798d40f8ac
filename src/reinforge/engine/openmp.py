"""Releasing a thread's OpenMP workers, so that the engine's thread is the only one holding a team.

libgomp, the OpenMP runtime of PyTorch's Linux wheels, keeps a pool of worker threads for every
thread that has run a parallel region. While the pools together hold more threads than the process
has CPUs, a waiting worker spins only briefly before it sleeps in the kernel, so every parallel region
after that starts with a wake-up. The engine computes in its own thread; the thread that loaded the
model (and started the engine) has a pool of its own from that work, which made the engine's decode
steps markedly slower than the same steps on the loading thread (docs/engine.md, "One OpenMP team"
has the figures). Freeing the starting thread's pool when the engine starts
removes that cost; the pool comes back by itself the next time that thread runs a parallel region.
"""

from __future__ import annotations

import ctypes
import functools
import os

_OMP_PAUSE_SOFT = 1


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    """The libgomp this process has loaded already (never a second copy), or None."""
    try:
        return ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except (OSError, AttributeError):  # not loaded (another OpenMP runtime, or none); no RTLD_NOLOAD
        return None


def release_openmp_workers() -> bool:
    """Free the calling thread's OpenMP worker threads (`omp_pause_resource_all`, OpenMP 5.0). Returns
    whether it did: False where libgomp is not the process's runtime or is too old to pause."""
    lib = _libgomp()
    if lib is None or not hasattr(lib, "omp_pause_resource_all"):
        return False
    return bool(lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0)
