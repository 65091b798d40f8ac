"""The OpenAI request bodies the gateway accepts, validated and turned into one GenerationRequest.

Why strict: an option the backend can't honour (top-k alternatives, audio, server-side conversation
state) is a clear 400 naming the parameter, never silently ignored, because a silently different
sampling distribution would corrupt the behaviour logprobs the trainer relies on. Fields that change
nothing about generation (user, metadata, store...) are accepted and only recorded. The table of every
field, honoured or refused, is in docs/gateway.md.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

from reinforge.finish_wire import FinishBody
from reinforge.gateway import body_schemas as schemas
from reinforge.gateway.errors import GatewayHTTPError
from reinforge.inference.contract import GenerationRequest, ResponseFormat, SamplingParams
from reinforge.types import INTEGRAL

M = TypeVar("M", bound=BaseModel)

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

MAX_CHOICES = 16
"""The most samples one request may ask for (`n`): each is a generation and a recorded call."""

_TOKEN_ID_KEY = re.compile(schemas.TOKEN_ID_KEY)

# Numbers as the published schema states them: JSON Schema's integer (`3.0` too, never `true`), and
# the bounds `SamplingParams` and the backends hold to.
TokenId = Annotated[int, Field(ge=0, le=schemas.MAX_TOKEN_ID), INTEGRAL]
TokenCount = Annotated[int, Field(ge=1, le=schemas.MAX_TOKENS), INTEGRAL]
Seed = Annotated[int, Field(ge=schemas.INT64[0], le=schemas.INT64[1]), INTEGRAL]
TopK = Annotated[int, Field(ge=-schemas.MAX_TOKENS - 1, le=schemas.MAX_TOKENS), INTEGRAL]
"""vLLM's spelling: -1 (or any negative) for no top-k."""
Temperature = Annotated[float, Field(ge=0.0, le=10.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Choices = Annotated[int, Field(ge=1, le=MAX_CHOICES), INTEGRAL]
OnlyZero = Annotated[int, Field(ge=0, le=0), INTEGRAL]
"""A count the gateway serves only at 0 (alternatives per token: none are recorded)."""
OnlyOne = Annotated[int, Field(ge=1, le=1), INTEGRAL]


def _false(value: bool) -> bool:
    if value:
        raise ValueError("only false is served")
    return value


OnlyFalse = Annotated[bool, AfterValidator(_false), WithJsonSchema({"const": False})]
Unsupported = Annotated[None, WithJsonSchema({"type": "null"})]
"""A parameter the gateway does not serve: only its absence (or null) is accepted."""

_WHY_REFUSED: dict[str, str] = {
    "n": f"must be between 1 and {MAX_CHOICES}",
    "top_logprobs": "alternative tokens are not recorded; use logprobs=true alone",
    "echo": "echo is not supported",
    "suffix": "suffix is not supported",
    "best_of": "only best_of=1 is supported",
    "previous_response_id": "the gateway keeps no conversation state; send the whole input",
    "conversation": "not supported",
    "prompt": "not supported",
    "background": "background responses are not supported",
    "modalities": "only text output is supported",
    "audio": "not supported by the reinforge gateway",
    "prediction": "not supported by the reinforge gateway",
    "functions": "not supported by the reinforge gateway",
    "function_call": "not supported by the reinforge gateway",
    "web_search_options": "not supported by the reinforge gateway",
    "reasoning_effort": "not supported by the reinforge gateway",
}
"""Why a value of these parameters is refused (their type admits only what the gateway serves)."""
_PER_MODEL_WHY: dict[tuple[str, str], str] = {
    (
        "CompletionBody",
        "logprobs",
    ): "alternative tokens are not recorded; use logprobs=0 for the chosen tokens",
    ("ResponsesBody", "top_logprobs"): "alternative tokens are not recorded",
}


class _Body(BaseModel):
    # Strict: `"temperature": "0.7"` or `"n": true` is a client bug, and the published schema
    # (gateway/openapi.py) promises numbers there.
    model_config = ConfigDict(extra="forbid", strict=True)

    # Accepted, recorded, and without effect on generation.
    model: str | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Sampling.
    stream: bool = False
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    seed: Seed | None = None
    stop_token_ids: list[TokenId] | None = None
    # Reinforge/vLLM extension: include the token ids in the response.
    return_token_ids: bool = False


class _OpenAISampling(_Body):
    # n>1 is served without streaming: the schema ties the two fields (`choice_count` checks it).
    model_config = ConfigDict(json_schema_extra=schemas.SAMPLES_NOT_STREAMED)

    stop: str | list[str] | None = None
    n: Choices | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: Annotated[dict[str, float] | None, WithJsonSchema(schemas.LOGIT_BIAS)] = None
    stream_options: dict[str, Any] | None = None


# The structured fields below are typed loosely for pydantic and checked by the request builders
# (`chat_request`...), whose refusals name the exact parameter; `body_schemas` states those checks.


class ChatCompletionBody(_OpenAISampling):
    messages: Annotated[list[dict[str, Any]], WithJsonSchema(schemas.CHAT_MESSAGES)] = Field(min_length=1)
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    logprobs: bool | None = None
    top_logprobs: OnlyZero | None = None
    tools: Annotated[list[dict[str, Any]] | None, WithJsonSchema(schemas.nullable(schemas.CHAT_TOOLS))] = None
    tool_choice: Annotated[Any, WithJsonSchema(schemas.CHAT_TOOL_CHOICE)] = None
    parallel_tool_calls: bool | None = None
    response_format: Annotated[dict[str, Any] | None, WithJsonSchema(schemas.CHAT_RESPONSE_FORMAT)] = None
    reasoning_effort: Unsupported = None
    modalities: Annotated[list[Literal["text"]], Field(max_length=1)] | None = None
    audio: Unsupported = None
    prediction: Unsupported = None
    functions: Unsupported = None
    function_call: Unsupported = None
    web_search_options: Unsupported = None
    verbosity: str | None = None


class CompletionBody(_OpenAISampling):
    prompt: Annotated[str | list[str] | list[TokenId] | list[list[TokenId]], WithJsonSchema(schemas.PROMPT)]
    max_tokens: TokenCount | None = 16
    logprobs: OnlyZero | None = None
    echo: OnlyFalse | None = None
    suffix: Literal[""] | None = None
    best_of: OnlyOne | None = None


class ResponsesBody(_Body):
    input: Annotated[str | list[dict[str, Any]], WithJsonSchema(schemas.RESPONSES_INPUT)]
    instructions: str | None = None
    max_output_tokens: TokenCount | None = None
    tools: Annotated[
        list[dict[str, Any]] | None, WithJsonSchema(schemas.nullable(schemas.RESPONSES_TOOLS))
    ] = None
    tool_choice: Annotated[Any, WithJsonSchema(schemas.RESPONSES_TOOL_CHOICE)] = None
    parallel_tool_calls: bool | None = None
    previous_response_id: Literal[""] | None = None
    reasoning: Annotated[dict[str, Any] | None, WithJsonSchema(schemas.RESPONSES_REASONING)] = None
    text: Annotated[dict[str, Any] | None, WithJsonSchema(schemas.RESPONSES_TEXT)] = None
    client_metadata: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: OnlyZero | None = None
    truncation: Literal["disabled", "auto"] | None = None
    background: OnlyFalse | None = None
    max_tool_calls: int | None = None
    conversation: Unsupported = None
    prompt: Unsupported = None
    stream_options: dict[str, Any] | None = None


class RewardBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    reward: float = Field(allow_inf_nan=False)
    final: bool = True
    name: str | None = Field(default=None, max_length=256)


def parse_body(model: type[M], data: Any) -> M:
    """Validate a decoded JSON body; a validation failure becomes a 400 naming the parameter (and,
    for a value the gateway does not serve, why)."""
    if not isinstance(data, dict):
        raise GatewayHTTPError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first["loc"]
        param = ".".join(str(p) for p in loc) or None
        kind = first["type"]
        why = (
            _PER_MODEL_WHY.get((model.__name__, str(loc[0])), _WHY_REFUSED.get(str(loc[0]))) if loc else None
        )
        if kind == "extra_forbidden":
            message = f"Unrecognized request argument supplied: {param}"
        elif why is not None and (kind == "none_required" or not kind.endswith("_type")):
            param = str(loc[0])
            code = "invalid_value" if param == "n" else "unsupported_parameter"
            raise GatewayHTTPError(400, f"{param}: {why}", param=param, code=code) from None
        else:
            message = f"{param}: {first['msg']}" if param else first["msg"]
        raise GatewayHTTPError(400, message, param=param, code="invalid_value") from None


def _reject(param: str, why: str) -> GatewayHTTPError:
    return GatewayHTTPError(400, f"{param}: {why}", param=param, code="unsupported_parameter")


def choice_count(n: int | None, stream: bool) -> int:
    """How many samples a request asks for (`n`), checked."""
    count = 1 if n is None else n
    if not 1 <= count <= MAX_CHOICES:
        raise GatewayHTTPError(
            400, f"n: must be between 1 and {MAX_CHOICES}", param="n", code="invalid_value"
        )
    if count > 1 and stream:
        raise _reject("n", "n>1 is served without streaming; send stream=false or n separate streams")
    return count


def _logit_bias(raw: dict[str, float] | None) -> dict[int, float]:
    bias: dict[int, float] = {}
    for key, value in (raw or {}).items():
        if not _TOKEN_ID_KEY.match(key):
            raise GatewayHTTPError(
                400, f"logit_bias: keys are token ids, got {key!r}", param="logit_bias", code="invalid_value"
            )
        bias[int(key)] = value
    return bias


def _response_format(raw: Any, param: str, nested: bool) -> ResponseFormat | None:
    """OpenAI's `response_format` (chat: the schema nested under `json_schema`) or `text.format`
    (responses: the schema beside `type`) as a ResponseFormat."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise GatewayHTTPError(400, f"{param}: must be an object with a 'type'", param=param)
    kind = raw.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return ResponseFormat(type="json_object")
    if kind != "json_schema":
        raise _reject(f"{param}.type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    spec = raw.get("json_schema") if nested else raw
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        where = f"{param}.json_schema.schema" if nested else f"{param}.schema"
        raise GatewayHTTPError(400, f"{where}: a JSON Schema object is required", param=where)
    assert isinstance(spec, dict)
    name = spec.get("name")
    return ResponseFormat(
        type="json_schema", json_schema=schema, name=name if isinstance(name, str) else None
    )


def _sampling(body: _Body, max_tokens: int | None, stop: str | list[str] | None) -> SamplingParams:
    values: dict[str, Any] = {}
    if isinstance(body, _OpenAISampling):
        if body.presence_penalty:
            values["presence_penalty"] = body.presence_penalty
        if body.frequency_penalty:
            values["frequency_penalty"] = body.frequency_penalty
        if body.logit_bias:
            values["logit_bias"] = _logit_bias(body.logit_bias)
    if body.temperature is not None:
        values["temperature"] = body.temperature
    if body.top_p is not None:
        values["top_p"] = body.top_p
    if body.top_k is not None:
        values["top_k"] = max(body.top_k, 0)  # vLLM uses -1 for "no top-k"
    if max_tokens is not None:
        values["max_tokens"] = max_tokens
    if stop:
        values["stop"] = [stop] if isinstance(stop, str) else stop
    if body.stop_token_ids:
        values["stop_token_ids"] = body.stop_token_ids
    if body.seed is not None:
        values["seed"] = body.seed
    try:
        return SamplingParams(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = str(first["loc"][0]) if first["loc"] else None
        if param == "max_tokens" and isinstance(body, ResponsesBody):
            param = "max_output_tokens"
        raise GatewayHTTPError(400, f"{param}: {first['msg']}", param=param, code="invalid_value") from None


def text_of(content: Any, param: str) -> str:
    """Plain text of a message's content (a string or a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _reject(param, f"only text content parts are supported, got {kind!r}")
            pieces.append(part["text"])
        return "".join(pieces)
    raise GatewayHTTPError(400, f"{param}: content must be a string or a list of parts", param=param)


def _check_calls(calls: Any, param: str) -> None:
    """An assistant turn's `tool_calls`: a list of function calls, each naming its function."""
    if calls is None:
        return
    if isinstance(calls, list) and all(
        isinstance(c, dict)
        and isinstance(fn := c.get("function"), dict)
        and isinstance(fn.get("name"), str)
        and isinstance(fn.get("arguments", ""), str | dict)
        for c in calls
    ):
        return
    raise GatewayHTTPError(
        400, f"{param}: must be a list of function calls, each with a function name", param=param
    )


def _normalise_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise GatewayHTTPError(
                400,
                f"messages.{i}.role: must be one of {sorted(_ROLES)}, got {role!r}",
                param=f"messages.{i}.role",
            )
        normalised = dict(message)
        if role == "developer":
            normalised["role"] = "system"
        normalised["content"] = text_of(message.get("content"), f"messages.{i}.content")
        _check_calls(message.get("tool_calls"), f"messages.{i}.tool_calls")
        out.append(normalised)
    return out


def _check_tools(tools: list[dict[str, Any]] | None, param: str = "tools") -> list[dict[str, Any]] | None:
    if not tools:
        return None
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise GatewayHTTPError(
                400, f"{param}.{i}: only function tools with a name are supported", param=f"{param}.{i}"
            )
    return tools


def chat_request(body: ChatCompletionBody) -> GenerationRequest:
    # Unserved values (top_logprobs, audio, functions...) were refused by the body's own types.
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return GenerationRequest(
        messages=_normalise_messages(body.messages),
        tools=_check_tools(body.tools),
        tool_choice=_tool_choice(body.tool_choice, "tool_choice"),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        response_format=_response_format(body.response_format, "response_format", nested=True),
        sampling=_sampling(body, max_tokens, body.stop),
        model=body.model,
    )


def _tool_choice(choice: Any, param: str) -> Any:
    """OpenAI's tool_choice: "auto", "none", "required", or a named function (checked for shape)."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
        if isinstance(name, str) and name:
            return {"type": "function", "function": {"name": name}}
    raise GatewayHTTPError(
        400,
        f"{param}: must be 'auto', 'none', 'required' or {{'type': 'function', 'function': {{'name': ...}}}}",
        param=param,
        code="invalid_value",
    )


def completion_request(body: CompletionBody) -> GenerationRequest:
    # echo, suffix, best_of>1 and logprobs>0 were refused by the body's own types.
    raw: Any = body.prompt
    if isinstance(raw, list) and raw and isinstance(raw[0], (str, list)):
        if len(raw) != 1:
            raise _reject("prompt", "batched prompts are not supported; send one request per prompt")
        raw = raw[0]
    prompt: str | list[int] = raw
    if not prompt:
        raise GatewayHTTPError(400, "prompt: must not be empty", param="prompt")
    return GenerationRequest(
        prompt=prompt, sampling=_sampling(body, body.max_tokens, body.stop), model=body.model
    )


CUSTOM_INPUT = "input"
"""A custom (freeform) tool's one argument: the model writes its free text as `{"input": "..."}` and
the gateway answers a `custom_tool_call` whose `input` is that text."""


def _custom_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """A custom tool as a function of one string, its grammar (if any) named in the description."""
    text: dict[str, Any] = {"type": "string"}
    fmt = tool.get("format")
    if isinstance(fmt, dict) and isinstance(fmt.get("definition"), str):
        text["description"] = f"Free text in this {fmt.get('syntax', '')} grammar:\n{fmt['definition']}"
    return {"type": "object", "properties": {CUSTOM_INPUT: text}, "required": [CUSTOM_INPUT]}


def _responses_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in ("function", "custom") or not isinstance(tool.get("name"), str):
            raise _reject(f"tools.{i}", "only function and custom tools are supported")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        if kind == "custom":
            fn["parameters"] = _custom_parameters(tool)
        out.append({"type": "function", "function": fn})
    return out


def custom_tool_names(tools: Any) -> frozenset[str]:
    """The names of a request's custom (freeform) tools: their calls are answered as `custom_tool_call`."""
    if not isinstance(tools, list):
        return frozenset()
    return frozenset(t["name"] for t in tools if isinstance(t, dict) and t.get("type") == "custom")


def _check_reasoning(reasoning: dict[str, Any] | None) -> None:
    """`summary` is accepted (nothing is reasoned apart from the reply, so there is none to summarise);
    an `effort` other than none would ask for a reasoning budget the backend does not have."""
    if not reasoning:
        return
    for key, value in reasoning.items():
        if key == "summary":
            if value not in (None, "auto", "concise", "detailed", "none"):
                raise _reject("reasoning.summary", "must be 'auto', 'concise', 'detailed' or 'none'")
        elif key == "effort":
            if value not in (None, "none"):
                raise _reject("reasoning.effort", "reasoning effort is not supported (only 'none')")
        else:
            raise _reject(f"reasoning.{key}", "not supported")


def _responses_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return _tool_choice({"type": "function", "function": {"name": choice.get("name")}}, "tool_choice")
    return _tool_choice(choice, "tool_choice")


def _responses_messages(body: ResponsesBody) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
        return messages
    if not body.input:
        raise GatewayHTTPError(400, "input: must not be empty", param="input")
    for i, item in enumerate(body.input):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise GatewayHTTPError(
                    400, f"input.{i}.role: unsupported role {role!r}", param=f"input.{i}.role"
                )
            content = text_of(item.get("content"), f"input.{i}.content")
            messages.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "function_call":
            _check_strings(item, f"input.{i}", required=("name",), optional=("arguments", "call_id"))
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # a turn's text and calls: one message
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "custom_tool_call":
            _check_strings(item, f"input.{i}", required=("name", "input"), optional=("call_id",))
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item["name"], "arguments": json.dumps({CUSTOM_INPUT: item["input"]})},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "reasoning":
            continue  # the gateway answers no reasoning items: one sent back is not the model's text
        elif kind in ("function_call_output", "custom_tool_call_output"):
            _check_strings(item, f"input.{i}", required=(), optional=("call_id",))
            output = item.get("output")
            text = output if isinstance(output, str) else text_of(output, f"input.{i}.output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        else:
            raise _reject(f"input.{i}.type", f"input items of type {kind!r} are not supported")
    return messages


def _check_strings(
    item: dict[str, Any], param: str, required: tuple[str, ...], optional: tuple[str, ...]
) -> None:
    """An input item's text fields: the required ones present, and each one sent a string."""
    for key in (*required, *optional):
        if (key in item or key in required) and not isinstance(item.get(key), str):
            raise GatewayHTTPError(400, f"{param}.{key}: must be a string", param=f"{param}.{key}")


def responses_request(body: ResponsesBody) -> GenerationRequest:
    # previous_response_id, conversation, prompt, background and top_logprobs were refused by the
    # body's own types.
    _check_reasoning(body.reasoning)
    if (body.text or {}).get("verbosity") not in (None, "low", "medium", "high"):
        raise _reject("text.verbosity", "must be 'low', 'medium' or 'high'")  # a hint, ignored
    return GenerationRequest(
        messages=_responses_messages(body),
        tools=_responses_tools(body.tools),
        tool_choice=_responses_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        response_format=_response_format((body.text or {}).get("format"), "text.format", nested=False),
        sampling=_sampling(body, body.max_output_tokens, None),
        model=body.model,
    )


def reward_body(data: Any) -> RewardBody:
    return parse_body(RewardBody, data)


def finish_body(data: Any, attempt_id: str) -> FinishBody:
    body = parse_body(FinishBody, data)
    check_span_owners(body, attempt_id)
    return body


def check_span_owners(body: FinishBody, attempt_id: str) -> None:
    """A finish may carry only the finished attempt's own spans (400 naming the first stray one)."""
    for i, span in enumerate(body.spans):
        if span.attempt_id != attempt_id:
            raise GatewayHTTPError(
                400,
                f"spans.{i}: the span belongs to attempt {span.attempt_id!r}, not {attempt_id!r}",
                param=f"spans.{i}.attempt_id",
                code="invalid_value",
            )
