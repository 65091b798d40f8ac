"""The gateway: an OpenAI-compatible ASGI app whose URL names the attempt, recording every call.

An agent is given `http://host/r/<attempt_id>/v1` as its base URL and the attempt's token as its API
key; it needs nothing else. Each call is served by the backend (embedded engine, vLLM/SGLang, or a
scripted one), and one LLM span with the exact token ids and logprobs the backend produced is queued
for the store before the response goes back, so a `/flush` after the agent returns always sees it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from reinforge import semconv
from reinforge.errors import ReinforgeError
from reinforge.gateway import formats
from reinforge.gateway.attempts import AttemptGuard, AttemptState
from reinforge.gateway.auth import attempt_token, bearer_token, token_matches
from reinforge.gateway.backend import Backend, GenerationRequest, GenerationResult, TextDelta
from reinforge.gateway.errors import GatewayHTTPError, UpstreamError, error_body, error_response, response_for
from reinforge.gateway.protocol import (
    ChatCompletionBody,
    CompletionBody,
    ResponsesBody,
    chat_request,
    completion_request,
    parse_body,
    responses_request,
    reward_body,
)
from reinforge.gateway.recorder import SpanRecorder
from reinforge.store.base import Store
from reinforge.types import Span, SpanKind, SpanStatus

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_JSON = "application/json"
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _new_id() -> str:
    return secrets.token_hex(12)


def _traceparent(header: str | None) -> tuple[str, str] | None:
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
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        attempt_cache_ttl_s: float = 2.0,
        max_queued_spans: int = 4096,
        max_span_batch: int = 256,
    ) -> None:
        if not secret:
            raise ValueError("the gateway secret must not be empty")
        self.store = store
        self.backend = backend
        self._secret = secret
        self.max_body_bytes = max_body_bytes
        self.attempts = AttemptGuard(store, ttl_s=attempt_cache_ttl_s)
        self.recorder = SpanRecorder(store, max_queue=max_queued_spans, max_batch=max_span_batch)
        texts = getattr(backend, "token_texts", None)
        self._texts: formats.TokenTexts = texts if callable(texts) else formats.token_id_texts
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id: int | None = None
        self._paused = False
        self._open: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._inflight = 0
        self.calls = 0

    # -- lifecycle and cross-thread control ---------------------------------------------------------

    def _bind(self) -> None:
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
        self.recorder.start()

    async def _on_loop(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        loop = self._loop
        if loop is None or loop is asyncio.get_running_loop():
            return await make()
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
        loop, gate = self._loop, self._open
        if loop is None or gate is None:
            return
        if threading.get_ident() == self._thread_id:
            gate.set()
        else:
            loop.call_soon_threadsafe(gate.set)

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def in_flight(self) -> int:
        return self._inflight

    async def flush(self, attempt_id: str | None = None) -> None:
        """Return once every span recorded so far for `attempt_id` (or for all) is in the store."""
        if self._loop is None:
            return
        await self._on_loop(lambda: self.recorder.flush(attempt_id))

    async def close(self) -> None:
        """Write every queued span, then stop the recorder."""
        if self._loop is None:
            return
        await self._on_loop(self.recorder.close)

    def token_for(self, attempt_id: str) -> str:
        return attempt_token(self._secret, attempt_id)

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

    # -- request plumbing --------------------------------------------------------------------------

    def _check_token(self, request: Request, attempt_id: str) -> None:
        given = bearer_token(request.headers.get("authorization"))
        if given is None:
            raise GatewayHTTPError(
                401, "missing bearer token: send the attempt's token as the API key", code="missing_api_key"
            )
        if not token_matches(attempt_token(self._secret, attempt_id), given):
            raise GatewayHTTPError(
                401, f"the token is not valid for attempt {attempt_id!r}", code="invalid_api_key"
            )

    async def authorize(self, request: Request) -> AttemptState:
        """Token (401), then the attempt's existence (404) and state (409)."""
        self._bind()
        attempt_id = request.path_params["attempt_id"]
        self._check_token(request, attempt_id)
        return await self.attempts.require_running(attempt_id)

    async def read_json(self, request: Request) -> Any:
        limit = self.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise GatewayHTTPError(400, "invalid Content-Length header")
            if int(length) > limit:
                raise GatewayHTTPError(413, f"request body of {length} bytes exceeds the {limit}-byte limit")
            raw = await request.body()
        else:
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise GatewayHTTPError(413, f"request body exceeds the {limit}-byte limit")
                chunks.append(chunk)
            raw = b"".join(chunks)
        if not raw:
            raise GatewayHTTPError(400, "the request body is empty; send a JSON object")
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise GatewayHTTPError(400, f"the request body is not valid JSON: {exc}") from None

    @staticmethod
    def agent_name(request: Request) -> str | None:
        name = request.path_params.get("agent_name") or request.headers.get("x-reinforge-agent")
        return name or None

    def _check_result(self, result: GenerationResult) -> GenerationResult:
        if len(result.logprobs) != len(result.completion_token_ids):
            raise UpstreamError(
                f"the backend returned {len(result.completion_token_ids)} completion tokens but "
                f"{len(result.logprobs)} logprobs; refusing to record a misaligned call"
            )
        return result

    async def record_call(
        self,
        request: Request,
        state: AttemptState,
        *,
        endpoint: str,
        body: dict[str, Any],
        response: dict[str, Any],
        result: GenerationResult,
        started: float,
        latency_ms: float,
    ) -> None:
        attributes: dict[str, Any] = {
            semconv.ATTR_STEP_KIND: semconv.STEP_LLM,
            semconv.ATTR_LLM_ENDPOINT: endpoint,
            semconv.ATTR_LLM_REQUEST: body,
            semconv.ATTR_LLM_RESPONSE: response,
            semconv.ATTR_PROMPT_TOKEN_IDS: result.prompt_token_ids,
            semconv.ATTR_COMPLETION_TOKEN_IDS: result.completion_token_ids,
            semconv.ATTR_COMPLETION_LOGPROBS: result.logprobs,
            semconv.ATTR_POLICY_VERSION: result.policy_version,
            semconv.ATTR_FINISH_REASON: result.finish_reason,
            semconv.ATTR_MODEL: self.backend.model_name,
            semconv.ATTR_LATENCY_MS: latency_ms,
            semconv.ATTR_MALFORMED_TOOL_CALL: result.malformed_tool_call,
            semconv.ATTR_SEQUENCE_IN_ATTEMPT: state.take_sequence(),
        }
        agent = self.agent_name(request)
        if agent is not None:
            attributes[semconv.ATTR_AGENT_NAME] = agent
        if result.malformed_tool_call:
            attributes[semconv.ATTR_AIR_SIGNAL] = semconv.AIR_MALFORMED_TOOL_CALL
        await self._record(request, state, semconv.SPAN_LLM_CALL, SpanKind.client, attributes, started)
        self.calls += 1

    async def _record(
        self,
        request: Request,
        state: AttemptState,
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any],
        started: float,
    ) -> Span:
        parent = _traceparent(request.headers.get("traceparent"))
        trace_id, parent_id = parent if parent is not None else (state.trace_id, None)
        # model_construct: every value is built here and already valid; skipping validation keeps
        # the per-call cost off the agent's latency.
        span = Span.model_construct(
            span_id=secrets.token_hex(8),
            trace_id=trace_id,
            parent_id=parent_id,
            rollout_id=state.rollout_id,
            attempt_id=state.attempt_id,
            name=name,
            kind=kind,
            start_time=started,
            end_time=time.time(),
            attributes=attributes,
            status=SpanStatus(),
            events=[],
            sequence=None,
        )
        await self.recorder.record(span)
        return span

    async def record_reward(
        self, request: Request, state: AttemptState, value: float, final: bool, name: str | None
    ) -> Span:
        attributes: dict[str, Any] = {
            semconv.ATTR_STEP_KIND: semconv.STEP_REWARD,
            semconv.ATTR_REWARD_VALUE: value,
            semconv.ATTR_SEQUENCE_IN_ATTEMPT: state.take_sequence(),
        }
        if name is not None:
            attributes[semconv.ATTR_REWARD_NAME] = name
        agent = self.agent_name(request)
        if agent is not None:
            attributes[semconv.ATTR_AGENT_NAME] = agent
        span_name = semconv.SPAN_FINAL_REWARD if final else semconv.SPAN_REWARD
        return await self._record(request, state, span_name, SpanKind.internal, attributes, time.time())

    async def generate(self, gen: GenerationRequest) -> GenerationResult:
        await self._enter()
        try:
            return self._check_result(await self.backend.generate(gen))
        finally:
            self._leave()

    async def stream(self, gen: GenerationRequest) -> AsyncGenerator[TextDelta | GenerationResult, None]:
        """The backend's stream inside the pause gate; ends with exactly one checked result."""
        await self._enter()
        try:
            result: GenerationResult | None = None
            async for item in self.backend.stream(gen):
                if isinstance(item, GenerationResult):
                    result = self._check_result(item)
                else:
                    yield item
            if result is None:
                raise UpstreamError("the backend's stream ended without a final result")
            yield result
        finally:
            self._leave()


# -- endpoints ---------------------------------------------------------------------------------------

Handler = Callable[[Request], Awaitable[Response]]


def _guarded(handler: Handler) -> Handler:
    """Turn every failure into an OpenAI-shaped error response (a crash is a 500, never a hang)."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ReinforgeError as exc:
            return response_for(exc)
        except Exception as exc:
            log.exception("gateway error on %s", request.url.path)
            return error_response(500, f"internal gateway error: {type(exc).__name__}: {exc}")

    return endpoint


def _stream_error(exc: BaseException) -> bytes:
    if isinstance(exc, ReinforgeError):
        status, message = exc.http_status, str(exc)
    else:
        log.exception("gateway error while streaming", exc_info=exc)
        status, message = 500, f"internal gateway error: {type(exc).__name__}: {exc}"
    return b"data: " + error_body(status, message) + b"\n\n"


def _ok(body: dict[str, Any]) -> Response:
    return Response(formats.dumps(body), media_type=_JSON)


class _Endpoints:
    """The route handlers, closed over one Gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self.g = gateway

    async def chat(self, request: Request) -> Response:
        g = self.g
        state = await g.authorize(request)
        data = await g.read_json(request)
        body = parse_body(ChatCompletionBody, data)
        gen = chat_request(body)
        response_id, created, model = "chatcmpl-" + _new_id(), int(time.time()), g.backend.model_name

        def assemble(result: GenerationResult) -> dict[str, Any]:
            return formats.chat_body(
                result,
                response_id=response_id,
                created=created,
                model=model,
                with_logprobs=bool(body.logprobs),
                with_token_ids=body.return_token_ids,
                texts=g._texts,
            )

        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(
                self._chat_stream(
                    request, state, data, gen, assemble, response_id, created, model, include_usage
                ),
                media_type="text/event-stream",
                headers=_SSE_HEADERS,
            )
        started, t0 = time.time(), time.perf_counter()
        result = await g.generate(gen)
        latency_ms = (time.perf_counter() - t0) * 1000
        response = assemble(result)
        await g.record_call(
            request,
            state,
            endpoint="chat.completions",
            body=data,
            response=response,
            result=result,
            started=started,
            latency_ms=latency_ms,
        )
        return _ok(response)

    async def _chat_stream(
        self,
        request: Request,
        state: AttemptState,
        data: dict[str, Any],
        gen: GenerationRequest,
        assemble: Callable[[GenerationResult], dict[str, Any]],
        response_id: str,
        created: int,
        model: str,
        include_usage: bool,
    ) -> AsyncIterator[bytes]:
        g = self.g

        def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
            return formats.sse(formats.chat_chunk(response_id, created, model, delta, finish, logprobs))

        items = g.stream(gen)
        try:
            started, t0 = time.time(), time.perf_counter()
            streamed: list[str] = []
            result: GenerationResult | None = None
            yield chunk({"role": "assistant", "content": ""})
            async for item in items:
                if isinstance(item, TextDelta):
                    if item.text:
                        streamed.append(item.text)
                        yield chunk({"content": item.text})
                else:
                    result = item
            assert result is not None
            latency_ms = (time.perf_counter() - t0) * 1000
            response = assemble(result)
            rest = _unsent_text("".join(streamed), result.text)
            if rest:
                yield chunk({"content": rest})
            choice = response["choices"][0]
            if choice["logprobs"] is not None:
                yield chunk({}, logprobs=choice["logprobs"])
            if result.tool_calls:
                yield chunk({"tool_calls": formats.chat_tool_call_deltas(result)})
            final = formats.chat_chunk(response_id, created, model, {}, result.finish_reason)
            if "token_ids" in choice:
                final["prompt_token_ids"] = result.prompt_token_ids
                final["choices"][0]["token_ids"] = result.completion_token_ids
            yield formats.sse(final)
            if include_usage:
                usage_chunk = formats.chat_chunk(response_id, created, model, {})
                usage_chunk["choices"] = []
                usage_chunk["usage"] = response["usage"]
                yield formats.sse(usage_chunk)
            await g.record_call(
                request,
                state,
                endpoint="chat.completions",
                body=data,
                response=response,
                result=result,
                started=started,
                latency_ms=latency_ms,
            )
            yield formats.SSE_DONE
        except Exception as exc:
            yield _stream_error(exc)
        finally:
            await items.aclose()  # leaves the pause gate even when the client went away mid-stream

    async def completions(self, request: Request) -> Response:
        g = self.g
        state = await g.authorize(request)
        data = await g.read_json(request)
        body = parse_body(CompletionBody, data)
        gen = completion_request(body)
        response_id, created, model = "cmpl-" + _new_id(), int(time.time()), g.backend.model_name

        def assemble(result: GenerationResult) -> dict[str, Any]:
            return formats.completion_body(
                result,
                response_id=response_id,
                created=created,
                model=model,
                with_logprobs=body.logprobs is not None,
                with_token_ids=body.return_token_ids,
                texts=g._texts,
            )

        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(
                self._completion_stream(
                    request, state, data, gen, assemble, response_id, created, model, include_usage
                ),
                media_type="text/event-stream",
                headers=_SSE_HEADERS,
            )
        started, t0 = time.time(), time.perf_counter()
        result = await g.generate(gen)
        latency_ms = (time.perf_counter() - t0) * 1000
        response = assemble(result)
        await g.record_call(
            request,
            state,
            endpoint="completions",
            body=data,
            response=response,
            result=result,
            started=started,
            latency_ms=latency_ms,
        )
        return _ok(response)

    async def _completion_stream(
        self,
        request: Request,
        state: AttemptState,
        data: dict[str, Any],
        gen: GenerationRequest,
        assemble: Callable[[GenerationResult], dict[str, Any]],
        response_id: str,
        created: int,
        model: str,
        include_usage: bool,
    ) -> AsyncIterator[bytes]:
        g = self.g
        items = g.stream(gen)
        try:
            started, t0 = time.time(), time.perf_counter()
            streamed: list[str] = []
            result: GenerationResult | None = None
            async for item in items:
                if isinstance(item, TextDelta):
                    if item.text:
                        streamed.append(item.text)
                        yield formats.sse(
                            formats.completion_chunk(response_id, created, model, item.text, None)
                        )
                else:
                    result = item
            assert result is not None
            latency_ms = (time.perf_counter() - t0) * 1000
            response = assemble(result)
            choice = response["choices"][0]
            final = formats.completion_chunk(
                response_id,
                created,
                model,
                _unsent_text("".join(streamed), result.text),
                choice["finish_reason"],
            )
            final["choices"][0]["logprobs"] = choice["logprobs"]
            if "token_ids" in choice:
                final["choices"][0]["prompt_token_ids"] = result.prompt_token_ids
                final["choices"][0]["token_ids"] = result.completion_token_ids
            yield formats.sse(final)
            if include_usage:
                usage_chunk = formats.completion_chunk(response_id, created, model, "", None)
                usage_chunk["choices"] = []
                usage_chunk["usage"] = response["usage"]
                yield formats.sse(usage_chunk)
            await g.record_call(
                request,
                state,
                endpoint="completions",
                body=data,
                response=response,
                result=result,
                started=started,
                latency_ms=latency_ms,
            )
            yield formats.SSE_DONE
        except Exception as exc:
            yield _stream_error(exc)
        finally:
            await items.aclose()  # leaves the pause gate even when the client went away mid-stream

    async def responses(self, request: Request) -> Response:
        g = self.g
        state = await g.authorize(request)
        data = await g.read_json(request)
        body = parse_body(ResponsesBody, data)
        gen = responses_request(body)
        response_id, created, model = "resp_" + _new_id(), int(time.time()), g.backend.model_name
        if body.stream:
            return StreamingResponse(
                self._responses_stream(request, state, data, gen, response_id, created, model),
                media_type="text/event-stream",
                headers=_SSE_HEADERS,
            )
        started, t0 = time.time(), time.perf_counter()
        result = await g.generate(gen)
        latency_ms = (time.perf_counter() - t0) * 1000
        response = formats.responses_body(
            response_id=response_id,
            created=created,
            model=model,
            request=data,
            status="completed",
            output=formats.responses_output(result, _new_id),
            result=result,
        )
        await g.record_call(
            request,
            state,
            endpoint="responses",
            body=data,
            response=response,
            result=result,
            started=started,
            latency_ms=latency_ms,
        )
        return _ok(response)

    async def _responses_stream(
        self,
        request: Request,
        state: AttemptState,
        data: dict[str, Any],
        gen: GenerationRequest,
        response_id: str,
        created: int,
        model: str,
    ) -> AsyncIterator[bytes]:
        g = self.g
        seq = 0

        def event(kind: str, **fields: Any) -> bytes:
            nonlocal seq
            payload = {"type": kind, "sequence_number": seq, **fields}
            seq += 1
            return formats.sse_event(payload)

        def snapshot(
            status: str, output: list[dict[str, Any]], result: GenerationResult | None
        ) -> dict[str, Any]:
            return formats.responses_body(
                response_id=response_id,
                created=created,
                model=model,
                request=data,
                status=status,
                output=output,
                result=result,
            )

        items = g.stream(gen)
        try:
            started, t0 = time.time(), time.perf_counter()
            yield event("response.created", response=snapshot("in_progress", [], None))
            yield event("response.in_progress", response=snapshot("in_progress", [], None))
            msg_id = "msg_" + _new_id()
            opened = False
            streamed: list[str] = []
            result: GenerationResult | None = None

            def open_message() -> list[bytes]:
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                return [
                    event(
                        "response.output_item.added",
                        output_index=0,
                        item=formats.responses_message_item(msg_id, "", status="in_progress"),
                    ),
                    event(
                        "response.content_part.added",
                        item_id=msg_id,
                        output_index=0,
                        content_index=0,
                        part=part,
                    ),
                ]

            def text_delta(text: str) -> bytes:
                return event(
                    "response.output_text.delta",
                    item_id=msg_id,
                    output_index=0,
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )

            async for item in items:
                if isinstance(item, TextDelta):
                    if item.text:
                        if not opened:
                            for e in open_message():
                                yield e
                            opened = True
                        streamed.append(item.text)
                        yield text_delta(item.text)
                else:
                    result = item
            assert result is not None
            latency_ms = (time.perf_counter() - t0) * 1000
            output: list[dict[str, Any]] = []
            if result.text or not result.tool_calls:
                if not opened:
                    for e in open_message():
                        yield e
                rest = _unsent_text("".join(streamed), result.text)
                if rest:
                    yield text_delta(rest)
                done_item = formats.responses_message_item(msg_id, result.text)
                part = done_item["content"][0]
                yield event(
                    "response.output_text.done",
                    item_id=msg_id,
                    output_index=0,
                    content_index=0,
                    text=result.text,
                    logprobs=[],
                )
                yield event(
                    "response.content_part.done", item_id=msg_id, output_index=0, content_index=0, part=part
                )
                yield event("response.output_item.done", output_index=0, item=done_item)
                output.append(done_item)
            for call in result.tool_calls:
                index, fc_id = len(output), "fc_" + _new_id()
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item=formats.responses_function_item(fc_id, call, status="in_progress"),
                )
                yield event(
                    "response.function_call_arguments.delta",
                    item_id=fc_id,
                    output_index=index,
                    delta=call.arguments,
                )
                yield event(
                    "response.function_call_arguments.done",
                    item_id=fc_id,
                    output_index=index,
                    arguments=call.arguments,
                    name=call.name,
                )
                done_call = formats.responses_function_item(fc_id, call)
                yield event("response.output_item.done", output_index=index, item=done_call)
                output.append(done_call)
            response = snapshot("completed", output, result)
            await g.record_call(
                request,
                state,
                endpoint="responses",
                body=data,
                response=response,
                result=result,
                started=started,
                latency_ms=latency_ms,
            )
            kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
            yield event(kind, response=response)
        except Exception as exc:
            yield _stream_error(exc)
        finally:
            await items.aclose()  # leaves the pause gate even when the client went away mid-stream

    async def models(self, request: Request) -> Response:
        if "attempt_id" in request.path_params:
            self.g._bind()
            self.g._check_token(request, request.path_params["attempt_id"])
        model = {"id": self.g.backend.model_name, "object": "model", "created": 0, "owned_by": "reinforge"}
        return _ok({"object": "list", "data": [model]})

    async def reward(self, request: Request) -> Response:
        g = self.g
        state = await g.authorize(request)
        body = reward_body(await g.read_json(request))
        span = await g.record_reward(request, state, body.reward, body.final, body.name)
        return _ok({"span_id": span.span_id, "reward": body.reward, "final": body.final, "name": body.name})

    async def flush(self, request: Request) -> Response:
        g = self.g
        g._bind()
        attempt_id = request.path_params["attempt_id"]
        g._check_token(request, attempt_id)
        await g.recorder.flush(attempt_id)
        return _ok({"attempt_id": attempt_id, "flushed": True})

    async def health(self, request: Request) -> Response:
        g = self.g
        return _ok(
            {
                "status": "ok",
                "model": g.backend.model_name,
                "paused": g.paused,
                "in_flight": g.in_flight,
                "queued_spans": g.recorder.queued,
                "calls": g.calls,
            }
        )


def _unsent_text(streamed: str, final: str) -> str:
    """What the final text adds to what was streamed (a backend may hold back a tail)."""
    return final[len(streamed) :] if final.startswith(streamed) else ""


def create_gateway_app(
    store: Store,
    backend: Backend,
    secret: str,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    attempt_cache_ttl_s: float = 2.0,
    max_queued_spans: int = 4096,
    max_span_batch: int = 256,
) -> FastAPI:
    """The gateway as an ASGI app; its `Gateway` is at `app.state.gateway`.

    Serve it alone or mount it beside the store server (`store_app.mount("/gateway", app)`); agents use
    `<url>/r/<attempt_id>/v1` as their OpenAI base URL and `attempt_token(secret, attempt_id)` as key.
    """
    gateway = Gateway(
        store,
        backend,
        secret,
        max_body_bytes=max_body_bytes,
        attempt_cache_ttl_s=attempt_cache_ttl_s,
        max_queued_spans=max_queued_spans,
        max_span_batch=max_span_batch,
    )
    e = _Endpoints(gateway)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gateway._bind()
        yield
        await gateway.close()

    routes: list[Route] = [
        Route("/health", _guarded(e.health), methods=["GET"]),
        Route("/v1/models", _guarded(e.models), methods=["GET"]),
        Route("/r/{attempt_id}/reward", _guarded(e.reward), methods=["POST"]),
        Route("/r/{attempt_id}/flush", _guarded(e.flush), methods=["POST"]),
    ]
    for prefix in ("/r/{attempt_id}/v1", "/r/{attempt_id}/agents/{agent_name}/v1"):
        routes += [
            Route(prefix + "/chat/completions", _guarded(e.chat), methods=["POST"]),
            Route(prefix + "/completions", _guarded(e.completions), methods=["POST"]),
            Route(prefix + "/responses", _guarded(e.responses), methods=["POST"]),
            Route(prefix + "/models", _guarded(e.models), methods=["GET"]),
        ]
    app = FastAPI(
        title="reinforge gateway",
        routes=routes,  # type: ignore[arg-type]
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.gateway = gateway

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        detail = getattr(exc, "detail", None) or "error"
        if status == 404:
            detail = (
                f"no route {request.method} {request.url.path}; agents call <gateway>/r/<attempt_id>/v1/..."
            )
        return error_response(status, str(detail))

    app.add_exception_handler(StarletteHTTPException, http_error)
    return app
