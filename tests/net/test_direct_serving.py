"""The gateway's routes served by `RouteTableProtocol` answer exactly as through the ASGI stack,
over the HTTP/1.1 details a lean path could get wrong: pipelining, a body that comes after the head,
chunked bodies, `Connection: close`, and a parent app whose middleware must not be skipped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import Response

from reinforge.access import attempt_token
from reinforge.gateway import create_gateway_app
from reinforge.inference import ScriptedBackend
from reinforge.net.background import BackgroundServer
from reinforge.net.route_protocol import RouteTableProtocol, find_route, served_routes
from reinforge.net.routes import Route as TableRoute
from reinforge.net.routes import RouteRequest, RouteTable
from reinforge.store.http.server import create_store_app
from reinforge.store.memory import MemoryStore
from reinforge.types import SpanQuery

from .conftest import SECRET, Served, running_attempt

CHAT = json.dumps({"model": "p", "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_the_route_table_covers_the_gateway_alone_and_mounted(tokenizer: Any) -> None:
    store = MemoryStore()
    alone = create_gateway_app(store, ScriptedBackend(tokenizer, ["x"]), SECRET)
    table = served_routes(alone)
    found = find_route(table, "POST", "/r/a1/v1/chat/completions")
    assert found is not None and found[2] == {"attempt_id": "a1"}
    found = find_route(table, "POST", "/r/a1/agents/planner/v1/completions")
    assert found is not None and found[2] == {"attempt_id": "a1", "agent_name": "planner"}
    assert find_route(table, "GET", "/r/a1/v1/chat/completions") is None  # 405: the app answers
    assert find_route(table, "POST", "/r/a1/v1/chat/completions/extra") is None
    assert find_route(table, "GET", "/health") is not None

    parent = create_store_app(store, "store-token")
    parent.mount("/gateway", alone)
    mounted = served_routes(parent)
    found = find_route(mounted, "POST", "/gateway/r/a-1/v1/chat/completions")
    assert found is not None and found[2] == {"attempt_id": "a-1"}
    assert find_route(mounted, "POST", "/r/a1/v1/chat/completions") is None
    assert find_route(mounted, "GET", "/store/counters") is None  # the store's other routes stay its own
    found = find_route(mounted, "POST", "/store/rollouts/lease")  # its per-rollout table is served too
    assert found is not None and found[1] is parent.state.route_table

    alone.add_middleware(BaseHTTPMiddleware, dispatch=_tag)
    assert served_routes(alone) == []  # its middleware must run
    assert {table for *_, table in served_routes(parent)} == {parent.state.route_table}  # the store's own


async def _tag(request: Request, call_next: RequestResponseEndpoint) -> Response:
    response = await call_next(request)
    response.headers["x-tagged"] = "yes"
    return response


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return status, headers, body


def _request(attempt_id: str, body: bytes = CHAT, extra: str = "") -> bytes:
    token = attempt_token(SECRET, attempt_id)
    return (
        f"POST /r/{attempt_id}/v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


async def _connect(served: Served) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = served.url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def test_pipelined_requests_are_answered_in_order(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    reader, writer = await _connect(served)
    writer.write(
        _request(attempt_id)
        + f"GET /r/{attempt_id}/v1/chat/completions HTTP/1.1\r\nHost: t\r\n\r\n".encode()
        + _request(attempt_id)
        + b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
    )
    await writer.drain()
    answers = [await _read_response(reader) for _ in range(4)]
    writer.close()
    assert [status for status, _, _ in answers] == [200, 405, 200, 200]
    first, wrong_method, second, health = (json.loads(body) for _, _, body in answers)
    assert first["choices"][0]["message"]["content"] == "The answer is 5."
    assert first["id"] != second["id"] and second["object"] == "chat.completion"
    assert wrong_method["error"]["type"] == "invalid_request_error"  # the app's OpenAI-shaped 405
    assert health["calls"] == 2
    await served.gateway.flush(attempt_id)
    assert (await served.store.query_spans(SpanQuery(attempt_id=attempt_id))).total == 2


async def test_a_body_that_comes_after_the_head(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    reader, writer = await _connect(served)
    request = _request(attempt_id)
    split = request.index(b"\r\n\r\n") + 4
    writer.write(request[:split])
    await writer.drain()
    await asyncio.sleep(0.1)  # the request waits for its body before its handler starts
    writer.write(request[split : split + 5])
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.write(request[split + 5 :])
    status, _, body = await _read_response(reader)
    writer.close()
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "The answer is 5."


async def test_a_chunked_body_and_connection_close(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    reader, writer = await _connect(served)
    token = attempt_token(SECRET, attempt_id)
    half = len(CHAT) // 2
    writer.write(
        f"POST /r/{attempt_id}/v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
        f"Authorization: Bearer {token}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode()
        + f"{half:x}\r\n".encode()
        + CHAT[:half]
        + f"\r\n{len(CHAT) - half:x}\r\n".encode()
        + CHAT[half:]
        + b"\r\n0\r\n\r\n"
    )
    status, headers, body = await _read_response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert json.loads(body)["object"] == "chat.completion"
    assert await reader.read() == b""  # and the server closed the connection
    writer.close()


@contextlib.asynccontextmanager
async def _small_body_limit_gateway(
    tokenizer: Any,
) -> AsyncIterator[tuple[str, asyncio.StreamReader, asyncio.StreamWriter]]:
    """A gateway that takes bodies up to 1 KiB, a running attempt and a raw connection to it."""
    store = MemoryStore()
    app = create_gateway_app(store, ScriptedBackend(tokenizer, ["ok"]), SECRET, max_body_bytes=1024)
    with BackgroundServer(app) as server:
        served = Served(server.url, store, ScriptedBackend(tokenizer, ["x"]), app)
        attempt_id = (await running_attempt(store)).attempt.attempt_id
        reader, writer = await _connect(served)
        yield attempt_id, reader, writer


async def test_unauthorised_and_oversize_calls_keep_the_connection(tokenizer: Any) -> None:
    async with _small_body_limit_gateway(tokenizer) as (attempt_id, reader, writer):
        writer.write(_request(attempt_id).replace(b"Bearer rf-", b"Bearer xx-"))
        status, _, body = await _read_response(reader)
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
        writer.write(_request(attempt_id, b"{" + b" " * 2000 + b"}"))
        status, _, body = await _read_response(reader)
        assert status == 413 and json.loads(body)["error"]["type"] == "invalid_request_error"
        writer.write(_request(attempt_id))  # the same keep-alive connection still serves
        status, _, body = await _read_response(reader)
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "ok"
        writer.close()


async def test_a_large_body_is_refused_from_its_head(tokenizer: Any) -> None:
    """A body too large to buffer first is streamed: the size limit answers before it is sent."""
    async with _small_body_limit_gateway(tokenizer) as (attempt_id, reader, writer):
        head = _request(attempt_id, b"x" * 1_000_000).split(b"\r\n\r\n")[0] + b"\r\n\r\n"
        writer.write(head)
        status, _, body = await asyncio.wait_for(_read_response(reader), 10)
        writer.close()
        assert status == 413 and json.loads(body)["error"]["type"] == "invalid_request_error"


async def test_expect_100_continue_is_answered_before_the_body(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    reader, writer = await _connect(served)
    request = _request(attempt_id, extra="Expect: 100-continue\r\n")
    split = request.index(b"\r\n\r\n") + 4
    writer.write(request[:split])
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert interim.startswith(b"HTTP/1.1 100 ")
    writer.write(request[split:])
    status, _, body = await _read_response(reader)
    writer.close()
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "The answer is 5."


async def test_a_parent_apps_middleware_still_runs(tokenizer: Any) -> None:
    store = MemoryStore()
    parent = FastAPI()
    parent.add_middleware(BaseHTTPMiddleware, dispatch=_tag)
    parent.mount("/gateway", create_gateway_app(store, ScriptedBackend(tokenizer, ["tagged"]), SECRET))
    assert served_routes(parent) == []
    with BackgroundServer(parent) as server:
        attempt_id = (await running_attempt(store)).attempt.attempt_id
        async with httpx.AsyncClient(base_url=server.url + "/gateway") as http:
            response = await http.post(
                f"/r/{attempt_id}/v1/chat/completions",
                content=CHAT,
                headers={"Authorization": f"Bearer {attempt_token(SECRET, attempt_id)}"},
            )
        assert response.status_code == 200 and response.headers["x-tagged"] == "yes"
        assert response.json()["choices"][0]["message"]["content"] == "tagged"


async def test_the_served_routes_skip_the_asgi_stack() -> None:
    """A route only the table knows answers (through the ASGI app it would be a 404): the direct
    path is engaged under `BackgroundServer` (a uvicorn change that dropped its hook would fail here)."""

    async def probe(request: RouteRequest) -> Response:
        return Response(b"direct " + request.body)

    app = Starlette()
    app.state.route_table = RouteTable(
        [TableRoute("POST", "/probe", probe)],
        max_body_bytes=1024,
        on_error=lambda _, exc: Response(status_code=500),
    )
    with BackgroundServer(app) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            answer = await http.post("/probe", content=b"hello")
            assert (answer.status_code, answer.content) == (200, b"direct hello")
            assert (await http.get("/elsewhere")).status_code == 404  # the app's own answer


async def test_keep_alive_closes_an_idle_connection_only(tokenizer: Any) -> None:
    """A connection in use stays open past the keep-alive timeout; one left idle for it is closed."""
    app = create_gateway_app(MemoryStore(), ScriptedBackend(tokenizer, ["x"]), SECRET)
    config = uvicorn.Config(
        app, http=RouteTableProtocol, timeout_keep_alive=0.5, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        await asyncio.sleep(0.01)
    reader, writer = await asyncio.open_connection(*listener.getsockname())
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        while loop.time() - started < 1.2:  # over two timeouts' worth, never idle for one
            writer.write(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            status, _, _ = await _read_response(reader)
            assert status == 200
            idle_from = loop.time()  # idle from the last response on, the sleep below included
            await asyncio.sleep(0.1)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the server closed it
        assert 0.4 < loop.time() - idle_from < 3.0
    finally:
        writer.close()
        server.should_exit = True
        await serving
