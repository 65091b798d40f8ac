"""Which attempt the current code runs for.

The runner enters an `attempt_scope` before it calls the agent; everything the agent does inside it
(spans, rewards) is attributed to that attempt. The scope is a `contextvars` variable, so asyncio tasks
inherit it by themselves and threads inherit it once `instrument_threads()` is on.
"""

from __future__ import annotations

import contextvars
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from reinforge.types import Span


class SpanSink(Protocol):
    """Where finished spans of an attempt go (a `SpanWriter` in practice). Called from any thread."""

    def submit(self, span: Span) -> None: ...


@dataclass(eq=False)
class AttemptContext:
    """The attempt an agent is running for, and where its spans are written."""

    rollout_id: str
    attempt_id: str
    sink: SpanSink
    agent_name: str | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    resources_version: int | None = None
    framework_telemetry: bool = False
    """Whether agent frameworks' own telemetry (tool runs, agent roles) is recorded as reinforge
    steps for this attempt; the runner sets it from `instrument_frameworks`."""
    _sequence: itertools.count[int] = field(default_factory=itertools.count, repr=False)

    def next_sequence(self) -> int:
        """A per-attempt counter, so span order survives equal timestamps (itertools.count is atomic)."""
        return next(self._sequence)


_current: contextvars.ContextVar[AttemptContext | None] = contextvars.ContextVar(
    "reinforge_attempt", default=None
)


def current_attempt() -> AttemptContext | None:
    """The attempt the calling code runs for, or None outside any attempt."""
    return _current.get()


@contextmanager
def attempt_scope(ctx: AttemptContext) -> Iterator[AttemptContext]:
    """Run the body (and the tasks/threads it starts) as part of `ctx`'s attempt."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
