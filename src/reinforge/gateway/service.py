"""The gateway's domain object: backend, attempt checks, span recording, the pause gate, policy holds.

`Gateway` never sees an HTTP request: it takes attempt ids, tokens, agent names and generation
requests, and returns results and recorded spans or raises typed errors (`GatewayHTTPError` and
the other `reinforge.errors`, which carry their HTTP status). The HTTP layer (`gateway/routes.py`)
reads requests into those values and writes the answers. The trainer holds the same object (at
`app.state.gateway`) to pause the gateway around a weight update, to hold the next step's calls
until the policy version they must be sampled by is published, and to flush an attempt's spans.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from reinforge import semconv
from reinforge.access import attempt_token, finish_token, token_matches
from reinforge.errors import UpstreamError
from reinforge.gateway.attempts import AttemptGuard, AttemptState
from reinforge.gateway.errors import GatewayHTTPError
from reinforge.gateway.history import Restored
from reinforge.gateway.recorder import PendingSpan, SpanRecorder
from reinforge.gateway.tool_schemas import canonical_tools
from reinforge.inference.contract import (
    Backend,
    GenerationRequest,
    GenerationResult,
    PreparesAhead,
    TextDelta,
)
from reinforge.store.protocol import Store
from reinforge.types import (
    AttemptOutcome,
    AttemptStatus,
    CountingIds,
    Rollout,
    Span,
    SpanKind,
    SpanQuery,
    SpanStatus,
    SpanStatusCode,
    new_span_id,
)

T = TypeVar("T")

_MAX_CACHED_TOKENS = 65_536


new_id = CountingIds(12)
"""A 24-hex-character id for responses and their output items: unique, not secret, and made without
a syscall on the hot path (see `CountingIds`)."""


_DROPPED = -1
"""The version a cancelled rollout's holds are set to: its waiting calls end with a 409."""


def parse_traceparent(header: str | None) -> tuple[str, str] | None:
    """(trace_id, parent span id) from a W3C `traceparent` header, so agent spans can nest calls."""
    if not header:
        return None
    parts = header.strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    trace_id, parent = parts[1].lower(), parts[2].lower()
    if not all(c in "0123456789abcdef" for c in trace_id + parent) or set(trace_id) == {"0"}:
        return None
    return trace_id, parent


async def _next_turn() -> None:
    """Started on a loop from another thread, it ends after the callbacks that loop's current turn
    schedules (a released call's request to the engine is one): `Gateway.settle`."""
    await asyncio.sleep(0)


DEFAULT_MAX_CALLS_PER_ATTEMPT = 10_000
"""LLM calls plus reward reports one attempt may make: far above what an agent's episode needs, low
enough that an agent stuck in a loop can't fill the store with one attempt's spans."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a call comes from: a running attempt, the agent's name, and the caller's trace context."""

    state: AttemptState
    agent: str | None = None
    trace: tuple[str, str] | None = None
    """(trace_id, parent span id) from the caller's `traceparent`, or None for the attempt's trace."""


def _span_of(
    caller: Caller,
    span_id: str,
    name: str,
    kind: SpanKind,
    attributes: dict[str, Any],
    started: float,
    ended: float,
    status: SpanStatus | None = None,
) -> Span:
    """A span of the caller's attempt, in the caller's trace context (else the attempt's trace).

    Validated: pydantic-core checks these few fields faster than `model_construct` assigns them in
    Python, and a bad id fails here, not in the store. Span ids come from `new_span_id` (adjacent
    ids: the store's span index appends).
    """
    state = caller.state
    trace_id, parent_id = caller.trace if caller.trace is not None else (state.trace_id, None)
    return Span(
        span_id=span_id,
        trace_id=trace_id,
        parent_id=parent_id,
        rollout_id=state.rollout_id,
        attempt_id=state.attempt_id,
        name=name,
        kind=kind,
        start_time=started,
        end_time=ended,
        attributes=attributes,
        status=status if status is not None else SpanStatus(),
        events=[],
        sequence=None,
    )


class Gateway:
    """The state behind the app: backend, attempt checks, span recorder, and the pause gate.

    Everything runs in the event loop that serves requests; `pause`, `resume` and `flush` may be
    called from any thread or loop (the trainer usually runs elsewhere) and hop onto that loop.
    """

    def __init__(
        self,
        store: Store,
        backend: Backend,
        secret: str,
        *,
        attempt_cache_ttl_s: float = 2.0,
        max_queued_spans: int = 4096,
        max_span_batch: int = 256,
        span_linger_s: float = 0.05,
        max_calls_per_attempt: int = DEFAULT_MAX_CALLS_PER_ATTEMPT,
    ) -> None:
        if not secret:
            raise ValueError("the gateway secret must not be empty")
        if max_calls_per_attempt < 1:
            raise ValueError("max_calls_per_attempt must be at least 1")
        self.max_calls_per_attempt = max_calls_per_attempt
        self.store = store
        self.backend = backend
        self._secret = secret
        self._tokens: dict[str, str] = {}
        self.attempts = AttemptGuard(store, ttl_s=attempt_cache_ttl_s)
        self.recorder = SpanRecorder(
            store, max_queue=max_queued_spans, max_batch=max_span_batch, linger_s=span_linger_s
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id: int | None = None
        self._paused = False
        self._open: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._inflight = 0
        self.calls = 0
        self.cancelled_calls = 0
        """Streamed calls whose client hung up before the end (recorded as cancelled)."""
        self.open_streams = 0
        """Streamed responses being written now (a dropped one closes at once)."""
        self._holds: dict[str, int] = {}
        """rollout id -> the policy version its LLM calls wait for (`hold_rollouts`)."""
        self._released_version = -1
        self._holds_changed: asyncio.Event | None = None

    # -- lifecycle and cross-thread control ---------------------------------------------------------

    def bind(self) -> None:
        """Attach to the serving loop on first use (mounted sub-apps get no lifespan events)."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread_id = threading.get_ident()
        self._open = asyncio.Event()
        if not self._paused:
            self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._holds_changed = asyncio.Event()
        self.recorder.start()

    async def _on_loop(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        loop = self._loop
        if loop is None or loop is asyncio.get_running_loop():
            return await make()
        if loop.is_closed():
            raise RuntimeError("the gateway's event loop has stopped (was its server shut down?)")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make(), loop))

    async def pause(self) -> None:
        """Hold new calls at the door and return once every in-flight call has finished."""
        self._paused = True

        async def drain() -> None:
            if self._open is not None:
                self._open.clear()
            if self._idle is not None:
                await self._idle.wait()

        await self._on_loop(drain)

    def resume(self) -> None:
        """Let held and new calls through again."""
        self._paused = False
        if self._open is not None:
            self._on_loop_soon(self._open.set)

    def hold_rollouts(self, rollout_ids: Iterable[str], version: int) -> None:
        """Make the LLM calls of these rollouts wait until policy `version` is released
        (`release_version`), so that agents can start before their weights are published.

        Call it before the rollouts are enqueued; safe from any thread (it only adds entries).
        """
        for rollout_id in rollout_ids:
            self._holds[rollout_id] = version

    def release_version(self, version: int) -> None:
        """Policy `version` is being served: let the calls held for it (or an older one) through."""
        self._on_loop_soon(lambda: self._release(version))

    async def settle(self) -> None:
        """Return once the serving loop has run what is ready on it now and what that scheduled next:
        after `release_version` and `resume`, the calls they let through have reached the backend.

        The trainer awaits it after publishing a version, so that its own next work (logging,
        enqueueing a step ahead) does not take the interpreter from the released calls on their way
        to the engine: the step's generation starts as soon as the weights are in.
        """
        await self._on_loop(_next_turn)

    def drop_holds(self, rollout_ids: Iterable[str]) -> None:
        """These rollouts were cancelled: their held calls get a 409 instead of waiting on."""
        ids = list(rollout_ids)
        self._on_loop_soon(lambda: self._drop(ids))

    def _on_loop_soon(self, callback: Callable[[], None]) -> None:
        """Run `callback` on the serving loop: now when called there (or before the gateway has
        served), else as soon as that loop gets to it (not at all once it has closed)."""
        loop = self._loop
        if loop is None or threading.get_ident() == self._thread_id:
            callback()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(callback)

    def _release(self, version: int) -> None:
        self._released_version = max(self._released_version, version)
        for rollout_id, held_for in list(self._holds.items()):
            if 0 <= held_for <= version:
                del self._holds[rollout_id]
        self._wake_held()

    def _drop(self, rollout_ids: list[str]) -> None:
        for rollout_id in rollout_ids:
            if rollout_id in self._holds:
                self._holds[rollout_id] = _DROPPED
        self._wake_held()

    def _wake_held(self) -> None:
        if self._holds_changed is not None:
            self._holds_changed.set()
            self._holds_changed = asyncio.Event()

    async def _wait_for_policy(self, state: AttemptState) -> None:
        """Wait while the attempt's rollout is held for a policy version not yet released."""
        while True:
            version = self._holds.get(state.rollout_id)
            if version is None or 0 <= version <= self._released_version:
                return
            if version == _DROPPED:
                del self._holds[state.rollout_id]
                raise GatewayHTTPError(
                    409,
                    f"rollout {state.rollout_id!r} was cancelled before the policy version its calls "
                    "were waiting for was published",
                    code="attempt_not_running",
                )
            assert self._holds_changed is not None
            await self._holds_changed.wait()

    @property
    def held(self) -> int:
        """Rollouts whose calls are held for a policy version not yet released."""
        return sum(1 for version in self._holds.values() if version > self._released_version)

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def in_flight(self) -> int:
        return self._inflight

    async def flush(self, attempt_id: str | None = None) -> None:
        """Return once every span recorded so far for `attempt_id` (or for all) is in the store."""
        if self._loop is None or self._loop.is_closed():
            return  # never served, or shut down (its lifespan flushed everything)
        await self._on_loop(lambda: self.recorder.flush(attempt_id))

    async def finish_attempt(
        self, attempt_id: str, outcome: AttemptOutcome, spans: Sequence[Span] = ()
    ) -> Rollout:
        """End an attempt with nothing of it missing from the store, in one call for the runner.

        Queues `spans` (the runner's own: final reward, tool spans) with the gateway's, waits until
        every span recorded for the attempt is in the store, then finishes the attempt. A succeeded
        outcome without a reward takes the last final reward recorded for the attempt (the agent's
        `emit_reward(..., final=True)` or a POST to the reward URL). Store errors propagate
        (StaleAttemptError for a late finish).
        """

        async def finish() -> Rollout:
            self.bind()
            for span in spans:
                await self.recorder.record(span)
            await self.recorder.flush(attempt_id)
            final = self._over_limit(attempt_id, outcome)
            if final.status is AttemptStatus.succeeded and final.reward is None:
                final = outcome.model_copy(update={"reward": await self._final_reward(attempt_id)})
            try:
                return await self.store.finish_attempt(attempt_id, final)
            finally:
                self.attempts.forget(attempt_id)  # the next call for it reads its final state

        return await self._on_loop(finish)

    def _over_limit(self, attempt_id: str, outcome: AttemptOutcome) -> AttemptOutcome:
        """A succeeded outcome of an attempt that had calls refused (a runaway agent) is recorded as a
        failure that names the limit: its episode is not what the agent would have done."""
        state = self.attempts.cached(attempt_id)
        if state is None or not state.refused or outcome.status is not AttemptStatus.succeeded:
            return outcome
        error = (
            f"the agent went on calling after its {self.max_calls_per_attempt} LLM calls and reward "
            f"reports (the gateway's max_calls_per_attempt); {state.refused} more were refused"
        )
        return AttemptOutcome(status=AttemptStatus.failed, error=error, retryable=False)

    async def _final_reward(self, attempt_id: str) -> float | None:
        page = await self.store.query_spans(
            SpanQuery(attempt_id=attempt_id, name=semconv.SPAN_FINAL_REWARD, limit=1000)
        )
        for span in reversed(page.items):
            value = span.attributes.get(semconv.ATTR_REWARD_VALUE)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
        return None

    async def close(self) -> None:
        """Write every queued span, then stop the recorder.

        A standalone app does this at shutdown; an app mounted in another (whose lifespan Starlette
        does not run for mounts) needs the parent's lifespan to call it.
        """
        if self._loop is None or self._loop.is_closed():
            return
        await self._on_loop(self.recorder.close)

    def token_for(self, attempt_id: str) -> str:
        """The attempt's token, remembered: an HMAC per call would cost more than the rest of a check."""
        token = self._tokens.get(attempt_id)
        if token is None:
            if len(self._tokens) >= _MAX_CACHED_TOKENS:
                self._tokens.clear()
            token = self._tokens[attempt_id] = attempt_token(self._secret, attempt_id)
        return token

    async def _enter(self) -> None:
        assert self._open is not None and self._idle is not None
        while not self._open.is_set():
            await self._open.wait()
        self._inflight += 1
        self._idle.clear()

    def _leave(self) -> None:
        assert self._idle is not None
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()

    # -- calls ----------------------------------------------------------------------------------------

    def check_attempt_token(self, attempt_id: str, given: str | None) -> None:
        """The attempt's own token (the agent's API key) or a 401."""
        if given is None:
            raise GatewayHTTPError(
                401, "missing bearer token: send the attempt's token as the API key", code="missing_api_key"
            )
        if not token_matches(self.token_for(attempt_id), given):
            raise GatewayHTTPError(
                401, f"the token is not valid for attempt {attempt_id!r}", code="invalid_api_key"
            )

    def check_finish_token(self, attempt_id: str, given: str | None) -> None:
        """Finishing needs the runner's token for the attempt; the agent's own token is refused."""
        if not token_matches(finish_token(self._secret, attempt_id), given):
            raise GatewayHTTPError(
                401,
                f"finishing attempt {attempt_id!r} needs the runner's finish token "
                "(reinforge.access.finish_token); the attempt's API key can't end it",
                code="invalid_api_key",
            )

    async def admit(
        self, attempt_id: str, token: str | None, agent: str | None = None, traceparent: str | None = None
    ) -> Caller:
        """A caller of a running attempt: its token (401), then its existence (404) and state (409)."""
        self.bind()
        self.check_attempt_token(attempt_id, token)
        state = await self.attempts.require_running(attempt_id)
        if state.admitted >= self.max_calls_per_attempt:
            state.refused += 1
            raise GatewayHTTPError(
                429,
                f"attempt {attempt_id!r} has made its {self.max_calls_per_attempt} LLM calls and reward "
                "reports (the gateway's max_calls_per_attempt); no more are accepted, and the attempt "
                "will be recorded as failed",
                code="too_many_calls",
            )
        state.admitted += 1
        return Caller(state, agent, parse_traceparent(traceparent))

    async def wait_for_policy(self, caller: Caller, request: GenerationRequest | None = None) -> None:
        """Wait while the caller's rollout is held for an unreleased policy (409 if it was dropped).

        The HTTP layer calls it once the request is parsed, with the request the backend will get: a
        held call's backend-side preparation (`PreparesAhead`) is done before it waits, so that when
        the version is released it has only its generation left to start, and the step's calls
        reach the engine together.
        """
        if not self._holds or self._holds.get(caller.state.rollout_id) is None:
            return
        if request is not None and isinstance(self.backend, PreparesAhead):
            self.backend.prepare_ahead(request)
        await self._wait_for_policy(caller.state)

    def prepare(
        self, caller: Caller, request: GenerationRequest
    ) -> tuple[GenerationRequest, Restored | None]:
        """The request as the backend should render it: the attempt's own assistant turns in their
        generated spelling and the tools in one spelling (`gateway.history`, `gateway.tool_schemas`);
        the caller's agent name names the adapter (the backend decides whether it has one)."""
        update: dict[str, Any] = {}
        if caller.agent is not None:
            update["adapter"] = caller.agent
        restored = None
        if request.messages is not None:
            restored = caller.state.turns.restore(request.messages)
            if restored.messages is not request.messages:
                update["messages"] = restored.messages
            if restored.token_ids:
                update["generated_turns"] = restored.token_ids
            if request.tools:
                update["tools"] = canonical_tools(request.tools)
        # One copy, and none when nothing changes (the usual first turn of a conversation).
        return (request.model_copy(update=update) if update else request), restored

    def _check_result(self, result: GenerationResult) -> GenerationResult:
        if len(result.logprobs) != len(result.completion_token_ids):
            raise UpstreamError(
                f"the backend returned {len(result.completion_token_ids)} completion tokens but "
                f"{len(result.logprobs)} logprobs; refusing to record a misaligned call"
            )
        return result

    async def record_call(
        self,
        caller: Caller,
        *,
        endpoint: str,
        request_body: dict[str, Any],
        response_body: dict[str, Any],
        result: GenerationResult,
        started: float,
        latency_ms: float,
        history: Restored | None = None,
    ) -> str:
        """Record one LLM call as a span (the exact token ids and logprobs, and both bodies) and
        remember the answer, so that the history sent back later renders as it was generated.

        Returns the span's id. Its fields are fixed here (ids, times, its place in the attempt); the
        recorder's writer builds and validates it after the answer has gone out (`PendingSpan`).
        """
        state = caller.state
        state.turns.remember(result)
        sequence = state.take_sequence()
        span_id = new_span_id()
        ended = time.time()
        model = self.backend.model_name
        agent = caller.agent

        def build() -> Span:
            attributes: dict[str, Any] = {
                semconv.ATTR_STEP_KIND: semconv.STEP_LLM,
                semconv.ATTR_LLM_ENDPOINT: endpoint,
                semconv.ATTR_LLM_REQUEST: request_body,
                semconv.ATTR_LLM_RESPONSE: response_body,
                semconv.ATTR_PROMPT_TOKEN_IDS: result.prompt_token_ids,
                semconv.ATTR_COMPLETION_TOKEN_IDS: result.completion_token_ids,
                semconv.ATTR_COMPLETION_LOGPROBS: result.logprobs,
                semconv.ATTR_POLICY_VERSION: result.policy_version,
                semconv.ATTR_FINISH_REASON: result.finish_reason,
                semconv.ATTR_MODEL: model,
                semconv.ATTR_LATENCY_MS: latency_ms,
                semconv.ATTR_MALFORMED_TOOL_CALL: result.malformed_tool_call,
                semconv.ATTR_SEQUENCE_IN_ATTEMPT: sequence,
            }
            if agent is not None:
                attributes[semconv.ATTR_AGENT_NAME] = agent
            if history is not None:
                attributes[semconv.ATTR_HISTORY_MATCHED] = history.matched
                attributes[semconv.ATTR_HISTORY_RESPELLED] = history.respelled
                attributes[semconv.ATTR_HISTORY_UNMATCHED] = history.unmatched
            if result.malformed_tool_call:
                attributes[semconv.ATTR_AIR_SIGNAL] = semconv.AIR_MALFORMED_TOOL_CALL
            return _span_of(
                caller, span_id, semconv.SPAN_LLM_CALL, SpanKind.client, attributes, started, ended
            )

        await self.recorder.record(PendingSpan(state.attempt_id, build))
        self.calls += 1
        return span_id

    async def record_cancelled(
        self, caller: Caller, *, endpoint: str, request_body: dict[str, Any], streamed: str, started: float
    ) -> Span:
        """Record a streamed call whose client hung up before its end: the request, the text sent so
        far and an error status, without token ids (credit counts it as a call it can't train on)."""
        attributes: dict[str, Any] = {
            semconv.ATTR_STEP_KIND: semconv.STEP_LLM,
            semconv.ATTR_LLM_ENDPOINT: endpoint,
            semconv.ATTR_LLM_REQUEST: request_body,
            semconv.ATTR_MODEL: self.backend.model_name,
            semconv.ATTR_SEQUENCE_IN_ATTEMPT: caller.state.take_sequence(),
        }
        if caller.agent is not None:
            attributes[semconv.ATTR_AGENT_NAME] = caller.agent
        status = SpanStatus(
            code=SpanStatusCode.error,
            message=(
                f"cancelled: the client closed the stream after {len(streamed)} characters, before the "
                "call ended; its generation was stopped and is not trained on"
            ),
        )
        span = await self._record(
            caller, semconv.SPAN_LLM_CALL, SpanKind.client, attributes, started, status=status
        )
        self.cancelled_calls += 1
        return span

    async def record_reward(self, caller: Caller, value: float, final: bool, name: str | None) -> Span:
        """Record a reward the agent reported (a final one ends up as the attempt's reward)."""
        attributes: dict[str, Any] = {
            semconv.ATTR_STEP_KIND: semconv.STEP_REWARD,
            semconv.ATTR_REWARD_VALUE: value,
            semconv.ATTR_SEQUENCE_IN_ATTEMPT: caller.state.take_sequence(),
        }
        if name is not None:
            attributes[semconv.ATTR_REWARD_NAME] = name
        if caller.agent is not None:
            attributes[semconv.ATTR_AGENT_NAME] = caller.agent
        span_name = semconv.SPAN_FINAL_REWARD if final else semconv.SPAN_REWARD
        return await self._record(caller, span_name, SpanKind.internal, attributes, time.time())

    async def _record(
        self,
        caller: Caller,
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any],
        started: float,
        status: SpanStatus | None = None,
    ) -> Span:
        span = _span_of(caller, new_span_id(), name, kind, attributes, started, time.time(), status)
        await self.recorder.record(span)
        return span

    async def generate(self, gen: GenerationRequest) -> GenerationResult:
        """The backend's result inside the pause gate, checked (one logprob per completion token)."""
        await self._enter()
        try:
            return self._check_result(await self.backend.generate(gen))
        finally:
            self._leave()

    async def stream(self, gen: GenerationRequest) -> AsyncGenerator[TextDelta | GenerationResult, None]:
        """The backend's stream inside the pause gate; ends with exactly one checked result."""
        await self._enter()
        items = self.backend.stream(gen)
        try:
            result: GenerationResult | None = None
            async for item in items:
                if isinstance(item, GenerationResult):
                    result = self._check_result(item)
                else:
                    yield item
            if result is None:
                raise UpstreamError("the backend's stream ended without a final result")
            yield result
        finally:
            self._leave()
            # Closed now, not when collected: a dropped stream's generation stops here (on the
            # engine, its slot is freed for the next call).
            close = getattr(items, "aclose", None)
            if close is not None:
                await close()
