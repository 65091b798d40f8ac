"""Reading request headers straight from an ASGI scope, shared by the store server and the gateway.

Their hot paths look up a header or two per request; Starlette's `Headers` builds a mapping for
that, and a missing header raises inside it. A scan of the raw list does neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def scope_header(scope: Mapping[str, Any], name: bytes) -> str | None:
    """The first value of header `name` (lower-case, as ASGI servers pass names), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None when there is none."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
