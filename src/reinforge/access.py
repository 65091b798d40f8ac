"""Per-attempt bearer tokens: an HMAC of the attempt id under the gateway's secret.

Why HMAC and not a token table: the gateway can verify a token with no store round-trip, and an
agent's key opens only its own attempt, so a subprocess agent's environment holds no trainer secret.
"""

from __future__ import annotations

import hashlib
import hmac

TOKEN_PREFIX = "rf-"
FINISH_TOKEN_PREFIX = "rff-"
_FINISH_KEY_LABEL = b"reinforge finish-token key v1"


def attempt_token(secret: str, attempt_id: str) -> str:
    """The bearer token that authorises calls for `attempt_id` (give it to the agent as its API key)."""
    if not secret:
        raise ValueError("the gateway secret must not be empty")
    digest = hmac.new(secret.encode(), attempt_id.encode(), hashlib.sha256).hexdigest()
    return TOKEN_PREFIX + digest


def finish_token(secret: str, attempt_id: str) -> str:
    """The token that lets a runner finish `attempt_id` through the gateway (`POST .../finish`).

    Signed under a key derived from the secret, so no attempt token (which the agent holds) is ever a
    finish token: an agent can record rewards for its attempt but not end it.
    """
    if not secret:
        raise ValueError("the gateway secret must not be empty")
    key = hmac.new(secret.encode(), _FINISH_KEY_LABEL, hashlib.sha256).digest()
    return FINISH_TOKEN_PREFIX + hmac.new(key, attempt_id.encode(), hashlib.sha256).hexdigest()


def token_matches(expected: str, given: str | None) -> bool:
    """Constant-time comparison, so the token can't be guessed byte by byte from timings."""
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())
