"""Route tables: (method, path pattern, handler) served alike by any ASGI server and by uvicorn directly.

Why: the gateway's LLM calls and the store's per-rollout calls are hot enough that a framework's
per-request machinery (middleware layers, the router, a `Request` object, dependency solving)
costs about as much as the work itself. A handler here takes a `RouteRequest` value (path
parameters, headers, the whole body) and returns a Starlette `Response`; the same `RouteTable` is

- mounted as ordinary Starlette routes (`RouteTable.starlette_routes`, `RouteTable.endpoint`),
- put in front of another ASGI app (`RouteTableFront`) for any ASGI server, and
- served by uvicorn's own protocol without the ASGI stack (`reinforge.net.route_protocol`),

so each route has one handler, one body-size rule and one error envelope whichever way it is reached.
An app offers its table to the uvicorn protocol as `app.state.route_table`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route as StarletteRoute
from starlette.types import ASGIApp, Receive, Scope, Send


class RouteRequest:
    """What a handler sees of a request: no framework object, just values."""

    __slots__ = ("body", "headers", "method", "path", "path_params")

    def __init__(
        self,
        method: str,
        path: str,
        path_params: dict[str, str],
        headers: Mapping[bytes, bytes],
        body: bytes = b"",
    ) -> None:
        self.method = method
        self.path = path
        self.path_params = path_params
        self.headers = headers
        """By lower-case name; the first value of a repeated header wins."""
        self.body = body

    def header(self, name: bytes) -> str | None:
        """The value of header `name` (lower-case), or None."""
        value = self.headers.get(name)
        return None if value is None else value.decode("latin-1")


def header_index(raw: Sequence[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """ASGI's header list as a dict, the first value winning.

    Why a dict: a handler reads a few headers, most of them absent, among the many an SDK sends;
    one dict built in C costs less than a scan per lookup.
    """
    return dict(reversed(raw))


class BodyTooLargeError(Exception):
    """The body is over the table's limit: declared so in Content-Length, or found so while read."""

    def __init__(self, limit: int, declared: int | None) -> None:
        super().__init__(f"request body over the {limit}-byte limit")
        self.limit = limit
        self.declared = declared


class BadContentLengthError(Exception):
    """The Content-Length header is not a number."""


class ClientDisconnectedError(Exception):
    """The client went away before it had sent the whole body."""


Handler = Callable[[RouteRequest], Awaitable[Response]]
HeadCheck = Callable[[RouteRequest], None]
"""Runs on the request's head (its body is still empty) and raises to refuse it, before the body is read."""
ErrorResponder = Callable[[RouteRequest, Exception], Response]
"""Turns anything a check, the body read or a handler raised into the app's error response."""


@dataclass(frozen=True)
class Route:
    """One route: `path` in Starlette's syntax (`{name}` is one segment, `{name:path}` any text)."""

    method: str
    path: str
    handler: Handler
    check_head: HeadCheck | None = None
    """Runs before the table's own check, if any; see `HeadCheck`."""
    max_param_length: int | None = None
    """A longer path parameter does not match: the request goes on to the app behind the table
    (whose validation then answers, as it does for any other request)."""


_PARAM = re.compile(r"{([A-Za-z_][A-Za-z0-9_]*)(?::(path))?}")


def path_regex(path: str, prefix: str = "", max_param_length: int | None = None) -> re.Pattern[str]:
    """The full-path regex of a route pattern, behind an optional mount `prefix`."""
    parts, at = ["^", re.escape(prefix)], 0
    bound = "+" if max_param_length is None else f"{{1,{max_param_length}}}"
    for match in _PARAM.finditer(path):
        parts.append(re.escape(path[at : match.start()]))
        chars = "." if match.group(2) else "[^/]"
        parts.append(f"(?P<{match.group(1)}>{chars}{bound})")
        at = match.end()
    parts += [re.escape(path[at:]), "$"]
    return re.compile("".join(parts), re.DOTALL)


def route_path(scope: Scope) -> str:
    """The path the app routes on (without the prefix it may be mounted under)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


class RouteTable:
    """Routes with one body-size limit, an optional head check for all, and the app's error envelope."""

    def __init__(
        self,
        routes: Sequence[Route],
        *,
        max_body_bytes: int,
        on_error: ErrorResponder,
        check_head: HeadCheck | None = None,
    ) -> None:
        if max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be positive")
        self.routes = list(routes)
        self.max_body_bytes = max_body_bytes
        self.on_error = on_error
        self.check_head = check_head
        self._matchers = self.matchers()

    def matchers(self, prefix: str = "") -> list[tuple[str, re.Pattern[str], Route]]:
        """(method, full-path regex, route) for each route, in order, behind a mount `prefix`."""
        return [(r.method, path_regex(r.path, prefix, r.max_param_length), r) for r in self.routes]

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        """The route for `method path` and its path parameters, or None."""
        for route_method, regex, route in self._matchers:
            if route_method == method:
                found = regex.match(path)
                if found is not None:
                    return route, found.groupdict()
        return None

    async def respond(self, route: Route, request: RouteRequest, receive: Receive | None) -> Response:
        """The route's answer: head checks, then the body (read through `receive` unless it is
        already in `request.body`, `receive` then None) within the limit, then the handler.
        Whatever any of them raises becomes the app's error response."""
        try:
            if route.check_head is not None:
                route.check_head(request)
            if self.check_head is not None:
                self.check_head(request)
            limit = self.max_body_bytes
            length = request.headers.get(b"content-length")
            if length is not None:
                if not length.isdigit():
                    raise BadContentLengthError("Content-Length is not a number")
                if int(length) > limit:
                    raise BodyTooLargeError(limit, int(length))
            if receive is not None:
                request.body = await read_body(receive, limit)
            elif len(request.body) > limit:
                raise BodyTooLargeError(limit, None)
            return await route.handler(request)
        except Exception as exc:
            return self.on_error(request, exc)

    def endpoint(self, route: Route) -> Callable[[Request], Awaitable[Response]]:
        """`route` as a Starlette endpoint (for a Starlette or FastAPI route declaring it)."""

        async def endpoint(request: Request) -> Response:
            scope = request.scope
            head = RouteRequest(
                scope["method"], scope["path"], dict(request.path_params), header_index(scope["headers"])
            )
            return await self.respond(route, head, request.receive)

        return endpoint

    def starlette_routes(self) -> list[StarletteRoute]:
        """The table as ordinary Starlette routes (a wrong method gets the app's 405, and so on)."""
        return [StarletteRoute(r.path, self.endpoint(r), methods=[r.method]) for r in self.routes]


class RouteTableFront:
    """ASGI: the table's routes are answered here; every other request goes on to `app`."""

    def __init__(self, table: RouteTable, app: ASGIApp) -> None:
        self.table = table
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = self.table.match(scope["method"], route_path(scope))
            if found is not None:
                route, params = found
                request = RouteRequest(scope["method"], scope["path"], params, header_index(scope["headers"]))
                response = await self.table.respond(route, request, receive)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole body from ASGI messages, refused as soon as it grows past `limit`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnectedError("the client disconnected before sending the whole body")
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError(limit, None)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
