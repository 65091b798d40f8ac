"""`HttpStoreClient`: the `Store` protocol over HTTP, so user code can't tell local from remote.

The server's error envelope is turned back into the same `reinforge.errors` class a local store
raises; network failures become `StoreUnavailableError`. Every call goes one way: a `DirectSender`
on reinforge's keep-alive transport, from any event loop. Waits longer than the server allows
per call are split into several calls, each with an HTTP timeout longer than its wait.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from reinforge import errors
from reinforge.net.keepalive_transport import DirectSender, KeepAliveTransport, Reply
from reinforge.retry import Backoff, Retrying
from reinforge.store.http.adapters import (
    ADDED,
    ATTEMPT,
    ATTEMPT_PAGE,
    COUNTERS,
    LEASED,
    RESOURCES,
    ROLLOUT,
    ROLLOUT_PAGE,
    ROLLOUTS,
    SPAN_PAGE,
)
from reinforge.store.http.auth import resolve_client_token
from reinforge.store.http.wire import (
    MAX_WAIT_SECONDS,
    AddSpansRequest,
    EnqueueRequest,
    HeartbeatRequest,
    LeaseRequest,
    PutResourcesRequest,
    RolloutIdsRequest,
    WaitRequest,
)
from reinforge.types import (
    Attempt,
    AttemptOutcome,
    AttemptQuery,
    LeasedRollout,
    Page,
    ResourcesVersion,
    Rollout,
    RolloutMode,
    RolloutQuery,
    RolloutSpec,
    Span,
    SpanQuery,
    StoreCounters,
)

_T = TypeVar("_T")


_ID_CHUNK = 10_000
"""Id lists longer than this are sent in several calls (keeps each SQL `IN (...)` bounded)."""

_FIXED_ROUTES = (
    "/store/rollouts/enqueue",
    "/store/rollouts/lease",
    "/store/rollouts/cancel",
    "/store/rollouts/wait",
    "/store/rollouts/query",
    "/store/attempts/query",
    "/store/spans",
    "/store/spans/query",
    "/store/resources",
    "/store/resources/latest",
    "/store/counters",
    "/health",
)

_ERRORS_BY_NAME: dict[str, type[errors.ReinforgeError]] = {
    cls.__name__: cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, errors.ReinforgeError)
}
_ERRORS_BY_STATUS: dict[int, type[errors.ReinforgeError]] = {
    400: errors.InvalidRequestError,
    401: errors.AuthenticationError,
    403: errors.AuthenticationError,
    404: errors.NotFoundError,
    409: errors.ConflictError,
    413: errors.PayloadTooLargeError,
    422: errors.InvalidRequestError,
    502: errors.StoreUnavailableError,
    503: errors.StoreUnavailableError,
    504: errors.StoreUnavailableError,
}


def error_from_response(response: Reply) -> errors.ReinforgeError:
    """The typed exception for an error response of the store server (or whatever answered): its
    `{"error": {"type", "message"}}` envelope names the class; a body without one (a proxy's page)
    is classed by its status."""
    status_code, content = response.status_code, response.content
    type_name, message = "", ""
    try:
        body = json.loads(content)
        detail = body.get("error") if isinstance(body, dict) else None
        if isinstance(detail, dict):
            type_name = str(detail.get("type", ""))
            message = str(detail.get("message", ""))
    except ValueError:
        pass
    if not message:
        text = content[:500].decode("utf-8", errors="replace")
        message = f"HTTP {status_code} from {response.url}: {text}"
    cls = _ERRORS_BY_NAME.get(type_name) or _ERRORS_BY_STATUS.get(status_code, errors.ReinforgeError)
    return cls(message)


class HttpStoreClient:
    """A `reinforge.store.protocol.Store` that talks to `reinforge store serve` (or `create_store_app`).

    `token` defaults to `$REINFORGE_STORE_TOKEN`. It re-sends (with back-off) a call whose connection
    could not be opened, and a call that is safe to apply twice whose connection broke: reads, waits,
    heartbeats, span batches (idempotent by span id), enqueues whose specs all carry a `rollout_id`,
    cancels, and attempt finishes (a re-sent finish that finds its first copy applied returns the
    rollout, as the first would have). Until the client has reached the server once it gives up after
    `connect_retries` tries (a wrong URL fails fast); after that it keeps trying for
    `restart_window_s`, which rides over a store server restart. Other failures raise
    `StoreUnavailableError`.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout_seconds: float = 60.0,
        connect_retries: int = 5,
        restart_window_s: float = 30.0,
        max_connections: int = 64,
        transport: KeepAliveTransport | None = None,
    ) -> None:
        resolved = resolve_client_token(token)
        if not resolved:
            raise errors.AuthenticationError(
                "no store token: pass token=..., or set REINFORGE_STORE_TOKEN "
                "(the server wrote it to <run-dir>/store.token)"
            )
        self.base_url = base_url.rstrip("/")
        self._token = resolved
        self._timeout = timeout_seconds
        # Until the server answered once, a wrong URL fails after `connect_retries` re-sends; from
        # then on a restart is ridden over for `restart_window_s`.
        self._connect_backoff = Backoff(0.1, max_s=2.0, tries=connect_retries + 1)
        self._restart_backoff = Backoff(0.1, max_s=2.0, within_s=restart_window_s)
        self._reached = False  # set once any call got an answer: from then on a restart is ridden over
        self._retrying = True
        # Absolute URLs built once for the routes without ids in them: httpx then skips joining
        # each call's path to the base URL.
        self._fixed_urls = {path: httpx.URL(self.base_url + path) for path in _FIXED_ROUTES}
        # Every call goes straight to the transport (`DirectSender`). It keeps connections per event
        # loop: one client serves the trainer's loop and the gateway's thread alike, and
        # `max_connections` bounds each loop's connections.
        self._direct = DirectSender(
            transport or KeepAliveTransport(max_connections=max_connections),
            {"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
            httpx.Timeout(self._timeout, connect=10.0),
        )

    async def __aenter__(self) -> HttpStoreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- transport ------------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        adapter: TypeAdapter[_T],
        body: BaseModel | None = None,
        *,
        wait_seconds: float = 0.0,
        idempotent: bool = False,
    ) -> _T:
        response, _ = await self._exchange(
            method, path, body, wait_seconds=wait_seconds, idempotent=idempotent
        )
        if response.status_code >= 400:
            raise error_from_response(response)
        return adapter.validate_json(response.content)

    async def _exchange(
        self,
        method: str,
        path: str,
        body: BaseModel | None = None,
        *,
        wait_seconds: float = 0.0,
        idempotent: bool = False,
    ) -> tuple[Reply, bool]:
        """(the response, whether the request was re-sent after a connection that broke mid-call)."""
        try:
            content = body.__pydantic_serializer__.to_json(body) if body is not None else None
        except PydanticSerializationError as exc:
            what = type(body).__name__
            raise errors.InvalidRequestError(f"{what} holds a value that is not JSON: {exc}") from exc
        # A long-poll may legitimately take `wait_seconds`; the read timeout must outlast it.
        timeout = httpx.Timeout(self._timeout + wait_seconds, connect=10.0) if wait_seconds else None
        url = self._fixed_urls.get(path) or httpx.URL(self.base_url + path)
        retry: Retrying | None = None  # started at the first failure: nothing to pay on the usual path
        resent = False
        while True:
            try:
                response = await self._direct.send(method, url, content, timeout=timeout)
                break
            except httpx.TransportError as exc:
                # A refused connection never reached the server, so any call may be re-sent; a call
                # cut off later may have been applied, so only calls that are safe twice are re-sent.
                refused = isinstance(exc, httpx.ConnectError)
                safe = refused or (idempotent and not isinstance(exc, httpx.TimeoutException))
                if retry is None:
                    retry = (self._restart_backoff if self._reached else self._connect_backoff).start()
                delay = retry.failed()
                if not safe or delay is None or not self._retrying:
                    raise self._unavailable(method, path, exc) from exc
                resent = resent or not refused
                await asyncio.sleep(delay)
        self._reached = True
        return response, resent

    def _unavailable(self, method: str, path: str, exc: Exception) -> errors.StoreUnavailableError:
        problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return errors.StoreUnavailableError(
            f"the store at {self.base_url} did not answer {method} {path} ({problem})"
        )

    @staticmethod
    def _request(model: type[BaseModel], **fields: Any) -> BaseModel:
        """Validate on this side too, so a bad argument fails like a local store's would."""
        try:
            return model(**fields)
        except ValidationError as exc:
            raise errors.InvalidRequestError(str(exc)) from exc

    # -- the Store protocol ---------------------------------------------------------------------

    async def enqueue_rollouts(self, specs: Sequence[RolloutSpec]) -> list[Rollout]:
        body = self._request(EnqueueRequest, specs=list(specs))
        # With every id given, a second enqueue returns the rollouts unchanged: safe to re-send.
        named = all(s.rollout_id is not None for s in specs)
        return await self._call("POST", "/store/rollouts/enqueue", ROLLOUTS, body, idempotent=named)

    async def lease_rollouts(
        self,
        runner_id: str,
        max_rollouts: int = 1,
        lease_seconds: float = 60.0,
        wait_seconds: float = 0.0,
        mode: RolloutMode | None = None,
    ) -> list[LeasedRollout]:
        deadline = time.monotonic() + _non_negative("wait_seconds", wait_seconds)
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            this_wait = min(remaining, MAX_WAIT_SECONDS)
            body = self._request(
                LeaseRequest,
                runner_id=runner_id,
                max_rollouts=max_rollouts,
                lease_seconds=lease_seconds,
                wait_seconds=this_wait,
                mode=mode,
            )
            leased = await self._call("POST", "/store/rollouts/lease", LEASED, body, wait_seconds=this_wait)
            if leased or remaining <= this_wait:
                return leased

    async def heartbeat(self, attempt_id: str, lease_seconds: float = 60.0) -> Attempt:
        body = self._request(HeartbeatRequest, lease_seconds=lease_seconds)
        path = f"/store/attempts/{_segment(attempt_id)}/heartbeat"
        return await self._call("POST", path, ATTEMPT, body, idempotent=True)

    async def finish_attempt(self, attempt_id: str, outcome: AttemptOutcome) -> Rollout:
        if outcome.reward is not None and not math.isfinite(outcome.reward):
            # JSON has no NaN/inf: refuse here, as a local store does, rather than send null.
            raise errors.InvalidRequestError(f"reward must be a finite number, got {outcome.reward}")
        path = f"/store/attempts/{_segment(attempt_id)}/finish"
        response, resent = await self._exchange("POST", path, outcome, idempotent=True)
        if response.status_code < 400:
            return ROLLOUT.validate_json(response.content)
        error = error_from_response(response)
        if resent and isinstance(error, errors.StaleAttemptError):
            # The connection broke after the first copy was applied: this one found the attempt
            # already ended. If it ended as this finish said, the first copy did it.
            attempt = await self.get_attempt(attempt_id)
            if attempt.status.value == outcome.status.value:
                return await self.get_rollout(attempt.rollout_id)
        raise error

    async def cancel_rollouts(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        ids = list(rollout_ids)
        cancelled: list[Rollout] = []
        for start in range(0, max(len(ids), 1), _ID_CHUNK):
            body = self._request(RolloutIdsRequest, rollout_ids=ids[start : start + _ID_CHUNK])
            chunk: list[Rollout] = await self._call(
                "POST", "/store/rollouts/cancel", ROLLOUTS, body, idempotent=True
            )
            cancelled.extend(chunk)
        return cancelled

    async def add_spans(self, spans: Sequence[Span]) -> int:
        if not spans:
            return 0
        body = AddSpansRequest.model_construct(spans=list(spans))  # already validated Span objects
        result = await self._call("POST", "/store/spans", ADDED, body, idempotent=True)
        return result.added

    async def get_rollout(self, rollout_id: str) -> Rollout:
        return await self._call("GET", f"/store/rollouts/{_segment(rollout_id)}", ROLLOUT, idempotent=True)

    async def get_attempt(self, attempt_id: str) -> Attempt:
        return await self._call("GET", f"/store/attempts/{_segment(attempt_id)}", ATTEMPT, idempotent=True)

    async def query_rollouts(self, query: RolloutQuery) -> Page[Rollout]:
        return await self._call("POST", "/store/rollouts/query", ROLLOUT_PAGE, query, idempotent=True)

    async def query_attempts(self, query: AttemptQuery) -> Page[Attempt]:
        return await self._call("POST", "/store/attempts/query", ATTEMPT_PAGE, query, idempotent=True)

    async def query_spans(self, query: SpanQuery) -> Page[Span]:
        return await self._call("POST", "/store/spans/query", SPAN_PAGE, query, idempotent=True)

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout_seconds: float) -> list[Rollout]:
        ids = list(dict.fromkeys(rollout_ids))
        deadline = time.monotonic() + _non_negative("timeout_seconds", timeout_seconds)
        final: dict[str, Rollout] = {}
        # Chunks one after the other share one deadline; a final rollout stays final, so rollouts
        # already seen final need no second look.
        for start in range(0, len(ids), _ID_CHUNK):
            chunk = ids[start : start + _ID_CHUNK]
            while True:
                remaining = max(0.0, deadline - time.monotonic())
                this_wait = min(remaining, MAX_WAIT_SECONDS)
                pending = [i for i in chunk if i not in final]
                body = self._request(WaitRequest, rollout_ids=pending, timeout_seconds=this_wait)
                for rollout in await self._call(
                    "POST", "/store/rollouts/wait", ROLLOUTS, body, wait_seconds=this_wait, idempotent=True
                ):
                    final[rollout.rollout_id] = rollout
                if all(i in final for i in chunk) or remaining <= this_wait:
                    break
        return [final[i] for i in ids if i in final]

    async def put_resources(
        self, resources: dict[str, object], version: int | None = None
    ) -> ResourcesVersion:
        body = self._request(PutResourcesRequest, resources=resources, version=version)
        return await self._call("POST", "/store/resources", RESOURCES, body)

    async def get_resources(self, version: int | None = None) -> ResourcesVersion:
        path = "/store/resources/latest" if version is None else f"/store/resources/{int(version)}"
        return await self._call("GET", path, RESOURCES, idempotent=True)

    async def counters(self) -> StoreCounters:
        return await self._call("GET", "/store/counters", COUNTERS, idempotent=True)

    def stop_retrying(self) -> None:
        """From now on a call fails at its first connection error: for a process on its way out (a
        runner whose trainer died), which should not wait out a restart that will never come."""
        self._retrying = False

    async def health(self) -> bool:
        """True when the server answers its health probe."""
        try:
            response = await self._direct.send("GET", self._fixed_urls["/health"])
        except httpx.TransportError:
            return False
        return response.status_code == 200

    async def close(self) -> None:
        """Close this loop's connections, and ask any other loop still running to close its own (the
        client stays usable: a later call opens fresh ones)."""
        await self._direct.transport.aclose()


def _non_negative(name: str, value: float) -> float:
    if not value >= 0:  # also catches NaN
        raise errors.InvalidRequestError(f"{name} must be >= 0, got {value}")
    return float(value)


def _segment(value: str) -> str:
    """An id as one URL path segment (ids are free-form strings; '/' or '?' must not split them)."""
    if not value:
        raise errors.InvalidRequestError("an id must not be empty")
    return quote(value, safe="")
