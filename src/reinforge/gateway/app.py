"""The gateway: an OpenAI-compatible ASGI app whose URL names the attempt, recording every call.

An agent is given `http://host/r/<attempt_id>/v1` as its base URL and the attempt's token as its API
key; it needs nothing else. Each call is served by the backend (embedded engine, vLLM/SGLang, or a
scripted one), and one LLM span with the exact token ids and logprobs the backend produced is queued
for the store before the response goes back, so a `/flush` after the agent returns always sees it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reinforge.gateway.endpoints import Endpoints, guarded
from reinforge.gateway.errors import error_response
from reinforge.gateway.service import DEFAULT_MAX_BODY_BYTES, Gateway
from reinforge.inference.contract import Backend
from reinforge.store.protocol import Store

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Gateway", "create_gateway_app"]


def create_gateway_app(
    store: Store,
    backend: Backend,
    secret: str,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    attempt_cache_ttl_s: float = 2.0,
    max_queued_spans: int = 4096,
    max_span_batch: int = 256,
    span_linger_s: float = 0.05,
) -> FastAPI:
    """The gateway as an ASGI app; its `Gateway` is at `app.state.gateway`.

    Serve it alone or mount it beside the store server (`store_app.mount("/gateway", app)`); agents use
    `<url>/r/<attempt_id>/v1` as their OpenAI base URL and `attempt_token(secret, attempt_id)` as key.
    """
    gateway = Gateway(
        store,
        backend,
        secret,
        max_body_bytes=max_body_bytes,
        attempt_cache_ttl_s=attempt_cache_ttl_s,
        max_queued_spans=max_queued_spans,
        max_span_batch=max_span_batch,
        span_linger_s=span_linger_s,
    )
    e = Endpoints(gateway)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gateway.bind()
        yield
        await gateway.close()

    routes: list[Route] = []
    for prefix in ("/r/{attempt_id}/v1", "/r/{attempt_id}/agents/{agent_name}/v1"):
        routes += [  # the hot routes first: routing tries them in order
            Route(prefix + "/chat/completions", guarded(e.chat), methods=["POST"]),
            Route(prefix + "/completions", guarded(e.completions), methods=["POST"]),
            Route(prefix + "/responses", guarded(e.responses), methods=["POST"]),
            Route(prefix + "/models", guarded(e.models), methods=["GET"]),
        ]
    routes += [
        Route("/r/{attempt_id}/reward", guarded(e.reward), methods=["POST"]),
        Route("/r/{attempt_id}/flush", guarded(e.flush), methods=["POST"]),
        Route("/r/{attempt_id}/finish", guarded(e.finish), methods=["POST"]),
        Route("/finish", guarded(e.finish_many), methods=["POST"]),
        Route("/v1/models", guarded(e.models), methods=["GET"]),
        Route("/health", guarded(e.health), methods=["GET"]),
    ]
    app = FastAPI(
        title="reinforge gateway",
        routes=routes,  # type: ignore[arg-type]
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.gateway = gateway
    app.state.gateway_routes = routes  # served without the ASGI stack by fastpath.GatewayHttpProtocol

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        detail = getattr(exc, "detail", None) or "error"
        if status == 404:
            detail = (
                f"no route {request.method} {request.url.path}; agents call <gateway>/r/<attempt_id>/v1/..."
            )
        return error_response(status, str(detail))

    app.add_exception_handler(StarletteHTTPException, http_error)
    return app
