"""The calls every rollout makes (lease, add spans, heartbeat, finish) as a route table.

A store server spends most of its time on these four, every rollout making several, and FastAPI's
per-request machinery (its middleware, routing through every route, a `Request`, dependency
solving) would cost about as much as the store work. The table (`reinforge.net.routes`) answers
them ahead of FastAPI in any ASGI server, and without the ASGI stack under `BackgroundServer`;
FastAPI declares the same routes for the OpenAPI schema with this table's handlers. The table
checks the bearer token and the content type before it reads a body, and keeps the body-size limit
and the error envelope (`responses.error_for`) of every other store route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from reinforge._headers import bearer_token
from reinforge.errors import AuthenticationError, InvalidRequestError
from reinforge.net.routes import Route, RouteRequest, RouteTable
from reinforge.store.http.adapters import ATTEMPT, LEASED, ROLLOUT
from reinforge.store.http.auth import tokens_match
from reinforge.store.http.responses import error_for, json_response
from reinforge.store.http.wire import MAX_BATCH, AddSpansRequest, HeartbeatRequest, LeaseRequest
from reinforge.store.protocol import Store
from reinforge.store.rules import check_text
from reinforge.store.span_records import SpanRecord, parse_span_batch
from reinforge.types import AttemptOutcome, LeasedRollout

_M = TypeVar("_M", bound=BaseModel)

STORE_PREFIX = "/store"
"""Every store route is under it (and needs the bearer token)."""
MAX_ID_LENGTH = 128


def token_problem(authorization: str | None, token: str) -> str | None:
    """Why an `Authorization` header does not carry the store's token, or None when it does."""
    given = bearer_token(authorization)
    if given is None:
        return "missing bearer token: send 'Authorization: Bearer <store token>'"
    return None if tokens_match(given, token) else "wrong bearer token for this store"


def check_content_type(content_type: str) -> None:
    """Bodies are JSON; anything else is refused before it is parsed."""
    media = content_type.split(";")[0].strip().lower() or "application/json"
    if media != "application/json" and not media.endswith("+json"):
        raise InvalidRequestError(f"send the body as application/json, not {media!r}")


def parse_body(model: type[_M], raw: bytes) -> _M:
    """`raw` validated as `model` in one pass (pydantic-core parses and validates together).
    Problems are located under `body`, as FastAPI locates them."""
    try:
        return model.model_validate_json(raw or b"null")
    except ValidationError as exc:
        raise RequestValidationError(
            [{**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False)]
        ) from exc


async def ingest_spans(store: Store, raw: bytes) -> int:
    """A span batch into the store: the SQL store takes pre-validated records (see
    `span_records`); other stores, and bodies outside that narrow shape, go through pydantic."""
    add_records: Callable[[list[SpanRecord]], Awaitable[int]] | None = getattr(
        store, "add_span_records", None
    )
    if add_records is not None:
        records = parse_span_batch(raw, MAX_BATCH)
        if records is not None:
            return await add_records(records)
    body = parse_body(AddSpansRequest, raw)
    return await store.add_spans(body.spans)


def _attempt_id(request: RouteRequest) -> str:
    """The path's attempt id, refused when it holds NUL (as the schema's pattern says)."""
    attempt_id = request.path_params["attempt_id"]
    check_text(attempt_id, "attempt_id")
    return attempt_id


class RolloutRoutes:
    """POST `/store/rollouts/lease`, `/store/spans`, `/store/attempts/{id}/heartbeat` and
    `/store/attempts/{id}/finish`, as one table."""

    def __init__(
        self,
        get_store: Callable[[], Store],
        token: str,
        *,
        max_body_bytes: int,
        on_lease: Callable[[list[LeasedRollout]], None] | None = None,
    ) -> None:
        self.get_store = get_store
        self.token = token
        self.on_lease = on_lease
        attempt = STORE_PREFIX + "/attempts/{attempt_id:path}"
        # Ids are free-form ('/' included), as FastAPI's `path` converter allows; an id outside the
        # length bounds is left to FastAPI's validation (and its 422).
        self.lease = Route("POST", STORE_PREFIX + "/rollouts/lease", self._lease)
        self.spans = Route("POST", STORE_PREFIX + "/spans", self._spans)
        self.heartbeat = Route(
            "POST", attempt + "/heartbeat", self._heartbeat, max_param_length=MAX_ID_LENGTH
        )
        self.finish = Route("POST", attempt + "/finish", self._finish, max_param_length=MAX_ID_LENGTH)
        self.table = RouteTable(
            [self.lease, self.spans, self.heartbeat, self.finish],
            max_body_bytes=max_body_bytes,
            on_error=lambda _, exc: error_for(exc),
            check_head=self._check_head,
        )

    def _check_head(self, request: RouteRequest) -> None:
        problem = token_problem(request.header(b"authorization"), self.token)
        if problem is not None:
            raise AuthenticationError(problem)
        check_content_type(request.header(b"content-type") or "")

    async def _lease(self, request: RouteRequest) -> Response:
        body = parse_body(LeaseRequest, request.body)
        leased = await self.get_store().lease_rollouts(
            body.runner_id,
            max_rollouts=body.max_rollouts,
            lease_seconds=body.lease_seconds,
            wait_seconds=body.wait_seconds,
            mode=body.mode,
        )
        if leased and self.on_lease is not None:
            self.on_lease(leased)
        return json_response(LEASED, leased)

    async def _spans(self, request: RouteRequest) -> Response:
        added = await ingest_spans(self.get_store(), request.body)
        return Response(b'{"added":%d}' % added, media_type="application/json")

    async def _heartbeat(self, request: RouteRequest) -> Response:
        body = parse_body(HeartbeatRequest, request.body)
        attempt_id = _attempt_id(request)
        return json_response(
            ATTEMPT, await self.get_store().heartbeat(attempt_id, lease_seconds=body.lease_seconds)
        )

    async def _finish(self, request: RouteRequest) -> Response:
        body = parse_body(AttemptOutcome, request.body)
        attempt_id = _attempt_id(request)
        return json_response(ROLLOUT, await self.get_store().finish_attempt(attempt_id, body))
