"""The store over HTTP: a FastAPI app that exposes the `Store` protocol one route per operation.

Runners, gateways and trainers on other machines reach the one shared store through this app (and
`HttpStoreClient` on their side). Bad input never reaches the store as a surprise: bodies are
size-limited before they are read, validated by the `_wire` models, and every error leaves as
`{"error": {"type": ..., "message": ...}}` with the status of its `reinforge.errors` class.
Responses are serialised by pydantic-core straight to bytes, which keeps span-heavy pages cheap.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reinforge._headers import scope_header
from reinforge.errors import ReinforgeError, StoreUnavailableError
from reinforge.net.routes import RouteTableFront, route_path
from reinforge.store.http.adapters import (
    ATTEMPT,
    ATTEMPT_PAGE,
    COUNTERS,
    RESOURCES,
    ROLLOUT,
    ROLLOUT_PAGE,
    ROLLOUTS,
    SPAN_PAGE,
)
from reinforge.store.http.dashboard_routes import mount_dashboard
from reinforge.store.http.responses import body_too_large_message, error_for, error_response, json_response
from reinforge.store.http.rollout_routes import (
    STORE_PREFIX,
    RolloutRoutes,
    check_content_type,
    parse_body,
    token_problem,
)
from reinforge.store.http.wire import (
    AddSpansRequest,
    AddSpansResponse,
    EnqueueRequest,
    ErrorBody,
    Health,
    HeartbeatRequest,
    LeaseRequest,
    PutResourcesRequest,
    RolloutIdsRequest,
    WaitRequest,
    error_responses,
)
from reinforge.store.protocol import Store
from reinforge.types import (
    MAX_STORED_INT,
    NO_NUL,
    Attempt,
    AttemptOutcome,
    AttemptQuery,
    LeasedRollout,
    Page,
    ResourcesVersion,
    Rollout,
    RolloutQuery,
    Span,
    SpanQuery,
    StoreCounters,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""Large enough for a thousand fat LLM spans in one batch, small enough to keep memory bounded."""

StoreFactory = Callable[[], Awaitable[Store]]
"""Opens a store inside the server's event loop (SQL engines and asyncio locks are loop-bound)."""

_T = TypeVar("_T")

PathId = Annotated[str, Path(min_length=1, max_length=128, pattern=NO_NUL)]
"""A rollout or attempt id in a path: bounded, and without NUL (no backend can look one up)."""


_ERROR_RESPONSES = error_responses(
    {
        400: "Malformed JSON or an invalid request",
        401: "Missing or wrong bearer token",
        404: "Unknown id",
        409: "Conflicts with the current state (a superseded attempt, a reused resources version)",
        413: "Body larger than the server's limit",
        422: "Body or parameters fail validation",
    }
)


_M = TypeVar("_M", bound=BaseModel)

_BODY_MODELS: set[type[BaseModel]] = set()
"""Every model a route reads with `read_body`; their schemas go into the OpenAPI components."""


async def read_body(request: Request, model: type[_M]) -> _M:
    """The request body parsed as `model` straight from bytes (see `rollout_routes.parse_body`).

    Malformed JSON is a 400, a body that does not fit the model a 422. Routes declare the body
    with `openapi_extra=_body_doc(model)`.
    """
    check_content_type(request.headers.get("content-type", ""))
    return parse_body(model, await request.body())


_REF = "#/components/schemas/{model}"


def _body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` declaring a `read_body` route's request body (FastAPI does not see it)."""
    _BODY_MODELS.add(model)
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}},
        }
    }


def _add_body_schemas(app: FastAPI, models: Collection[type[BaseModel]]) -> None:
    """Put the body models' JSON schemas into the OpenAPI components that `_body_doc` refers to,
    and declare the bearer token that `BearerAuth` demands on the store routes."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            _, defs = models_json_schema(
                [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)], ref_template=_REF
            )
            components = schema.setdefault("components", {})
            for name, definition in defs.get("$defs", {}).items():
                components.setdefault("schemas", {}).setdefault(name, definition)
            components["securitySchemes"] = {
                "HTTPBearer": {"type": "http", "scheme": "bearer", "description": "`<run-dir>/store.token`"}
            }
            # Every route but the liveness probe needs the token (the middleware and the route
            # table refuse it with 401 before anything else), so the document says so for each.
            unauthorised = {"$ref": _REF.format(model=ErrorBody.__name__)}
            for path, item in schema["paths"].items():
                if path != "/health":
                    for operation in item.values():
                        operation["security"] = [{"HTTPBearer": []}]
                        operation["responses"].setdefault(
                            "401",
                            {
                                "description": "Missing or wrong bearer token",
                                "content": {"application/json": {"schema": unauthorised}},
                            },
                        )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


class BearerAuth:
    """Refuses requests under `prefix` without `Authorization: Bearer <token>` (pure ASGI).

    A middleware rather than a FastAPI dependency: it costs a header scan instead of a dependency
    solve per request, it runs before any body is read, and apps mounted beside the store (the
    gateway, with its own per-attempt tokens) are left alone.
    """

    def __init__(self, app: ASGIApp, token: str, prefix: str) -> None:
        self.app = app
        self.token = token
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and route_path(scope).startswith(self.prefix):
            problem = self._problem(scope)
            if problem is not None:
                headers = {"WWW-Authenticate": "Bearer"}
                await error_response(401, "AuthenticationError", problem, headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _problem(self, scope: Scope) -> str | None:
        return token_problem(scope_header(scope, b"authorization"), self.token)


class BodySizeLimit:
    """Refuses bodies over `max_body_bytes` with 413 before reading them (pure ASGI, so cheap).

    A declared Content-Length is checked up front; a chunked body is counted as it streams in.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        length = scope_header(scope, b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await error_response(400, "InvalidRequestError", "Content-Length is not a number")(
                    scope, receive, send
                )
                return
            if declared > limit:
                message = body_too_large_message(limit, declared)
                await error_response(413, "PayloadTooLargeError", message)(scope, receive, send)
                return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise StarletteHTTPException(413, body_too_large_message(limit, None))
            return message

        await self.app(scope, limited_receive, send)


class _StoreApp(FastAPI):
    """FastAPI with a lean front: every request passes `front` (the per-rollout route table, then
    auth and the body-size limit) before FastAPI's own middleware stack, which only the other
    routes then pay for."""

    front: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is not None and scope["type"] == "http":
            await self.front(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def call_fastapi(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


class _StoreHolder:
    """Where the routes find the store; filled at start-up when the app was given a factory."""

    def __init__(self, store: Store | None) -> None:
        self._store = store

    def get(self) -> Store:
        if self._store is None:
            # Only reachable when an ASGI host skipped the app's lifespan (which opens the store).
            raise StoreUnavailableError("the store is not open: the server's start-up (lifespan) has not run")
        return self._store

    def set(self, store: Store | None) -> None:
        self._store = store


def create_store_app(
    store: Store | StoreFactory,
    token: str,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    on_lease: Callable[[list[LeasedRollout]], None] | None = None,
    run_dir: str | os.PathLike[str] | None = None,
) -> FastAPI:
    """The store's HTTP app.

    `store` is an open store (the caller keeps ownership and closes it), or an async factory that
    the app calls at start-up and whose store it closes at shutdown. Pass a factory whenever the
    app runs in another thread's event loop (`BackgroundServer`, `reinforge store serve`).
    Every route except `/health` and the dashboard page needs `Authorization: Bearer <token>`.
    `on_lease` sees every batch leased through the app (a gateway beside the store learns of the
    attempts its calls will come from without asking the store again).
    `run_dir` is the run folder whose metrics and transitions the dashboard shows (docs/dashboard.md).
    """
    if not token:
        raise ValueError("the store server needs a non-empty token")
    if max_body_bytes <= 0:
        raise ValueError("max_body_bytes must be positive")
    holder = _StoreHolder(store if isinstance(store, Store) else None)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if isinstance(store, Store):
            yield
            return
        opened = await store()
        holder.set(opened)
        try:
            yield
        finally:
            holder.set(None)
            await opened.close()

    app = _StoreApp(
        title="reinforge store",
        version="1",
        description="The shared store of a reinforge run: rollouts, attempts, spans and resources.",
        lifespan=lifespan,
        # One schema per model (no "-Input"/"-Output" twins), so the body schemas can be merged in.
        separate_input_output_schemas=False,
    )
    app.state.store_holder = holder
    _add_body_schemas(app, _BODY_MODELS)
    rollout_routes = RolloutRoutes(holder.get, token, max_body_bytes=max_body_bytes, on_lease=on_lease)
    app.state.route_table = rollout_routes.table  # served without the ASGI stack by BackgroundServer
    # The per-rollout routes check the token and the body size themselves; for every other request
    # auth runs first (refused before its body is read), then the body-size limit, then FastAPI.
    app.front = RouteTableFront(
        rollout_routes.table,
        BearerAuth(BodySizeLimit(app.call_fastapi, max_body_bytes), token, STORE_PREFIX + "/"),
    )
    _install_error_handlers(app)

    router = APIRouter(prefix=STORE_PREFIX, responses=_ERROR_RESPONSES)
    _add_store_routes(router, holder, rollout_routes)
    app.include_router(router)

    @app.get("/health", response_model=Health, tags=["meta"])
    async def health() -> Response:
        """Liveness probe; needs no token and reveals nothing."""
        return Response(b'{"status":"ok"}', media_type="application/json")

    mount_dashboard(app, holder.get, token, run_dir)

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(url="dashboard")

    return app


def _install_error_handlers(app: FastAPI) -> None:
    async def on_error(_: Request, exc: Exception) -> Response:
        return error_for(exc)

    for kind in (ReinforgeError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, on_error)


def _add_store_routes(router: APIRouter, holder: _StoreHolder, rollout_routes: RolloutRoutes) -> None:
    """One route per `Store` method; the handlers only translate, the store decides.

    Ids are free-form strings, so id segments use the `path` converter: an id holding '/' (sent
    percent-encoded, decoded before routing) still reaches its route. The per-rollout routes are
    answered by `rollout_routes`' handlers (its table usually answers them before FastAPI does);
    they are declared here for the schema and for FastAPI's validation of ids the table leaves alone.
    """
    table = rollout_routes.table
    serve_lease = table.endpoint(rollout_routes.lease)
    serve_heartbeat = table.endpoint(rollout_routes.heartbeat)
    serve_finish = table.endpoint(rollout_routes.finish)
    serve_spans = table.endpoint(rollout_routes.spans)

    @router.post(
        "/rollouts/enqueue",
        response_model=list[Rollout],
        tags=["rollouts"],
        openapi_extra=_body_doc(EnqueueRequest),
    )
    async def enqueue_rollouts(request: Request) -> Response:
        """Add rollouts in one batch (idempotent for specs that carry a rollout_id)."""
        body = await read_body(request, EnqueueRequest)
        return json_response(ROLLOUTS, await holder.get().enqueue_rollouts(body.specs))

    @router.post(
        "/rollouts/lease",
        response_model=list[LeasedRollout],
        tags=["rollouts"],
        openapi_extra=_body_doc(LeaseRequest),
    )
    async def lease_rollouts(request: Request) -> Response:
        """Lease up to max_rollouts queued rollouts, waiting up to wait_seconds for one."""
        return await serve_lease(request)

    @router.post(
        "/rollouts/cancel",
        response_model=list[Rollout],
        tags=["rollouts"],
        openapi_extra=_body_doc(RolloutIdsRequest),
    )
    async def cancel_rollouts(request: Request) -> Response:
        body = await read_body(request, RolloutIdsRequest)
        return json_response(ROLLOUTS, await holder.get().cancel_rollouts(body.rollout_ids))

    @router.post(
        "/rollouts/wait",
        response_model=list[Rollout],
        tags=["rollouts"],
        openapi_extra=_body_doc(WaitRequest),
    )
    async def wait_for_rollouts(request: Request) -> Response:
        """Block until every listed rollout is final or the timeout passes; returns the final ones."""
        body = await read_body(request, WaitRequest)
        done = await holder.get().wait_for_rollouts(body.rollout_ids, body.timeout_seconds)
        return json_response(ROLLOUTS, done)

    @router.post(
        "/rollouts/query",
        response_model=Page[Rollout],
        tags=["rollouts"],
        openapi_extra=_body_doc(RolloutQuery),
    )
    async def query_rollouts(request: Request) -> Response:
        body = await read_body(request, RolloutQuery)
        return json_response(ROLLOUT_PAGE, await holder.get().query_rollouts(body))

    @router.get("/rollouts/{rollout_id:path}", response_model=Rollout, tags=["rollouts"])
    async def get_rollout(rollout_id: PathId) -> Response:
        return json_response(ROLLOUT, await holder.get().get_rollout(rollout_id))

    @router.post(
        "/attempts/{attempt_id:path}/heartbeat",
        response_model=Attempt,
        tags=["attempts"],
        openapi_extra=_body_doc(HeartbeatRequest),
    )
    async def heartbeat(attempt_id: PathId, request: Request) -> Response:
        return await serve_heartbeat(request)

    @router.post(
        "/attempts/{attempt_id:path}/finish",
        response_model=Rollout,
        tags=["attempts"],
        openapi_extra=_body_doc(AttemptOutcome),
    )
    async def finish_attempt(attempt_id: PathId, request: Request) -> Response:
        """Report the end of an attempt; 409 when the attempt was superseded (nothing is counted)."""
        return await serve_finish(request)

    @router.post(
        "/attempts/query",
        response_model=Page[Attempt],
        tags=["attempts"],
        openapi_extra=_body_doc(AttemptQuery),
    )
    async def query_attempts(request: Request) -> Response:
        body = await read_body(request, AttemptQuery)
        return json_response(ATTEMPT_PAGE, await holder.get().query_attempts(body))

    @router.get("/attempts/{attempt_id:path}", response_model=Attempt, tags=["attempts"])
    async def get_attempt(attempt_id: PathId) -> Response:
        return json_response(ATTEMPT, await holder.get().get_attempt(attempt_id))

    @router.post(
        "/spans", response_model=AddSpansResponse, tags=["spans"], openapi_extra=_body_doc(AddSpansRequest)
    )
    async def add_spans(request: Request) -> Response:
        """Insert spans in one batch, idempotent by span_id; `added` counts the new ones."""
        return await serve_spans(request)

    @router.post(
        "/spans/query", response_model=Page[Span], tags=["spans"], openapi_extra=_body_doc(SpanQuery)
    )
    async def query_spans(request: Request) -> Response:
        body = await read_body(request, SpanQuery)
        return json_response(SPAN_PAGE, await holder.get().query_spans(body))

    @router.post(
        "/resources",
        response_model=ResourcesVersion,
        tags=["resources"],
        openapi_extra=_body_doc(PutResourcesRequest),
    )
    async def put_resources(request: Request) -> Response:
        """Store a resources version (the next number when version is null); 409 on conflicting reuse."""
        body = await read_body(request, PutResourcesRequest)
        put = await holder.get().put_resources(body.resources, version=body.version)
        return json_response(RESOURCES, put)

    @router.get("/resources/latest", response_model=ResourcesVersion, tags=["resources"])
    async def get_latest_resources() -> Response:
        return json_response(RESOURCES, await holder.get().get_resources(None))

    @router.get("/resources/{version}", response_model=ResourcesVersion, tags=["resources"])
    async def get_resources(version: Annotated[int, Path(ge=0, le=MAX_STORED_INT)]) -> Response:
        return json_response(RESOURCES, await holder.get().get_resources(version))

    @router.get("/counters", response_model=StoreCounters, tags=["meta"])
    async def counters() -> Response:
        """Counts by status, spans and resources versions (for `reinforge store status`, the dashboard)."""
        return json_response(COUNTERS, await holder.get().counters())
