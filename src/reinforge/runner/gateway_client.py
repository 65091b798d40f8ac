"""The runner's calls to the gateway: finish attempts (one request, or one for several that end
together), flush an abandoned one.

Why through the gateway: the gateway holds the attempt's LLM spans in its recorder and sits beside the
store, so one request there can write the runner's spans with the gateway's, wait until all of them
are stored, and finish the attempt. Finishing directly would cost three round trips per attempt
(gateway flush, add_spans, finish_attempt).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from urllib.parse import quote

import httpx

from reinforge.access import attempt_token, finish_token
from reinforge.errors import (
    InvalidRequestError,
    NotFoundError,
    ReinforgeError,
    StaleAttemptError,
    StoreUnavailableError,
)
from reinforge.finish_wire import MAX_FINISH_BATCH
from reinforge.net.keepalive_transport import DirectSender, KeepAliveTransport
from reinforge.types import AttemptOutcome, Span


class GatewayClient:
    """Finishes and flushes attempts at the gateway `gateway_url` (signed with its `secret`).

    `transport` replaces the client's own keep-alive transport (to share one, or to watch the requests)."""

    def __init__(
        self,
        gateway_url: str,
        secret: str,
        *,
        timeout_s: float = 60.0,
        transport: KeepAliveTransport | None = None,
    ) -> None:
        self.gateway_url = gateway_url.rstrip("/")
        self._secret = secret
        self.timeout_s = timeout_s
        # Straight to the transport: fixed JSON routes, called once or twice per attempt.
        self._direct = DirectSender(
            transport or KeepAliveTransport(),
            {"Content-Type": "application/json"},
            httpx.Timeout(timeout_s, connect=10.0),
        )
        self._batch_url = httpx.URL(self.gateway_url + "/finish")  # built once: the hot route
        self._finishing: list[tuple[str, bytes, asyncio.Future[None]]] = []
        self._finisher: asyncio.Task[None] | None = None

    async def finish(self, attempt_id: str, outcome: AttemptOutcome, spans: Sequence[Span] = ()) -> None:
        """Record `spans`, flush the attempt's spans and finish it (see `Gateway.finish_attempt`).

        Finishes asked for while an earlier one is in flight queue up and go out together, in one
        `POST /finish` (each with its own result), as soon as it returns: a burst of attempts
        ending together costs a few requests instead of one each, and a lone finish waits for
        nothing.

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
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._finishing.append((attempt_id, body, done))
        if self._finisher is None or self._finisher.done():
            self._finisher = loop.create_task(self._send_finishes(), name="gateway-finishes")
        await done

    async def _send_finishes(self) -> None:
        batch: list[tuple[str, bytes, asyncio.Future[None]]] = []
        try:
            while self._finishing:
                batch = self._finishing[:MAX_FINISH_BATCH]
                del self._finishing[:MAX_FINISH_BATCH]
                batch = [entry for entry in batch if not entry[2].done()]  # callers cancelled meanwhile
                if len(batch) == 1:
                    attempt_id, body, done = batch[0]
                    try:
                        await self._post(attempt_id, "finish", body, finish_token(self._secret, attempt_id))
                    except ReinforgeError as e:
                        _settle(done, e)
                    else:
                        _settle(done, None)
                elif batch:
                    await self._finish_many(batch)
        finally:
            # Cancelled (the loop is closing): nobody may be left waiting for an answer.
            unsent = StoreUnavailableError("the finish was not sent: the gateway client stopped")
            for _, _, done in [*batch, *self._finishing]:
                _settle(done, unsent)
            self._finishing.clear()

    async def _finish_many(self, batch: list[tuple[str, bytes, asyncio.Future[None]]]) -> None:
        items = [
            b"".join(
                (
                    b'{"attempt_id":',
                    json.dumps(attempt_id).encode(),
                    b',"token":"',
                    finish_token(self._secret, attempt_id).encode(),
                    b'",',
                    body[1:],  # the single finish's fields, inside the item's object
                )
            )
            for attempt_id, body, _ in batch
        ]
        what = f"gateway finish of {len(batch)} attempts"
        try:
            status, data = await self._request(
                self._batch_url, b'{"items":[' + b",".join(items) + b"]}", None, what
            )
            if status >= 400:
                raise _error(status, data, what)
            results = json.loads(data)["results"]
            if not isinstance(results, list) or len(results) != len(batch):
                raise StoreUnavailableError(f"{what}: the gateway answered {len(results)} results")
        except ReinforgeError as e:
            for _, _, done in batch:
                _settle(done, e)
            return
        except (ValueError, KeyError, TypeError) as e:
            error = StoreUnavailableError(f"{what}: unreadable answer from the gateway: {e!r}")
            for _, _, done in batch:
                _settle(done, error)
            return
        for (attempt_id, _, done), result in zip(batch, results, strict=True):
            code = int(result.get("status", 500)) if isinstance(result, dict) else 500
            if code < 400:
                _settle(done, None)
            else:
                error_json = json.dumps({"error": result.get("error") if isinstance(result, dict) else None})
                _settle(done, _error(code, error_json.encode(), f"gateway finish for {attempt_id}"))

    async def flush(self, attempt_id: str) -> None:
        """Return once every span the gateway recorded for the attempt is in the store."""
        await self._post(attempt_id, "flush", b"{}", attempt_token(self._secret, attempt_id))

    async def _post(self, attempt_id: str, action: str, body: bytes, token: str) -> None:
        path = f"/r/{quote(attempt_id, safe='')}/{action}"
        what = f"gateway {action} for {attempt_id}"
        status, data = await self._request(path, body, token, what)
        if status >= 400:
            raise _error(status, data, what)

    async def _request(
        self, path: str | httpx.URL, body: bytes, token: str | None, what: str
    ) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else None
        url = path if isinstance(path, httpx.URL) else httpx.URL(self.gateway_url + path)
        try:
            response = await self._direct.send("POST", url, body, headers=headers)
        except httpx.HTTPError as e:
            raise StoreUnavailableError(f"{what} failed: {e!r}") from e
        return response.status_code, response.content

    async def aclose(self) -> None:
        await self._direct.transport.aclose()


def _settle(done: asyncio.Future[None], error: ReinforgeError | None) -> None:
    if done.done():  # the caller was cancelled: nobody is waiting for the result
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)


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
