"""`KeepAliveTransport` under `httpx.AsyncClient` against real sockets: reuse, chunked bodies, servers
that close or go silent, connection limits, loops in two threads."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from reinforge.net.keepalive_transport import KeepAliveTransport


def keepalive_client(url: str, **kwargs: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, transport=KeepAliveTransport(), **kwargs)  # type: ignore[arg-type]


async def post(
    client: httpx.AsyncClient, body: bytes, timeout: float = 5, path: str = "/"
) -> tuple[int, bytes]:
    response = await client.post(path, content=body, timeout=timeout)
    return response.status_code, response.content


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
    async with keepalive_client(url, headers={"Authorization": "Bearer k"}) as client:
        for n in range(5):
            status, body = await post(client, json.dumps({"n": n}).encode(), path="/v1/x")
            assert (status, json.loads(body)) == (200, {"ok": True})
    assert server.connections == 1
    assert server.requests[0].startswith(b"POST /v1/x HTTP/1.1\r\n")
    assert b"Authorization: Bearer k\r\n" in server.requests[0]
    assert b"Content-Length: 8\r\n" in server.requests[4]
    assert server.requests[4].endswith(b'{"n": 4}')


async def test_chunked_bodies_and_closing_servers() -> None:
    chunked = (
        b"HTTP/1.1 502 Bad Gateway\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    server = RawServer(chunked, close_after=True)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    async with keepalive_client(url) as client:
        for _ in range(3):  # each answer closes its connection; the next request opens a fresh one
            assert await post(client, b"{}") == (502, b"hello world")
        assert server.connections == 3
        listener.close()
        await listener.wait_closed()
        with pytest.raises(httpx.ConnectError, match="can't connect"):
            await post(client, b"{}")


async def test_a_truncated_response_is_an_error() -> None:
    server = RawServer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", close_after=True)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    async with keepalive_client(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}") as client:
        with pytest.raises(httpx.RemoteProtocolError, match="closed before the response was complete"):
            await post(client, b"{}")
    listener.close()


async def test_a_connection_closed_before_any_reply_is_a_protocol_error() -> None:
    """A connection that dies with the request in flight fails the call (it may have been applied:
    re-sending is the caller's choice); the next call connects afresh."""
    calls = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        calls += 1
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
        if calls > 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with keepalive_client(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}") as client:
        with pytest.raises(httpx.RemoteProtocolError, match="closed before the response was complete"):
            await post(client, b"{}")
        assert await post(client, b"{}") == (200, b"ok")
    listener.close()


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
    client = keepalive_client(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(httpx.ReadTimeout):
        await post(client, b"{}", timeout=0.2)
    assert 0.15 < loop.time() - started < 2.0
    assert await post(client, b"{}") == (200, b"ok")
    assert answered == 1
    await client.aclose()
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
    client = keepalive_client(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}")
    loop = asyncio.get_running_loop()
    assert await post(client, b"answer", timeout=30) == (200, b"ok")  # its timer is set 30 s out
    started = loop.time()
    later, sooner, last = (asyncio.create_task(post(client, b"silent", timeout=t)) for t in (0.6, 0.2, 30))
    for call, timeout, by in ((sooner, 0.2, 0.55), (later, 0.6, 1.6)):  # sooner: before `later`'s
        with pytest.raises(httpx.ReadTimeout):
            await call
        assert timeout - 0.05 < loop.time() - started < by
    assert not last.done()
    assert await post(client, b"answer") == (200, b"ok")
    last.cancel()
    await client.aclose()
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
    transport = KeepAliveTransport()
    client = httpx.AsyncClient(base_url=server.url, transport=transport)
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    async def calls(tag: str) -> list[bytes]:
        barrier.wait(10)  # both loops are calling at the same time
        bodies = [f"{tag}-{n}".encode() for n in range(60)]
        replies = await asyncio.gather(*(post(client, b, timeout=10) for b in bodies))
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
        assert len(transport._pools) == 2
        # Both loops are closed now: the next loop's first call drops their pools.
        assert asyncio.run(post(client, b"c", timeout=10)) == (200, b"c")
        assert len(transport._pools) == 1
    finally:
        asyncio.run(client.aclose())
        server.stop()


def test_close_reaches_a_pool_whose_loop_runs_in_another_thread() -> None:
    server = _EchoServer()
    transport = KeepAliveTransport()
    client = httpx.AsyncClient(base_url=server.url, transport=transport)
    other = asyncio.new_event_loop()
    worker = threading.Thread(target=other.run_forever, daemon=True)
    worker.start()
    try:
        done = asyncio.run_coroutine_threadsafe(post(client, b"x", timeout=10), other)
        assert done.result(10) == (200, b"x")
        pool = transport._pools[other]
        (origin,) = pool.origins.values()
        assert len(origin.idle) == 1
        conn = origin.idle[0]
        asyncio.run(client.aclose())  # from this thread's loop, while `other` runs: scheduled on `other`
        deadline = time.monotonic() + 10
        while not conn.closed:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert transport._pools == {} and pool.origins == {} and origin.idle == []
    finally:
        other.call_soon_threadsafe(other.stop)
        worker.join(10)
        other.close()
        server.stop()


async def test_max_connections_bounds_a_loops_connections_to_an_origin() -> None:
    """Calls beyond the bound wait for a connection to come free (up to the pool timeout) instead of
    opening another."""
    release = asyncio.Event()
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                body = await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
                await release.wait()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    async with httpx.AsyncClient(base_url=url, transport=KeepAliveTransport(max_connections=2)) as client:
        calls = [asyncio.create_task(post(client, b"%d" % n)) for n in range(6)]
        await asyncio.sleep(0.2)
        with pytest.raises(httpx.PoolTimeout):
            await client.post("/", content=b"late", timeout=httpx.Timeout(5, pool=0.1))
        release.set()
        assert await asyncio.gather(*calls) == [(200, b"%d" % n) for n in range(6)]
    assert connections == 2
    listener.close()
    await listener.wait_closed()


async def test_a_stalled_stream_times_out_and_a_stream_left_early_frees_its_connection() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                assert b"Transfer-Encoding: chunked" in head
                assert await reader.readuntil(b"0\r\n\r\n") == b"4\r\nup!!\r\n0\r\n\r\n"
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
                await writer.drain()  # and the rest never comes
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def upload() -> AsyncIterator[bytes]:
        yield b"up"
        yield b"!!"

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    transport = KeepAliveTransport(max_connections=1)
    async with httpx.AsyncClient(base_url=url, transport=transport, timeout=0.3) as client:
        async with client.stream("POST", "/", content=upload()) as response:
            parts = response.aiter_bytes()
            assert await parts.__anext__() == b"first"
            with pytest.raises(httpx.ReadTimeout):
                await parts.__anext__()
        async with client.stream("POST", "/", content=upload()) as response:
            assert await response.aiter_bytes().__anext__() == b"first"
        # Left with its body unread: its connection is closed, and the one slot is free again.
        (origin,) = transport._pools[asyncio.get_running_loop()].origins.values()
        assert origin.busy == 0 and origin.idle == []
    listener.close()
    await listener.wait_closed()
