"""Responses and error envelopes shared by the store server's FastAPI routes and its hot routes.

Every error leaves as `{"error": {"type": ..., "message": ...}}` with the status of its
`reinforge.errors` class, whichever of the two paths answered the request.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import TypeAdapter
from starlette.responses import Response
from starlette.types import Scope

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


def route_path(scope: Scope) -> str:
    """The path the app routes on (without the prefix it may be mounted under)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
