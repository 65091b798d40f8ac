"""A run folder's append-only JSONL files, read incrementally: `metrics.jsonl` and `transitions.jsonl`.

The trainer writes them (training/metrics.py, training/transition_log.py); the store server reads them
for the dashboard, during a run and after it (`reinforge store serve --run-dir DIR`). The readers only
ever read the bytes appended since their last look, so a page that polls a long run costs what the new
steps wrote, not the whole history. A file that shrank was rewritten (a resumed run drops the steps
past its checkpoint), and is then read again from its start.

`TransitionRecord` lives here, below `training/`, because both sides need it: the trainer writes it,
the store server (which may not import training/) reads it.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

METRICS_FILE = "metrics.jsonl"
TRANSITIONS_FILE = "transitions.jsonl"


class TokenSegment(BaseModel):
    """A run of response tokens that are all trained (`trained`) or all context (a tool result or an
    observation between merged calls, masked out of the loss)."""

    model_config = ConfigDict(extra="forbid")

    text: str
    tokens: int = Field(ge=0)
    trained: bool


class TransitionRecord(BaseModel):
    """One trained transition as the dashboard shows it: its credit, its advantage, and which of its
    response tokens the loss saw. Token ids are not kept (the spans have them); text is decoded once,
    by the trainer, which holds the tokenizer."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0)
    rollout_id: str
    attempt_id: str
    index: int = Field(ge=0)
    group_id: str | None = None
    agent_name: str | None = None
    policy_version: int = 0
    num_calls: int = Field(default=1, ge=1)
    reward: float
    final_reward: float
    reward_sources: dict[str, float] = Field(default_factory=dict)
    advantage: float | None = None
    prompt_tokens: int = Field(ge=0)
    response_tokens: int = Field(ge=0)
    trained_tokens: int = Field(ge=0)
    segments: list[TokenSegment] = Field(default_factory=list)


def _complete_lines(path: Path, offset: int) -> tuple[list[tuple[int, bytes]], int] | None:
    """The complete lines appended to `path` after byte `offset`, each with its start, and the
    offset after the last one; None when the file shrank (rewritten: read it again from 0).

    A line still being written (no newline yet) is left for the next look.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return ([], 0) if offset == 0 else None
    if size < offset:
        return None
    if size == offset:
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        chunk = f.read(size - offset)
    end = chunk.rfind(b"\n") + 1
    lines: list[tuple[int, bytes]] = []
    position = offset
    for line in chunk[:end].split(b"\n")[:-1]:
        if line.strip():
            lines.append((position, line))
        position += len(line) + 1
    return lines, offset + end


class _Position:
    """How far a reader has read, and the last line it read: if those bytes changed, the file was
    rewritten (a resume cuts it back and appends again, possibly past the old end), and is read anew."""

    def __init__(self) -> None:
        self.offset = 0
        self.last: tuple[int, bytes] | None = None

    def lines(self, path: Path) -> tuple[list[tuple[int, bytes]], bool]:
        """The complete lines appended since the last call, and whether they are read from the start
        (the first read, or a rewritten file: what the reader kept is then stale)."""
        if self.last is not None and not _still_there(path, *self.last):
            self.offset, self.last = 0, None
        read = _complete_lines(path, self.offset)
        if read is None:
            self.offset, self.last = 0, None
            read = _complete_lines(path, 0) or ([], 0)
        from_start = self.offset == 0
        lines, self.offset = read
        if lines:
            self.last = lines[-1]
        return lines, from_start


def _still_there(path: Path, start: int, line: bytes) -> bool:
    try:
        with path.open("rb") as f:
            f.seek(start)
            return f.read(len(line)) == line
    except FileNotFoundError:
        return False


def _json_object(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None  # a torn line from a killed writer: skipped, never fatal for the page
    return record if isinstance(record, dict) else None


class JsonlTail:
    """The records of an append-only JSONL file, read as the file grows (thread-safe). For small
    files (one record per step): the records are kept in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._position = _Position()
        self._records: list[dict[str, Any]] = []

    def refresh(self) -> int:
        """Read what was appended since the last look; returns how many records there are now."""
        with self._lock:
            lines, from_start = self._position.lines(self.path)
            if from_start:
                self._records = []
            self._records.extend(r for r in (_json_object(line) for _, line in lines) if r is not None)
            return len(self._records)

    def since(self, index: int) -> list[dict[str, Any]]:
        """Records from position `index` on (0: all of them)."""
        self.refresh()
        with self._lock:
            return list(self._records[max(index, 0) :])


class TransitionIndex:
    """`transitions.jsonl` indexed by rollout id: the index keeps byte offsets only, and a rollout's
    transitions are read from the file when asked for (the file grows by a batch per step, too big
    to hold in memory for a long run)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._position = _Position()
        self._by_rollout: dict[str, list[tuple[int, int]]] = {}

    def _refresh(self) -> None:
        lines, from_start = self._position.lines(self.path)
        if from_start:
            self._by_rollout = {}
        for start, line in lines:
            record = _json_object(line)
            if record is not None:
                self._by_rollout.setdefault(str(record.get("rollout_id")), []).append((start, len(line)))

    def for_rollout(self, rollout_id: str) -> list[TransitionRecord]:
        with self._lock:
            self._refresh()
            places = list(self._by_rollout.get(rollout_id, ()))
            if not places:
                return []
            out: list[TransitionRecord] = []
            with self.path.open("rb") as f:
                for start, length in places:
                    f.seek(start)
                    out.append(TransitionRecord.model_validate_json(f.read(length)))
        return sorted(out, key=lambda t: (t.step, t.attempt_id, t.index))


class RunFiles:
    """The dashboard's view of one run folder (None-safe: a store served without a run folder has
    no metrics and no transitions, and says so)."""

    def __init__(self, run_dir: Path | None) -> None:
        self.run_dir = run_dir
        self.metrics = JsonlTail(run_dir / METRICS_FILE) if run_dir is not None else None
        self.transitions = TransitionIndex(run_dir / TRANSITIONS_FILE) if run_dir is not None else None

    def metrics_since(self, index: int) -> list[dict[str, Any]]:
        return self.metrics.since(index) if self.metrics is not None else []

    def metrics_count(self) -> int:
        return self.metrics.refresh() if self.metrics is not None else 0

    def transitions_of(self, rollout_id: str) -> list[TransitionRecord]:
        return self.transitions.for_rollout(rollout_id) if self.transitions is not None else []
