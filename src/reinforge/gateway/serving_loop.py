"""The event loop that serves the gateway's requests, and the hop onto it from other threads.

Why: the trainer pauses the gateway, publishes policy versions and flushes spans from its own thread
or loop, while everything the gateway keeps (its events, holds and span queue) belongs to the loop
that serves requests. `ServingLoop` runs such work there and hands back the result.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def _next_turn() -> None:
    """Started on a loop from another thread, it ends after the callbacks that loop's current turn
    schedules (a released call's request to the engine is one): `ServingLoop.settle`."""
    await asyncio.sleep(0)


class ServingLoop:
    """The loop the gateway was first used on (mounted sub-apps get no lifespan events to tell)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread_id: int | None = None

    def bind(self) -> None:
        """Attach to the running loop (the caller checks that it is not bound yet)."""
        self.loop = asyncio.get_running_loop()
        self._thread_id = threading.get_ident()

    @property
    def live(self) -> bool:
        """Bound to a loop that has not closed: there is something on it to wait for."""
        return self.loop is not None and not self.loop.is_closed()

    async def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """`make()`'s result, awaited on the serving loop (here, when called there or before it is bound)."""
        loop = self.loop
        if loop is None or loop is asyncio.get_running_loop():
            return await make()
        if loop.is_closed():
            raise RuntimeError("the gateway's event loop has stopped (was its server shut down?)")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make(), loop))

    def soon(self, callback: Callable[[], None]) -> None:
        """Run `callback` on the serving loop: now when called there (or before the gateway has
        served), else as soon as that loop gets to it (not at all once it has closed)."""
        loop = self.loop
        if loop is None or threading.get_ident() == self._thread_id:
            callback()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(callback)

    async def settle(self) -> None:
        """Return once the serving loop has run what is ready on it now and what that scheduled next."""
        await self.run(_next_turn)
