"""TensorBoard event files under `<run folder>/tensorboard/`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from reinforge.training.metric_sinks.base import Outcome

FLUSH_EVERY_S = 2.0
"""How often the writer thread flushes (and fsyncs) the event file: off the trainer's event loop,
instead of once per step on it."""


class TensorBoardSink:
    """One event per step holding all of its finite scalars (TensorBoard can't chart NaN or inf)."""

    name = "tensorboard"

    def __init__(self, run_dir: Path) -> None:
        # tensorboardX, not torch.utils.tensorboard: the latter needs the tensorboard package, whose
        # protobuf floor (>=6.31 since 2.21) can't co-install with frameworks that pin protobuf 5
        # (autogen-core). tensorboardX writes the same event files on either.
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(logdir=str(run_dir / "tensorboard"), flush_secs=FLUSH_EVERY_S)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """One multi-value summary, not `add_scalar` per value.

        `SummaryWriter.add_scalar` makes one event per scalar, and each goes through the writer
        thread's small bounded queue: a step's few dozen scalars made the trainer wait on that queue,
        on its critical path (docs/training.md). TensorBoard reads a multi-value summary the same way.
        The file is flushed by the writer's own thread every `FLUSH_EVERY_S` and on close: a flush
        here fsyncs the event file on the trainer's event loop, during the next step's generation.
        """
        from tensorboardX.proto.summary_pb2 import Summary

        scalars = [
            Summary.Value(tag=key, simple_value=value)
            for key, value in values.items()
            if math.isfinite(value)
        ]
        if scalars:
            self._writer.file_writer.add_summary(Summary(value=scalars), step)

    def close(self, outcome: Outcome = "finished") -> None:
        self._writer.close()
