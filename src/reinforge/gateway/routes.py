"""The gateway's HTTP layer: its route table, one serving path for every API format, error envelopes.

Reading a request (path parameters, headers, the JSON body) and writing the answer (a JSON body or
server-sent events) happen here; everything else is the domain object's (`Gateway`). Every API
format goes through `serve_format`: admit the caller → parse the body with the format's adapter →
wait for the policy version → generate or stream → record the call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from reinforge._headers import bearer_token
from reinforge.access import attempt_of_token
from reinforge.errors import PromptTooLongError, ReinforgeError
from reinforge.finish_wire import FinishItem, FinishManyBody
from reinforge.gateway.errors import (
    GatewayHTTPError,
    anthropic_error_body,
    anthropic_error_response,
    anthropic_fields,
    anthropic_response_for,
    error_body,
    error_object,
    error_response,
    response_for,
    status_and_error,
)
from reinforge.gateway.formats import API_FORMATS, ApiFormat, FormatContext, TokenTexts
from reinforge.gateway.formats.anthropic_messages import AnthropicMessages
from reinforge.gateway.formats.base import Event, merge_choices
from reinforge.gateway.history import Restored
from reinforge.gateway.openai_bodies import check_span_owners, finish_body, parse_body, reward_body
from reinforge.gateway.openapi import OPENAPI_PATH, document_for
from reinforge.gateway.otlp import OtlpLimits
from reinforge.gateway.otlp_receiver import TRACES_PATH, OtlpReceiver
from reinforge.gateway.phase_sampling import AppliedSampling
from reinforge.gateway.service import Caller, Gateway
from reinforge.inference.contract import GenerationRequest, GenerationResult, TextDelta
from reinforge.json_codec import dumps, loads
from reinforge.net.routes import (
    BadContentLengthError,
    BodyTooLargeError,
    Route,
    RouteRequest,
    RouteTable,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024

AGENT_PREFIXES = (
    "/r/{attempt_id}/v1",
    "/r/{attempt_id}/agents/{agent_name}/v1",
    "/v1",
    "/agents/{agent_name}/v1",
)
"""An agent's base URLs: per attempt, and per attempt and named agent (multi-agent systems); the
last two are shared by every attempt, the key naming the attempt (`access.attempt_of_token`)."""

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_SSE_DONE = b"data: [DONE]\n\n"


class JSONResponse(Response):
    """A 200 JSON response with its two headers written directly.

    Why: `Response.__init__` works its headers out through a generic path (media type, charset,
    header merging) on every call; the gateway's own bodies always need the same two.
    """

    media_type = "application/json"

    def __init__(self, body: bytes) -> None:
        self.status_code = 200
        self.background = None
        self.body = body
        self.raw_headers = [
            (b"content-length", str(len(body)).encode()),
            (b"content-type", b"application/json"),
        ]


class EventStream(StreamingResponse):
    """Server-sent events whose generator is closed as soon as the response ends, however it ends.

    Why: when a client hangs up, Starlette cancels the writing of the stream but leaves its generator
    suspended until it is collected; until then the call holds its place in the pause gate and its
    backend stream (on the engine, a generation slot). Closed here, a dropped call ends at once and is
    recorded as cancelled (`GatewayRoutes._stream`).
    """

    def __init__(self, events: AsyncGenerator[bytes, None]) -> None:
        super().__init__(events, media_type="text/event-stream", headers=_SSE_HEADERS)
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()


def _ok(body: dict[str, Any]) -> Response:
    return JSONResponse(dumps(body))


def json_body(request: RouteRequest) -> Any:
    """The request's decoded JSON body (400 when empty or not JSON)."""
    if not request.body:
        raise GatewayHTTPError(400, "the request body is empty; send a JSON object")
    try:
        return loads(request.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GatewayHTTPError(400, f"the request body is not valid JSON: {exc}") from None


def _token(request: RouteRequest) -> str | None:
    """The bearer token, or else the `x-api-key` header (Anthropic's SDKs send the key there)."""
    token = bearer_token(request.header(b"authorization"))
    return token if token is not None else (request.header(b"x-api-key") or "").strip() or None


def _anthropic_route(path: str) -> bool:
    """Anthropic's Messages route answers in Anthropic's error envelope, so its SDK raises typed errors."""
    return path.endswith("/v1" + AnthropicMessages.path)


def error_for(request: RouteRequest, exc: Exception) -> Response:
    """Every failure as an OpenAI-shaped error response, Anthropic-shaped on Anthropic's route (a
    crash is a 500, never a hang)."""
    anthropic = _anthropic_route(request.path)
    if isinstance(exc, BodyTooLargeError):
        if exc.declared is not None:
            message = f"request body of {exc.declared} bytes exceeds the {exc.limit}-byte limit"
        else:
            message = f"request body exceeds the {exc.limit}-byte limit"
        exc = GatewayHTTPError(413, message)
    elif isinstance(exc, BadContentLengthError):
        exc = GatewayHTTPError(400, "invalid Content-Length header")
    if isinstance(exc, ReinforgeError):
        return anthropic_response_for(exc) if anthropic else response_for(exc)
    log.exception("gateway error on %s", request.path, exc_info=exc)
    message = f"internal gateway error: {type(exc).__name__}: {exc}"
    if anthropic:
        return anthropic_error_response(500, message)
    return error_response(500, message)


def _stream_error(exc: BaseException, call: ApiFormat) -> bytes:
    code: str | None = None
    anthropic = isinstance(call, AnthropicMessages)
    if isinstance(exc, ReinforgeError):
        if anthropic:
            status, message, code = anthropic_fields(exc)
        else:
            status, message, code = exc.http_status, str(exc), getattr(exc, "code", None)
    else:
        log.exception("gateway error while streaming", exc_info=exc)
        status, message = 500, f"internal gateway error: {type(exc).__name__}: {exc}"
    own = call.stream_failed(status, message, code)
    if own is not None:  # the format's terminal event (Responses: `response.failed`)
        return b"".join(_frame(event, call.named_events) for event in own)
    if anthropic:  # Anthropic's stream error is an `error` event
        return b"event: error\ndata: " + anthropic_error_body(status, message, code) + b"\n\n"
    return b"data: " + error_body(status, message, code=code) + b"\n\n"


def _frame(event: Event, named: bool) -> bytes:
    """One server-sent event."""
    if named:
        return b"event: " + event["type"].encode() + b"\ndata: " + dumps(event) + b"\n\n"
    return b"data: " + dumps(event) + b"\n\n"


def sample_of(request: GenerationRequest, index: int) -> GenerationRequest:
    """The `index`-th of n samples: a seeded request gets seed + index, so the samples differ."""
    seed = request.sampling.seed
    if not index or seed is None:
        return request
    return request.model_copy(update={"sampling": request.sampling.model_copy(update={"seed": seed + index})})


def _unsent_text(streamed: str, final: str) -> str:
    """What the final text adds to what was streamed (a backend may hold back a tail)."""
    return final[len(streamed) :] if final.startswith(streamed) else ""


def _record(
    g: Gateway,
    caller: Caller,
    call: ApiFormat,
    gen: GenerationRequest,
    history: Restored | None,
    data: dict[str, Any],
    response: dict[str, Any],
    result: GenerationResult,
    started: float,
    latency_ms: float,
) -> Awaitable[str]:
    """Record one answered call, plain or streamed: both bodies and the sampling asked for and
    applied. A plain function handing back `record_call`'s awaitable, so no coroutine is added."""
    return g.record_call(
        caller,
        endpoint=call.endpoint,
        request_body=data,
        response_body=response,
        result=result,
        started=started,
        latency_ms=latency_ms,
        history=history,
        sampling=AppliedSampling(call.request.sampling, gen.sampling, caller.sampling),
    )


class GatewayRoutes:
    """The route handlers, closed over one `Gateway`."""

    def __init__(self, gateway: Gateway, otlp_limits: OtlpLimits | None = None) -> None:
        self.g = gateway
        self.otlp = OtlpReceiver(gateway, otlp_limits)
        self.texts: TokenTexts = gateway.backend.token_texts
        self._openapi = b"{}"

    def table(self, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> RouteTable:
        routes: list[Route] = []
        for prefix in AGENT_PREFIXES:  # the calls first: matching tries routes in order
            routes += [Route("POST", prefix + fmt.path, self.serve_format(fmt)) for fmt in API_FORMATS]
            routes.append(Route("GET", prefix + "/models", self.models))
        # The base URLs themselves (`.../v1` stripped): Claude Code sends a HEAD there at start-up to
        # open its connection early, and ignores the answer; a 200 keeps the gateway's log clean.
        routes += [
            Route("HEAD", prefix.removesuffix("/v1") or "/", self.warm_up) for prefix in AGENT_PREFIXES
        ]
        routes += [
            Route("POST", TRACES_PATH, self.otlp.receive),  # OpenTelemetry traces (OTLP/HTTP)
            Route("POST", "/r/{attempt_id}/reward", self.reward),
            Route("POST", "/r/{attempt_id}/flush", self.flush),
            Route("POST", "/r/{attempt_id}/finish", self.finish),
            Route("POST", "/finish", self.finish_many),
            Route("GET", "/health", self.health),
            Route("GET", OPENAPI_PATH, self.openapi),
        ]
        table = RouteTable(routes, max_body_bytes=max_body_bytes, on_error=error_for)
        self._openapi = dumps(document_for(table))
        return table

    async def warm_up(self, request: RouteRequest) -> Response:
        """A HEAD on a base URL: 200, no body, no key needed (it reveals nothing)."""
        return Response(status_code=200)

    async def openapi(self, request: RouteRequest) -> Response:
        """The gateway's OpenAPI document (see `gateway.openapi`)."""
        return JSONResponse(self._openapi)

    async def _admit(self, request: RouteRequest) -> Caller:
        params = request.path_params
        token = _token(request)
        attempt_id = params.get("attempt_id") or attempt_of_token(token)
        if attempt_id is None:
            raise GatewayHTTPError(
                401,
                "the key names no attempt: on the shared /v1 URL, send the attempt's key (LLM.api_key)",
                code="invalid_api_key" if token else "missing_api_key",
            )
        return await self.g.admit(
            attempt_id,
            token,
            agent=params.get("agent_name") or request.header(b"x-reinforge-agent") or None,
            traceparent=request.header(b"traceparent"),
        )

    def serve_format(self, fmt: type[ApiFormat]) -> Callable[[RouteRequest], Awaitable[Response]]:
        """The one serving path, for `fmt`'s calls plain and streamed."""
        g = self.g

        async def serve(request: RouteRequest) -> Response:
            caller = await self._admit(request)
            data = json_body(request)
            if not isinstance(data, dict):
                raise GatewayHTTPError(400, "the request body must be a JSON object")
            call = fmt.parse(data, FormatContext(g.backend.model_name, self.texts, caller.state.extra))
            gen, history = g.prepare(caller, call.request)
            await g.record_tool_failures(caller, call.failed_tool_calls)
            await g.wait_for_policy(caller, gen)
            if call.stream:
                return EventStream(self._stream(caller, call, gen, history, data))
            started, t0 = time.time(), time.perf_counter()
            try:
                if call.n == 1:
                    results = [await g.generate(gen)]
                else:
                    samples = (g.generate(sample_of(gen, i)) for i in range(call.n))
                    results = list(await asyncio.gather(*samples))
            except PromptTooLongError as exc:
                await g.record_too_long(
                    caller, endpoint=call.endpoint, request_body=data, started=started, error=exc
                )
                raise
            latency_ms = (time.perf_counter() - t0) * 1000
            bodies = [call.body(result) for result in results]
            for result, body in zip(results, bodies, strict=True):
                await _record(g, caller, call, gen, history, data, body, result, started, latency_ms)
            return _ok(bodies[0] if len(bodies) == 1 else merge_choices(bodies))

        return serve

    async def _stream(
        self,
        caller: Caller,
        call: ApiFormat,
        gen: GenerationRequest,
        history: Restored | None,
        data: dict[str, Any],
    ) -> AsyncGenerator[bytes, None]:
        g, named = self.g, call.named_events
        items = g.stream(gen)
        started, t0 = time.time(), time.perf_counter()
        streamed: list[str] = []
        ended = False  # recorded, or answered with an error event; else the client hung up first
        try:
            for event in call.stream_start():
                yield _frame(event, named)
            result: GenerationResult | None = None
            async for item in items:
                if isinstance(item, TextDelta):
                    if item.text:
                        streamed.append(item.text)
                        for event in call.stream_text(item.text):
                            yield _frame(event, named)
                else:
                    result = item
            assert result is not None
            latency_ms = (time.perf_counter() - t0) * 1000
            events, response = call.stream_end(result, _unsent_text("".join(streamed), result.text))
            for event in events:
                yield _frame(event, named)
            await _record(g, caller, call, gen, history, data, response, result, started, latency_ms)
            ended = True
            for event in call.stream_done(response):
                yield _frame(event, named)
            if call.ends_with_done:
                yield _SSE_DONE
        except Exception as exc:
            ended = True
            if isinstance(exc, PromptTooLongError):
                await g.record_too_long(
                    caller, endpoint=call.endpoint, request_body=data, started=started, error=exc
                )
            yield _stream_error(exc, call)
        finally:
            await items.aclose()  # leaves the pause gate even when the client went away mid-stream
            if not ended:
                await g.record_cancelled(
                    caller,
                    endpoint=call.endpoint,
                    request_body=data,
                    streamed="".join(streamed),
                    started=started,
                )

    async def models(self, request: RouteRequest) -> Response:
        if "attempt_id" in request.path_params:
            self.g.bind()
            self.g.keys.check_attempt(request.path_params["attempt_id"], _token(request))
        model = {"id": self.g.backend.model_name, "object": "model", "created": 0, "owned_by": "reinforge"}
        return _ok({"object": "list", "data": [model]})

    async def reward(self, request: RouteRequest) -> Response:
        caller = await self._admit(request)
        body = reward_body(json_body(request))
        span = await self.g.record_reward(caller, body.reward, body.final, body.name)
        return _ok({"span_id": span.span_id, "reward": body.reward, "final": body.final, "name": body.name})

    async def flush(self, request: RouteRequest) -> Response:
        g = self.g
        g.bind()
        attempt_id = request.path_params["attempt_id"]
        g.keys.check_attempt(attempt_id, _token(request))
        await g.flush(attempt_id)
        return _ok({"attempt_id": attempt_id, "flushed": True})

    async def finish(self, request: RouteRequest) -> Response:
        """The runner's one call per attempt: record its spans, flush, finish (see `Gateway`)."""
        g = self.g
        g.bind()
        attempt_id = request.path_params["attempt_id"]
        g.keys.check_finish(attempt_id, _token(request))
        body = finish_body(json_body(request), attempt_id)
        rollout = await g.finish_attempt(attempt_id, body.outcome, body.spans)
        return Response(rollout.model_dump_json(), media_type="application/json")

    async def finish_many(self, request: RouteRequest) -> Response:
        """`POST /finish`: a runner ends several attempts in one request, each as `finish` would.

        Every item gets its own status (and OpenAI-shaped error), so one refused item (a stale
        attempt, a wrong token) does not fail the others; they are stored together.
        """
        g = self.g
        g.bind()
        body = parse_body(FinishManyBody, json_body(request))

        async def one(item: FinishItem) -> dict[str, Any]:
            try:
                g.keys.check_finish(item.attempt_id, item.token)
                check_span_owners(item, item.attempt_id)
                await g.finish_attempt(item.attempt_id, item.outcome, item.spans)
            except ReinforgeError as exc:
                status, error = status_and_error(exc)
                return {"status": status, "error": error}
            except Exception as exc:
                log.exception("gateway error finishing %s", item.attempt_id)
                message = f"internal gateway error: {type(exc).__name__}: {exc}"
                return {"status": 500, "error": error_object(500, message)}
            return {"status": 200}

        results = await asyncio.gather(*(one(item) for item in body.items))
        return _ok({"results": results})

    async def health(self, request: RouteRequest) -> Response:
        g = self.g
        return _ok(
            {
                "status": "ok",
                "model": g.backend.model_name,
                "paused": g.paused,
                "in_flight": g.in_flight,
                "open_streams": g.open_streams,
                "tasks": len(asyncio.all_tasks()),
                "cancelled_calls": g.cancelled_calls,
                "queued_spans": g.recorder.queued,
                "calls": g.calls,
            }
        )
