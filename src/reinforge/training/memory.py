"""A run's memory on the CPU: handing freed memory back to the OS while it trains, and measuring the
peak of the whole run (this process and every process it started).

The update and the engine allocate tensors of ever-changing shapes; with glibc's defaults what they
free stays resident, and a long run's RSS creeps up step after step (docs/training.md, "Memory").
`Trainer.fit` therefore runs inside `returning_freed_memory` unless
`ComputeSettings.return_freed_memory` is off.

`getrusage` gives one process's peak (or the largest child's), not the peak of their sum; a bar is on
what the whole run holds at once (trainer, engine, runner children), so `PeakTreeRss` samples the
process tree's summed RSS in a thread and keeps the highest value.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

import psutil


def tree_rss_bytes(root: psutil.Process) -> int:
    """The summed RSS of `root` and its descendants now (processes that vanish mid-read count 0)."""
    total = 0
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


class PeakTreeRss:
    """`with PeakTreeRss() as peak: ...`, then `peak.bytes`: the highest summed RSS sampled."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.interval_s = interval_s
        self.bytes = 0
        self._root = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="peak-rss", daemon=True)

    def sample(self) -> int:
        self.bytes = max(self.bytes, tree_rss_bytes(self._root))
        return self.bytes

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> PeakTreeRss:
        self.sample()
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    @property
    def gigabytes(self) -> float:
        return self.bytes / 1e9


M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3


def release_large_blocks(threshold_bytes: int = 1 << 20, arenas: int = 2) -> bool:
    """Make glibc hand large freed blocks back to the OS (False where libc is not glibc).

    The update (in a worker thread) and the engine allocate tensors of ever-changing shapes; glibc's
    default raises its mmap threshold to 32 MB after the first large free and keeps one arena per
    thread, so freed activations stay in the process instead of going back. Blocks of
    `threshold_bytes` and more are then mapped and unmapped one by one.
    """
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold_bytes)) and bool(mallopt(M_ARENA_MAX, arenas))


class TrimFreedMemory:
    """`with TrimFreedMemory(): ...`: glibc's `malloc_trim(0)` every `interval_s` in a thread.

    Blocks under the mmap threshold (most of one layer's activations for a GRPO group, 0.1-1 MB)
    live in the arenas' heaps; freed, they stay resident (only the top of a heap is given back), so
    an update's activations left ~1 GB behind each time and the next phase added to it. `malloc_trim`
    hands every whole free page inside the heaps back to the OS (a few milliseconds). Does nothing
    where libc is not glibc.
    """

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.trims = 0
        self._trim = getattr(_libc(), "malloc_trim", None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="malloc-trim", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.trim()

    def trim(self) -> None:
        if self._trim is not None:
            self._trim(0)
            self.trims += 1

    def __enter__(self) -> TrimFreedMemory:
        if self._trim is not None:
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


@contextmanager
def returning_freed_memory(enabled: bool = True) -> Iterator[None]:
    """Large freed blocks unmapped at once (`release_large_blocks`, for the rest of the process's life:
    mallopt has no undo) and `malloc_trim` every second until the block ends. Nothing when disabled
    or where libc is not glibc."""
    if not enabled:
        yield
        return
    release_large_blocks()
    with TrimFreedMemory():
        yield
