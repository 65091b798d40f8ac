"""The gateway: an OpenAI-compatible ASGI app whose URL names the attempt, recording every call.

An agent is given `http://host/r/<attempt_id>/v1` as its base URL and the attempt's token as its API
key; it needs nothing else. Each call is served by the backend (embedded engine, vLLM/SGLang, or a
scripted one), and one LLM span with the exact token ids and logprobs the backend produced is queued
for the store before the response goes back, so a `/flush` after the agent returns always sees it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Unpack

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from reinforge.gateway.errors import error_response
from reinforge.gateway.routes import DEFAULT_MAX_BODY_BYTES, GatewayRoutes
from reinforge.gateway.service import Gateway, GatewayOptions
from reinforge.inference.contract import Backend
from reinforge.store.protocol import Store

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Gateway", "create_gateway_app"]


def create_gateway_app(
    store: Store,
    backend: Backend,
    secret: str,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    **options: Unpack[GatewayOptions],
) -> FastAPI:
    """The gateway as an ASGI app; its `Gateway` (built with `options`) is at `app.state.gateway`.

    Serve it alone or mount it beside the store server (`store_app.mount("/gateway", app)`); agents use
    `<url>/r/<attempt_id>/v1` as their OpenAI base URL and `attempt_token(secret, attempt_id)` as key.
    Its routes are a `RouteTable` (at `app.state.route_table`), which `BackgroundServer` serves
    without the ASGI stack.
    """
    gateway = Gateway(store, backend, secret, **options)
    table = GatewayRoutes(gateway).table(max_body_bytes)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gateway.bind()
        yield
        await gateway.close()

    app = FastAPI(
        title="reinforge gateway",
        routes=table.starlette_routes(),  # type: ignore[arg-type]
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.gateway = gateway
    app.state.route_table = table

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        detail = getattr(exc, "detail", None) or "error"
        if status == 404:
            detail = (
                f"no route {request.method} {request.url.path}; agents call <gateway>/r/<attempt_id>/v1/..."
            )
        response = error_response(status, str(detail))
        allow = getattr(exc, "headers", None)
        if status == 405 and allow:
            response.headers.update(allow)  # `Allow`, which RFC 9110 requires with a 405
        return response

    app.add_exception_handler(StarletteHTTPException, http_error)
    return app
