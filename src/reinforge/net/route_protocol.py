"""uvicorn's HTTP/1.1 protocol, answering the served app's route tables without the ASGI stack.

Why: a request that goes through the ASGI app pays for its middleware stack, the router and the
ASGI send protocol, and uvicorn writes a response's head and body in two syscalls. That is a
large share of the gateway's added-latency budget and of the store's per-rollout calls.
`RouteTableProtocol` is uvicorn's httptools protocol (so keep-alive, pipelining, flow control,
timeouts and graceful shutdown stay uvicorn's) with one change: a request that one of the app's
`RouteTable`s (`reinforge.net.routes`) matches goes straight to that table (once its body is in,
when that is small), and a plain response goes out in one write. Anything else (another route, a
wrong method, a streamed response's body, an upgrade) takes the ordinary ASGI path.

The tables are found as `app.state.route_table` on the served app and on apps mounted one level
down (`store_app.mount("/gateway", gateway_app)`), only where no app in between adds middleware
the direct path would skip.

This module is the one place that relies on uvicorn's internals (`HttpToolsProtocol._start_asgi_task`,
`on_message_complete`, the keep-alive hooks, `RequestResponseCycle`'s fields), which is why
pyproject.toml pins uvicorn to the versions the tests cover.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from typing import Any

from starlette.responses import Response
from starlette.routing import Mount
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
from uvicorn.server import ServerState

from reinforge.net.routes import Route, RouteRequest, RouteTable, header_index

_TIMER_SLACK_S = 0.001
"""How early a timer may fire (loops keep time in milliseconds)."""

_Matcher = tuple[str, re.Pattern[str], Route, RouteTable]


def route_table(app: Any) -> RouteTable | None:
    """The table an app offers (`app.state.route_table`), or None."""
    state = getattr(app, "state", None)
    table = getattr(state, "route_table", None) if state is not None else None
    return table if isinstance(table, RouteTable) else None


def _plain(app: Any) -> bool:
    """True when the app adds no middleware of its own (which the direct path would skip)."""
    return not getattr(app, "user_middleware", None)


def served_routes(app: Any) -> list[_Matcher]:
    """Every table route reachable in `app` with no middleware in between, as full-path matchers."""
    if not _plain(app):
        return []
    found: list[tuple[str, RouteTable]] = []
    if (own := route_table(app)) is not None:
        found.append(("", own))
    for route in getattr(app, "routes", None) or []:
        if isinstance(route, Mount) and _plain(route.app) and (table := route_table(route.app)) is not None:
            found.append((route.path, table))
    return [
        (method, regex, route, table)
        for prefix, table in found
        for method, regex, route in table.matchers(prefix)
    ]


def find_route(
    matchers: list[_Matcher], method: str, path: str
) -> tuple[Route, RouteTable, dict[str, str]] | None:
    """The route for `method path`, its table and path parameters, or None (the ASGI app decides)."""
    for route_method, regex, route, table in matchers:
        if route_method == method:
            match = regex.match(path)
            if match is not None:
                return route, table, match.groupdict()
    return None


_SERVED: weakref.WeakKeyDictionary[Any, list[_Matcher]] = weakref.WeakKeyDictionary()


def _served_for(app: Any) -> list[_Matcher]:
    try:
        return _SERVED[app]
    except KeyError:
        matchers = _SERVED[app] = served_routes(app)
        return matchers
    except TypeError:  # not weak-referenceable: look it up each time
        return served_routes(app)


class RouteTableProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the app's route tables served without the ASGI stack."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._matchers = _served_for(config.app)
        self._deferred: tuple[RequestResponseCycle, _DirectApp] | None = None
        """A matched request whose small body is still on its way: its task starts once it has all."""
        self._idle_since: float | None = None
        """When the connection's last response finished, or None while a request is on it."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # Called for every request, pipelined ones included, once its head is parsed; `app` is not
        # the served app when uvicorn refuses the request (limit_concurrency), and then it goes on.
        if self._matchers and app is self.app:
            scope = cycle.scope
            found = find_route(self._matchers, scope["method"], scope["path"])
            if found is not None:
                route, table, params = found
                headers = header_index(scope["headers"])  # type: ignore[arg-type]  # a list, as uvicorn builds it
                app = _DirectApp(
                    cycle, table, route, RouteRequest(scope["method"], scope["path"], params, headers)
                )
                if cycle.more_body and _buffered_whole(cycle, headers):
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
    # timer made and dropped per request. Here one timer stays set across requests and, when it
    # fires, closes the connection only if it has been idle long enough.

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


def _buffered_whole(cycle: RequestResponseCycle, headers: dict[bytes, bytes]) -> bool:
    """True when the request's body may be read in full before its handler starts.

    Why: clients often send a request's head and body in two packets; a task started on the head
    alone runs, waits for the body, and runs again. A body that fits under uvicorn's read-pause mark
    (so reading never stalls waiting for a handler to drain it) and that no `Expect: 100-continue`
    holds back is better read first. A larger or chunked body keeps the streaming path, so the
    table's size limit still answers before the body is read.
    """
    if cycle.waiting_for_100_continue:
        return False
    length = headers.get(b"content-length")
    return length is not None and length.isdigit() and int(length) <= HIGH_WATER_LIMIT


class _DirectApp:
    """One request's ASGI callable for uvicorn's cycle: the table's answer, then a one-write response."""

    __slots__ = ("cycle", "request", "route", "table")

    def __init__(
        self, cycle: RequestResponseCycle, table: RouteTable, route: Route, request: RouteRequest
    ) -> None:
        self.cycle = cycle
        self.table = table
        self.route = route
        self.request = request

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        cycle = self.cycle
        if cycle.more_body:
            response = await self.table.respond(self.route, self.request, receive)
        else:
            # The whole body came with the head (the usual case): take it without a receive() round.
            self.request.body = bytes(cycle.body)
            cycle.body = bytearray()
            response = await self.table.respond(self.route, self.request, None)
        if type(response).__call__ is not Response.__call__ or response.background is not None:
            await response(scope, receive, send)  # streamed, or work to run after the body
        else:
            await _write(cycle, response)


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
