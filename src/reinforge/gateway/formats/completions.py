"""OpenAI's (legacy) completions (`POST .../v1/completions`), plain and streamed."""

from __future__ import annotations

import time
from typing import Any, Self

from reinforge.gateway.formats.base import ApiFormat, Event, FormatContext, TokenTexts, usage
from reinforge.gateway.openai_bodies import CompletionBody, choice_count, completion_request, parse_body
from reinforge.gateway.service import new_id
from reinforge.inference.contract import GenerationResult


def completion_logprobs(ids: list[int], logprobs: list[float], texts: TokenTexts) -> dict[str, Any]:
    tokens = texts(ids)
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": offsets}


class Completions(ApiFormat):
    path = "/completions"
    endpoint = "completions"
    ends_with_done = True

    def __init__(self, body: CompletionBody, context: FormatContext) -> None:
        self.request = completion_request(body)
        self.stream = body.stream
        self.n = choice_count(body.n, body.stream)
        self.with_logprobs = body.logprobs is not None
        self.with_token_ids = body.return_token_ids
        self.include_usage = bool((body.stream_options or {}).get("include_usage"))
        self.context = context
        self.response_id = "cmpl-" + new_id()
        self.created = int(time.time())

    @classmethod
    def parse(cls, data: dict[str, Any], context: FormatContext) -> Self:
        return cls(parse_body(CompletionBody, data), context)

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
        return {
            "id": self.response_id,
            "object": "text_completion",
            "created": self.created,
            "model": self.context.model,
            "choices": [choice],
            "usage": usage(result),
            "system_fingerprint": f"policy-v{result.policy_version}",
        }

    def _chunk(self, text: str, finish_reason: str | None) -> Event:
        return {
            "id": self.response_id,
            "object": "text_completion",
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
            usage_chunk = self._chunk("", None)
            usage_chunk["choices"] = []
            usage_chunk["usage"] = response["usage"]
            events.append(usage_chunk)
        return events, response
