"""A small keep-alive HTTP/1.1 client for the gateway's hot path to a plain-HTTP upstream.

Why not httpx here: the gateway's added latency budget is about a millisecond, and a general client
spends a good part of it per request on a fast local upstream (request models, auth and redirect
layers, an anyio stream stack). This client does exactly one thing: POST a JSON body on a pooled
connection and read one response, parsed by httptools (the C parser uvicorn uses). Streams and HTTPS
still go through httpx, where that cost is small next to the generation itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

_TIMER_SLACK_S = 0.001
"""How early a timer may fire (loops keep time in milliseconds); a deadline this close has passed."""


class HTTPConnectionError(ConnectionError):
    """The connection failed or closed before a whole response arrived."""


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.body: list[bytes] = []
        self.closed = False
        self.got_bytes = False
        self.keep_alive = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HTTPConnectionError(f"malformed HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(HTTPConnectionError(f"connection closed before the response was complete ({exc})"))

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        # Read here: the parser resets its keep-alive state for the next message afterwards.
        self.keep_alive = self.parser.should_keep_alive()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((self.parser.get_status_code(), b"".join(self.body)))
        self.body = []

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    @property
    def reusable(self) -> bool:
        return not self.closed and self.keep_alive


class _LoopPool:
    """One event loop's share of a client: its idle connections and its exchanges' deadlines."""

    __slots__ = ("alarm", "alarm_at", "deadlines", "idle", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.idle: list[_Connection] = []
        self.deadlines: dict[asyncio.Future[tuple[int, bytes]], float] = {}
        """Each exchange in flight, by its deadline."""
        self.alarm: asyncio.TimerHandle | None = None
        self.alarm_at = 0.0

    def close(self) -> None:
        """On `loop`'s thread: close the idle connections and the timer."""
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()
        if self.alarm is not None:
            self.alarm.cancel()
            self.alarm = None


class KeepAliveClient:
    """POSTs to one `http://host:port` origin over pools of keep-alive connections.

    Connections and timers belong to the event loop that made them, so each loop that calls `post`
    gets its own pool: one client may serve a gateway's loop and a trainer's loop at once (two
    threads), which a single shared pool could not (a connection read by two loops mixes their
    replies).
    """

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, max_idle: int = 256) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"KeepAliveClient speaks plain http only, not {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"Host: {parts.netloc}\r\nContent-Type: application/json\r\n{extra}"
        self._max_idle = max_idle
        self._pools: dict[asyncio.AbstractEventLoop, _LoopPool] = {}
        self._last: _LoopPool | None = None
        """The pool of the loop that called last: one identity check per call on the usual path."""
        self._pools_lock = threading.Lock()

    def _pool(self, loop: asyncio.AbstractEventLoop) -> _LoopPool:
        last = self._last
        if last is not None and last.loop is loop:
            return last
        with self._pools_lock:
            pool = self._pools.get(loop)
            if pool is None:
                # A closed loop's pool can serve nobody (its connections died with it): drop it.
                for gone in [other for other in self._pools if other.is_closed()]:
                    del self._pools[gone]
                pool = self._pools[loop] = _LoopPool(loop)
        self._last = pool
        return pool

    async def post(
        self, path: str, body: bytes, timeout: float, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of one POST; raises HTTPConnectionError or TimeoutError (`timeout`
        bounds the whole call). `headers` are sent with this request only, after the client's own."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()) if headers else ""
        head = f"POST {self._prefix}{path} HTTP/1.1\r\n{self._head}{extra}Content-Length: {len(body)}\r\n\r\n"
        request = head.encode() + body
        loop = asyncio.get_running_loop()  # once per call: on Python 3.11 each is a getpid() syscall
        pool = self._pool(loop)
        deadline = loop.time() + timeout
        while pool.idle:
            conn = pool.idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(pool, conn, request, deadline)
            except HTTPConnectionError:
                # The server closed an idle connection before reading our request: it saw
                # nothing, so a fresh connection may safely carry it.
                if conn.got_bytes:
                    raise
        async with asyncio.timeout_at(deadline):
            _, conn = await loop.create_connection(_Connection, self._host, self._port)
        return await self._exchange(pool, conn, request, deadline)

    async def _exchange(
        self, pool: _LoopPool, conn: _Connection, request: bytes, deadline: float
    ) -> tuple[int, bytes]:
        assert conn.transport is not None
        waiter = conn.waiter = pool.loop.create_future()
        conn.got_bytes = False
        pool.deadlines[waiter] = deadline
        if pool.alarm is None or deadline < pool.alarm_at:
            self._arm(pool, deadline)
        try:
            conn.transport.write(request)
            result = await waiter
        except BaseException:
            conn.close()
            raise
        finally:
            del pool.deadlines[waiter]
            conn.waiter = None
        if conn.reusable and len(pool.idle) < self._max_idle:
            pool.idle.append(conn)
        else:
            conn.close()
        return result

    def _arm(self, pool: _LoopPool, when: float) -> None:
        """One timer per loop for every exchange in flight there, set for the earliest deadline.

        Why not a timer per exchange (or `asyncio.timeout`): creating and cancelling one costs more
        per call than the rest of the client's own work. Calls share a timeout, so deadlines come in
        order and the timer rarely moves; when it fires it fails the overdue exchanges and is set
        again for the next deadline.
        """
        if pool.alarm is not None:
            pool.alarm.cancel()
        pool.alarm, pool.alarm_at = pool.loop.call_at(when, self._expire, pool), when

    def _expire(self, pool: _LoopPool) -> None:
        pool.alarm = None
        now = pool.loop.time() + _TIMER_SLACK_S
        for waiter, deadline in list(pool.deadlines.items()):
            if deadline <= now:
                if not waiter.done():
                    waiter.set_exception(TimeoutError("the upstream did not answer in time"))
            elif pool.alarm is None or deadline < pool.alarm_at:
                self._arm(pool, deadline)

    def close(self) -> None:
        """Close every pool's idle connections: this loop's now, a running other loop's on that loop
        (its transports are not to be touched from here); a closed loop's are gone already."""
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        with self._pools_lock:
            pools = list(self._pools.values())
            self._pools.clear()
        self._last = None
        for pool in pools:
            if pool.loop is current or not (pool.loop.is_running() or pool.loop.is_closed()):
                pool.close()
            elif not pool.loop.is_closed():
                with contextlib.suppress(RuntimeError):  # it closed meanwhile
                    pool.loop.call_soon_threadsafe(pool.close)
