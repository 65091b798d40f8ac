"""A lean HTTP path for the gateway's routes, inside uvicorn's own HTTP/1.1 protocol.

Why: the gateway's added-latency budget is well under a millisecond, and a plain request through
FastAPI pays for its middleware stack (error, exception, exit-stack, body-limit and telemetry layers),
the router and the ASGI send protocol, and uvicorn writes a response's head and body in two
syscalls. `GatewayHttpProtocol` is uvicorn's httptools protocol (so keep-alive, pipelining, flow
control, timeouts and graceful shutdown stay uvicorn's) with one change: a request for one of the
gateway's own routes goes straight to its handler, the very function the ASGI app routes to (once
its body is in, when that is small), and a plain response goes out in one write. Anything else
(another route, a wrong method, a streamed response's body, an upgrade) takes the ordinary ASGI
path, so every route answers as before.

Serve with `uvicorn.Config(app, http=GatewayHttpProtocol)`; `BackgroundServer` does. The gateway app
is found at the root of the served app or mounted one level down (`store_app.mount("/gateway", ...)`),
and only when neither app adds middleware the fast path would skip.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
from uvicorn.server import ServerState

from reinforge.gateway.service import header_index

Handler = Callable[[Request], Awaitable[Response]]

_TIMER_SLACK_S = 0.001
"""How early a timer may fire (loops keep time in milliseconds)."""


@dataclass(frozen=True)
class _HotRoute:
    regex: re.Pattern[str]
    method: str
    handler: Handler


def gateway_routes(app: Any) -> list[Route]:
    """The routes a gateway app registered for the fast path (see `create_gateway_app`)."""
    state = getattr(app, "state", None)
    routes = getattr(state, "gateway_routes", None) if state is not None else None
    return list(routes) if routes else []


def _plain(app: Any) -> bool:
    """True when the app adds no middleware of its own (which the fast path would skip)."""
    return not getattr(app, "user_middleware", None)


def hot_routes(app: Any) -> list[_HotRoute]:
    """Every gateway route reachable in `app` with no middleware in between, as full-path regexes."""
    if not _plain(app):
        return []
    found: list[tuple[str, list[Route]]] = []
    if own := gateway_routes(app):
        found.append(("", own))
    for route in getattr(app, "routes", None) or []:
        if isinstance(route, Mount) and gateway_routes(route.app) and _plain(route.app):
            found.append((route.path, gateway_routes(route.app)))
    table = []
    for prefix, routes in found:
        for route in routes:
            assert route.methods is not None
            # Starlette's own regex for the route (`^/r/(?P<attempt_id>[^/]+)/v1/...$`), behind the mount.
            pattern = "^" + re.escape(prefix) + route.path_regex.pattern.removeprefix("^")
            for method in route.methods - {"HEAD"}:
                table.append(_HotRoute(re.compile(pattern), method, route.endpoint))
    return table


def find_route(table: list[_HotRoute], method: str, path: str) -> tuple[Handler, dict[str, str]] | None:
    """The handler for `method path` and its path parameters, or None (the ASGI app decides)."""
    for route in table:
        if route.method == method:
            match = route.regex.match(path)
            if match is not None:
                return route.handler, match.groupdict()
    return None


_TABLES: weakref.WeakKeyDictionary[Any, list[_HotRoute]] = weakref.WeakKeyDictionary()


def _table_for(app: Any) -> list[_HotRoute]:
    try:
        return _TABLES[app]
    except KeyError:
        table = _TABLES[app] = hot_routes(app)
        return table
    except TypeError:  # not weak-referenceable: look it up each time
        return hot_routes(app)


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the gateway's routes served without the ASGI stack."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._hot = _table_for(config.app)
        self._deferred: tuple[RequestResponseCycle, _HotApp] | None = None
        """A hot request whose small body is still on its way: its task starts once it has all."""
        self._idle_since: float | None = None
        """When the connection's last response finished, or None while a request is on it."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # Called for every request, pipelined ones included, once its head is parsed; `app` is not
        # the served app when uvicorn refuses the request (limit_concurrency), and then it goes on.
        if self._hot and app is self.app:
            scope = cycle.scope
            found = find_route(self._hot, scope["method"], scope["path"])
            if found is not None:
                handler, scope["path_params"] = found  # type: ignore[typeddict-unknown-key]
                app = _HotApp(cycle, handler)
                if cycle.more_body and _buffered_whole(cycle):
                    self._deferred = (cycle, app)
                    return
        super()._start_asgi_task(cycle, app)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        deferred = self._deferred
        if deferred is not None and deferred[0] is self.cycle:
            self._deferred = None
            super()._start_asgi_task(*deferred)

    # Keep-alive: uvicorn sets a timer when a response ends and cancels it on the next bytes in, a
    # timer made and dropped per request (about 2% of a gateway call's CPU). Here one timer stays set
    # across requests and, when it fires, closes the connection only if it has been idle long enough.

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None

    def on_response_complete(self) -> None:
        """uvicorn's, but for the keep-alive timer (see above)."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def timeout_keep_alive_handler(self) -> None:
        self.timeout_keep_alive_task = None
        if self._idle_since is None:
            return  # in use: the end of its response sets the timer again
        left = self._idle_since + self.timeout_keep_alive - self.loop.time()
        if left > _TIMER_SLACK_S:
            self.timeout_keep_alive_task = self.loop.call_later(left, self.timeout_keep_alive_handler)
        else:
            super().timeout_keep_alive_handler()


def _buffered_whole(cycle: RequestResponseCycle) -> bool:
    """True when the request's body may be read in full before its handler starts.

    Why: clients often send a request's head and body in two packets; a task started on the head
    alone runs, waits for the body, and runs again. A body that fits under uvicorn's read-pause mark
    (so reading never stalls waiting for a handler to drain it) and that no `Expect: 100-continue`
    holds back is better read first. A larger or chunked body keeps the streaming path, so the
    handler's size limit still answers before the body is read.
    """
    if cycle.waiting_for_100_continue:
        return False
    length = header_index(cycle.scope).get(b"content-length")  # type: ignore[arg-type]
    return length is not None and length.isdigit() and int(length) <= HIGH_WATER_LIMIT


class _HotApp:
    """One request's ASGI callable for uvicorn's cycle: the handler, then a one-write response."""

    __slots__ = ("cycle", "handler")

    def __init__(self, cycle: RequestResponseCycle, handler: Handler) -> None:
        self.cycle = cycle
        self.handler = handler

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        cycle = self.cycle
        if not cycle.more_body:
            # The whole body came with the head (the usual case): hand it over as Starlette's own
            # cached body, without a receive() round through an async generator.
            request._body = bytes(cycle.body)
            cycle.body = bytearray()
        response = await self.handler(request)
        if type(response).__call__ is not Response.__call__ or response.background is not None:
            await response(scope, receive, send)  # streamed, or work to run after the body
        else:
            await _write(self.cycle, response)


async def _write(cycle: RequestResponseCycle, response: Response) -> None:
    """What `cycle.send` does for a start and a final body message, as one transport write."""
    if cycle.flow.write_paused and not cycle.disconnected:
        await cycle.flow.drain()
    if cycle.disconnected:
        return
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    status = response.status_code
    if cycle.access_log:
        scope = cycle.scope
        cycle.access_logger.info(
            '%s - "%s %s HTTP/%s" %d',
            get_client_addr(scope),
            scope["method"],
            get_path_with_query_string(scope),
            scope["http_version"],
            status,
        )
    content: list[bytes | memoryview] = [STATUS_LINE[status]]
    for name, value in cycle.default_headers:
        content += (name, b": ", value, b"\r\n")
    for name, value in response.raw_headers:
        if name == b"connection" and b"close" in value.lower():
            cycle.keep_alive = False
        content += (name, b": ", value, b"\r\n")
    if not cycle.keep_alive:
        content.append(b"connection: close\r\n")
    content += (b"\r\n", response.body)
    cycle.transport.write(b"".join(content))
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()
