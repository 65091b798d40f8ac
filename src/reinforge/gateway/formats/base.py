"""The adapter interface of one API format (OpenAI chat completions, completions, responses...).

Why one interface: the gateway serves every format along one path (admit the caller → parse →
wait for the policy → generate or stream → record, in `gateway/routes.py`); what differs between
formats is only how a body becomes a `GenerationRequest` and how a result, or its text as it
streams, becomes the format's answer. A new format is a new subclass of `ApiFormat` listed in
`API_FORMATS`, with no new code path.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from reinforge.inference.contract import GenerationRequest, GenerationResult

TokenTexts = Callable[[list[int]], list[str]]
"""Maps token ids to the text of each token, for the `token` fields of logprobs (`Backend.token_texts`)."""


@dataclass(frozen=True, slots=True)
class FormatContext:
    """What an adapter needs from the gateway to shape answers."""

    model: str
    """The served model's name, as the answers report it."""
    texts: TokenTexts
    attempt_memory: dict[str, object] = field(default_factory=dict)
    """The calling attempt's memory between its calls (`AttemptState.extra`), for a format that keeps
    state on the server (Anthropic's threads); it goes when the gateway forgets the attempt."""


Event = dict[str, Any]
"""One stream event's payload; the HTTP layer frames it as server-sent events."""


class ApiFormat(ABC):
    """One API format's adapter; an instance is one call: its request and the shaping of its answer.

    The stream methods are called in order: `stream_start`, `stream_text` for each piece of text as
    the backend produces it, `stream_end` once the result is in (its response body is what the span
    records), then `stream_done` after the call is recorded.
    """

    path: ClassVar[str]
    """The route under the agent's base URL (`.../v1`)."""
    endpoint: ClassVar[str]
    """The span's `ATTR_LLM_ENDPOINT`."""
    named_events: ClassVar[bool] = False
    """Frame each event with an `event: <its type>` line (else `data:` lines alone)."""
    ends_with_done: ClassVar[bool] = False
    """End the stream with OpenAI's `data: [DONE]` line."""

    request: GenerationRequest
    stream: bool
    n: int = 1
    """Samples asked for; formats with `choices` accept n>1 (served without streaming)."""
    failed_tool_calls: tuple[str, ...] = ()
    """Ids of the tool calls whose results this request reports as failed (a format with an error
    flag on tool results: Anthropic's `is_error`); the gateway turns each new one into an AIR signal."""

    @classmethod
    @abstractmethod
    def parse(cls, data: dict[str, Any], context: FormatContext) -> Self:
        """The decoded body as one call; a `GatewayHTTPError` (400) names a bad or unsupported parameter."""

    @abstractmethod
    def body(self, result: GenerationResult) -> dict[str, Any]:
        """The whole answer of a call that does not stream."""

    @abstractmethod
    def stream_start(self) -> list[Event]:
        """Events before the first text."""

    @abstractmethod
    def stream_text(self, text: str) -> list[Event]:
        """Events for a non-empty piece of generated text."""

    @abstractmethod
    def stream_end(self, result: GenerationResult, rest: str) -> tuple[list[Event], dict[str, Any]]:
        """Events once the result is in, and the response body to record; `rest` is the final text
        the stream has not sent yet (a backend may hold back a tail)."""

    def stream_done(self, response: dict[str, Any]) -> list[Event]:
        """Events after the call is recorded."""
        return []

    def stream_failed(self, status: int, message: str, code: str | None) -> list[Event] | None:
        """The format's own terminal event for a stream that failed, or None for the generic error
        event (`data: {"error": ...}`)."""
        return None


def merge_choices(bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """One answer with n choices from n single-choice answers (each was recorded as its own call)."""
    merged = dict(bodies[0])
    merged["choices"] = [{**body["choices"][0], "index": i} for i, body in enumerate(bodies)]
    completion = sum(body["usage"]["completion_tokens"] for body in bodies)
    prompt = bodies[0]["usage"]["prompt_tokens"]
    merged["usage"] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    return merged


def usage(result: GenerationResult) -> dict[str, int]:
    p, c = len(result.prompt_token_ids), len(result.completion_token_ids)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def chat_logprobs(ids: list[int], logprobs: list[float], texts: TokenTexts) -> dict[str, Any]:
    """Logprobs in the chat completions shape (the responses API reuses its `content` items)."""
    content = []
    for token, logprob in zip(texts(ids), logprobs, strict=True):
        content.append(
            {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}
        )
    return {"content": content, "refusal": None}
