"""TensorBoard event files under `<run folder>/tensorboard/`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from reinforge.training.metric_sinks.base import Outcome


class TensorBoardSink:
    """One event per step holding all of its finite scalars (TensorBoard can't chart NaN or inf)."""

    name = "tensorboard"

    def __init__(self, run_dir: Path) -> None:
        # tensorboardX, not torch.utils.tensorboard: the latter needs the tensorboard package, whose
        # protobuf floor (>=6.31 since 2.21) can't co-install with frameworks that pin protobuf 5
        # (autogen-core). tensorboardX writes the same event files on either.
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(logdir=str(run_dir / "tensorboard"))

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """One multi-value summary, not `add_scalar` per value.

        `SummaryWriter.add_scalar` makes one event per scalar, and each goes through the writer
        thread's small bounded queue: a step's few dozen scalars made the trainer wait on that queue,
        on its critical path (docs/training.md). TensorBoard reads a multi-value summary the same way.
        """
        from tensorboardX.proto.summary_pb2 import Summary

        scalars = [
            Summary.Value(tag=key, simple_value=value)
            for key, value in values.items()
            if math.isfinite(value)
        ]
        if scalars:
            self._writer.file_writer.add_summary(Summary(value=scalars), step)
        self._writer.flush()

    def close(self, outcome: Outcome = "finished") -> None:
        self._writer.close()
