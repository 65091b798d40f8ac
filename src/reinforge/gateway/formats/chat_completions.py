"""OpenAI's chat completions (`POST .../v1/chat/completions`), plain and streamed.

The shapes follow OpenAI's API reference so the official SDKs parse them into their typed objects.
"""

from __future__ import annotations

import time
from typing import Any, Self

from reinforge.gateway.formats.base import ApiFormat, Event, FormatContext, chat_logprobs, usage
from reinforge.gateway.openai_bodies import ChatCompletionBody, chat_request, choice_count, parse_body
from reinforge.gateway.service import new_id
from reinforge.inference.contract import GenerationResult, ToolCall


def tool_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def chat_message(result: GenerationResult) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.text or None, "refusal": None}
    if result.tool_calls:
        message["tool_calls"] = [tool_call(c) for c in result.tool_calls]
    elif message["content"] is None:
        message["content"] = ""
    return message


class ChatCompletions(ApiFormat):
    path = "/chat/completions"
    endpoint = "chat.completions"
    ends_with_done = True

    def __init__(self, body: ChatCompletionBody, context: FormatContext) -> None:
        self.request = chat_request(body)
        self.stream = body.stream
        self.n = choice_count(body.n, body.stream)
        self.with_logprobs = bool(body.logprobs)
        self.with_token_ids = body.return_token_ids
        self.include_usage = bool((body.stream_options or {}).get("include_usage"))
        self.context = context
        self.response_id = "chatcmpl-" + new_id()
        self.created = int(time.time())

    @classmethod
    def parse(cls, data: dict[str, Any], context: FormatContext) -> Self:
        return cls(parse_body(ChatCompletionBody, data), context)

    def body(self, result: GenerationResult) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "message": chat_message(result),
            "logprobs": chat_logprobs(result.completion_token_ids, result.logprobs, self.context.texts)
            if self.with_logprobs
            else None,
            "finish_reason": result.finish_reason,
        }
        body: dict[str, Any] = {
            "id": self.response_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.context.model,
            "choices": [choice],
            "usage": usage(result),
            "system_fingerprint": f"policy-v{result.policy_version}",
        }
        if self.with_token_ids:
            body["prompt_token_ids"] = result.prompt_token_ids
            choice["token_ids"] = result.completion_token_ids
        return body

    def _chunk(
        self, delta: dict[str, Any], finish_reason: str | None = None, logprobs: dict[str, Any] | None = None
    ) -> Event:
        return {
            "id": self.response_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.context.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
        }

    def stream_start(self) -> list[Event]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def stream_text(self, text: str) -> list[Event]:
        return [self._chunk({"content": text})]

    def stream_end(self, result: GenerationResult, rest: str) -> tuple[list[Event], dict[str, Any]]:
        response = self.body(result)
        events = []
        if rest:
            events.append(self._chunk({"content": rest}))
        choice = response["choices"][0]
        if choice["logprobs"] is not None:
            events.append(self._chunk({}, logprobs=choice["logprobs"]))
        if result.tool_calls:
            deltas = [{"index": i, **tool_call(call)} for i, call in enumerate(result.tool_calls)]
            events.append(self._chunk({"tool_calls": deltas}))
        final = self._chunk({}, result.finish_reason)
        if "token_ids" in choice:
            final["prompt_token_ids"] = result.prompt_token_ids
            final["choices"][0]["token_ids"] = result.completion_token_ids
        events.append(final)
        if self.include_usage:
            usage_chunk = self._chunk({})
            usage_chunk["choices"] = []
            usage_chunk["usage"] = response["usage"]
            events.append(usage_chunk)
        return events, response
