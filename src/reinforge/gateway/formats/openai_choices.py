"""What OpenAI's two choice-based formats (chat completions, completions) share.

A call's id and time, its `n` choices, the answer's envelope, and the usage chunk a stream ends
with when `stream_options.include_usage` asks for it. Each format keeps the shape of its own
choices, and builds its stream chunks in one literal (the per-chunk path makes no extra call).
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from reinforge.gateway.formats.base import ApiFormat, Event, FormatContext, usage
from reinforge.gateway.openai_bodies import ChatCompletionBody, CompletionBody, choice_count
from reinforge.gateway.service import new_id
from reinforge.inference.contract import GenerationRequest, GenerationResult


class OpenAIChoices(ApiFormat):
    """The common part of `ChatCompletions` and `Completions`."""

    ends_with_done = True
    answer_object: ClassVar[str]
    """The answer's `object` field."""
    chunk_object: ClassVar[str]
    """A stream chunk's `object` field."""
    id_prefix: ClassVar[str]

    def __init__(
        self,
        request: GenerationRequest,
        body: ChatCompletionBody | CompletionBody,
        with_logprobs: bool,
        context: FormatContext,
    ) -> None:
        self.request = request
        self.stream = body.stream
        self.n = choice_count(body.n, body.stream)
        self.with_logprobs = with_logprobs
        self.with_token_ids = body.return_token_ids
        self.include_usage = bool((body.stream_options or {}).get("include_usage"))
        self.context = context
        self.response_id = self.id_prefix + new_id()
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": obj,
            "created": self.created,
            "model": self.context.model,
            "choices": choices,
        }

    def _answer(self, choice: dict[str, Any], result: GenerationResult) -> dict[str, Any]:
        """The whole answer around its one choice (the gateway merges n of them, `merge_choices`)."""
        body = self._envelope(self.answer_object, [choice])
        body["usage"] = usage(result)
        body["system_fingerprint"] = f"policy-v{result.policy_version}"
        return body

    def _usage_chunk(self, response: dict[str, Any]) -> Event:
        chunk = self._envelope(self.chunk_object, [])
        chunk["usage"] = response["usage"]
        return chunk
