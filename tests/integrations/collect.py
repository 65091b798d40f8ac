"""An attempt whose spans are kept in a list: hooks tested without a runner around them."""

from __future__ import annotations

import threading

from reinforge.tracing import AttemptContext
from reinforge.types import Span


class Collected:
    """A `SpanSink` that keeps what it is given."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[Span] = []

    def submit(self, span: Span) -> None:
        with self._lock:
            self.spans.append(span)


def attempt(sink: Collected, *, framework_telemetry: bool = True) -> AttemptContext:
    return AttemptContext(
        rollout_id="r-hooks", attempt_id="a-hooks", sink=sink, framework_telemetry=framework_telemetry
    )
