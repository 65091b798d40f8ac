"""`DirectSender`: the clients' fixed routes sent on the transport itself, answered with whole `Reply`s
and failing with httpx's exceptions."""

from __future__ import annotations

import asyncio
import gzip
import json

import httpx
import pytest

from reinforge.errors import StoreUnavailableError
from reinforge.net.keepalive_transport import DirectSender, KeepAliveTransport
from reinforge.store.http.client import HttpStoreClient

from .test_keepalive_transport import RawServer, raw  # noqa: F401  (the fixture)


async def _serve(answer: bytes) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(RawServer(answer).handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_keepalive_requests_go_out_as_built_and_reuse_one_connection(
    raw: tuple[RawServer, str],  # noqa: F811  (the imported fixture)
) -> None:
    server, url = raw
    sender = DirectSender(KeepAliveTransport(), {"Authorization": "Bearer k"}, httpx.Timeout(5))
    for i in range(3):
        response = await sender.send("POST", httpx.URL(f"{url}/r/a/finish?x={i}"), b'{"n":%d}' % i)
        assert (response.status_code, json.loads(response.content)) == (200, {"ok": True})
    assert server.connections == 1
    head, _, body = server.requests[2].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /r/a/finish?x=2 HTTP/1.1"
    assert b"Authorization: Bearer k" in lines
    assert b"content-length: 7" in lines and body == b'{"n":2}'
    other = await sender.send("POST", httpx.URL(url + "/x"), b"{}", headers={"Authorization": "Bearer z"})
    assert other.status_code == 200
    assert b"Authorization: Bearer z" in server.requests[-1] and b"Bearer k" not in server.requests[-1]
    await sender.transport.aclose()


async def test_a_silent_server_times_out_with_httpx_exception() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        await asyncio.sleep(2)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sender = DirectSender(KeepAliveTransport(), {}, httpx.Timeout(0.2))
    try:
        with pytest.raises(httpx.ReadTimeout):
            await sender.send("POST", httpx.URL(f"http://127.0.0.1:{port}/"), b"{}")
        with pytest.raises(httpx.ConnectError):
            await sender.send("POST", httpx.URL("http://127.0.0.1:9/"), b"{}")
    finally:
        server.close()
        await sender.transport.aclose()


async def test_a_stream_gives_its_lines_as_they_arrive_and_an_early_exit_closes_the_connection() -> None:
    release = asyncio.Event()

    async def events(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for piece in (b"data: 1\r\n\r\nda", b"ta: 2\n\n", b"data: [DONE]\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                await release.wait()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    server = await asyncio.start_server(events, "127.0.0.1", 0)
    url = httpx.URL(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions")
    sender = DirectSender(KeepAliveTransport(), {}, httpx.Timeout(5))
    try:
        async with sender.stream("POST", url, b"{}") as reply:
            assert reply.status_code == 200
            lines = reply.lines()
            assert await anext(lines) == "data: 1"  # before the server sent the rest
            release.set()
            assert [line async for line in lines] == ["", "data: 2", "", "data: [DONE]", ""]
        release.clear()
        async with sender.stream("POST", url, b"{}") as reply:
            assert await anext(reply.lines()) == "data: 1"
        conn = sender.transport._pool(asyncio.get_running_loop()).origins["127.0.0.1", url.port]
        assert (conn.busy, conn.idle) == (0, [])  # left mid-body: closed, not kept busy or idle
    finally:
        release.set()
        server.close()
        await sender.transport.aclose()


async def test_a_reply_whose_body_comes_after_its_head_is_read_whole() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        for piece in (b'{"a":', b" 1}"):
            await asyncio.sleep(0.05)
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    server = await asyncio.start_server(slow, "127.0.0.1", 0)
    sender = DirectSender(KeepAliveTransport(), {}, httpx.Timeout(5))
    try:
        url = httpx.URL(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/x")
        reply = await sender.send("POST", url, b"{}")
        assert (reply.status_code, reply.content, reply.header("transfer-encoding")) == (
            200,
            b'{"a": 1}',
            "chunked",
        )
    finally:
        server.close()
        await sender.transport.aclose()


async def test_a_compressed_reply_is_decoded() -> None:
    packed = gzip.compress(b'{"ok": true}')
    answer = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (
        len(packed),
        packed,
    )
    server, url = await _serve(answer)
    sender = DirectSender(KeepAliveTransport(), {}, httpx.Timeout(5))
    try:
        reply = await sender.send("POST", httpx.URL(url + "/x"), b"{}")
        assert json.loads(reply.content) == {"ok": True} and reply.text == '{"ok": true}'
    finally:
        server.close()
        await sender.transport.aclose()


async def test_the_store_client_names_the_url_of_an_error_page_that_is_not_json() -> None:
    page = b"<html>bad gateway</html>"
    answer = b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (
        len(page),
        page,
    )
    server, url = await _serve(answer)
    client = HttpStoreClient(url, token="t", connect_retries=0)
    try:
        with pytest.raises(
            StoreUnavailableError, match=r"HTTP 502 from http://127\.0\.0\.1:\d+/.*bad gateway"
        ):
            await client.lease_rollouts("runner-1")
    finally:
        server.close()
        await client.close()


async def test_a_read_cancelled_mid_body_frees_the_connection_for_the_next_request() -> None:
    calls = 0

    async def first_stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            calls += 1
            if calls == 1:  # a head and part of the body, then nothing
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    server = await asyncio.start_server(first_stalls, "127.0.0.1", 0)
    url = httpx.URL(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/x")
    sender = DirectSender(KeepAliveTransport(max_connections=1), {}, httpx.Timeout(5, pool=1))
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sender.send("POST", url, b"{}"), 0.3)
        reply = await sender.send("POST", url, b"{}")  # the one connection slot is free again
        assert (reply.status_code, reply.content, calls) == (200, b"ok", 2)
    finally:
        server.close()
        await sender.transport.aclose()
