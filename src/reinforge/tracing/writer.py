"""Write spans to the store in batches, off the agent's path.

Spans are submitted from any thread (an OpenTelemetry processor runs where a span ends); the store is
async and bound to one event loop. The writer buffers submissions under a lock and a task on the
writer's loop writes them in batches, lingering briefly so one `add_spans` call carries many spans.
Memory is bounded: past `max_pending`, submitters on other threads wait for room (backpressure);
the loop's own thread cannot wait, so it is let through and the writer is woken at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from reinforge.errors import InvalidRequestError
from reinforge.retry import Backoff
from reinforge.store.protocol import Store
from reinforge.types import Span

log = logging.getLogger(__name__)

_WRITE_BACKOFF = Backoff(0.05, max_s=5.0)


class SpanWriter:
    """Batches spans into `store.add_spans`; `await flush()` returns once everything submitted before
    the call is stored."""

    def __init__(
        self,
        store: Store,
        *,
        batch_size: int = 500,
        linger_s: float = 0.02,
        max_pending: int = 50_000,
        backpressure_timeout_s: float = 30.0,
    ) -> None:
        if batch_size < 1 or max_pending < batch_size:
            raise InvalidRequestError("SpanWriter needs batch_size >= 1 and max_pending >= batch_size")
        self._store = store
        self._batch_size = batch_size
        self._linger_s = linger_s
        self._max_pending = max_pending
        self._backpressure_timeout_s = backpressure_timeout_s
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._pending: list[Span] = []
        # Spans are written in submission order, so two counters tell a flush when it is done.
        self._submitted = 0
        self._stored = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._wake: asyncio.Event | None = None
        self._write_lock: asyncio.Lock | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.written = 0
        """How many spans the store accepted as new."""

    async def start(self) -> SpanWriter:
        """Bind to the running loop and start the background writer."""
        if self._task is not None:
            return self
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._task = asyncio.create_task(self._run(), name="reinforge-span-writer")
        if self._pending:
            self._wake.set()
        return self

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def submit(self, span: Span) -> None:
        """Queue one span for writing; safe from any thread."""
        on_loop = threading.get_ident() == self._loop_thread
        with self._lock:
            if len(self._pending) >= self._max_pending and not on_loop and self._task is not None:
                self._wake_writer()
                if not self._room.wait_for(
                    lambda: len(self._pending) < self._max_pending or self._closed,
                    timeout=self._backpressure_timeout_s,
                ):
                    log.warning(
                        "span writer still full after %.0fs; queueing anyway", self._backpressure_timeout_s
                    )
            self._pending.append(span)
            self._submitted += 1
            n = len(self._pending)
        # Wake on the first span (the writer lingers to batch) and whenever a full batch is ready.
        if n == 1 or n % self._batch_size == 0:
            self._wake_writer()

    def _wake_writer(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or loop.is_closed():
            return
        if threading.get_ident() == self._loop_thread:
            wake.set()
        else:
            loop.call_soon_threadsafe(wake.set)

    async def flush(self) -> None:
        """Write every span submitted before this call (not those that arrive meanwhile, so a busy
        writer can't starve a flush); raises the store's error if it cannot."""
        if self._write_lock is None:
            await self.start()
        with self._lock:
            target = self._submitted
        while self._stored < target and self.pending:
            await self._write_pending(target)

    async def close(self) -> None:
        """Flush what is left and stop the background writer."""
        try:
            await self.flush()
        finally:
            self._closed = True
            with self._lock:
                self._room.notify_all()
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
                self._task = None

    async def _write_pending(self, target: int | None = None) -> None:
        """Write the oldest batch; a no-op when the spans up to `target` were stored meanwhile (many
        concurrent flushes then share one store call)."""
        assert self._write_lock is not None
        async with self._write_lock:
            if target is not None and self._stored >= target:
                return
            with self._lock:
                batch, self._pending = self._pending[: self._batch_size], self._pending[self._batch_size :]
            if not batch:
                return
            try:
                self.written += await self._store.add_spans(batch)
                self._stored += len(batch)
            except BaseException:
                # Keep the spans (add_spans is idempotent by span_id, so a partial write is harmless).
                with self._lock:
                    self._pending[:0] = batch
                raise
            with self._lock:
                self._room.notify_all()

    async def _run(self) -> None:
        assert self._wake is not None
        retry = _WRITE_BACKOFF.start()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.pending < self._batch_size:
                await asyncio.sleep(self._linger_s)
            try:
                while self.pending:
                    await self._write_pending()
                retry.succeeded()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = retry.failed() or 0.0  # no budget: the writer never gives up on its spans
                log.warning("writing spans to the store failed (%s); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)
                self._wake.set()
