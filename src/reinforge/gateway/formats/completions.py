"""OpenAI's (legacy) completions (`POST .../v1/completions`), plain and streamed."""

from __future__ import annotations

from typing import Any, Self

from reinforge.gateway.formats.base import Event, FormatContext, TokenTexts
from reinforge.gateway.formats.openai_choices import OpenAIChoices
from reinforge.gateway.openai_bodies import CompletionBody, completion_request, parse_body
from reinforge.inference.contract import GenerationResult


def completion_logprobs(ids: list[int], logprobs: list[float], texts: TokenTexts) -> dict[str, Any]:
    tokens = texts(ids)
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": offsets}


class Completions(OpenAIChoices):
    path = "/completions"
    endpoint = "completions"
    answer_object = "text_completion"
    chunk_object = "text_completion"
    id_prefix = "cmpl-"

    @classmethod
    def parse(cls, data: dict[str, Any], context: FormatContext) -> Self:
        body = parse_body(CompletionBody, data)
        return cls(completion_request(body), body, body.logprobs is not None, context)

    def body(self, result: GenerationResult) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "text": result.text,
            "logprobs": completion_logprobs(result.completion_token_ids, result.logprobs, self.context.texts)
            if self.with_logprobs
            else None,
            "finish_reason": "stop" if result.finish_reason == "tool_calls" else result.finish_reason,
        }
        if self.with_token_ids:
            choice["prompt_token_ids"] = result.prompt_token_ids
            choice["token_ids"] = result.completion_token_ids
        return self._answer(choice, result)

    def _chunk(self, text: str, finish_reason: str | None) -> Event:
        return {
            "id": self.response_id,
            "object": self.chunk_object,
            "created": self.created,
            "model": self.context.model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        }

    def stream_start(self) -> list[Event]:
        return []

    def stream_text(self, text: str) -> list[Event]:
        return [self._chunk(text, None)]

    def stream_end(self, result: GenerationResult, rest: str) -> tuple[list[Event], dict[str, Any]]:
        response = self.body(result)
        choice = response["choices"][0]
        final = self._chunk(rest, choice["finish_reason"])
        final["choices"][0]["logprobs"] = choice["logprobs"]
        if "token_ids" in choice:
            final["choices"][0]["prompt_token_ids"] = result.prompt_token_ids
            final["choices"][0]["token_ids"] = result.completion_token_ids
        events = [final]
        if self.include_usage:
            events.append(self._usage_chunk(response))
        return events, response
