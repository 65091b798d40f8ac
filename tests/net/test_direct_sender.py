"""`DirectSender`: the clients' fixed routes sent on the transport itself, with httpx's answers."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from reinforge.net.keepalive_transport import DirectSender, KeepAliveTransport

from .test_keepalive_transport import RawServer, raw  # noqa: F401  (the fixture)


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


async def test_any_other_transport_gets_an_httpx_request() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json={"echo": json.loads(request.content)})

    sender = DirectSender(httpx.MockTransport(answer), {"Content-Type": "application/json"}, httpx.Timeout(5))
    response = await sender.send("PUT", httpx.URL("https://store.example/v1/x"), b'{"a":1}')
    assert (response.status_code, response.json()) == (201, {"echo": {"a": 1}})
    assert seen[0].method == "PUT" and seen[0].headers["content-type"] == "application/json"
