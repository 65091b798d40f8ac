"""The protocol between the gateway and whatever produces tokens.

A backend turns one OpenAI-style request (chat messages or a plain prompt, tools, sampling params)
into one generation, and reports the exact token ids and logprobs it produced. The gateway never
re-tokenises: what a backend returns is what gets recorded and trained on.

Implementations: the embedded engine (`reinforge.engine.engine_backend.EngineBackend`), an upstream
OpenAI-compatible server such as vLLM or SGLang (`reinforge.inference.upstream.UpstreamBackend`), and a
scripted backend for tests (`reinforge.inference.scripted.ScriptedBackend`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    """0 means greedy."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    """0 means no top-k filtering."""
    max_tokens: int | None = Field(default=None, ge=1)
    """None means up to the backend's limit."""
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    seed: int | None = None


class ToolCall(BaseModel):
    """A function call in OpenAI's shape; `arguments` is the JSON text the model produced."""

    id: str
    name: str
    arguments: str


class GenerationRequest(BaseModel):
    """Exactly one of `messages` (chat) or `prompt` (text completion) is set."""

    model_config = ConfigDict(extra="forbid")

    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    tools: list[dict[str, Any]] | None = None
    """OpenAI function-tool definitions: [{"type": "function", "function": {...}}]."""
    tool_choice: Any = None
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    model: str | None = None


FinishReason = Literal["stop", "length", "tool_calls"]


class GenerationResult(BaseModel):
    text: str
    """The completion text, with tool-call markup removed when tool calls were parsed."""
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    """The logprob of each completion token under the sampling distribution's base model."""
    finish_reason: FinishReason
    tool_calls: list[ToolCall] = Field(default_factory=list)
    malformed_tool_call: bool = False
    """The model tried to call a tool but the call could not be parsed; the text holds the attempt."""
    policy_version: int = 0


class TextDelta(BaseModel):
    """A piece of completion text produced so far (for streaming)."""

    text: str


@runtime_checkable
class Backend(Protocol):
    model_name: str

    async def generate(self, request: GenerationRequest) -> GenerationResult: ...

    def stream(self, request: GenerationRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        """Yield text deltas as they are produced, then exactly one GenerationResult."""
        ...
