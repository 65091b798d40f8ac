"""The calls every rollout makes (lease, add spans, heartbeat, finish) as lean ASGI handlers.

A store server spends its time on these four: thousands per second in a busy run. FastAPI's
per-request machinery (routing through every route, building a `Request`, solving dependencies,
the exception middleware) cost about as much as the store work for a lease. These handlers answer
the same paths with the same bodies, validation and error envelopes, straight from the ASGI
scope; the FastAPI routes stay for everything else and for the OpenAPI schema. They sit inside
the auth and body-size middlewares, so those rules hold unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from reinforge._headers import scope_header
from reinforge.errors import AuthenticationError, InvalidRequestError, ReinforgeError, StoreUnavailableError
from reinforge.store.http.adapters import ATTEMPT, LEASED, ROLLOUT
from reinforge.store.http.responses import (
    error_response,
    http_error_type,
    json_response,
    route_path,
    validation_error_response,
)
from reinforge.store.http.wire import MAX_BATCH, AddSpansRequest, HeartbeatRequest, LeaseRequest
from reinforge.store.protocol import Store
from reinforge.store.span_records import SpanRecord, parse_span_batch
from reinforge.types import AttemptOutcome, LeasedRollout

logger = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)


_ATTEMPTS = "/attempts/"
_MAX_ID = 128


def check_content_type(content_type: str) -> None:
    """Bodies are JSON; anything else is refused before it is parsed."""
    media = content_type.split(";")[0].strip().lower() or "application/json"
    if media != "application/json" and not media.endswith("+json"):
        raise InvalidRequestError(f"send the body as application/json, not {media!r}")


def parse_body(model: type[_M], raw: bytes) -> _M:
    """`raw` validated as `model` in one pass: pydantic-core parses and validates together, about
    five times faster than `json.loads` plus validation. Problems are located under `body`."""
    try:
        return model.model_validate_json(raw or b"null")
    except ValidationError as exc:
        raise RequestValidationError(
            [{**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False)]
        ) from exc


async def ingest_spans(store: Store, raw: bytes) -> int:
    """A span batch into the store: the SQL store takes pre-validated records (see
    `_span_records`); other stores, and bodies off the fast path, go through pydantic."""
    add_records: Callable[[list[SpanRecord]], Awaitable[int]] | None = getattr(
        store, "add_span_records", None
    )
    if add_records is not None:
        records = parse_span_batch(raw, MAX_BATCH)
        if records is not None:
            return await add_records(records)
    body = parse_body(AddSpansRequest, raw)
    return await store.add_spans(body.spans)


class HotRoutes:
    """Answers POST `{prefix}/rollouts/lease`, `{prefix}/spans`, `{prefix}/attempts/{id}/heartbeat`
    and `{prefix}/attempts/{id}/finish`; passes every other request on to `app`."""

    def __init__(
        self,
        app: ASGIApp,
        get_store: Callable[[], Store],
        prefix: str,
        on_lease: Callable[[list[LeasedRollout]], None] | None = None,
    ) -> None:
        self.app = app
        self.get_store = get_store
        self.prefix = prefix
        self.on_lease = on_lease
        self.lease_path = prefix + "/rollouts/lease"
        self.spans_path = prefix + "/spans"
        self.attempts_path = prefix + _ATTEMPTS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self._handler(route_path(scope))
            if handler is not None:
                response = await self._answer(handler, scope, receive)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _handler(self, path: str) -> Callable[[Store, bytes], Awaitable[Response]] | None:
        if path == self.lease_path:
            return self._lease
        if path == self.spans_path:
            return self._spans
        if path.startswith(self.attempts_path):
            # Ids are free-form ('/' included), as the FastAPI routes' `path` converter allows;
            # ids outside the length bounds are left to FastAPI's validation (and its 422).
            rest = path[len(self.attempts_path) :]
            attempt_id, _, action = rest.rpartition("/")
            if 1 <= len(attempt_id) <= _MAX_ID:
                if action == "finish":
                    return lambda store, raw: self._finish(store, attempt_id, raw)
                if action == "heartbeat":
                    return lambda store, raw: self._heartbeat(store, attempt_id, raw)
        return None

    async def _answer(
        self, handler: Callable[[Store, bytes], Awaitable[Response]], scope: Scope, receive: Receive
    ) -> Response:
        """The handler's response, or the error envelope FastAPI's handlers would have sent."""
        try:
            check_content_type(scope_header(scope, b"content-type") or "")
            raw = await _read_body(receive)
            return await handler(self.get_store(), raw)
        except RequestValidationError as exc:
            return validation_error_response(exc.errors())
        except ReinforgeError as exc:
            headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthenticationError) else None
            if exc.http_status >= 500:
                logger.warning("store error: %s", exc)
            return error_response(exc.http_status, type(exc).__name__, str(exc), headers)
        except StarletteHTTPException as exc:  # the body-size limit, hit while streaming
            type_name = http_error_type(exc.status_code)
            return error_response(exc.status_code, type_name, str(exc.detail), dict(exc.headers or {}))
        except Exception as exc:
            logger.exception("unexpected error in the store server", exc_info=exc)
            message = f"internal error in the store server: {type(exc).__name__}"
            return error_response(500, "ReinforgeError", message)

    async def _lease(self, store: Store, raw: bytes) -> Response:
        return await lease(store, parse_body(LeaseRequest, raw), self.on_lease)

    @staticmethod
    async def _spans(store: Store, raw: bytes) -> Response:
        added = await ingest_spans(store, raw)
        return Response(b'{"added":%d}' % added, media_type="application/json")

    @staticmethod
    async def _heartbeat(store: Store, attempt_id: str, raw: bytes) -> Response:
        body = parse_body(HeartbeatRequest, raw)
        return json_response(ATTEMPT, await store.heartbeat(attempt_id, lease_seconds=body.lease_seconds))

    @staticmethod
    async def _finish(store: Store, attempt_id: str, raw: bytes) -> Response:
        body = parse_body(AttemptOutcome, raw)
        return json_response(ROLLOUT, await store.finish_attempt(attempt_id, body))


async def lease(
    store: Store, body: LeaseRequest, on_lease: Callable[[list[LeasedRollout]], None] | None
) -> Response:
    """The lease route's answer (hot and FastAPI routes alike); `on_lease` sees a non-empty batch."""
    leased = await store.lease_rollouts(
        body.runner_id,
        max_rollouts=body.max_rollouts,
        lease_seconds=body.lease_seconds,
        wait_seconds=body.wait_seconds,
        mode=body.mode,
    )
    if leased and on_lease is not None:
        on_lease(leased)
    return json_response(LEASED, leased)


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise StoreUnavailableError("the client disconnected before sending the whole body")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
