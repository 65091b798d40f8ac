"""The dashboard's routes on the store server: the page and its assets (no token: they hold no data),
and read-only JSON and server-sent-event routes under `/dashboard/api/` (the store's token).

JSON routes take the token as `Authorization: Bearer <token>`, like the store's routes. The event
stream (`/dashboard/api/events`) is read by the browser's `EventSource`, which cannot set headers, so
that one route takes the token as the `token` query parameter instead (compared in constant time);
no other route accepts it there.

Metrics come from the run folder's `metrics.jsonl` and transitions from its `transitions.jsonl`
(store/run_files.py): the store server knows the run folder when `reinforge train`/`demo` starts it
and when `reinforge store serve --run-dir DIR` serves a finished run.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from reinforge.dashboard import dashboard_asset, dashboard_html
from reinforge.errors import AuthenticationError, InvalidRequestError, NotFoundError
from reinforge.store.dashboard_backend import dashboard_queries_for
from reinforge.store.dashboard_queries import (
    DashboardQueries,
    RolloutFilter,
    RolloutListPage,
    RunnersView,
)
from reinforge.store.http.auth import tokens_match
from reinforge.store.http.dashboard_views import LogprobsView, SpanView, logprobs_view, span_view
from reinforge.store.http.rollout_routes import token_problem
from reinforge.store.http.wire import error_responses
from reinforge.store.protocol import Store
from reinforge.store.run_files import RunFiles, TransitionRecord
from reinforge.types import (
    MAX_PAGE_SIZE,
    Attempt,
    AttemptQuery,
    Rollout,
    RolloutMode,
    RolloutStatus,
    Span,
    SpanQuery,
    StoreCounters,
)

API_PREFIX = "/dashboard/api"
RolloutId = Annotated[str, Query(min_length=1, max_length=128, pattern=r"^[^\x00]+$")]
STREAM_TICK_S = 1.0
"""How often an event stream looks for new metrics and changed counters."""
STREAM_MAX_S = 300.0
"""An event stream ends after this long; the browser reconnects at once. It bounds how long a server
shutdown can wait for a stream whose browser never closes."""
STREAM_COUNTERS_EVERY = 2
"""Counters are read every this many ticks (a count over a big store costs more than a file stat)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Overview(_Model):
    counters: StoreCounters
    run_dir: str | None
    metrics: int
    """How many records metrics.jsonl holds (0 without a run folder)."""
    server_time: float


class MetricsPage(_Model):
    records: list[dict[str, Any]]
    next: int
    """Ask `?since=<next>` for what comes after these."""


class RolloutDetail(_Model):
    rollout: Rollout
    policy_version: int | None
    attempts: list[Attempt]
    spans: list[SpanView]
    transitions: list[TransitionRecord]
    transitions_source: str
    """Where transitions come from: the run folder's file, or 'none' (no run folder / not trained)."""


class DashboardState:
    """What the routes share: the store's queries, the run folder's files, and the open streams
    (closed by `close()` when the server is about to stop, so a shutdown never waits on a browser)."""

    def __init__(self, get_store: Callable[[], Store], run_dir: Path | None) -> None:
        self._get_store = get_store
        self.files = RunFiles(run_dir)
        self._queries: DashboardQueries | None = None
        self._queries_for: Store | None = None
        self.closing = threading.Event()

    @property
    def store(self) -> Store:
        return self._get_store()

    @property
    def queries(self) -> DashboardQueries:
        store = self.store
        if self._queries is None or self._queries_for is not store:
            self._queries, self._queries_for = dashboard_queries_for(store), store
        return self._queries

    def close(self) -> None:
        self.closing.set()


_ERRORS = error_responses(
    {
        400: "An invalid filter (reward_min above reward_max), an unknown query parameter",
        404: "Unknown rollout or span",
        422: "Parameters fail validation",
    }
)


def _json(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


def mount_dashboard(
    app: FastAPI, get_store: Callable[[], Store], token: str, run_dir: str | os.PathLike[str] | None = None
) -> DashboardState:
    """Add the page, its assets and its API to the store's `app`; `app.state.dashboard` holds the
    returned state (call its `close()` before stopping the server)."""
    state = DashboardState(get_store, Path(run_dir) if run_dir is not None else None)
    app.state.dashboard = state

    @app.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        # The page holds no data; its script reads the token from the URL fragment or asks for it.
        return HTMLResponse(dashboard_html(), headers={"Cache-Control": "no-cache"})

    @app.get("/dashboard/assets/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        found = dashboard_asset(name)
        if found is None:
            raise NotFoundError(f"no dashboard asset named {name!r}")
        body, media_type = found
        return Response(body, media_type=media_type, headers={"Cache-Control": "max-age=300"})

    def require_token(request: Request) -> None:
        problem = token_problem(request.headers.get("authorization"), token)
        if problem is not None:
            raise AuthenticationError(problem)

    router = APIRouter(
        prefix=API_PREFIX, tags=["dashboard"], dependencies=[Depends(require_token)], responses=_ERRORS
    )
    _add_json_routes(router, state)
    app.include_router(router)
    _add_event_stream(app, state, token)
    return state


_ROLLOUT_PARAMS = (
    "status",
    "mode",
    "reward_min",
    "reward_max",
    "task",
    "agent",
    "policy_version",
    "before",
    "limit",
)


REPEATABLE_PARAMETERS = frozenset({"status"})
"""Query parameters that take a list (`?status=failed&status=succeeded`); every other one takes one value."""


def _only(*names: str) -> Any:
    """A dependency refusing query parameters the route does not take, and a single-valued one given
    twice: a misspelt filter (`?staus=failed`) is an error, not a silently unfiltered list, and
    `?since=1&since=9` is an error, not whichever value the framework happens to keep."""
    allowed = frozenset(names)

    def check(request: Request) -> None:
        unknown = sorted(set(request.query_params.keys()) - allowed)
        if unknown:
            takes = ", ".join(sorted(allowed)) or "no parameters"
            raise InvalidRequestError(f"unknown query parameter {unknown[0]!r}: this route takes {takes}")
        for name in sorted(set(request.query_params.keys()) - REPEATABLE_PARAMETERS):
            count = len(request.query_params.getlist(name))
            if count > 1:
                raise InvalidRequestError(f"query parameter {name!r} given {count} times: it takes one value")

    return Depends(check)


def _add_json_routes(router: APIRouter, state: DashboardState) -> None:
    @router.get("/overview", response_model=Overview, dependencies=[_only()])
    async def overview() -> Response:
        counters = await state.store.counters()
        run_dir = state.files.run_dir
        return _json(
            Overview(
                counters=counters,
                run_dir=str(run_dir) if run_dir is not None else None,
                metrics=await asyncio.to_thread(state.files.metrics_count),
                server_time=time.time(),
            )
        )

    @router.get("/metrics", response_model=MetricsPage, dependencies=[_only("since")])
    async def metrics(since: Annotated[int, Query(ge=0)] = 0) -> Response:
        records = await asyncio.to_thread(state.files.metrics_since, since)
        return _json(MetricsPage(records=records, next=since + len(records)))

    @router.get("/rollouts", response_model=RolloutListPage, dependencies=[_only(*_ROLLOUT_PARAMS)])
    async def rollouts(
        status: Annotated[list[RolloutStatus] | None, Query()] = None,
        mode: RolloutMode | None = None,
        reward_min: float | None = None,
        reward_max: float | None = None,
        task: Annotated[str | None, Query(max_length=200)] = None,
        agent: Annotated[str | None, Query(max_length=256)] = None,
        policy_version: Annotated[int | None, Query(ge=0)] = None,
        before: Annotated[int | None, Query(ge=1)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 50,
    ) -> Response:
        """Newest first; filters combine with AND; `before` is the previous page's `next_cursor`."""
        try:
            where = RolloutFilter(
                statuses=status or None,
                mode=mode,
                reward_min=reward_min,
                reward_max=reward_max,
                task_text=task or None,
                agent=agent or None,
                policy_version=policy_version,
            )
        except ValidationError as exc:
            raise InvalidRequestError(f"bad rollout filter: {exc.errors()[0]['msg']}") from exc
        return _json(await state.queries.rollouts(where, before, limit))

    @router.get("/rollout", response_model=RolloutDetail, dependencies=[_only("rollout_id")])
    async def rollout(rollout_id: RolloutId) -> Response:
        store = state.store
        found = await store.get_rollout(rollout_id)
        attempts = (
            await store.query_attempts(AttemptQuery(rollout_id=rollout_id, limit=MAX_PAGE_SIZE))
        ).items
        spans = await _spans_of(store, rollout_id)
        policy_version = None
        if found.resources_version is not None:
            resources = (await store.get_resources(found.resources_version)).resources
            value = resources.get("policy_version")
            policy_version = value if isinstance(value, int) else None
        transitions = await asyncio.to_thread(state.files.transitions_of, rollout_id)
        source = "run folder" if state.files.run_dir is not None else "none"
        return _json(
            RolloutDetail(
                rollout=found,
                policy_version=policy_version,
                attempts=attempts,
                spans=[span_view(s) for s in spans],
                transitions=transitions,
                transitions_source=source,
            )
        )

    @router.get("/logprobs", response_model=LogprobsView, dependencies=[_only("rollout_id", "span_id")])
    async def logprobs(
        rollout_id: RolloutId,
        span_id: Annotated[str, Query(pattern=r"^[0-9a-f]{16}$")],
    ) -> Response:
        """One LLM call's completion token ids and logprobs (left out of the rollout view: bulky)."""
        for s in await _spans_of(state.store, rollout_id):
            if s.span_id == span_id:
                return _json(logprobs_view(s))
        raise NotFoundError(f"rollout {rollout_id} has no span {span_id}")

    @router.get("/runners", response_model=RunnersView, dependencies=[_only()])
    async def runners() -> Response:
        return _json(await state.queries.runners())


async def _spans_of(store: Store, rollout_id: str) -> list[Span]:
    spans: list[Span] = []
    offset = 0
    while True:
        page = await store.query_spans(SpanQuery(rollout_id=rollout_id, limit=MAX_PAGE_SIZE, offset=offset))
        spans.extend(page.items)
        if page.next_offset is None:
            return spans
        offset = page.next_offset


def _event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _add_event_stream(app: FastAPI, state: DashboardState, token: str) -> None:
    # Not in the OpenAPI document: a client generated from it (or a fuzzer) would wait on a stream
    # that only ends after STREAM_MAX_S; docs/dashboard.md describes it.
    @app.get(API_PREFIX + "/events", include_in_schema=False)
    async def events(
        request: Request,
        token_param: Annotated[str | None, Query(alias="token")] = None,
        since: Annotated[int, Query(ge=0)] = 0,
    ) -> StreamingResponse:
        """Server-sent events: `metrics` (new metrics records, `{records, next}`) and `counters` (the
        store's counters when they change). The token comes as `?token=` (EventSource sends no
        headers), or as the bearer header like every other route."""
        from_header = token_problem(request.headers.get("authorization"), token) is None
        if not (from_header or tokens_match(token_param, token)):
            raise AuthenticationError(
                "the event stream needs the store token: ?token=<store token> or 'Authorization: Bearer'"
            )
        return StreamingResponse(
            _stream(state, since),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


async def _stream(state: DashboardState, since: int) -> AsyncIterator[bytes]:
    """The stream's body. A browser that goes away is noticed by the response itself (its next write
    fails or Starlette sees the disconnect) and the generator is closed; a comment line every few
    quiet ticks makes sure there is a next write."""
    yield b"retry: 1000\n\n"
    started = time.monotonic()
    last_counters: str | None = None
    tick = quiet = 0
    while not state.closing.is_set() and time.monotonic() - started < STREAM_MAX_S:
        sent = False
        records = await asyncio.to_thread(state.files.metrics_since, since)
        if records:
            since += len(records)
            sent = True
            yield _event("metrics", {"records": records, "next": since})
        if tick % STREAM_COUNTERS_EVERY == 0:
            counters = (await state.store.counters()).model_dump_json()
            if counters != last_counters:
                last_counters = counters
                sent = True
                yield _event("counters", json.loads(counters))
        quiet = 0 if sent else quiet + 1
        if quiet >= 5:
            quiet = 0
            yield b": keep-alive\n\n"
        tick += 1
        deadline = time.monotonic() + STREAM_TICK_S
        while not state.closing.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
