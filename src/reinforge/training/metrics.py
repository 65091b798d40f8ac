"""Training metrics: one JSON line per step (the source of truth), TensorBoard scalars, the reward curve.

The JSONL file is appended and flushed every step, so a killed run keeps its history; on resume the
lines past the checkpoint's step are dropped, so the history matches the restored state.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reinforge.errors import InvalidRequestError


@contextmanager
def phase_timer(name: str, times: dict[str, float]) -> Iterator[None]:
    """Add the block's wall time to `times["time/<name>_s"]` (verl's `marked_timer`): a step names
    its phases instead of keeping start times by hand, and its record carries each phase's share."""
    key = f"time/{name}_s"
    started = time.monotonic()
    try:
        yield
    finally:
        times[key] = times.get(key, 0.0) + time.monotonic() - started


class MetricsLog:
    """Append-only metrics for one run directory: `metrics.jsonl` and `tensorboard/`."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self._writer: Any = None
        if tensorboard:
            # tensorboardX, not torch.utils.tensorboard: the latter needs the tensorboard package,
            # whose protobuf floor (>=6.31 since 2.21) can't co-install with frameworks that pin
            # protobuf 5 (autogen-core). tensorboardX writes the same event files on either.
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(logdir=str(run_dir / "tensorboard"))

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after `step` (they belong to work a resume redoes)."""
        kept = [r for r in self.records() if int(r.get("step", 0)) <= step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")

    def log(self, step: int, values: Mapping[str, Any]) -> None:
        record: dict[str, Any] = {"step": step, **values}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self._writer is not None:
            self._write_scalars(step, values)

    def _write_scalars(self, step: int, values: Mapping[str, Any]) -> None:
        """One TensorBoard event holding all of a step's scalars.

        `SummaryWriter.add_scalar` makes one event per scalar, and each goes through the writer
        thread's small bounded queue: a step's few dozen scalars made the trainer wait on that queue,
        on its critical path (docs/training.md). TensorBoard reads a multi-value summary the same way.
        """
        from tensorboardX.proto.summary_pb2 import Summary

        scalars = [
            Summary.Value(tag=key, simple_value=float(value))
            for key, value in values.items()
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        ]
        if scalars:
            self._writer.file_writer.add_summary(Summary(value=scalars), step)
        self._writer.flush()

    def records(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return [
            json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()
        ]

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def plot_reward_curve(records: list[dict[str, Any]], out: Path, title: str = "reinforge training") -> Path:
    """Training reward per step, and held-out success (and mean reward, when rewards are graded)
    where validation ran, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed; must precede pyplot's import
    import matplotlib.pyplot as plt

    train = [(r["step"], r["train/reward"]) for r in records if "train/reward" in r]
    if not train:
        raise InvalidRequestError("no training steps recorded yet: nothing to plot")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([s for s, _ in train], [v for _, v in train], label="train reward (sampled)", alpha=0.6)
    # A graded reward (an F1) differs from the success rate: then its mean is the held-out figure too.
    graded = any(r.get("val/reward", r.get("val/success")) != r.get("val/success") for r in records)
    for key, label in (
        ("val/success", "held-out success (sampled)"),
        ("val/greedy_success", "held-out (greedy)"),
        *([("val/reward", "held-out mean reward (sampled)")] if graded else []),
    ):
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            ax.plot([s for s, _ in points], [v for _, v in points], marker="o", label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("reward / success")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
