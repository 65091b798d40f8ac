"""Per-attempt bearer tokens: the attempt id and its HMAC under the gateway's secret.

Why HMAC and not a token table: the gateway can verify a token with no store round-trip, and an
agent's key opens only its own attempt, so a subprocess agent's environment holds no trainer secret.
Why the id in the token: the key alone then says which attempt a call belongs to, so every attempt
can share one base URL (`<gateway>/v1`). Frameworks that build an HTTP client per base URL and cache
it (LangChain's ChatOpenAI spends two SSL contexts on each) then reuse one client for every rollout.
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
    return f"{TOKEN_PREFIX}{attempt_id}.{digest}"


def attempt_of_token(token: str | None) -> str | None:
    """The attempt id an attempt token names (unverified: check it with `attempt_token`)."""
    if not token or not token.startswith(TOKEN_PREFIX):
        return None
    attempt_id, dot, digest = token[len(TOKEN_PREFIX) :].rpartition(".")
    return attempt_id if dot and attempt_id and len(digest) == 64 else None


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
