"""The terminal view of a run: a rich progress bar with reward and success, plus notes.

On a terminal the bar redraws in place; in a log file (no TTY) each step becomes one plain line, so
CI logs and `tee` output stay readable.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class StepProgress:
    def __init__(self, total: int, *, start: int = 0, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled
        self._live = enabled and self.console.is_terminal
        self._progress: Progress | None = None
        if self._live:
            self._progress = Progress(
                TextColumn("[bold]RL"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._task = self._progress.add_task("steps", total=total, completed=start, stats="")
            self._progress.start()

    def note(self, text: str) -> None:
        if self.enabled:
            self.console.print(text)

    def advance(self, step: int, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        stats = f"reward {record.get('train/reward', 0.0):.3f} success {record.get('train/success', 0.0):.3f}"
        if "val/success" in record:
            stats += f" | held-out {record['val/success']:.3f}"
        if self._progress is not None:
            self._progress.update(self._task, completed=step, stats=stats)
        else:
            self.console.print(f"step {step}: {stats} ({record.get('time/step_s', 0.0):.1f}s)")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
