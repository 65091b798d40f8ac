"""The HTTP handlers: OpenAI's chat completions, completions and responses (plain and streamed),
models, and the reward and flush routes; each turns failures into OpenAI-shaped errors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from reinforge.errors import ReinforgeError
from reinforge.finish_wire import FinishItem, FinishManyBody
from reinforge.gateway import formats
from reinforge.gateway.attempts import AttemptState
from reinforge.gateway.errors import error_body, error_object, error_response, response_for, status_and_error
from reinforge.gateway.openai_bodies import (
    ChatCompletionBody,
    CompletionBody,
    ResponsesBody,
    chat_request,
    check_span_owners,
    completion_request,
    finish_body,
    parse_body,
    responses_request,
    reward_body,
)
from reinforge.gateway.service import Gateway, new_id
from reinforge.inference.contract import GenerationRequest, GenerationResult, TextDelta

log = logging.getLogger(__name__)

_JSON = "application/json"
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


Handler = Callable[[Request], Awaitable[Response]]


def guarded(handler: Handler) -> Handler:
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


class _JSONResponse(Response):
    """A 200 JSON response with its two headers written directly.

    Why: `Response.__init__` works its headers out through a generic path (media type, charset,
    header merging) on every call; the gateway's own bodies always need the same two.
    """

    media_type = _JSON

    def __init__(self, body: bytes) -> None:
        self.status_code = 200
        self.background = None
        self.body = body
        self.raw_headers = [
            (b"content-length", str(len(body)).encode()),
            (b"content-type", b"application/json"),
        ]


def _ok(body: dict[str, Any]) -> Response:
    return _JSONResponse(formats.dumps(body))


class Endpoints:
    """The route handlers, closed over one Gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self.g = gateway

    async def chat(self, request: Request) -> Response:
        g = self.g
        state = await g.authorize(request)
        data = await g.read_json(request)
        body = parse_body(ChatCompletionBody, data)
        gen = chat_request(body)
        await g.wait_for_policy(state)
        response_id, created, model = "chatcmpl-" + new_id(), int(time.time()), g.backend.model_name

        def assemble(result: GenerationResult) -> dict[str, Any]:
            return formats.chat_body(
                result,
                response_id=response_id,
                created=created,
                model=model,
                with_logprobs=bool(body.logprobs),
                with_token_ids=body.return_token_ids,
                texts=g.token_texts,
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
        return await self._generate_and_record(request, state, "chat.completions", data, gen, assemble)

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
        await g.wait_for_policy(state)
        response_id, created, model = "cmpl-" + new_id(), int(time.time()), g.backend.model_name

        def assemble(result: GenerationResult) -> dict[str, Any]:
            return formats.completion_body(
                result,
                response_id=response_id,
                created=created,
                model=model,
                with_logprobs=body.logprobs is not None,
                with_token_ids=body.return_token_ids,
                texts=g.token_texts,
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
        return await self._generate_and_record(request, state, "completions", data, gen, assemble)

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
        await g.wait_for_policy(state)
        response_id, created, model = "resp_" + new_id(), int(time.time()), g.backend.model_name
        if body.stream:
            return StreamingResponse(
                self._responses_stream(request, state, data, gen, response_id, created, model),
                media_type="text/event-stream",
                headers=_SSE_HEADERS,
            )

        def assemble(result: GenerationResult) -> dict[str, Any]:
            return formats.responses_body(
                response_id=response_id,
                created=created,
                model=model,
                request=data,
                status="completed",
                output=formats.responses_output(result, new_id, self._responses_logprobs(data, result)),
                result=result,
            )

        return await self._generate_and_record(request, state, "responses", data, gen, assemble)

    async def _generate_and_record(
        self,
        request: Request,
        state: AttemptState,
        endpoint: str,
        data: dict[str, Any],
        gen: GenerationRequest,
        assemble: Callable[[GenerationResult], dict[str, Any]],
    ) -> Response:
        """The non-streaming path every endpoint shares: generate, shape the body, record the call."""
        g = self.g
        started, t0 = time.time(), time.perf_counter()
        result = await g.generate(gen)
        latency_ms = (time.perf_counter() - t0) * 1000
        response = assemble(result)
        await g.record_call(
            request,
            state,
            endpoint=endpoint,
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
            msg_id = "msg_" + new_id()
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
                logprobs = self._responses_logprobs(data, result)
                done_item = formats.responses_message_item(msg_id, result.text, logprobs=logprobs)
                part = done_item["content"][0]
                yield event(
                    "response.output_text.done",
                    item_id=msg_id,
                    output_index=0,
                    content_index=0,
                    text=result.text,
                    logprobs=part["logprobs"],
                )
                yield event(
                    "response.content_part.done", item_id=msg_id, output_index=0, content_index=0, part=part
                )
                yield event("response.output_item.done", output_index=0, item=done_item)
                output.append(done_item)
            for call in result.tool_calls:
                index, fc_id = len(output), "fc_" + new_id()
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

    def _responses_logprobs(
        self, data: dict[str, Any], result: GenerationResult
    ) -> list[dict[str, Any]] | None:
        if "message.output_text.logprobs" not in (data.get("include") or []):
            return None
        return formats.responses_logprobs(result, self.g.token_texts)

    async def models(self, request: Request) -> Response:
        if "attempt_id" in request.path_params:
            self.g.bind()
            self.g.check_token(request, request.path_params["attempt_id"])
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
        g.bind()
        attempt_id = request.path_params["attempt_id"]
        g.check_token(request, attempt_id)
        await g.recorder.flush(attempt_id)
        return _ok({"attempt_id": attempt_id, "flushed": True})

    async def finish(self, request: Request) -> Response:
        """The runner's one call per attempt: record its spans, flush, finish (see Gateway)."""
        g = self.g
        g.bind()
        attempt_id = request.path_params["attempt_id"]
        g.check_finish_token(request, attempt_id)
        body = finish_body(await g.read_json(request), attempt_id)
        rollout = await g.finish_attempt(attempt_id, body.outcome, body.spans)
        return Response(rollout.model_dump_json(), media_type=_JSON)

    async def finish_many(self, request: Request) -> Response:
        """`POST /finish`: a runner ends several attempts in one request, each as `finish` would.

        Every item gets its own status (and OpenAI-shaped error), so one refused item (a stale
        attempt, a wrong token) does not fail the others; they are stored together.
        """
        g = self.g
        g.bind()
        body = parse_body(FinishManyBody, await g.read_json(request))

        async def one(item: FinishItem) -> dict[str, Any]:
            try:
                g.check_finish_token_value(item.attempt_id, item.token)
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
