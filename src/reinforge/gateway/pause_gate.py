"""The pause gate: new calls wait at the door while the trainer updates the weights.

`pause` returns once every call in flight has finished, so no call is answered by a half-updated
model; calls that arrive meanwhile wait until `resume`.
"""

from __future__ import annotations

import asyncio

from reinforge.gateway.serving_loop import ServingLoop


class PauseGate:
    """Counts the calls inside the gate and holds new ones while paused; events live on the serving loop."""

    def __init__(self, serving: ServingLoop) -> None:
        self._serving = serving
        self._paused = False
        self._open: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._inflight = 0

    def bind(self) -> None:
        """Make the events on the serving loop (called there, once)."""
        self._open = asyncio.Event()
        if not self._paused:
            self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def in_flight(self) -> int:
        """Calls inside the gate now (generating, or streaming their answer)."""
        return self._inflight

    async def pause(self) -> None:
        """Hold new calls at the door and return once every in-flight call has finished."""
        self._paused = True

        async def drain() -> None:
            if self._open is not None:
                self._open.clear()
            if self._idle is not None:
                await self._idle.wait()

        await self._serving.run(drain)

    def resume(self) -> None:
        """Let held and new calls through again."""
        self._paused = False
        if self._open is not None:
            self._serving.soon(self._open.set)

    async def enter(self) -> None:
        """Wait while paused, then count the call in."""
        assert self._open is not None and self._idle is not None
        while not self._open.is_set():
            await self._open.wait()
        self._inflight += 1
        self._idle.clear()

    def leave(self) -> None:
        assert self._idle is not None
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()
