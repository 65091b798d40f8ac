"""CPU seconds per training step, summed over every process a side runs.

Why: steps/s alone cannot tell a side that is slow because it waits (a latency chain, a lock) from
one that is slow because the machine's cores are full. CPU seconds per step, over the same steps
that steps/s is measured on, bound what any scheduling could reach: `cores / cpu_per_step` steps/s.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class StepCpu:
    """CPU seconds (user + system) per step between the first and the last logged step."""

    steps: int
    seconds: float
    own_per_step: float
    children_per_step: float

    @property
    def per_step(self) -> float:
        return self.own_per_step + self.children_per_step

    @property
    def cores_busy(self) -> float:
        return self.per_step * self.steps / self.seconds if self.seconds > 0 else float("nan")

    def line(self, children: str = "child processes") -> str:
        split = f" (this process {self.own_per_step:.3f}, {children} {self.children_per_step:.3f})"
        return (
            f"  CPU {self.per_step:.3f} core-s per step{split if self.children_per_step else ''}, "
            f"{self.cores_busy:.2f} of {os.cpu_count()} cores busy, over {self.steps} steps"
        )


def from_step_ends(step_ends: list[float], step_cpu: list[float]) -> StepCpu | None:
    """A single process's CPU per step from its CPU clock read at each step's end (first step left
    out, as steps/s leaves it out)."""
    if len(step_ends) < 2 or len(step_cpu) != len(step_ends):
        return None
    steps = len(step_ends) - 1
    return StepCpu(steps, step_ends[-1] - step_ends[0], (step_cpu[-1] - step_cpu[0]) / steps, 0.0)


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


class MetricsCpuSampler:
    """Reads this process's and its live descendants' CPU whenever a run's `metrics.jsonl` gains a
    training step (polled every `every_s`); `result()` gives CPU per step from the first logged
    step to the last, the window `steps_per_second` measures."""

    def __init__(self, metrics: Path, *, every_s: float = 0.2, relist_s: float = 2.0) -> None:
        self._metrics = metrics
        self._every_s = every_s
        self._me = psutil.Process()
        self._last_read: dict[int, float] = {}  # a child that exits keeps its last reading
        self._children: list[psutil.Process] = []
        self._relist_s = relist_s
        """How often the child processes are listed again (a child started since is read from then on)."""
        self._relist_at = 0.0
        self._offset = 0
        self._steps = 0
        self._samples: list[tuple[int, float, float, float]] = []  # steps, monotonic, own, children
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="step-cpu", daemon=True)

    def __enter__(self) -> MetricsCpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _new_steps(self) -> int:
        try:
            with self._metrics.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return 0
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        return complete.count(b'"train/reward"')

    def _children_cpu(self) -> float:
        # Listing the descendants walks every process on the machine: a few ms of this process's CPU,
        # beside the trainer it measures. They change only when a child is restarted, so the list is
        # taken again every `relist_s`.
        now = time.monotonic()
        if now >= self._relist_at:
            self._children = self._me.children(recursive=True)
            self._relist_at = now + self._relist_s
        for child in self._children:
            try:
                self._last_read[child.pid] = _cpu(child)
            except psutil.NoSuchProcess:
                continue
        return sum(self._last_read.values())

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            added = self._new_steps()
            if added:
                self._steps += added
                self._samples.append((self._steps, time.monotonic(), _cpu(self._me), self._children_cpu()))

    def result(self) -> StepCpu | None:
        if len(self._samples) < 2:
            return None
        first, last = self._samples[0], self._samples[-1]
        steps = last[0] - first[0]
        return StepCpu(steps, last[1] - first[1], (last[2] - first[2]) / steps, (last[3] - first[3]) / steps)
