"""A cap on the spans one attempt's agent may record in process (tool steps, rewards, framework steps).

Why: an agent stuck in a loop that opens spans would otherwise grow the runner's memory and the
store without bound, and its rollout would still look like an ordinary, finished episode. Past the
cap spans are dropped (counted), and the runner records the attempt as failed with the reason.
"""

from __future__ import annotations

import threading

from reinforge.tracing.context import SpanSink
from reinforge.types import Span

DEFAULT_MAX_SPANS_PER_ATTEMPT = 100_000


class SpanBudget:
    """A `SpanSink` that forwards an attempt's first `limit` spans to `sink` and drops the rest."""

    def __init__(self, sink: SpanSink, limit: int) -> None:
        if limit < 1:
            raise ValueError("the span limit must be at least 1")
        self._sink = sink
        self.limit = limit
        self.accepted = 0
        self.dropped = 0
        self._lock = threading.Lock()  # spans end on any thread

    def submit(self, span: Span) -> None:
        with self._lock:
            if self.accepted >= self.limit:
                self.dropped += 1
                return
            self.accepted += 1
        self._sink.submit(span)

    def overrun_error(self) -> str | None:
        """Why the attempt can't count as succeeded, or None when it kept within the budget."""
        if not self.dropped:
            return None
        return (
            f"the agent recorded more than {self.limit} spans in one attempt (Runner's "
            f"max_spans_per_attempt); {self.dropped} were dropped"
        )
