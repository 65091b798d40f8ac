"""The stores work from any thread and event loop (a tracing exporter's thread, a server's loop),
and a wait on one loop is woken by a change made on another. The HTTP client too: the trainer calls
it from its own loop while the gateway's thread calls the same client from another."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from reinforge.store import Store
from reinforge.types import RolloutSpec

from .conftest import WAKE_LIMIT, http_store, memory_store, sqlite_store


@pytest.mark.parametrize(
    "factory", [memory_store, sqlite_store, http_store], ids=["memory", "sqlite", "http"]
)
async def test_enqueue_from_another_thread_wakes_a_waiting_lease(factory: object, tmp_path: Path) -> None:
    async with factory(tmp_path) as store:  # type: ignore[operator]
        assert isinstance(store, Store)
        waiter = asyncio.create_task(store.lease_rollouts("r", wait_seconds=10))
        await asyncio.sleep(0.2)
        enqueued_at: list[float] = []

        def other_thread() -> None:
            asyncio.run(store.enqueue_rollouts([RolloutSpec(rollout_id="from-thread")]))
            enqueued_at.append(time.monotonic())

        t = threading.Thread(target=other_thread)
        t.start()
        (leased,) = await asyncio.wait_for(waiter, 5)
        t.join()
        assert leased.rollout.rollout_id == "from-thread"
        assert time.monotonic() - enqueued_at[0] < WAKE_LIMIT


async def test_one_http_client_serves_two_loops_at_once(tmp_path: Path) -> None:
    """Calls in flight on two loops at the same time each get their own answer (each loop has its
    own connections: one pool shared across loops mixed up their replies)."""
    async with http_store(tmp_path) as store:
        await store.enqueue_rollouts([RolloutSpec(rollout_id=f"r{i}") for i in range(40)])
        other_loop = asyncio.new_event_loop()
        thread = threading.Thread(target=other_loop.run_forever)
        thread.start()
        try:

            async def reads(prefix: str) -> list[str]:
                got = await asyncio.gather(*(store.get_rollout(f"r{i}") for i in range(40)))
                leased = await store.lease_rollouts(prefix, max_rollouts=5)
                return [r.rollout_id for r in got] + [lr.attempt.runner_id for lr in leased]

            there = asyncio.run_coroutine_threadsafe(reads("runner-there"), other_loop)
            here = await reads("runner-here")
            theirs = await asyncio.wrap_future(there)
            expected = [f"r{i}" for i in range(40)]
            assert here == expected + ["runner-here"] * 5
            assert theirs == expected + ["runner-there"] * 5
        finally:
            other_loop.call_soon_threadsafe(other_loop.stop)
            thread.join(5)
            other_loop.close()
