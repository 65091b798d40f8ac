"""`GatewayTransport`: an httpx transport that speaks HTTP/1.1 to plain-HTTP origins (the gateway)
straight over asyncio, for the OpenAI clients of agents that run many short LLM calls.

Why: a chat call of a small policy costs the gateway about a millisecond, and the generic stack
under the OpenAI SDK (httpcore's connection pool, anyio streams, h11 events) spent more than that
per request in the agent's process: a third of the agents' CPU in `benchmarks/trainer_bench.py`.
This transport writes the request httpx built as it is (method, target, headers, body) on a
pooled keep-alive connection and parses the reply with httptools (the C parser uvicorn uses).
Everything above the transport (the SDK's retries and errors, httpx's auth, redirects, timeouts
configuration and response model) is unchanged. HTTPS, other schemes and HEAD requests go to
httpx's own transport.

It works with both `httpx` and `httpx2` (the fork recent OpenAI SDKs use): responses, streams and
errors are built from the package of the request it is handed.
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from collections.abc import AsyncIterator
from functools import cache
from types import ModuleType
from typing import Any, cast

import httptools


class _Body:
    """A response body that may still be arriving (server-sent events): chunks as they come."""

    __slots__ = ("chunks", "done", "error", "waiter")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None

    def feed(self, data: bytes) -> None:
        self.chunks.append(data)
        self._wake()

    def finish(self, error: BaseException | None = None) -> None:
        if not self.done:
            self.done, self.error = True, error
            self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            if self.chunks:
                chunks, self.chunks = self.chunks, []
                yield b"".join(chunks)
            elif self.done:
                if self.error is not None:
                    raise self.error
                return
            else:
                self.waiter = asyncio.get_running_loop().create_future()
                await self.waiter
                self.waiter = None


class _Connection(asyncio.Protocol):
    """One keep-alive connection; `exchange` sends a request and waits for the reply's head."""

    def __init__(self, pool: list[_Connection], max_idle: int) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.pool, self.max_idle = pool, max_idle
        self.head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]], _Body]] | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: _Body | None = None
        self.closed = False
        self.got_bytes = False
        self.error_type: type[Exception] = ConnectionError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"malformed HTTP response: {exc}")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(f"connection closed before the response was complete ({exc})")

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim response (100 Continue): its final one follows
            self.headers = []
            return
        self.body = _Body()
        if self.head is not None and not self.head.done():
            self.head.set_result((status, self.headers, self.body))

    def on_body(self, data: bytes) -> None:
        if self.body is not None:
            self.body.feed(data)

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() < 200:
            return
        keep_alive = self.parser.should_keep_alive()
        if self.body is not None:
            self.body.finish()
        self.head, self.body, self.headers = None, None, []
        # The reply is whole (its bytes are buffered in its body): the connection can serve another.
        if keep_alive and not self.closed and len(self.pool) < self.max_idle:
            self.pool.append(self)
        else:
            self.close()

    def _fail(self, message: str) -> None:
        error = self.error_type(message)
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
        if self.body is not None:
            self.body.finish(error)
            self.body = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class GatewayTransport:
    """An httpx (or httpx2) async transport: plain-HTTP requests on pooled keep-alive connections
    written and parsed directly; anything else through httpx's default transport.

    Pass it to an httpx client: `httpx2.AsyncClient(transport=GatewayTransport())`, or use
    `gateway_http_client()` for a ready OpenAI-SDK client. Connections belong to the event loop
    they were opened on; the transport follows the running loop.
    """

    def __init__(self, max_idle_per_origin: int = 256) -> None:
        self._max_idle = max_idle_per_origin
        self._pools: dict[tuple[str, int], list[_Connection]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fallback: Any = None

    async def handle_async_request(self, request: Any) -> Any:
        mod = _package_of(request)
        url = request.url
        if url.scheme != "http" or request.method == "HEAD":  # a HEAD reply's length has no body
            if self._fallback is None:
                self._fallback = mod.AsyncHTTPTransport()
            return await self._fallback.handle_async_request(request)
        body = await request.aread()
        target = url.raw_path.decode("ascii")
        head = "".join(f"{k}: {v}\r\n" for k, v in _header_lines(request.headers.raw))
        wire = f"{request.method} {target} HTTP/1.1\r\n{head}\r\n".encode("latin-1") + body
        timeout = _timeout(request, "read")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._pools, self._loop = {}, loop  # another loop's connections can't serve this one
        host, port = url.host, url.port or 80
        pool = self._pools.setdefault((host, port), [])
        try:
            while pool:
                conn = pool.pop()
                if conn.closed:
                    continue
                try:
                    return await self._exchange(mod, conn, wire, request, timeout)
                except ConnectionError:
                    # The server closed an idle connection before reading the request: it saw
                    # nothing, so a fresh connection may carry it.
                    if conn.got_bytes:
                        raise
            try:
                async with asyncio.timeout(_timeout(request, "connect")):
                    _, conn = await loop.create_connection(
                        lambda: _Connection(pool, self._max_idle), host, port
                    )
            except TimeoutError as exc:
                raise mod.ConnectTimeout(f"connecting to {host}:{port} timed out") from exc
            except OSError as exc:
                raise mod.ConnectError(f"can't connect to {host}:{port}: {exc}") from exc
            return await self._exchange(mod, conn, wire, request, timeout)
        except ConnectionError as exc:
            raise mod.RemoteProtocolError(str(exc), request=request) from exc

    async def _exchange(
        self, mod: ModuleType, conn: _Connection, wire: bytes, request: Any, timeout: float | None
    ) -> Any:
        assert conn.transport is not None
        conn.got_bytes = False
        head = conn.head = asyncio.get_running_loop().create_future()
        try:
            conn.transport.write(wire)
            if timeout is None:
                status, headers, body = await head
            else:
                async with asyncio.timeout(timeout):
                    status, headers, body = await head
        except TimeoutError as exc:
            conn.close()
            raise mod.ReadTimeout("the server did not answer in time", request=request) from exc
        except BaseException:
            conn.close()
            raise
        if body.done and body.error is None:
            # The whole reply came with its head (the usual case): no streaming machinery.
            stream = mod.ByteStream(b"".join(body.chunks))
        else:
            stream = _stream_class(mod)(body, mod)
        return mod.Response(status, headers=headers, stream=stream, extensions={"http_version": b"HTTP/1.1"})

    async def aclose(self) -> None:
        for pool in self._pools.values():
            for conn in pool:
                conn.close()
        self._pools.clear()
        if self._fallback is not None:
            await self._fallback.aclose()
            self._fallback = None

    async def __aenter__(self) -> GatewayTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()


def gateway_http_client() -> Any:
    """The OpenAI SDK's async HTTP client with a `GatewayTransport`, one per event loop, shared.

        client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, http_client=gateway_http_client())

    Sharing one client also spares each rollout's `AsyncOpenAI` the SSL context a fresh httpx client
    builds (tens of milliseconds). Needs the `openai` package; the SDK's defaults (timeouts, limits,
    redirects) are kept.
    """
    loop = asyncio.get_running_loop()
    client = _CLIENTS.get(loop)
    if client is None or client.is_closed:
        try:
            from openai import DefaultAsyncHttpxClient
        except ImportError as exc:  # pragma: no cover - openai is how agents reach the gateway
            raise ImportError("gateway_http_client() is for the OpenAI SDK: pip install openai") from exc
        client = DefaultAsyncHttpxClient(transport=GatewayTransport())  # type: ignore[arg-type]
        _CLIENTS[loop] = client
    return client


def _package_of(request: Any) -> ModuleType:
    """`httpx` or `httpx2`: whichever built the request."""
    return sys.modules[type(request).__module__.partition(".")[0]]


@cache
def _stream_class(mod: ModuleType) -> type:
    """A streaming body type of `mod` (its clients check for their own AsyncByteStream)."""

    class _Stream(mod.AsyncByteStream):  # type: ignore[name-defined]
        def __init__(self, body: _Body, package: ModuleType) -> None:
            self._body, self._mod = body, package

        async def __aiter__(self) -> AsyncIterator[bytes]:
            try:
                async for chunk in self._body:
                    yield chunk
            except ConnectionError as exc:
                raise self._mod.RemoteProtocolError(str(exc)) from exc

        async def aclose(self) -> None:
            return None

    return _Stream


def _header_lines(raw: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw]


def _timeout(request: Any, kind: str) -> float | None:
    """The request's `connect` or `read` timeout in seconds (None: wait as long as it takes)."""
    value = (request.extensions.get("timeout") or {}).get(kind)
    return None if value is None else float(value)
