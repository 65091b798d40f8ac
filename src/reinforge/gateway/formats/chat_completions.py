"""OpenAI's chat completions (`POST .../v1/chat/completions`), plain and streamed.

The shapes follow OpenAI's API reference so the official SDKs parse them into their typed objects.
"""

from __future__ import annotations

from typing import Any, Self

from reinforge.gateway.formats.base import Event, FormatContext, chat_logprobs
from reinforge.gateway.formats.openai_choices import OpenAIChoices
from reinforge.gateway.openai_bodies import ChatCompletionBody, chat_request, parse_body
from reinforge.inference.contract import GenerationResult


def chat_message(result: GenerationResult) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.text or None, "refusal": None}
    if result.tool_calls:
        message["tool_calls"] = [c.as_openai() for c in result.tool_calls]
    elif message["content"] is None:
        message["content"] = ""
    return message


class ChatCompletions(OpenAIChoices):
    path = "/chat/completions"
    endpoint = "chat.completions"
    answer_object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    @classmethod
    def parse(cls, data: dict[str, Any], context: FormatContext) -> Self:
        body = parse_body(ChatCompletionBody, data)
        return cls(chat_request(body), body, bool(body.logprobs), context)

    def body(self, result: GenerationResult) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "message": chat_message(result),
            "logprobs": chat_logprobs(result.completion_token_ids, result.logprobs, self.context.texts)
            if self.with_logprobs
            else None,
            "finish_reason": result.finish_reason,
        }
        body = self._answer(choice, result)
        if self.with_token_ids:
            body["prompt_token_ids"] = result.prompt_token_ids
            choice["token_ids"] = result.completion_token_ids
        return body

    def _chunk(
        self, delta: dict[str, Any], finish_reason: str | None = None, logprobs: dict[str, Any] | None = None
    ) -> Event:
        return {
            "id": self.response_id,
            "object": self.chunk_object,
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
            deltas = [{"index": i, **call.as_openai()} for i, call in enumerate(result.tool_calls)]
            events.append(self._chunk({"tool_calls": deltas}))
        final = self._chunk({}, result.finish_reason)
        if "token_ids" in choice:
            final["prompt_token_ids"] = result.prompt_token_ids
            final["choices"][0]["token_ids"] = result.completion_token_ids
        events.append(final)
        if self.include_usage:
            events.append(self._usage_chunk(response))
        return events, response
