"""The gateway's keep-alive client against real sockets: reuse, chunked bodies, servers that close."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from reinforge.gateway.http11 import HTTPConnectionError, KeepAliveClient


class RawServer:
    """An HTTP/1.1 server on a raw socket, so each test picks the exact bytes it answers with."""

    def __init__(self, answer: bytes, close_after: bool = False) -> None:
        self.answer = answer
        self.close_after = close_after
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                self.requests.append(head + await reader.readexactly(length))
                writer.write(self.answer)
                await writer.drain()
                if self.close_after:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
async def raw() -> AsyncIterator[tuple[RawServer, str]]:
    body = b'{"ok": true}'
    server = RawServer(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    yield server, f"http://127.0.0.1:{port}"
    listener.close()


async def test_connections_are_reused(raw: tuple[RawServer, str]) -> None:
    server, url = raw
    client = KeepAliveClient(url, {"Authorization": "Bearer k"})
    for n in range(5):
        status, body = await client.post("/v1/x", json.dumps({"n": n}).encode(), timeout=5)
        assert (status, json.loads(body)) == (200, {"ok": True})
    assert server.connections == 1
    assert server.requests[0].startswith(b"POST /v1/x HTTP/1.1\r\n")
    assert b"Authorization: Bearer k\r\n" in server.requests[0]
    assert server.requests[4].endswith(b'{"n": 4}')
    client.close()


async def test_chunked_bodies_and_closing_servers() -> None:
    chunked = (
        b"HTTP/1.1 502 Bad Gateway\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    server = RawServer(chunked, close_after=True)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    client = KeepAliveClient(url)
    for _ in range(3):  # each answer closes its connection; the next request opens a fresh one
        assert await client.post("/", b"{}", timeout=5) == (502, b"hello world")
    assert server.connections == 3
    listener.close()
    await listener.wait_closed()
    with pytest.raises(OSError):
        await client.post("/", b"{}", timeout=5)


async def test_a_truncated_response_is_an_error() -> None:
    server = RawServer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", close_after=True)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    client = KeepAliveClient(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}")
    with pytest.raises(HTTPConnectionError, match="closed before the response was complete"):
        await client.post("/", b"{}", timeout=5)
    listener.close()
    with pytest.raises(ValueError, match="plain http"):
        KeepAliveClient("https://example.invalid")


async def test_a_silent_server_times_out_and_the_next_call_reconnects() -> None:
    """The deadline covers the whole call; a timed-out connection is dropped, never reused."""
    silent = asyncio.Event()
    answered = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
            if not silent.is_set():
                silent.set()
                await reader.read()  # never answers this one; returns once the client gives up
                return
            answered += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            await reader.read()
        finally:
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    client = KeepAliveClient(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await client.post("/", b"{}", timeout=0.2)
    assert 0.15 < loop.time() - started < 2.0
    assert await client.post("/", b"{}", timeout=5) == (200, b"ok")
    assert answered == 1
    client.close()
    listener.close()
    await listener.wait_closed()
    await asyncio.sleep(0.05)  # the handlers see the client's close and close their side


async def test_each_call_times_out_at_its_own_deadline() -> None:
    """Calls in flight share one timer: a shorter deadline than the one it is set for still fires on
    time, and after it fires the next deadline still does."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                if await reader.readexactly(length) == b"answer":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    client = KeepAliveClient(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}")
    loop = asyncio.get_running_loop()
    assert await client.post("/", b"answer", timeout=30) == (200, b"ok")  # its timer is set 30 s out
    started = loop.time()
    later, sooner, last = (
        asyncio.create_task(client.post("/", b"silent", timeout=t)) for t in (0.6, 0.2, 30)
    )
    for call, timeout, by in ((sooner, 0.2, 0.55), (later, 0.6, 1.6)):  # sooner: before `later`'s
        with pytest.raises(TimeoutError):
            await call
        assert timeout - 0.05 < loop.time() - started < by
    assert not last.done()
    assert await client.post("/", b"answer", timeout=5) == (200, b"ok")
    last.cancel()
    client.close()
    listener.close()
    await listener.wait_closed()
    await asyncio.sleep(0.05)
