"""Errors in OpenAI's format: `{"error": {"message", "type", "param", "code"}}`.

Agents written against OpenAI's SDKs parse this shape to raise their own typed exceptions
(`openai.NotFoundError`, `openai.BadRequestError`...), so every gateway error uses it.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from reinforge.errors import PromptTooLongError, ReinforgeError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    502: "upstream_error",
    503: "service_unavailable",
}


class GatewayHTTPError(ReinforgeError):
    """An error with an explicit status, `param` and `code` for the OpenAI error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.http_status = status
        self.param = param
        self.code = code


def error_object(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The inside of an error body: `{"message", "type", "param", "code"}`."""
    return {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> bytes:
    return json.dumps({"error": error_object(status, message, param, code)}).encode()


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> Response:
    return Response(
        error_body(status, message, param, code), status_code=status, media_type="application/json"
    )


def response_for(exc: ReinforgeError) -> Response:
    """Map any reinforge error to its HTTP status and an OpenAI-shaped body."""
    return error_response(exc.http_status, **_fields(exc))


def status_and_error(exc: ReinforgeError) -> tuple[int, dict[str, Any]]:
    """`response_for`, as a status and the error object (for one item of a batched reply)."""
    return exc.http_status, error_object(exc.http_status, **_fields(exc))


def _fields(exc: ReinforgeError) -> dict[str, Any]:
    return {
        "message": str(exc) or type(exc).__name__,
        "param": getattr(exc, "param", None),
        "code": getattr(exc, "code", None) or type(exc).__name__,
    }


# -- Anthropic's envelope, for the Messages route ---------------------------------------------------

_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_body(status: int, message: str, code: str | None = None) -> bytes:
    """`{"type": "error", "error": {"type", "message", "details"}}`: the Anthropic SDK raises its typed
    error for the status (and for `details.error_code`, e.g. `ThreadNotFoundError`) with the message."""
    kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    error: dict[str, Any] = {"type": kind, "message": message}
    if code is not None:
        error["details"] = {"error_code": code}
    return json.dumps({"type": "error", "error": error}).encode()


def anthropic_error_response(status: int, message: str, code: str | None = None) -> Response:
    body = anthropic_error_body(status, message, code)
    return Response(body, status_code=status, media_type="application/json")


def anthropic_fields(exc: ReinforgeError) -> tuple[int, str, str | None]:
    """Status, message and error code of `exc` as the Messages API words it: a prompt too long for
    the context is Anthropic's own "prompt is too long: N tokens > M maximum" (Claude Code reads the
    two numbers from it), with no error code, as the API sends it."""
    if isinstance(exc, PromptTooLongError):
        return exc.http_status, exc.anthropic_message, None
    return exc.http_status, str(exc) or type(exc).__name__, getattr(exc, "code", None)


def anthropic_response_for(exc: ReinforgeError) -> Response:
    """Any reinforge error with its HTTP status and an Anthropic-shaped body."""
    return anthropic_error_response(*anthropic_fields(exc))
