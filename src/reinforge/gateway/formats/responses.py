"""OpenAI's responses API (`POST .../v1/responses`), plain and streamed as typed events."""

from __future__ import annotations

import json
import time
from typing import Any, Self

from reinforge.gateway.formats.base import ApiFormat, Event, FormatContext, chat_logprobs
from reinforge.gateway.openai_bodies import (
    CUSTOM_INPUT,
    ResponsesBody,
    custom_tool_names,
    parse_body,
    responses_request,
)
from reinforge.gateway.service import new_id
from reinforge.inference.contract import GenerationResult, ToolCall


def message_item(
    item_id: str, text: str, status: str = "completed", logprobs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}]
        if status == "completed"
        else []
    )
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def function_item(
    item_id: str, call: ToolCall, status: str = "completed", custom: bool = False
) -> dict[str, Any]:
    """A `function_call` item, or a `custom_tool_call` whose `input` is the call's free text."""
    if custom:
        return {
            "id": item_id,
            "type": "custom_tool_call",
            "status": status,
            "call_id": call.id,
            "name": call.name,
            "input": custom_input(call) if status == "completed" else "",
        }
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if status == "completed" else "",
    }


def custom_input(call: ToolCall) -> str:
    """A custom tool call's free text: the `input` the model wrote (its whole arguments if not JSON)."""
    try:
        parsed = json.loads(call.arguments)
    except ValueError:
        return call.arguments
    if isinstance(parsed, dict) and isinstance(parsed.get(CUSTOM_INPUT), str):
        return str(parsed[CUSTOM_INPUT])
    return call.arguments


class Responses(ApiFormat):
    path = "/responses"
    endpoint = "responses"
    named_events = True

    def __init__(self, body: ResponsesBody, data: dict[str, Any], context: FormatContext) -> None:
        self.request = responses_request(body)
        self.stream = body.stream
        self.data = data
        """The request as sent: a response echoes several of its fields."""
        self.with_logprobs = "message.output_text.logprobs" in (data.get("include") or [])
        self.context = context
        self.custom_tools = custom_tool_names(data.get("tools"))
        self.response_id = "resp_" + new_id()
        self.created = int(time.time())
        self._sequence = 0
        self._message_id = ""
        self._opened = False

    @classmethod
    def parse(cls, data: dict[str, Any], context: FormatContext) -> Self:
        return cls(parse_body(ResponsesBody, data), data, context)

    def _logprobs(self, result: GenerationResult) -> list[dict[str, Any]] | None:
        """Every generated token's logprob (tool-call markup included: it was generated too)."""
        if not self.with_logprobs:
            return None
        return chat_logprobs(result.completion_token_ids, result.logprobs, self.context.texts)["content"]

    def _response(
        self, status: str, output: list[dict[str, Any]], result: GenerationResult | None
    ) -> dict[str, Any]:
        request = self.data
        body: dict[str, Any] = {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": request.get("instructions"),
            "max_output_tokens": request.get("max_output_tokens"),
            "model": self.context.model,
            "output": output,
            "parallel_tool_calls": request.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "prompt_cache_key": request.get("prompt_cache_key"),
            "temperature": request.get("temperature", 1.0),
            "text": {"format": (request.get("text") or {}).get("format") or {"type": "text"}},
            "tool_choice": request.get("tool_choice") or "auto",
            "tools": request.get("tools") or [],
            "top_p": request.get("top_p", 1.0),
            "truncation": "disabled",
            "usage": None,
            "user": request.get("user"),
            "metadata": request.get("metadata") or {},
        }
        if result is not None:
            if result.finish_reason == "length":
                body["status"] = "incomplete"
                body["incomplete_details"] = {"reason": "max_output_tokens"}
            p, c = len(result.prompt_token_ids), len(result.completion_token_ids)
            body["usage"] = {
                "input_tokens": p,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": c,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": p + c,
            }
        return body

    def body(self, result: GenerationResult) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if result.text or not result.tool_calls:
            output.append(message_item("msg_" + new_id(), result.text, logprobs=self._logprobs(result)))
        output.extend(self._call_item(call) for call in result.tool_calls)
        return self._response("completed", output, result)

    def _call_item(self, call: ToolCall, item_id: str = "", status: str = "completed") -> dict[str, Any]:
        custom = call.name in self.custom_tools
        item_id = item_id or ("ctc_" if custom else "fc_") + new_id()
        return function_item(item_id, call, status=status, custom=custom)

    # -- streaming: typed events, numbered in order ----------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def stream_start(self) -> list[Event]:
        self._message_id = "msg_" + new_id()
        return [
            self._event("response.created", response=self._response("in_progress", [], None)),
            self._event("response.in_progress", response=self._response("in_progress", [], None)),
        ]

    def _open_message(self) -> list[Event]:
        self._opened = True
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item = message_item(self._message_id, "", status="in_progress")
        return [
            self._event("response.output_item.added", output_index=0, item=item),
            self._event(
                "response.content_part.added",
                item_id=self._message_id,
                output_index=0,
                content_index=0,
                part=part,
            ),
        ]

    def _text_delta(self, text: str) -> Event:
        return self._event(
            "response.output_text.delta",
            item_id=self._message_id,
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def stream_text(self, text: str) -> list[Event]:
        events = [] if self._opened else self._open_message()
        events.append(self._text_delta(text))
        return events

    def stream_end(self, result: GenerationResult, rest: str) -> tuple[list[Event], dict[str, Any]]:
        events: list[Event] = []
        output: list[dict[str, Any]] = []
        msg_id = self._message_id
        if result.text or not result.tool_calls:
            if not self._opened:
                events += self._open_message()
            if rest:
                events.append(self._text_delta(rest))
            done_item = message_item(msg_id, result.text, logprobs=self._logprobs(result))
            part = done_item["content"][0]
            events += [
                self._event(
                    "response.output_text.done",
                    item_id=msg_id,
                    output_index=0,
                    content_index=0,
                    text=result.text,
                    logprobs=part["logprobs"],
                ),
                self._event(
                    "response.content_part.done", item_id=msg_id, output_index=0, content_index=0, part=part
                ),
                self._event("response.output_item.done", output_index=0, item=done_item),
            ]
            output.append(done_item)
        for call in result.tool_calls:
            index, done_call = len(output), self._call_item(call)
            fc_id = done_call["id"]
            custom = done_call["type"] == "custom_tool_call"
            kind = "response.custom_tool_call_input" if custom else "response.function_call_arguments"
            text = done_call["input"] if custom else call.arguments
            final = {"input": text} if custom else {"arguments": text, "name": call.name}
            events += [
                self._event(
                    "response.output_item.added",
                    output_index=index,
                    item=self._call_item(call, fc_id, status="in_progress"),
                ),
                self._event(kind + ".delta", item_id=fc_id, output_index=index, delta=text),
                self._event(kind + ".done", item_id=fc_id, output_index=index, **final),
                self._event("response.output_item.done", output_index=index, item=done_call),
            ]
            output.append(done_call)
        return events, self._response("completed", output, result)

    def stream_done(self, response: dict[str, Any]) -> list[Event]:
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return [self._event(kind, response=response)]

    def stream_failed(self, status: int, message: str, code: str | None) -> list[Event]:
        """A stream that fails ends with `response.failed` (Codex waits for a terminal event; a
        dropped connection it retries as a network error)."""
        response = self._response("failed", [], None)
        response["error"] = {
            "code": code or ("server_error" if status >= 500 else "invalid_request"),
            "message": message,
        }
        return [self._event("response.failed", response=response)]
