"""The gateway's domain object: admit a call, generate it, record it; and the trainer's controls.

`Gateway` never sees an HTTP request: it takes attempt ids, tokens, agent names and generation
requests, and returns results and recorded spans or raises typed errors (`GatewayHTTPError` and
the other `reinforge.errors`, which carry their HTTP status). The HTTP layer (`gateway/routes.py`)
reads requests into those values and writes the answers. The trainer holds the same object (at
`app.state.gateway`) to pause the gateway around a weight update, to hold the next step's calls
until the policy version they must be sampled by is published, and to flush an attempt's spans.
Each of those jobs is a collaborator of its own (`ServingLoop`, `PauseGate`, `PolicyHolds`,
`AttemptKeys`, `AttemptFinisher`); `Gateway` holds them and offers the calls the trainer makes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from reinforge import semconv
from reinforge.errors import PromptTooLongError, UpstreamError
from reinforge.gateway.attempts import AttemptGuard, AttemptState
from reinforge.gateway.errors import GatewayHTTPError
from reinforge.gateway.finishing import AttemptFinisher
from reinforge.gateway.history import Restored
from reinforge.gateway.keys import AttemptKeys
from reinforge.gateway.pause_gate import PauseGate
from reinforge.gateway.phase_sampling import AppliedSampling, RunSamplings
from reinforge.gateway.policy_holds import PolicyHolds
from reinforge.gateway.recorder import PendingSpan, SpanRecorder
from reinforge.gateway.serving_loop import ServingLoop
from reinforge.gateway.tool_schemas import canonical_tools
from reinforge.inference.contract import (
    Backend,
    GenerationRequest,
    GenerationResult,
    PreparesAhead,
    TextDelta,
)
from reinforge.inference.run_sampling import RunSampling
from reinforge.store.protocol import Store
from reinforge.types import (
    AttemptOutcome,
    CountingIds,
    Rollout,
    Span,
    SpanKind,
    SpanStatus,
    SpanStatusCode,
    new_span_id,
)

new_id = CountingIds(12)
"""A 24-hex-character id for responses and their output items: unique, not secret, and made without
a syscall on the hot path (see `CountingIds`)."""


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


_FAILED_TOOLS_KEY = "air.failed_tool_calls"
"""Attempt memory: the tool call ids already recorded as failed (`Gateway.record_tool_failures`)."""

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
    sampling: RunSampling | None = None
    """The run's sampling for the attempt's phase (None: the run publishes none)."""


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


class GatewayOptions(TypedDict, total=False):
    """`Gateway`'s tuning, as `create_gateway_app` passes it on (the defaults are `Gateway`'s)."""

    attempt_cache_ttl_s: float
    max_queued_spans: int
    max_span_batch: int
    span_linger_s: float
    max_calls_per_attempt: int


class Gateway:
    """The state behind the app: backend, attempt checks, span recorder, and the trainer's controls.

    Everything runs in the event loop that serves requests; `pause`, `resume`, `flush` and the hold
    controls may be called from any thread or loop (the trainer usually runs elsewhere) and hop onto
    that loop (`ServingLoop`).
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
        if max_calls_per_attempt < 1:
            raise ValueError("max_calls_per_attempt must be at least 1")
        self.keys = AttemptKeys(secret)
        self.max_calls_per_attempt = max_calls_per_attempt
        self.store = store
        self.backend = backend
        self.attempts = AttemptGuard(store, ttl_s=attempt_cache_ttl_s)
        self.samplings = RunSamplings(store)
        self.recorder = SpanRecorder(
            store, max_queue=max_queued_spans, max_batch=max_span_batch, linger_s=span_linger_s
        )
        self.serving = ServingLoop()
        self.gate = PauseGate(self.serving)
        self.holds = PolicyHolds(self.serving)
        self.finisher = AttemptFinisher(store, self.attempts, self.recorder, max_calls_per_attempt)
        self._bound = False
        self.calls = 0
        self.cancelled_calls = 0
        """Streamed calls whose client hung up before the end (recorded as cancelled)."""
        self.open_streams = 0
        """Streamed calls being answered now (a dropped one closes at once)."""

    # -- lifecycle and the trainer's controls ---------------------------------------------------------

    def bind(self) -> None:
        """Attach to the serving loop on first use (mounted sub-apps get no lifespan events)."""
        if self._bound:
            return
        self._bound = True
        self.serving.bind()
        self.gate.bind()
        self.holds.bind()
        self.recorder.start()

    @property
    def paused(self) -> bool:
        return self.gate.paused

    @property
    def in_flight(self) -> int:
        return self.gate.in_flight

    async def pause(self) -> None:
        """Hold new calls at the door and return once every in-flight call has finished."""
        await self.gate.pause()

    def resume(self) -> None:
        """Let held and new calls through again."""
        self.gate.resume()

    def hold_rollouts(self, rollout_ids: Iterable[str], version: int) -> None:
        """Make the LLM calls of these rollouts wait until policy `version` is released
        (`release_version`), so that agents can start before their weights are published.

        Call it before the rollouts are enqueued; safe from any thread (it only adds entries).
        """
        self.holds.hold(rollout_ids, version)

    def release_version(self, version: int) -> None:
        """Policy `version` is being served: let the calls held for it (or an older one) through."""
        self.holds.release(version)

    def drop_holds(self, rollout_ids: Iterable[str]) -> None:
        """These rollouts were cancelled: their held calls get a 409 instead of waiting on."""
        self.holds.drop(rollout_ids)

    async def settle(self) -> None:
        """Return once the serving loop has run what is ready on it now and what that scheduled next:
        after `release_version` and `resume`, the calls they let through have reached the backend.

        The trainer awaits it after publishing a version, so that its own next work (logging,
        enqueueing a step ahead) does not take the interpreter from the released calls on their way
        to the engine: the step's generation starts as soon as the weights are in.
        """
        await self.serving.settle()

    async def flush(self, attempt_id: str | None = None) -> None:
        """Return once every span recorded so far for `attempt_id` (or for all) is in the store."""
        if not self.serving.live:
            return  # never served, or shut down (its lifespan flushed everything)
        await self.serving.run(lambda: self.recorder.flush(attempt_id))

    async def finish_attempt(
        self, attempt_id: str, outcome: AttemptOutcome, spans: Sequence[Span] = ()
    ) -> Rollout:
        """End an attempt with nothing of it missing from the store, in one call for the runner, with
        its one final reward (`gateway.finishing`). Store errors propagate (StaleAttemptError for a
        late finish)."""

        async def finish() -> Rollout:
            self.bind()
            return await self.finisher.finish(attempt_id, outcome, spans)

        return await self.serving.run(finish)

    async def close(self) -> None:
        """Write every queued span, then stop the recorder.

        A standalone app does this at shutdown; an app mounted in another (whose lifespan Starlette
        does not run for mounts) needs the parent's lifespan to call it.
        """
        if not self.serving.live:
            return
        await self.serving.run(self.recorder.close)

    # -- calls ----------------------------------------------------------------------------------------

    async def admit(
        self, attempt_id: str, token: str | None, agent: str | None = None, traceparent: str | None = None
    ) -> Caller:
        """A caller of a running attempt: its token (401), then its existence (404) and state (409)."""
        self.bind()
        self.keys.check_attempt(attempt_id, token)
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
        sampling = await self.samplings.of_rollout(state.rollout_id)
        return Caller(state, agent, parse_traceparent(traceparent), sampling)

    async def wait_for_policy(self, caller: Caller, request: GenerationRequest | None = None) -> None:
        """Wait while the caller's rollout is held for an unreleased policy (409 if it was dropped).

        The HTTP layer calls it once the request is parsed, with the request the backend will get: a
        held call's backend-side preparation (`PreparesAhead`) is done before it waits, so that when
        the version is released it has only its generation left to start, and the step's calls
        reach the engine together.
        """
        held = self.holds.versions
        if not held or caller.state.rollout_id not in held:
            return
        if request is not None and isinstance(self.backend, PreparesAhead):
            self.backend.prepare_ahead(request)
        await self.holds.wait(caller.state.rollout_id)

    def prepare(
        self, caller: Caller, request: GenerationRequest
    ) -> tuple[GenerationRequest, Restored | None]:
        """The request as the backend should render it: sampled as the run says for the phase, unless
        the run leaves sampling to the agent (`inference.run_sampling`); the attempt's own assistant
        turns in their generated spelling and the tools in one spelling (`gateway.history`,
        `gateway.tool_schemas`); the caller's agent name names the adapter (the backend decides
        whether it has one)."""
        update: dict[str, Any] = {}
        if caller.sampling is not None:
            applied = caller.sampling.apply(request.sampling)
            if applied is not request.sampling:
                update["sampling"] = applied
        if caller.agent is not None:
            update["adapter"] = caller.agent
        restored = None
        if request.messages is not None:
            restored = caller.state.turns.restore(request.messages, request.tools)
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
        sampling: AppliedSampling | None = None,
    ) -> str:
        """Record one LLM call as a span (the exact token ids and logprobs, both bodies, and the
        sampling asked for and applied) and remember the answer, so that the history sent back later
        renders as it was generated.

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
            if sampling is not None:
                attributes.update(sampling.attributes())
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

    async def record_tool_failures(self, caller: Caller, tool_call_ids: Sequence[str]) -> None:
        """A tool span with error status (an AIR `tool_error`) for each tool call of this attempt's
        own whose result the agent reports as failed, once: every later request repeats the result.
        Recorded before the call it arrives with, so credit charges it to the call that made the
        tool call (the latest one before it)."""
        if not tool_call_ids:
            return
        seen = caller.state.extra.setdefault(_FAILED_TOOLS_KEY, set())
        assert isinstance(seen, set)
        for call_id in tool_call_ids:
            turn = caller.state.turns.by_call_id.get(call_id)
            if turn is None or call_id in seen:
                continue
            seen.add(call_id)
            name = next(c.name for c in turn.tool_calls if c.id == call_id)
            attributes: dict[str, Any] = {
                semconv.ATTR_STEP_KIND: semconv.STEP_TOOL,
                semconv.ATTR_TOOL_NAME: name,
                semconv.ATTR_TOOL_CALL_ID: call_id,
                semconv.ATTR_AIR_SIGNAL: semconv.AIR_TOOL_ERROR,
                semconv.ATTR_SEQUENCE_IN_ATTEMPT: caller.state.take_sequence(),
            }
            if caller.agent is not None:
                attributes[semconv.ATTR_AGENT_NAME] = caller.agent
            status = SpanStatus(
                code=SpanStatusCode.error, message=f"the agent reported the result of {name} as an error"
            )
            await self._record(
                caller, semconv.SPAN_TOOL_RESULT, SpanKind.internal, attributes, time.time(), status=status
            )

    async def record_too_long(
        self,
        caller: Caller,
        *,
        endpoint: str,
        request_body: dict[str, Any],
        started: float,
        error: PromptTooLongError,
    ) -> Span:
        """Record a call refused because its prompt outgrew the served model's context: the request
        and an error status naming both lengths, without token ids (credit counts it as a call it
        can't train on)."""
        attributes: dict[str, Any] = {
            semconv.ATTR_STEP_KIND: semconv.STEP_LLM,
            semconv.ATTR_LLM_ENDPOINT: endpoint,
            semconv.ATTR_LLM_REQUEST: request_body,
            semconv.ATTR_MODEL: self.backend.model_name,
            semconv.ATTR_FINISH_REASON: PromptTooLongError.code,
            semconv.ATTR_SEQUENCE_IN_ATTEMPT: caller.state.take_sequence(),
        }
        if caller.agent is not None:
            attributes[semconv.ATTR_AGENT_NAME] = caller.agent
        status = SpanStatus(
            code=SpanStatusCode.error,
            message=(
                f"{PromptTooLongError.code}: the prompt has {error.prompt_tokens} tokens, the served "
                f"model's context {error.limit}; the call was refused"
            ),
        )
        return await self._record(
            caller, semconv.SPAN_LLM_CALL, SpanKind.client, attributes, started, status=status
        )

    async def record_reward(self, caller: Caller, value: float, final: bool, name: str | None) -> Span:
        """Record a reward the agent reported; a final one is remembered for the attempt's finish,
        which decides the attempt's reward (`gateway.finishing`)."""
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
        span = await self._record(caller, span_name, SpanKind.internal, attributes, time.time())
        if final:
            caller.state.report_final_reward(span.start_time, value)
        return span

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
        await self.gate.enter()
        try:
            return self._check_result(await self.backend.generate(gen))
        finally:
            self.gate.leave()

    async def stream(self, gen: GenerationRequest) -> AsyncGenerator[TextDelta | GenerationResult, None]:
        """The backend's stream inside the pause gate; ends with exactly one checked result. Counted
        in `open_streams` from its first item until it is closed (the HTTP layer closes it as soon as
        its response ends, however it ends)."""
        self.open_streams += 1
        try:
            await self.gate.enter()
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
                self.gate.leave()
                # Closed now, not when collected: a dropped stream's generation stops here (on the
                # engine, its slot is freed for the next call).
                close = getattr(items, "aclose", None)
                if close is not None:
                    await close()
        finally:
            self.open_streams -= 1
