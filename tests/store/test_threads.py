"""The local stores work from any thread and event loop (a tracing exporter's thread, a server's
loop), and a wait on one loop is woken by a change made on another."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from reinforge.store import Store
from reinforge.types import RolloutSpec

from .conftest import WAKE_LIMIT, memory_store, sqlite_store


@pytest.mark.parametrize("factory", [memory_store, sqlite_store], ids=["memory", "sqlite"])
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
