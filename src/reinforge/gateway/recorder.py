"""Writes spans to the store in batches, off the request path, with bounded memory.

Why a queue and not a write per call: a store round-trip per LLM call would sit on the agent's
latency. The request path only enqueues; one writer task drains the queue in batches. The queue is
bounded: when the store falls behind, `record` waits for room (backpressure) instead of dropping a
span or growing without limit, because a lost LLM span is a lost training sample. A failed write is
retried with backoff; only a span the store refuses outright (invalid, or over its size limit) is
logged and skipped. A batch lingers up to `linger_s` for company (each store write
has a fixed cost: a transaction, a commit, a round-trip), unless someone is waiting on a flush.
`flush(attempt_id)` waits until every span recorded so far for that attempt is in the store, which is
what a runner needs before it reports the attempt finished.

A caller may enqueue a `PendingSpan` instead of a span: its fields fixed, its building (and
validation) left to the writer, so that an LLM call's answer is not held back by the building of
its span. It counts toward `flush` from the moment it is enqueued, as a span does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from reinforge.errors import InvalidRequestError, PayloadTooLargeError
from reinforge.retry import Backoff
from reinforge.store.protocol import Store
from reinforge.types import Span

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PendingSpan:
    """A span the writer builds: the attempt it belongs to, and how to build it."""

    attempt_id: str
    build: Callable[[], Span]


class SpanRecorder:
    """Batching span writer; create, `start()` inside the event loop that serves requests."""

    def __init__(
        self,
        store: Store,
        *,
        max_queue: int = 4096,
        max_batch: int = 256,
        linger_s: float = 0.05,
        max_retry_delay_s: float = 2.0,
    ) -> None:
        if max_queue < 1 or max_batch < 1:
            raise ValueError("max_queue and max_batch must be at least 1")
        self._store = store
        self._max_queue = max_queue
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._max_retry_delay_s = max_retry_delay_s
        self._hurry: asyncio.Event | None = None
        self._queue: asyncio.Queue[Span | PendingSpan] | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending: dict[str, int] = defaultdict(int)
        """Spans enqueued but not yet stored, per attempt."""
        self._waiters: dict[str, list[asyncio.Future[None]]] = defaultdict(list)
        self.written = 0
        self.write_errors = 0
        self.rejected = 0
        """Spans the store refused as invalid or too large, or that failed to build (logged; nothing
        else is ever dropped)."""

    def start(self) -> None:
        if self._task is None:
            self._queue = asyncio.Queue(self._max_queue)
            self._hurry = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="reinforge-span-recorder")

    @property
    def queued(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    async def record(self, span: Span | PendingSpan) -> None:
        """Enqueue one span (or one to be built); waits while the queue is full."""
        if self._queue is None:
            self.start()
        assert self._queue is not None
        self._pending[span.attempt_id] += 1
        try:
            self._queue.put_nowait(span)  # O(1), no coroutine: the common case, room in the queue
        except asyncio.QueueFull:
            try:
                await self._queue.put(span)
            except BaseException:
                self._done(span.attempt_id, 1)
                raise
        if self._queue.qsize() >= self._max_batch and self._hurry is not None:
            self._hurry.set()

    async def flush(self, attempt_id: str | None = None) -> None:
        """Wait until the spans recorded so far (for one attempt, or all) are in the store."""
        keys = [attempt_id] if attempt_id is not None else [k for k, n in self._pending.items() if n]
        loop = asyncio.get_running_loop()
        for key in keys:
            if self._pending.get(key):
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters[key].append(waiter)
                if self._hurry is not None:
                    self._hurry.set()
                await waiter

    async def close(self) -> None:
        """Write everything still queued, then stop the writer."""
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _done(self, attempt_id: str, count: int) -> None:
        left = self._pending[attempt_id] - count
        if left > 0:
            self._pending[attempt_id] = left
            return
        self._pending.pop(attempt_id, None)
        for waiter in self._waiters.pop(attempt_id, []):
            if not waiter.done():
                waiter.set_result(None)

    async def _run(self) -> None:
        assert self._queue is not None and self._hurry is not None
        queue, hurry = self._queue, self._hurry
        while True:
            batch: list[Span | PendingSpan] = [await queue.get()]
            if self._linger_s > 0 and not self._waiters and queue.qsize() < self._max_batch:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._linger_s):
                        await hurry.wait()
            hurry.clear()
            while len(batch) < self._max_batch and not queue.empty():
                batch.append(queue.get_nowait())
            built = [item if isinstance(item, Span) else self._build(item) for item in batch]
            spans = [span for span in built if span is not None]
            if spans:
                await self._write(spans)
            counts: dict[str, int] = defaultdict(int)
            for item in batch:
                counts[item.attempt_id] += 1
            for attempt_id, count in counts.items():
                self._done(attempt_id, count)

    def _build(self, pending: PendingSpan) -> Span | None:
        try:
            return pending.build()
        except Exception:
            # A bug in the code that fixed the span's fields; the rest of the batch is still stored.
            self.rejected += 1
            log.exception("building a span of attempt %s failed; it is not stored", pending.attempt_id)
            return None

    async def _write(self, batch: list[Span]) -> None:
        retry = Backoff(0.05, max_s=self._max_retry_delay_s).start()
        while True:
            try:
                await self._store.add_spans(batch)
                self.written += len(batch)
                return
            except asyncio.CancelledError:
                raise
            except (InvalidRequestError, PayloadTooLargeError) as exc:
                # Retrying can't help. Halve the batch to find the spans the store refuses (a huge
                # conversation over an HTTP store's body limit); keep the rest. Stalling the whole
                # gateway behind one unstorable span would lose far more than that span.
                if len(batch) > 1:
                    half = len(batch) // 2
                    await self._write(batch[:half])
                    await self._write(batch[half:])
                else:
                    self.rejected += 1
                    log.error(
                        "the store refused span %s of attempt %s: %s",
                        batch[0].span_id,
                        batch[0].attempt_id,
                        exc,
                    )
                return
            except Exception as exc:
                # add_spans is idempotent by span_id, so retrying a half-applied batch is safe.
                self.write_errors += 1
                delay = retry.failed() or 0.0  # no budget: a lost LLM span is a lost sample
                log.warning(
                    "writing %d spans to the store failed (%s); retrying in %.2fs", len(batch), exc, delay
                )
                await asyncio.sleep(delay)
