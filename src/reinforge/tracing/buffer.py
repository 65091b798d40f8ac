"""Hold a short attempt's spans until it finishes, so they travel with the finish in one request.

Why: most attempts are short and record a handful of spans (a final reward, a few tool calls). Writing
them through the shared `SpanWriter` costs a store round trip that the runner must then wait on before
finishing; held here, they ride along in the runner's single finish call instead. A long or busy
attempt should still be visible live (the dashboard, a trainer watching): once the attempt has run
`hold_s` or holds `max_held` spans, everything goes to the writer as before, except final rewards:
those are held until the finish in every case, because the gateway decides the attempt's reward from
the final rewards reported to it (`gateway.finishing`) and reads none back from the store.
"""

from __future__ import annotations

import threading
import time

from reinforge.semconv import SPAN_FINAL_REWARD
from reinforge.tracing.context import SpanSink
from reinforge.types import Span


class AttemptSpanBuffer:
    """The span sink of one attempt: holds spans, or passes them on to `writer` (see module doc).

    Thread-safe (spans end on any thread). After `take()`, every span goes straight to the writer:
    a span that ends after the finish was sent must not be lost.
    """

    def __init__(self, writer: SpanSink, *, hold_s: float = 1.0, max_held: int = 64) -> None:
        self._writer = writer
        self._deadline = time.monotonic() + hold_s
        self._max_held = max_held
        self._lock = threading.Lock()
        self._held: list[Span] = []
        self._passing = False
        self._taken = False
        self.passed = 0
        """How many spans went to the writer (the runner flushes it before finishing if any did)."""

    def submit(self, span: Span) -> None:
        # The writer is called under the lock, so spans reach it in the order they ended.
        with self._lock:
            if span.name == SPAN_FINAL_REWARD and not self._taken:
                self._held.append(span)  # the finish carries it to the gateway (see module doc)
                return
            if not self._passing:
                self._held.append(span)
                if len(self._held) < self._max_held and time.monotonic() < self._deadline:
                    return
                self._passing = True
                spans, self._held = self._held, []
            else:
                spans = [span]
            self.passed += len(spans)
            for s in spans:
                self._writer.submit(s)

    def take(self) -> list[Span]:
        """The spans still held, in submission order; later spans go to the writer."""
        with self._lock:
            self._passing = True
            self._taken = True
            spans, self._held = self._held, []
        return spans
