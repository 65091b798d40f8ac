"""In-process wake-ups for the store's long-poll waits.

A waiter registers *before* it checks the store and sleeps only afterwards, so a change that lands
between the check and the sleep still wakes it (no lost wake-ups). Waiters may live on different
event loops and threads (the HTTP server's loop, a tracing exporter's thread), so firing hands the
wake-up to each waiter's own loop with `call_soon_threadsafe`. A fire may name what changed (the
rollouts a commit made final): a waiter that only cares about some can sleep on through the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Collection
from types import TracebackType


class Watch:
    """One registration on a `Signal`; `await wait(timeout)` returns True when the signal fired."""

    def __init__(self, signal: Signal) -> None:
        self._signal = signal
        self._loop = asyncio.get_running_loop()
        self._future: asyncio.Future[None] = self._loop.create_future()
        self._keys: set[str] | None = set()

    def _fire(self, keys: Collection[str] | None) -> None:
        if keys is None:
            self._keys = None
        elif self._keys is not None:
            self._keys.update(keys)
        if not self._future.done():
            self._future.set_result(None)

    def take_keys(self) -> set[str] | None:
        """What the fires since the last call named; None when one of them named nothing (anything
        may have changed)."""
        keys, self._keys = self._keys, set()
        return keys

    async def wait(self, timeout: float) -> bool:
        """Sleep until the signal fires or `timeout` seconds pass; re-arms for the next wait."""
        if not self._future.done() and timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._future), timeout)
        fired = self._future.done()
        if fired:
            # Re-arm: later waits on this watch must see only later fires.
            self._future = self._loop.create_future()
        return fired

    def __enter__(self) -> Watch:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._signal._remove(self)


class Signal:
    """Wakes every current watcher when `fire()` is called, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: set[Watch] = set()

    def watch(self) -> Watch:
        """Register now (inside a running loop); use as a context manager to unregister."""
        w = Watch(self)
        with self._lock:
            self._watches.add(w)
        return w

    def fire(self, keys: Collection[str] | None = None) -> None:
        """Wake every watcher; `keys` names what changed (None: unknown)."""
        with self._lock:
            watches = list(self._watches)
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for w in watches:
            if w._loop is here:
                w._loop.call_soon(w._fire, keys)  # same loop: no need to write to its wake-up pipe
                continue
            try:
                w._loop.call_soon_threadsafe(w._fire, keys)
            except RuntimeError:  # that loop is closed; its waiter is gone with it
                self._remove(w)

    def _remove(self, w: Watch) -> None:
        with self._lock:
            self._watches.discard(w)
