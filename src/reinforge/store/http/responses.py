"""Responses and the error envelope of the store server, whichever way a request is answered.

Every error leaves as `{"error": {"type": ..., "message": ...}}` with the status of its
`reinforge.errors` class, from the FastAPI routes and the per-rollout route table alike: both send
what they raise through `error_for`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from reinforge.errors import AuthenticationError, ReinforgeError, StoreUnavailableError
from reinforge.net.routes import BadContentLengthError, BodyTooLargeError, ClientDisconnectedError

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


def json_response(adapter: TypeAdapter[_T], value: _T, status_code: int = 200) -> Response:
    """Serialised by pydantic-core straight to bytes, which keeps span-heavy pages cheap."""
    return Response(adapter.dump_json(value), status_code=status_code, media_type="application/json")


def error_response(
    status_code: int, type_name: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    body = json.dumps({"error": {"type": type_name, "message": message}}).encode()
    return Response(body, status_code=status_code, media_type="application/json", headers=headers)


def describe_validation(errors: Sequence[Any]) -> str:
    """One line per problem, e.g. `body.specs.0.max_attempts: Input should be ...` (first ten)."""
    parts = []
    for err in errors[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = err.get("msg", "invalid")
        if err.get("type") == "json_invalid" and err.get("ctx", {}).get("error"):
            msg = f"malformed JSON: {err['ctx']['error']}"
        parts.append(f"{loc}: {msg}" if loc else msg)
    if len(errors) > 10:
        parts.append(f"... and {len(errors) - 10} more")
    return "; ".join(parts)


def validation_error_response(errors: Sequence[Any]) -> Response:
    """Malformed JSON is a 400; a body that does not fit its model a 422."""
    status = 400 if any(err.get("type") == "json_invalid" for err in errors) else 422
    return error_response(status, "InvalidRequestError", describe_validation(errors))


def http_error_type(status_code: int) -> str:
    """The error type name for a plain HTTP error raised by the framework (404, 413, ...)."""
    return {
        404: "NotFoundError",
        413: "PayloadTooLargeError",
        401: "AuthenticationError",
    }.get(status_code, "InvalidRequestError" if status_code < 500 else "ReinforgeError")


def body_too_large_message(limit: int, declared: int | None) -> str:
    if declared is not None:
        return f"request body of {declared} bytes exceeds the limit of {limit} bytes"
    return f"request body exceeds the limit of {limit} bytes"


def error_for(exc: Exception) -> Response:
    """The error envelope for anything a route raised."""
    if isinstance(exc, ClientDisconnectedError):
        exc = StoreUnavailableError(str(exc))
    if isinstance(exc, RequestValidationError):
        return validation_error_response(exc.errors())
    if isinstance(exc, ReinforgeError):
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthenticationError) else None
        if exc.http_status >= 500:
            logger.warning("store error: %s", exc)
        return error_response(exc.http_status, type(exc).__name__, str(exc), headers)
    if isinstance(exc, BodyTooLargeError):
        return error_response(413, "PayloadTooLargeError", body_too_large_message(exc.limit, exc.declared))
    if isinstance(exc, BadContentLengthError):
        return error_response(400, "InvalidRequestError", "Content-Length is not a number")
    if isinstance(exc, StarletteHTTPException):
        type_name = http_error_type(exc.status_code)
        return error_response(exc.status_code, type_name, str(exc.detail), dict(exc.headers or {}) or None)
    logger.exception("unexpected error in the store server", exc_info=exc)
    return error_response(500, "ReinforgeError", f"internal error in the store server: {type(exc).__name__}")
