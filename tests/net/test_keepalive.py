"""The gateway's keep-alive client against real sockets: reuse, chunked bodies, servers that close."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator

import pytest

from reinforge.net.keepalive import HTTPConnectionError, KeepAliveClient


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


class _EchoServer:
    """Answers each POST with its own body, on a loop in its own thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.connections = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.listener = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.sockets[0].getsockname()[1]}"
        ready.set()
        self.loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                body = await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
                await asyncio.sleep(0.001 * (body[-1] % 3))  # replies overtake each other
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        async def shutdown() -> None:
            self.listener.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_one_client_serves_loops_in_two_threads_at_once() -> None:
    """Each loop gets its own pool: every call gets its own reply back, whichever loop made it."""
    server = _EchoServer()
    client = KeepAliveClient(server.url)
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    async def calls(tag: str) -> list[bytes]:
        barrier.wait(10)  # both loops are calling at the same time
        bodies = [f"{tag}-{n}".encode() for n in range(60)]
        replies = await asyncio.gather(*(client.post("/", b, timeout=10) for b in bodies))
        assert replies == [(200, b) for b in bodies]
        return bodies

    def thread(tag: str) -> None:
        try:
            asyncio.run(calls(tag))
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=thread, args=(t,)) for t in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert len(client._pools) == 2
        # Both loops are closed now: the next loop's first call drops their pools.
        assert asyncio.run(client.post("/", b"c", timeout=10)) == (200, b"c")
        assert len(client._pools) == 1
    finally:
        client.close()
        server.stop()


def test_close_reaches_a_pool_whose_loop_runs_in_another_thread() -> None:
    server = _EchoServer()
    client = KeepAliveClient(server.url)
    other = asyncio.new_event_loop()
    worker = threading.Thread(target=other.run_forever, daemon=True)
    worker.start()
    try:
        done = asyncio.run_coroutine_threadsafe(client.post("/", b"x", timeout=10), other)
        assert done.result(10) == (200, b"x")
        pool = client._pools[other]
        assert len(pool.idle) == 1
        conn = pool.idle[0]
        client.close()  # from this thread, while `other` runs: scheduled on `other`
        deadline = time.monotonic() + 10
        while not conn.closed:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert client._pools == {} and pool.idle == []
    finally:
        other.call_soon_threadsafe(other.stop)
        worker.join(10)
        other.close()
        server.stop()
