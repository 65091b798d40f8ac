"""The runner's calls to the gateway: finish an attempt (one request), flush an abandoned one.

Why through the gateway: the gateway holds the attempt's LLM spans in its recorder and sits beside the
store, so one request there can write the runner's spans with the gateway's, wait until all of them
are stored, and finish the attempt. Finishing directly would cost three round trips per attempt
(gateway flush, add_spans, finish_attempt). Plain-http gateways are reached with the keep-alive
client the gateway itself uses upstream (a fraction of httpx's per-request CPU); https goes through
httpx.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from urllib.parse import quote, urlsplit

import httpx

from reinforge.errors import (
    InvalidRequestError,
    NotFoundError,
    ReinforgeError,
    StaleAttemptError,
    StoreUnavailableError,
)
from reinforge.gateway.auth import attempt_token, finish_token
from reinforge.gateway.http11 import HTTPConnectionError, KeepAliveClient
from reinforge.types import AttemptOutcome, Span


class GatewayClient:
    """Finishes and flushes attempts at the gateway `gateway_url` (signed with its `secret`)."""

    def __init__(self, gateway_url: str, secret: str, *, timeout_s: float = 60.0) -> None:
        self.gateway_url = gateway_url.rstrip("/")
        self._secret = secret
        self.timeout_s = timeout_s
        self._fast: KeepAliveClient | None = None
        self._httpx: httpx.AsyncClient | None = None
        if urlsplit(self.gateway_url).scheme == "http":
            self._fast = KeepAliveClient(self.gateway_url)
        else:
            self._httpx = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), trust_env=False)

    async def finish(self, attempt_id: str, outcome: AttemptOutcome, spans: Sequence[Span] = ()) -> None:
        """Record `spans`, flush the attempt's spans and finish it (see `Gateway.finish_attempt`).

        Raises StaleAttemptError (finished too late), NotFoundError, StoreUnavailableError (worth
        retrying: the gateway or its store is unreachable or failing), or InvalidRequestError.
        """
        body = b"".join(
            (
                b'{"outcome":',
                outcome.model_dump_json().encode(),
                b',"spans":[',
                b",".join(span.model_dump_json().encode() for span in spans),
                b"]}",
            )
        )
        await self._post(attempt_id, "finish", body, finish_token(self._secret, attempt_id))

    async def flush(self, attempt_id: str) -> None:
        """Return once every span the gateway recorded for the attempt is in the store."""
        await self._post(attempt_id, "flush", b"{}", attempt_token(self._secret, attempt_id))

    async def _post(self, attempt_id: str, action: str, body: bytes, token: str) -> None:
        path = f"/r/{quote(attempt_id, safe='')}/{action}"
        headers = {"Authorization": f"Bearer {token}"}
        try:
            if self._fast is not None:
                status, data = await self._fast.post(path, body, self.timeout_s, headers)
            else:
                assert self._httpx is not None
                headers["Content-Type"] = "application/json"
                response = await self._httpx.post(self.gateway_url + path, content=body, headers=headers)
                status, data = response.status_code, response.content
        except (HTTPConnectionError, OSError, TimeoutError, httpx.HTTPError) as e:
            raise StoreUnavailableError(f"gateway {action} for {attempt_id} failed: {e!r}") from e
        if status >= 400:
            raise _error(status, data, f"gateway {action} for {attempt_id}")

    async def aclose(self) -> None:
        if self._fast is not None:
            self._fast.close()
        if self._httpx is not None:
            await self._httpx.aclose()


def _error(status: int, data: bytes, what: str) -> ReinforgeError:
    """The typed error for a gateway error response (OpenAI-shaped body; `code` names our class)."""
    try:
        error = json.loads(data)["error"]
        message, code = str(error.get("message")), error.get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, code = data[:500].decode(errors="replace"), None
    text = f"{what} answered {status}: {message}"
    if status == 409 and code == StaleAttemptError.__name__:
        return StaleAttemptError(text)
    if status == 404 and code == NotFoundError.__name__:
        return NotFoundError(text)
    if status >= 500 or status in (408, 429):
        return StoreUnavailableError(text)
    return InvalidRequestError(text)
