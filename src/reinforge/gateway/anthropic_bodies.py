"""Anthropic's Messages request body, validated and turned into one OpenAI-style GenerationRequest.

Why OpenAI-style: every backend and every chat template already takes chat messages with
`tool_calls` and `tool` messages, so an Anthropic conversation is rewritten into that shape once here
(text blocks → content, `tool_use` → a function call whose `arguments` is the input's JSON text in its
key order, `tool_result` → a tool message) and nothing below the gateway learns a second format.

Why strict, as for the OpenAI bodies: a field the gateway can't honour (images, documents, thinking,
server tools, structured output) is a 400 naming it, never silently dropped. Fields that change nothing
about generation (metadata, service_tier, cache_control, output_config.effort, adaptive thinking,
clear_thinking context edits: what Claude Code sends on every call) are accepted and only recorded.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from reinforge.gateway.body_schemas import MAX_TOKENS, Documented, OrText
from reinforge.gateway.errors import GatewayHTTPError
from reinforge.inference.contract import GenerationRequest, SamplingParams
from reinforge.types import INTEGRAL


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # types as the published schema says


def _as_blocks(content: Any) -> Any:
    """A string content as one text block, so a bad block is reported at its own field (a `str | list`
    union would report the string branch first)."""
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: Annotated[list[Any], Documented({"maxItems": 0})] | None = None

    @field_validator("citations")
    @classmethod
    def _no_citations(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("citations are not supported by the reinforge gateway")
        return value


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None
    # What the SDK's own `ToolUseBlock.model_dump()` adds when an agent sends a reply back: only
    # their empty values are accepted (a programmatic caller or a toolset is not served here).
    caller: None = None
    toolset_name: None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: Annotated[list[TextBlock], BeforeValidator(_as_blocks), OrText()] = Field(default_factory=list)
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]
_BLOCK_TAGS = frozenset({"text", "tool_use", "tool_result"})
_SUPPORTED_BLOCKS = "text, tool_use or tool_result"


def _refused_in(role: str, block: str) -> dict[str, Any]:
    """A message of `role` holding a `block` block (the parser refuses it, naming the block)."""
    holds = {"type": "object", "required": ["type"], "properties": {"type": {"const": block}}}
    content = {"type": "array", "contains": holds}
    return {
        "not": {"required": ["role", "content"], "properties": {"role": {"const": role}, "content": content}}
    }


class Message(_Strict):
    # tool_use blocks come from the assistant, tool_result blocks from the user (`chat_messages`).
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [_refused_in("user", "tool_use"), _refused_in("assistant", "tool_result")]
        }
    )

    role: Literal["user", "assistant"]
    content: Annotated[list[ContentBlock], BeforeValidator(_as_blocks), OrText()]


class Tool(_Strict):
    type: Literal["custom"] | None = None
    """Only client tools (`custom`, the default): the gateway runs no server tools."""
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None
    eager_input_streaming: bool | None = None
    """Fine-grained tool streaming: how the input is streamed, not what is generated."""


class ToolChoice(_Strict):
    # A `tool` choice names the tool (`chat_tool_choice`).
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"properties": {"type": {"enum": ["auto", "any", "none"]}}},
                {"required": ["name"], "properties": {"name": {"type": "string", "minLength": 1}}},
            ]
        }
    )

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thread(_Strict):
    """The message-threads beta: the gateway holds the conversation under the id of its last reply."""

    # Only a continue names a reply, and it must (`AnthropicMessages`).
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"properties": {"type": {"const": "create"}, "previous_message_id": {"type": "null"}}},
                {
                    "required": ["previous_message_id"],
                    "properties": {
                        "type": {"const": "continue"},
                        "previous_message_id": {"type": "string", "minLength": 1},
                    },
                },
            ]
        }
    )

    type: Literal["create", "continue"]
    previous_message_id: str | None = None


class Thinking(_Strict):
    type: Literal["disabled", "adaptive"]
    """Extended thinking is not served. `disabled` says so; `adaptive` (Claude Code's default) lets the
    model decide whether to think, and a reply without thinking is one it may give. `enabled` (thinking
    required, with a budget) is refused."""


class ContextEdit(_Strict):
    type: Literal["clear_thinking_20251015"]
    """Only clearing thinking blocks: the gateway never produces or accepts one, so there is nothing
    to clear. Edits that drop tool results would rewrite the history the backend sees: refused."""
    keep: str | dict[str, Any] | None = None


class ContextManagement(_Strict):
    """The context-management beta (Claude Code sends `clear_thinking` on every call)."""

    edits: list[ContextEdit] = Field(default_factory=list)


class OutputConfig(_Strict):
    """The effort beta: a hint the served policy has no setting for; recorded. `format` (structured
    output) is refused."""

    effort: str | None = None


def _kept_by_the_thread(name: str) -> dict[str, Any]:
    """A continue that sends `name` (refused: the thread keeps the one it was created with)."""
    thread = {"type": "object", "required": ["type"], "properties": {"type": {"const": "continue"}}}
    return {"not": {"required": ["thread", name], "properties": {"thread": thread}}}


class MessagesBody(_Strict):
    """`POST /v1/messages`."""

    model_config = ConfigDict(
        json_schema_extra={"allOf": [_kept_by_the_thread("system"), _kept_by_the_thread("tools")]}
    )

    model: str
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS), INTEGRAL]
    messages: Annotated[list[Message], Documented({"minItems": 1})]
    system: Annotated[list[TextBlock], BeforeValidator(_as_blocks), OrText()] = Field(default_factory=list)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    temperature: Annotated[float, Field(ge=0.0, le=10.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0, le=MAX_TOKENS), INTEGRAL] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    thread: Thread | None = None
    thinking: Thinking | None = None
    context_management: ContextManagement | None = None
    # Accepted, recorded, and without effect on generation.
    output_config: OutputConfig | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    inference_geo: str | None = None
    speed: str | None = None
    cache_control: dict[str, Any] | None = None


def _param(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as the dotted field name, without the discriminator tags pydantic adds
    after a content block's index (`messages.0.content.1.text.text` → `messages.0.content.1.text`)."""
    parts = [
        str(part)
        for k, part in enumerate(loc)
        if not (part in _BLOCK_TAGS and k > 0 and isinstance(loc[k - 1], int) and k < len(loc) - 1)
    ]
    return ".".join(parts)


def parse_messages_body(data: dict[str, Any]) -> MessagesBody:
    """Validate a decoded body; the first problem becomes a 400 naming the field."""
    try:
        return MessagesBody.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _param(first["loc"])
        kind = first["type"]
        if kind == "extra_forbidden":
            why = "unknown field, or one the reinforge gateway does not support"
        elif kind == "union_tag_invalid":
            param += ".type"
            why = f"{first['ctx']['tag']!r} content blocks are not supported; use {_SUPPORTED_BLOCKS}"
        elif kind == "literal_error":
            expected = first["ctx"]["expected"]
            why = f"{first['input']!r} is not supported by the reinforge gateway; use {expected}"
        else:
            why = first["msg"]
        raise GatewayHTTPError(400, f"{param}: {why}", param=param) from None


def _reject(param: str, why: str) -> GatewayHTTPError:
    return GatewayHTTPError(400, f"{param}: {why}", param=param)


def _text(blocks: list[TextBlock]) -> str:
    """Text blocks as one string, a newline between blocks."""
    return "\n".join(block.text for block in blocks)


def system_message(body: MessagesBody) -> list[dict[str, Any]]:
    """The system prompt as a leading chat message (none when absent or empty)."""
    text = _text(body.system)
    return [{"role": "system", "content": text}] if text else []


def arguments_text(tool_input: dict[str, Any]) -> str:
    """A tool_use `input` as OpenAI's `arguments` JSON text, its keys in the order they came."""
    return json.dumps(tool_input, ensure_ascii=False)


def _tool_result(block: ToolResultBlock) -> dict[str, Any]:
    """A tool message. `is_error` has no slot in a chat message: the content carries the error text."""
    return {
        "role": "tool",
        "tool_call_id": block.tool_use_id,
        "content": _text(block.content),
    }


def _user(blocks: list[TextBlock | ToolUseBlock | ToolResultBlock], param: str) -> list[dict[str, Any]]:
    """A user turn: its tool results as tool messages, its text as a user message, in their order."""
    out: list[dict[str, Any]] = []
    texts: list[TextBlock] = []
    for j, block in enumerate(blocks):
        if isinstance(block, ToolUseBlock):
            raise _reject(f"{param}.{j}.type", "tool_use blocks belong in assistant messages")
        if isinstance(block, TextBlock):
            texts.append(block)
            continue
        if texts:
            out.append({"role": "user", "content": _text(texts)})
            texts = []
        out.append(_tool_result(block))
    if texts or not out:
        out.append({"role": "user", "content": _text(texts)})
    return out


def _assistant(blocks: list[TextBlock | ToolUseBlock | ToolResultBlock], param: str) -> dict[str, Any]:
    texts: list[TextBlock] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if isinstance(block, ToolResultBlock):
            raise _reject(f"{param}.{j}.type", "tool_result blocks belong in user messages")
        if isinstance(block, TextBlock):
            texts.append(block)
        else:
            function = {"name": block.name, "arguments": arguments_text(block.input)}
            calls.append({"id": block.id, "type": "function", "function": function})
    message: dict[str, Any] = {"role": "assistant", "content": _text(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Anthropic messages as OpenAI chat messages."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        param = f"messages.{i}.content"
        if message.role == "user":
            out += _user(message.content, param)
        else:
            out.append(_assistant(message.content, param))
    return out


def chat_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """Client tools as OpenAI function tools (`input_schema` → `parameters`)."""
    if not tools:
        return None
    out = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = tool.input_schema
        if tool.strict is not None:
            function["strict"] = tool.strict
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: ToolChoice | None) -> Any:
    """Anthropic's tool_choice in OpenAI's terms: auto, any → required, tool → a named function, none."""
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name:
            raise _reject("tool_choice.name", "a tool_choice of type 'tool' names the tool")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def sampling(body: MessagesBody) -> SamplingParams:
    values: dict[str, Any] = {"max_tokens": body.max_tokens}
    if body.temperature is not None:
        values["temperature"] = body.temperature
    if body.top_p is not None:
        values["top_p"] = body.top_p
    if body.top_k is not None:
        values["top_k"] = body.top_k
    if body.stop_sequences:
        values["stop"] = body.stop_sequences
    try:
        return SamplingParams(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = str(first["loc"][0]) if first["loc"] else "body"
        if param == "stop":
            param = "stop_sequences"
        raise _reject(param, first["msg"]) from None


def messages_request(
    body: MessagesBody,
    history: list[dict[str, Any]] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> GenerationRequest:
    """The body as one generation. `history` and `tools` come from the thread a `continue` resumes
    (the system prompt is its first message); without one they come from the body."""
    if history is None:
        if not body.messages:
            raise _reject("messages", "at least one message is required")
        messages = system_message(body) + chat_messages(body.messages)
        tools = chat_tools(body.tools)
    else:
        if not body.messages:
            raise _reject("messages", "a continue sends the new turn's messages")
        messages = history + chat_messages(body.messages)
    return GenerationRequest(
        messages=messages,
        tools=tools,
        tool_choice=chat_tool_choice(body.tool_choice),
        parallel_tool_calls=not (body.tool_choice and body.tool_choice.disable_parallel_tool_use),
        sampling=sampling(body),
        model=body.model,
    )
