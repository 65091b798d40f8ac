"""A small keep-alive HTTP/1.1 client for the gateway's hot path to a plain-HTTP upstream.

Why not httpx here: the gateway's added latency budget is about a millisecond, and a general client
spends a good part of it per request on a fast local upstream (request models, auth and redirect
layers, an anyio stream stack). This client does exactly one thing: POST a JSON body on a pooled
connection and read one response, parsed by httptools (the C parser uvicorn uses). Streams and HTTPS
still go through httpx, where that cost is small next to the generation itself.
"""

from __future__ import annotations

import asyncio
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


class KeepAliveClient:
    """POSTs to one `http://host:port` origin over a pool of keep-alive connections (one event loop
    at a time)."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, max_idle: int = 256) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"KeepAliveClient speaks plain http only, not {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"Host: {parts.netloc}\r\nContent-Type: application/json\r\n{extra}"
        self._idle: list[_Connection] = []
        self._max_idle = max_idle
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the idle connections belong to."""
        self._deadlines: dict[asyncio.Future[tuple[int, bytes]], float] = {}
        """Each exchange in flight, by its deadline."""
        self._alarm: asyncio.TimerHandle | None = None
        self._alarm_at = 0.0

    async def post(
        self, path: str, body: bytes, timeout: float, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of one POST; raises HTTPConnectionError or TimeoutError (`timeout`
        bounds the whole call). `headers` are sent with this request only, after the client's own."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()) if headers else ""
        head = f"POST {self._prefix}{path} HTTP/1.1\r\n{self._head}{extra}Content-Length: {len(body)}\r\n\r\n"
        request = head.encode() + body
        loop = asyncio.get_running_loop()  # once per call: on Python 3.11 each is a getpid() syscall
        if loop is not self._loop:
            # Another loop's connections and timer (that loop likely closed) can't serve this one.
            self._idle, self._deadlines, self._alarm = [], {}, None
            self._loop = loop
        deadline = loop.time() + timeout
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(loop, conn, request, deadline)
            except HTTPConnectionError:
                # The server closed an idle connection before reading our request: it saw
                # nothing, so a fresh connection may safely carry it.
                if conn.got_bytes:
                    raise
        async with asyncio.timeout_at(deadline):
            _, conn = await loop.create_connection(_Connection, self._host, self._port)
        return await self._exchange(loop, conn, request, deadline)

    async def _exchange(
        self, loop: asyncio.AbstractEventLoop, conn: _Connection, request: bytes, deadline: float
    ) -> tuple[int, bytes]:
        assert conn.transport is not None
        waiter = conn.waiter = loop.create_future()
        conn.got_bytes = False
        self._deadlines[waiter] = deadline
        if self._alarm is None or deadline < self._alarm_at:
            self._arm(loop, deadline)
        try:
            conn.transport.write(request)
            result = await waiter
        except BaseException:
            conn.close()
            raise
        finally:
            del self._deadlines[waiter]
            conn.waiter = None
        if conn.reusable and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()
        return result

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        """One timer for every exchange in flight, set for the earliest deadline.

        Why not a timer per exchange (or `asyncio.timeout`): creating and cancelling one costs more
        per call than the rest of the client's own work. Calls share a timeout, so deadlines come in
        order and the timer rarely moves; when it fires it fails the overdue exchanges and is set
        again for the next deadline.
        """
        if self._alarm is not None:
            self._alarm.cancel()
        self._alarm, self._alarm_at = loop.call_at(when, self._expire, loop), when

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._alarm = None
        now = loop.time() + _TIMER_SLACK_S
        for waiter, deadline in list(self._deadlines.items()):
            if deadline <= now:
                if not waiter.done():
                    waiter.set_exception(TimeoutError("the upstream did not answer in time"))
            elif self._alarm is None or deadline < self._alarm_at:
                self._arm(loop, deadline)

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
        if self._alarm is not None:
            self._alarm.cancel()
            self._alarm = None
