"""One route table, three ways to serve it (Starlette routes, an ASGI front, uvicorn's protocol
without the ASGI stack): the same answers, head checks before the body, one body-size rule."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, Response

from reinforge.net.background import BackgroundServer
from reinforge.net.routes import (
    BadContentLengthError,
    BodyTooLargeError,
    Route,
    RouteRequest,
    RouteTable,
    RouteTableFront,
    path_regex,
)

LIMIT = 64


def test_path_patterns() -> None:
    one = path_regex("/r/{attempt_id}/v1/chat")
    assert one.match("/r/a-1/v1/chat").groupdict() == {"attempt_id": "a-1"}  # type: ignore[union-attr]
    assert one.match("/r/a/b/v1/chat") is None and one.match("/r//v1/chat") is None
    free = path_regex("/attempts/{attempt_id:path}/finish", prefix="/store", max_param_length=5)
    assert free.match("/store/attempts/a/b\nc/finish").groupdict() == {"attempt_id": "a/b\nc"}  # type: ignore[union-attr]
    assert free.match("/store/attempts/abcdef/finish") is None  # too long: left to the app behind
    assert free.match("/attempts/a/finish") is None


async def _echo(request: RouteRequest) -> Response:
    agent = request.header(b"x-agent") or "-"
    return PlainTextResponse(
        f"{request.method} {request.path_params['name']} {agent} {request.body.decode()}"
    )


async def _boom(request: RouteRequest) -> Response:
    raise RuntimeError("boom")


def _refuse_without_key(request: RouteRequest) -> None:
    if request.header(b"x-key") != "k":
        raise PermissionError("no key")


def _on_error(request: RouteRequest, exc: Exception) -> Response:
    if isinstance(exc, BodyTooLargeError):
        return PlainTextResponse(f"too large {exc.declared}", status_code=413)
    if isinstance(exc, BadContentLengthError):
        return PlainTextResponse("bad length", status_code=400)
    if isinstance(exc, PermissionError):
        return PlainTextResponse(str(exc), status_code=401)
    return PlainTextResponse(f"{type(exc).__name__}: {exc}", status_code=500)


def _table() -> RouteTable:
    return RouteTable(
        [Route("POST", "/echo/{name}", _echo), Route("GET", "/boom", _boom)],
        max_body_bytes=LIMIT,
        on_error=_on_error,
        check_head=_refuse_without_key,
    )


async def _fallback(scope: Any, receive: Any, send: Any) -> None:
    await PlainTextResponse("fallback", status_code=404)(scope, receive, send)


def _as_routes() -> Starlette:
    return Starlette(routes=_table().starlette_routes())


def _as_front() -> RouteTableFront:
    return RouteTableFront(_table(), _fallback)


def _served_directly() -> Starlette:
    app = Starlette()  # no routes: only the protocol's direct path can answer the table's
    app.state.route_table = _table()
    return app


@asynccontextmanager
async def _client(make: Callable[[], Any], direct: bool) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"x-key": "k"}
    if direct:
        with BackgroundServer(make()) as server:
            async with httpx.AsyncClient(base_url=server.url, headers=headers) as http:
                yield http
    else:
        transport = httpx.ASGITransport(app=make())
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as http:
            yield http


SERVINGS = [(_as_routes, False), (_as_front, False), (_served_directly, True)]


@pytest.mark.parametrize(
    ("make", "direct"), SERVINGS, ids=["starlette-routes", "asgi-front", "uvicorn-direct"]
)
async def test_every_serving_answers_alike(make: Callable[[], Any], direct: bool) -> None:
    async with _client(make, direct) as http:
        answer = await http.post("/echo/x", content=b"hello", headers={"x-agent": "planner"})
        assert (answer.status_code, answer.text) == (200, "POST x planner hello")
        refused = await http.post("/echo/x", content=b"hello", headers={"x-key": "wrong"})
        assert (refused.status_code, refused.text) == (401, "no key")  # before the body is read
        declared = await http.post("/echo/x", content=b"x" * (LIMIT + 1))
        assert (declared.status_code, declared.text) == (413, f"too large {LIMIT + 1}")

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(3):
                yield b"x" * 30

        streamed = await http.post("/echo/x", content=chunks())
        assert (streamed.status_code, streamed.text) == (413, "too large None")
        crashed = await http.get("/boom")
        assert (crashed.status_code, crashed.text) == (500, "RuntimeError: boom")


async def test_a_request_outside_the_table_goes_on() -> None:
    async with _client(_as_front, False) as http:
        assert (await http.get("/echo/x")).text == "fallback"  # a method the table does not serve
        assert (await http.post("/elsewhere")).status_code == 404
    async with _client(_as_routes, False) as http:
        assert (await http.get("/echo/x")).status_code == 405  # Starlette's own answer


async def test_a_mounted_table_gets_its_path_without_the_prefix() -> None:
    from starlette.routing import Mount

    inner = Starlette(routes=_table().starlette_routes())
    inner.state.route_table = _table()
    outer = Starlette(routes=[Mount("/sub", inner)])
    async with _client(lambda: outer, True) as http:
        answer = await http.post("/sub/echo/y", content=b"z")
        assert (answer.status_code, answer.text) == (200, "POST y - z")
