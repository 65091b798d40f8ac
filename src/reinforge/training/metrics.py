"""Training metrics: one JSON line per step (the source of truth), the optional backends
(TensorBoard, W&B, MLflow: `metric_sinks/`), the reward curve.

The JSONL file is appended and flushed every step, so a killed run keeps its history; on resume the
lines past the checkpoint's step are dropped, so the history matches the restored state.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from reinforge.errors import InvalidRequestError
from reinforge.training.metric_sinks import LoggingSettings, MetricSink, Outcome, numeric_values, open_sinks
from reinforge.training.metric_sinks.base import flat_params

_logger = logging.getLogger(__name__)


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
    """Append-only metrics for one run directory: `metrics.jsonl`, then each backend `settings` lists
    (by default TensorBoard, in `tensorboard/`).

    The JSONL line is written first and is the record: a backend that fails mid-run is warned about
    once and left behind, never allowed to stop training. `params` (the run's settings groups) become
    W&B config and MLflow params. `continue_runs`: W&B and MLflow continue the runs this folder
    logged to before, instead of starting new ones.
    """

    def __init__(
        self,
        run_dir: Path,
        settings: LoggingSettings | None = None,
        *,
        params: Mapping[str, BaseModel] | None = None,
        continue_runs: bool = True,
    ) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self._sinks: list[MetricSink] = open_sinks(
            settings or LoggingSettings(), run_dir, flat_params(params or {}), continue_runs=continue_runs
        )
        self._failures: dict[str, int] = {}

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after `step` (they belong to work a resume redoes)."""
        kept = [r for r in self.records() if int(r.get("step", 0)) <= step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")

    def log(self, step: int, values: Mapping[str, Any]) -> None:
        record: dict[str, Any] = {"step": step, **values}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self._sinks:
            numbers = numeric_values(values)
            for sink in self._sinks:
                try:
                    sink.log(step, numbers)
                except Exception as exc:
                    self._failed(sink.name, "log", exc)

    def _failed(self, backend: str, what: str, exc: Exception) -> None:
        """Warn on a backend's first failure only: a broken connection would fail every step."""
        if backend not in self._failures:
            _logger.warning(
                "metrics backend %s failed to %s (%s: %s); training goes on, and %s still gets every "
                "step (later failures of %s are counted, not shown)",
                backend,
                what,
                type(exc).__name__,
                exc,
                self.path,
                backend,
            )
        self._failures[backend] = self._failures.get(backend, 0) + 1

    def records(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return [
            json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()
        ]

    @property
    def failures(self) -> dict[str, int]:
        """Per backend, how many writes (and closes) failed."""
        return dict(self._failures)

    def close(self) -> None:
        """Close the backends' runs, marked by how the fit ended: called while an exception
        propagates (the trainer closes the log in a `finally`), they are marked failed, or killed for
        an interrupt, instead of finished."""
        outcome = _outcome(sys.exc_info()[1])
        sinks, self._sinks = self._sinks, []
        for sink in sinks:
            try:
                sink.close(outcome)
            except Exception as exc:
                self._failed(sink.name, "close", exc)
        for backend, count in self._failures.items():
            _logger.warning(
                "metrics backend %s: %d write(s) failed; %s has every step", backend, count, self.path
            )


def _outcome(exc: BaseException | None) -> Outcome:
    if exc is None:
        return "finished"
    if isinstance(exc, KeyboardInterrupt | SystemExit | asyncio.CancelledError):
        return "killed"
    return "failed"


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
