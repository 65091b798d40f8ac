"""`KeepAliveTransport`: the httpx transport under every reinforge HTTP client (the store client, the
upstream backend, the runner's gateway client, and agents' OpenAI SDK via `gateway_http_client()`).

Why not httpx's own transport: its stack (httpcore's pool, anyio streams, h11 events) costs many
times what a call to a fast local server does. This transport writes the request httpx built as it
is (method, target, headers, body) on a pooled keep-alive connection and parses the reply with
httptools. Everything above it (auth, redirects, timeout configuration, the response model, the
exception family) is httpx's. HTTPS, other schemes and HEAD requests go to httpx's own transport.

It works with both `httpx` and `httpx2` (the fork recent OpenAI SDKs use): responses, streams and
errors are built from the package of the request it is handed.

Connections, timers and the fallback transport belong to the event loop that made them, so each
loop that sends a request gets its own pool: one client may serve a gateway's loop and a trainer's
loop in two threads at once (a connection read by two loops would mix their replies).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import AsyncIterator, Iterable
from functools import cache
from types import ModuleType
from typing import Any, NamedTuple

import httpx

from reinforge.net.connection import Connection, ConnectionBroken, Head, ResponseBody

_TIMER_SLACK_S = 0.001
"""How early a timer may fire (loops keep time in milliseconds); a deadline this close has passed."""


class _Origin:
    """One loop's connections to one `host:port`: the idle ones, and how many carry an exchange."""

    __slots__ = ("busy", "closed", "host", "idle", "max_connections", "max_idle", "port", "waiters")

    def __init__(self, host: str, port: int, max_idle: int, max_connections: int | None) -> None:
        self.host, self.port = host, port
        self.max_idle, self.max_connections = max_idle, max_connections
        self.idle: list[Connection] = []
        self.busy = 0
        self.closed = False
        """Closed with its transport: a connection coming free is closed, not kept."""
        self.waiters: list[asyncio.Future[None]] = []
        """Requests waiting for a connection while `max_connections` are busy, oldest first."""

    def take_idle(self) -> Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                conn.busy = True
                self.busy += 1
                return conn
        return None

    def release(self, conn: Connection, reusable: bool) -> None:
        if reusable and not self.closed and len(self.idle) < self.max_idle:
            self.idle.append(conn)
        else:
            conn.close()
        self.free_slot()

    def free_slot(self) -> None:
        """A connection stopped being busy: the request waiting longest may take one."""
        self.busy -= 1
        while self.waiters:
            waiter = self.waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                break

    def close(self) -> None:
        self.closed = True
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()


class _LoopPool:
    """One event loop's share of a transport: its origins, its exchanges' deadlines and one timer
    for all of them, and its fallback transport."""

    __slots__ = ("alarm", "alarm_at", "deadlines", "fallback", "loop", "origins")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.origins: dict[tuple[str, int], _Origin] = {}
        self.deadlines: dict[asyncio.Future[Any], float] = {}
        """Each wait in flight (a reply's head, a stream's next chunk), by its deadline."""
        self.alarm: asyncio.TimerHandle | None = None
        self.alarm_at = 0.0
        self.fallback: Any = None

    async def wait(self, future: asyncio.Future[Any], timeout: float | None) -> Any:
        """`await future`, failing it with TimeoutError if it is not done within `timeout` seconds.

        Why one timer per loop, not one per wait (or `asyncio.timeout`): creating and cancelling
        one costs more per call than the rest of the transport's own work. Calls share a timeout,
        so deadlines come in order and the timer rarely moves; when it fires it fails the overdue
        waits and is set again for the next deadline.
        """
        if timeout is None:
            return await future
        deadline = self.loop.time() + timeout
        self.deadlines[future] = deadline
        if self.alarm is None or deadline < self.alarm_at:
            self._arm(deadline)
        try:
            return await future
        finally:
            del self.deadlines[future]

    def _arm(self, when: float) -> None:
        if self.alarm is not None:
            self.alarm.cancel()
        self.alarm, self.alarm_at = self.loop.call_at(when, self._expire), when

    def _expire(self) -> None:
        self.alarm = None
        now = self.loop.time() + _TIMER_SLACK_S
        for future, deadline in list(self.deadlines.items()):
            if deadline <= now:
                if not future.done():
                    future.set_exception(TimeoutError())
            elif self.alarm is None or deadline < self.alarm_at:
                self._arm(deadline)

    def close(self) -> None:
        """On `loop`'s thread: close the idle connections and the timer."""
        origins, self.origins = list(self.origins.values()), {}
        for origin in origins:
            origin.close()
        if self.alarm is not None:
            self.alarm.cancel()
            self.alarm = None


class _Answer(NamedTuple):
    """A reply's head, and its body as it arrives on its connection."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: ResponseBody
    conn: Connection
    timeout: float | None
    """The read timeout each wait for more of the body gets."""


class KeepAliveTransport(httpx.AsyncBaseTransport):
    """An httpx (or httpx2) async transport: plain-HTTP requests on pooled keep-alive connections
    written and parsed directly; anything else through httpx's default transport.

        client = httpx.AsyncClient(base_url="http://127.0.0.1:8000", transport=KeepAliveTransport())

    `max_connections` bounds the connections a loop opens to one origin (None: no bound); a request
    beyond it waits for one to come free, up to the request's `pool` timeout. At most
    `max_idle_per_origin` idle connections are kept. Timeouts come from the request's extensions
    (httpx's `Timeout`): `connect` for opening a connection, `read` for each wait on the server.
    Failures raise httpx's own exceptions: `ConnectError`/`ConnectTimeout` (nothing was sent),
    `ReadTimeout`, `RemoteProtocolError` (the connection broke or the reply was malformed), and
    `PoolTimeout`.
    """

    def __init__(self, max_connections: int | None = None, max_idle_per_origin: int = 256) -> None:
        self._max_connections = max_connections
        self._max_idle = max_idle_per_origin
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

    async def handle_async_request(self, request: Any) -> Any:
        mod = _package_of(request)
        loop = asyncio.get_running_loop()  # once per call: on Python 3.11 each is a getpid() syscall
        pool = self._pool(loop)
        url = request.url
        if url.scheme != "http" or request.method == "HEAD":  # a HEAD reply's length has no body
            if pool.fallback is None:
                limits = mod.Limits(max_connections=self._max_connections)
                pool.fallback = mod.AsyncHTTPTransport(limits=limits)
            return await pool.fallback.handle_async_request(request)
        wire = _wire(request, await _body(request, mod))
        answer = await self.send_wire(mod, pool, url.host, url.port or 80, wire, request)
        if answer.body.done and answer.body.error is None:
            # The whole reply came with its head (the usual case): no streaming machinery.
            stream = mod.ByteStream(answer.body.take())
        else:
            stream = _stream_class(mod)(answer.body, answer.conn, pool, answer.timeout, request)
        return mod.Response(
            answer.status, headers=answer.headers, stream=stream, extensions={"http_version": b"HTTP/1.1"}
        )

    async def send_wire(
        self, mod: ModuleType, pool: _LoopPool, host: str, port: int, wire: bytes, request: Any
    ) -> _Answer:
        """Send a request already on the wire's bytes to `host:port` over the pool and return the
        reply's head with its body as it arrives (`handle_async_request`'s exchange; `DirectSender`
        calls it with bytes it built)."""
        origin = pool.origins.get((host, port))
        if origin is None:
            origin = pool.origins[host, port] = _Origin(host, port, self._max_idle, self._max_connections)
        timeouts = request.extensions.get("timeout") or {}
        read_timeout = timeouts.get("read")
        loop = pool.loop
        try:
            while True:
                conn = origin.take_idle()
                if conn is not None:
                    try:
                        return await self._exchange(mod, pool, conn, wire, request, read_timeout)
                    except ConnectionBroken:
                        # The server closed an idle connection before reading the request: it saw
                        # nothing, so a fresh connection may carry it.
                        if conn.got_bytes:
                            raise
                        continue
                if origin.max_connections is not None and origin.busy >= origin.max_connections:
                    await self._wait_for_slot(mod, pool, origin, request, timeouts.get("pool"))
                    continue
                conn = await self._connect(mod, loop, origin, timeouts.get("connect"))
                return await self._exchange(mod, pool, conn, wire, request, read_timeout)
        except ConnectionBroken as exc:
            raise mod.RemoteProtocolError(str(exc), request=request) from exc

    async def _connect(
        self, mod: ModuleType, loop: asyncio.AbstractEventLoop, origin: _Origin, timeout: float | None
    ) -> Connection:
        origin.busy += 1  # the slot is taken while connecting
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(lambda: Connection(origin), origin.host, origin.port)
        except BaseException as exc:
            origin.free_slot()
            where = f"{origin.host}:{origin.port}"
            if isinstance(exc, TimeoutError):
                raise mod.ConnectTimeout(f"connecting to {where} timed out") from exc
            if isinstance(exc, OSError):
                raise mod.ConnectError(f"can't connect to {where}: {exc}") from exc
            raise
        return conn

    async def _wait_for_slot(
        self, mod: ModuleType, pool: _LoopPool, origin: _Origin, request: Any, timeout: float | None
    ) -> None:
        waiter = pool.loop.create_future()
        origin.waiters.append(waiter)
        try:
            await pool.wait(waiter, timeout)
        except TimeoutError as exc:
            raise mod.PoolTimeout("no connection came free in time", request=request) from exc
        finally:
            if not waiter.done():
                waiter.cancel()
            with contextlib.suppress(ValueError):
                origin.waiters.remove(waiter)

    async def _exchange(
        self,
        mod: ModuleType,
        pool: _LoopPool,
        conn: Connection,
        wire: bytes,
        request: Any,
        timeout: float | None,
    ) -> _Answer:
        head: asyncio.Future[Head] = pool.loop.create_future()
        try:
            conn.send(wire, head)
            status, headers, body = await pool.wait(head, timeout)
        except TimeoutError as exc:
            conn.close()
            raise mod.ReadTimeout("the server did not answer in time", request=request) from exc
        except BaseException:
            conn.close()
            raise
        return _Answer(status, headers, body, conn, timeout)

    async def aclose(self) -> None:
        """Close every loop's idle connections and fallback transport: this loop's now, a running
        other loop's on that loop (its transports are not to be touched from here); a closed loop's
        are gone already."""
        current = asyncio.get_running_loop()
        with self._pools_lock:
            pools = list(self._pools.values())
            self._pools.clear()
        self._last = None
        for pool in pools:
            fallback, pool.fallback = pool.fallback, None
            if pool.loop is current or not (pool.loop.is_running() or pool.loop.is_closed()):
                pool.close()
                if fallback is not None and pool.loop is current:
                    await fallback.aclose()
            elif not pool.loop.is_closed():
                with contextlib.suppress(RuntimeError):  # it closed meanwhile
                    pool.loop.call_soon_threadsafe(pool.close)
                    if fallback is not None:
                        asyncio.run_coroutine_threadsafe(fallback.aclose(), pool.loop)


def _package_of(request: Any) -> ModuleType:
    """`httpx` or `httpx2`: whichever built the request."""
    return sys.modules[type(request).__module__.partition(".")[0]]


async def _body(request: Any, mod: ModuleType) -> bytes:
    """The request's body as it goes on the wire (httpx has read a body given as bytes already)."""
    try:
        content: bytes = request.content
        return content
    except mod.RequestNotRead:
        body: bytes = await request.aread()
    if request.headers.get("transfer-encoding") == "chunked":  # a streamed body, now whole: one chunk
        return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
    return body


def _wire(request: Any, body: bytes) -> bytes:
    """The request's bytes on the wire: httpx's request line and headers as they are, then the body."""
    lines = b"".join(b"%s: %s\r\n" % pair for pair in request.headers.raw)
    return _wire_bytes(request.method.encode("ascii"), request.url.raw_path, lines, body)


def _wire_bytes(method: bytes, target: bytes, header_lines: bytes, body: bytes) -> bytes:
    """A request on the wire: its request line, its header lines (each ending in CRLF), the body."""
    return b"%s %s HTTP/1.1\r\n%s\r\n%s" % (method, target, header_lines, body)


def _header_value(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of header `name` (lower-case) in a raw header list, any case."""
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


@cache
def _stream_class(mod: ModuleType) -> type:
    """A streaming body type of `mod` (its clients check for their own AsyncByteStream)."""

    class _Stream(mod.AsyncByteStream):  # type: ignore[name-defined]
        """A body still arriving: each chunk as it comes, each wait bounded by the read timeout."""

        def __init__(
            self, body: ResponseBody, conn: Connection, pool: _LoopPool, timeout: float | None, request: Any
        ) -> None:
            self._body, self._conn, self._pool = body, conn, pool
            self._timeout, self._request = timeout, request

        async def __aiter__(self) -> AsyncIterator[bytes]:
            body = self._body
            while True:
                if body.chunks:
                    yield body.take()
                elif body.done:
                    if body.error is not None:
                        raise mod.RemoteProtocolError(str(body.error), request=self._request) from body.error
                    return
                else:
                    waiter = body.waiter = self._pool.loop.create_future()
                    try:
                        await self._pool.wait(waiter, self._timeout)
                    except TimeoutError as exc:
                        self._conn.close()
                        raise mod.ReadTimeout("the server stopped sending", request=self._request) from exc
                    finally:
                        body.waiter = None

        async def aclose(self) -> None:
            if not self._body.done:
                self._conn.close()  # the rest of the reply would keep the connection busy

    return _Stream


class _WireRequest:
    """What the exchange needs of a request it did not build: its timeouts (and a name in errors)."""

    __slots__ = ("extensions", "method", "url")

    def __init__(self, method: str, url: httpx.URL, extensions: dict[str, Any]) -> None:
        self.method, self.url, self.extensions = method, url, extensions


class Reply:
    """A whole reply to a `DirectSender` request: what its callers read of it.

    Why not an `httpx.Response`: building one and reading a body that is already whole through its
    decoder chain cost the gateway as much per call as parsing the agent's request
    (docs/benchmarks-spine.md, "where a call's time goes inside the gateway").
    """

    __slots__ = ("content", "headers", "status_code", "url")

    def __init__(
        self, status_code: int, headers: list[tuple[bytes, bytes]], content: bytes, url: httpx.URL
    ) -> None:
        self.status_code = status_code
        self.headers = headers
        """As they came, names in the server's case."""
        self.content = content
        """The body, decoded when the server compressed it."""
        self.url = url

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def header(self, name: str) -> str | None:
        """The first value of header `name` (any case), or None."""
        value = _header_value(self.headers, name.lower().encode("latin-1"))
        return None if value is None else value.decode("latin-1")

    def __repr__(self) -> str:
        return f"<Reply [{self.status_code}] {self.url}>"


class _Opened(NamedTuple):
    """A reply's head, the part of its body already here, and the rest still to come (None: whole)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    first: bytes
    rest: Any
    """An async iterable of the body's remaining bytes, with `aclose()`; None when the body is whole."""


class StreamedReply:
    """A reply whose body is read as it arrives (server-sent events): `DirectSender.stream`'s answer."""

    __slots__ = ("_opened", "headers", "status_code", "url")

    def __init__(self, opened: _Opened, url: httpx.URL) -> None:
        self._opened = opened
        self.status_code = opened.status
        self.headers = opened.headers
        self.url = url

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (as sent: a stream is not decompressed)."""
        if self._opened.first:
            yield self._opened.first
        if self._opened.rest is not None:
            async for chunk in self._opened.rest:
                yield chunk

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines as they complete, without their line ends."""
        partial = b""
        async for chunk in self.chunks():
            *complete, partial = (partial + chunk).split(b"\n")
            for line in complete:
                yield line.rstrip(b"\r").decode("utf-8", errors="replace")
        if partial:
            yield partial.rstrip(b"\r").decode("utf-8", errors="replace")

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        return b"".join([chunk async for chunk in self.chunks()])


class DirectSender:
    """Requests on a `KeepAliveTransport` itself: every request of reinforge's own clients (the store
    client, the upstream backend, the runner's gateway client) goes this one way.

    Why: `httpx.AsyncClient.send` spends more per call on its own machinery (cookie jar, auth flow,
    event hooks, redirect handling, URL merging, header models) than the exchange costs on a
    keep-alive connection (docs/benchmarks-history.md has the figures), and reinforge's clients
    need none of it. A plain-HTTP request goes out as bytes built here (the fixed headers encoded
    once); an HTTPS one as an `httpx.Request` through the transport, which hands it to httpx's own.
    The answer is a `Reply` read to its end (`send`) or a `StreamedReply` (`stream`); failures are
    httpx's exceptions.
    """

    def __init__(
        self, transport: KeepAliveTransport, headers: dict[str, str], timeout: httpx.Timeout
    ) -> None:
        self.transport = transport
        self._headers = dict(headers)
        self._header_lines = _header_lines(self._headers)
        self._extensions = {"timeout": timeout.as_dict()}

    async def send(
        self,
        method: str,
        url: httpx.URL,
        body: bytes | None = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> Reply:
        """Send one request and read its whole reply; `headers` add to (or replace) the fixed ones."""
        status, raw_headers, data, rest = await self._open(method, url, body, headers, timeout)
        if rest is not None:
            try:
                data += b"".join([chunk async for chunk in rest])
            finally:
                await rest.aclose()  # a read cut short closes the connection instead of keeping it busy
        if _encoded(raw_headers):
            data = httpx.Response(status, headers=raw_headers, content=data).content
        return Reply(status, raw_headers, data, url)

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        url: httpx.URL,
        body: bytes | None = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> AsyncIterator[StreamedReply]:
        """Send one request and read its reply as it arrives: `async with sender.stream(...) as reply`.
        Leaving the block before the body ended closes the connection."""
        opened = await self._open(method, url, body, headers, timeout)
        try:
            yield StreamedReply(opened, url)
        finally:
            if opened.rest is not None:
                await opened.rest.aclose()

    async def _open(
        self,
        method: str,
        url: httpx.URL,
        body: bytes | None,
        headers: dict[str, str] | None,
        timeout: httpx.Timeout | None,
    ) -> _Opened:
        extensions = self._extensions if timeout is None else {"timeout": timeout.as_dict()}
        transport = self.transport
        if url.scheme != "http":
            merged = self._headers if headers is None else {**self._headers, **headers}
            request = httpx.Request(method, url, headers=merged, content=body, extensions=extensions)
            response = await transport.handle_async_request(request)
            return _Opened(response.status_code, list(response.headers.raw), b"", response.stream)
        content = body or b""
        port = url.port or 80
        fixed = self._header_lines if headers is None else _header_lines({**self._headers, **headers})
        lines = b"host: %s:%d\r\n%scontent-length: %d\r\n" % (url.host.encode(), port, fixed, len(content))
        wire = _wire_bytes(method.encode(), url.raw_path, lines, content)
        pool = transport._pool(asyncio.get_running_loop())
        stand_in = _WireRequest(method, url, extensions)
        answer = await transport.send_wire(httpx, pool, url.host, port, wire, stand_in)
        body_in = answer.body
        if body_in.done and body_in.error is None:
            return _Opened(answer.status, answer.headers, body_in.take(), None)  # the usual case
        rest = _stream_class(httpx)(body_in, answer.conn, pool, answer.timeout, stand_in)
        return _Opened(answer.status, answer.headers, body_in.take(), rest)


def _header_lines(headers: dict[str, str]) -> bytes:
    return b"".join(b"%s: %s\r\n" % (name.encode(), value.encode()) for name, value in headers.items())


def _encoded(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the body came compressed (`Content-Encoding` other than identity)."""
    value = _header_value(headers, b"content-encoding")
    return value is not None and value.strip().lower() not in (b"", b"identity")
