"""SpanWriter against a real MemoryStore: batching, flush semantics, backpressure, store failures."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest

from reinforge.errors import InvalidRequestError, StoreUnavailableError
from reinforge.store.memory import MemoryStore
from reinforge.tracing import SpanWriter
from reinforge.types import Span, SpanQuery


class CountingStore(MemoryStore):
    """A real MemoryStore that also counts `add_spans` calls, and can be slowed down or made to fail
    (the only way to exercise the writer's backpressure and retry paths deterministically)."""

    def __init__(self, delay_s: float = 0.0, failures: int = 0) -> None:
        super().__init__()
        self.calls: list[int] = []
        self.delay_s = delay_s
        self.failures = failures

    async def add_spans(self, spans: Sequence[Span]) -> int:
        if self.failures:
            self.failures -= 1
            raise StoreUnavailableError("store is restarting")
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.calls.append(len(spans))
        return await super().add_spans(spans)


def _span(i: int, attempt: str = "a1") -> Span:
    return Span(rollout_id="r1", attempt_id=attempt, name=f"s{i}")


async def _stored(store: MemoryStore) -> list[str]:
    return [s.name for s in (await store.query_spans(SpanQuery(limit=1000))).items]


async def test_spans_are_written_in_batches_in_order() -> None:
    store = CountingStore()
    writer = await SpanWriter(store, batch_size=50).start()
    for i in range(120):
        writer.submit(_span(i))
    await writer.flush()
    assert await _stored(store) == [f"s{i}" for i in range(120)]
    assert sum(store.calls) == 120 and max(store.calls) <= 50 and len(store.calls) <= 4
    assert writer.pending == 0 and writer.written == 120
    await writer.close()


async def test_background_writer_needs_no_flush() -> None:
    store = CountingStore()
    writer = await SpanWriter(store, linger_s=0.01).start()
    writer.submit(_span(0))
    for _ in range(200):
        if await _stored(store):
            break
        await asyncio.sleep(0.01)
    assert await _stored(store) == ["s0"]
    await writer.close()


async def test_concurrent_flushes_share_store_calls_and_are_not_starved() -> None:
    store = CountingStore(delay_s=0.02)
    writer = await SpanWriter(store, batch_size=1000, linger_s=5.0).start()

    async def attempt(i: int) -> None:
        writer.submit(_span(i, f"a{i}"))
        await writer.flush()
        # Everything this attempt submitted is stored when its flush returns.
        assert (await store.query_spans(SpanQuery(attempt_id=f"a{i}"))).total == 1

    await asyncio.gather(*(attempt(i) for i in range(40)))
    assert sum(store.calls) == 40 and len(store.calls) < 40
    await writer.close()


async def test_submitters_on_other_threads_wait_when_the_writer_is_full() -> None:
    store = CountingStore(delay_s=0.05)
    writer = await SpanWriter(store, batch_size=10, max_pending=20, linger_s=0.0).start()
    peak = 0

    def produce() -> None:
        nonlocal peak
        for i in range(100):
            writer.submit(_span(i))
            peak = max(peak, writer.pending)

    thread = threading.Thread(target=produce)
    started = time.monotonic()
    thread.start()
    while thread.is_alive():
        await asyncio.sleep(0.01)
    assert peak <= 20
    assert time.monotonic() - started > 0.2  # the producer was held back by the slow store
    await writer.flush()
    assert len(await _stored(store)) == 100
    await writer.close()


async def test_a_failing_store_keeps_the_spans_and_the_writer_retries() -> None:
    store = CountingStore(failures=2)
    writer = await SpanWriter(store).start()
    writer.submit(_span(0))
    with pytest.raises(StoreUnavailableError):
        await writer.flush()
    assert writer.pending == 1
    # The background writer retries with backoff until the store is back.
    for _ in range(300):
        if await _stored(store):
            break
        await asyncio.sleep(0.01)
    assert await _stored(store) == ["s0"]
    await writer.close()


def test_bad_limits_are_rejected() -> None:
    with pytest.raises(InvalidRequestError):
        SpanWriter(MemoryStore(), batch_size=0)
    with pytest.raises(InvalidRequestError):
        SpanWriter(MemoryStore(), batch_size=10, max_pending=5)
