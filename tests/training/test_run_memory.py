"""Freed memory goes back to the OS during a run (glibc), and the trainer does it unless told not to.

Each case runs in a fresh interpreter: mallopt settings last for the whole process, and a pytest
process's heap already holds whatever earlier tests left in it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from reinforge.training.config import ComputeSettings, TrainerConfig

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

# 200 MB in 400 KB blocks, every other one freed at once and the rest later in reverse order:
# allocations of a size between the default mmap threshold (128 KB) and glibc's dynamic ceiling
# (32 MB) that land in the heap once a larger block has been freed, as the update's activations do.
_PROBE = textwrap.dedent(
    """
    import ctypes, json, sys, time
    import psutil
    from reinforge.training.memory import returning_freed_memory
    enabled = sys.argv[1] == "on"
    rss = lambda: psutil.Process().memory_info().rss / 2**20
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free(libc.malloc(16 << 20))  # a large free: glibc now puts blocks up to 16 MB in the heap
    with returning_freed_memory(enabled):
        before = rss()
        blocks = [bytearray(400 << 10) for _ in range(500)]
        for block in blocks:
            block[::4096] = b"x" * len(block[::4096])
        peak = rss()
        del blocks[::2]
        blocks.reverse()
        del blocks
        time.sleep(1.6)  # the trim thread runs every second
        after = rss()
    print(json.dumps({"before": before, "peak": peak, "after": after}))
    """
)


def _probe(mode: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_freed_blocks_go_back_to_the_os_only_when_enabled() -> None:
    on, off = _probe("on"), _probe("off")
    assert on["peak"] - on["before"] > 150 and off["peak"] - off["before"] > 150  # the blocks were there
    assert on["after"] - on["before"] < 40, on  # handed back
    assert off["after"] - off["before"] > 150, off  # glibc's default keeps them


def test_the_trainer_returns_freed_memory_by_default() -> None:
    assert TrainerConfig().compute.return_freed_memory is True
    assert ComputeSettings(return_freed_memory=False).return_freed_memory is False
