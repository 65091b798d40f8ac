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

from pydantic import BaseModel, ConfigDict, Field, field_validator


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
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    """Subtracted once from the logit of every token already generated (OpenAI's definition)."""
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    """Subtracted from a token's logit once per time it was generated."""
    logit_bias: dict[int, float] = Field(default_factory=dict)
    """Token id -> a bias in [-100, 100] added to its logit before sampling."""
    grammar: str | None = None
    """A Lark grammar (llguidance's dialect, `%json {...}` for JSON schemas) the output must match.

    Penalties, bias and grammar shape the distribution sampled from, so the recorded (behaviour)
    logprob includes them; the trainer's policy has none of them and truncated importance sampling
    corrects for the difference (see `reinforge.engine.sampling`).
    """

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, value: dict[int, float]) -> dict[int, float]:
        for token, bias in value.items():
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"the bias of token {token} is {bias}; biases lie in [-100, 100]")
        return value

    @property
    def shapes_logits(self) -> bool:
        """Whether sampling needs more than temperature and truncation."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias or self.grammar)


class ToolCall(BaseModel):
    """A function call in OpenAI's shape; `arguments` is the JSON text the model produced."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        """The call as an item of an OpenAI chat message's `tool_calls`."""
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


class ResponseFormat(BaseModel):
    """Structured output: any JSON object, or JSON matching a schema (OpenAI's `response_format`)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None
    """The JSON Schema itself (for "json_schema")."""
    name: str | None = None


class GenerationRequest(BaseModel):
    """Exactly one of `messages` (chat) or `prompt` (text completion) is set."""

    model_config = ConfigDict(extra="forbid")

    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    tools: list[dict[str, Any]] | None = None
    """OpenAI function-tool definitions: [{"type": "function", "function": {...}}]."""
    tool_choice: Any = None
    """None/"auto", "none", "required", or {"type": "function", "function": {"name": ...}}."""
    parallel_tool_calls: bool = True
    """False: at most one tool call per turn (enforced where the output is constrained to a call)."""
    response_format: ResponseFormat | None = None
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    model: str | None = None
    adapter: str | None = None
    """Which LoRA adapter serves this call; None: the base. The gateway sets the caller's agent name;
    a backend without an adapter of that name serves the base model (a frozen role has none)."""
    generated_turns: dict[int, list[int]] = Field(default_factory=dict)
    """Assistant messages (by index in `messages`) that this policy generated, with the exact token
    ids it generated for each. A backend that renders prompts itself puts these ids where the chat
    template would spell the turn its own way (a tool call the model wrote with other spacing), so
    the prompt extends the tokens the model produced; others may ignore it."""


FinishReason = Literal["stop", "length", "tool_calls"]


class GenerationResult(BaseModel):
    text: str
    """The completion text, with tool-call markup removed when tool calls were parsed."""
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    """The logprob of each completion token under the distribution it was sampled from: after
    penalties, bias, grammar, temperature, top-k and top-p (at temperature 0, the shaped logits at
    temperature 1, untruncated); see `reinforge.engine.sampling`."""
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

    def token_texts(self, ids: list[int]) -> list[str]:
        """The text of each token, for the `token` fields of logprobs in the gateway's answers
        (`token_id_texts` when the backend can't name its tokens)."""
        ...


def token_id_texts(ids: list[int]) -> list[str]:
    """vLLM's `return_tokens_as_token_ids` convention: `token_id:<id>` for each token, for a backend
    that can't name its tokens (or would spend per-call work doing so)."""
    return [f"token_id:{i}" for i in ids]


@runtime_checkable
class PreparesAhead(Protocol):
    """A backend with work of its own to do on a request before generating it (the embedded engine
    renders the chat prompt into token ids): the gateway has it done while the call is held for a
    policy version not yet published, so that on release only the generation is left."""

    def prepare_ahead(self, request: GenerationRequest) -> None:
        """Do `request`'s preparation now, where `generate` and `stream` find it done; raise nothing
        (they raise what the request's preparation raises, as before)."""
        ...
