"""The OpenAI request bodies the gateway accepts, validated and turned into one GenerationRequest.

Why strict: an option the backend can't honour (top-k alternatives, audio, server-side conversation
state) is a clear 400 naming the parameter, never silently ignored, because a silently different
sampling distribution would corrupt the behaviour logprobs the trainer relies on. Fields that change
nothing about generation (user, metadata, store...) are accepted and only recorded. The table of every
field, honoured or refused, is in docs/gateway.md.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reinforge.finish_wire import FinishBody
from reinforge.gateway.errors import GatewayHTTPError
from reinforge.inference.contract import GenerationRequest, ResponseFormat, SamplingParams

M = TypeVar("M", bound=BaseModel)

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

MAX_CHOICES = 16
"""The most samples one request may ask for (`n`): each is a generation and a recorded call."""


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
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    # Reinforge/vLLM extension: include the token ids in the response.
    return_token_ids: bool = False


class _OpenAISampling(_Body):
    stop: str | list[str] | None = None
    n: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream_options: dict[str, Any] | None = None


class ChatCompletionBody(_OpenAISampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: Any = None
    web_search_options: dict[str, Any] | None = None
    verbosity: str | None = None


class CompletionBody(_OpenAISampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None


class ResponsesBody(_Body):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    truncation: Literal["disabled", "auto"] | None = None
    background: bool | None = None
    max_tool_calls: int | None = None
    conversation: Any = None
    prompt: Any = None
    stream_options: dict[str, Any] | None = None


class RewardBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    reward: float = Field(allow_inf_nan=False)
    final: bool = True
    name: str | None = Field(default=None, max_length=256)


def parse_body(model: type[M], data: Any) -> M:
    """Validate a decoded JSON body; a validation failure becomes a 400 naming the parameter."""
    if not isinstance(data, dict):
        raise GatewayHTTPError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            message = f"Unrecognized request argument supplied: {param}"
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
        try:
            token = int(key)
        except ValueError:
            raise GatewayHTTPError(
                400, f"logit_bias: keys are token ids, got {key!r}", param="logit_bias", code="invalid_value"
            ) from None
        bias[token] = value
    return bias


def _response_format(raw: dict[str, Any] | None, param: str) -> ResponseFormat | None:
    """OpenAI's `response_format` (chat) or `text.format` (responses) as a ResponseFormat."""
    if not raw or raw.get("type") in (None, "text"):
        return None
    kind = raw.get("type")
    if kind == "json_object":
        return ResponseFormat(type="json_object")
    if kind != "json_schema":
        raise _reject(f"{param}.type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    spec = raw.get("json_schema", raw)  # chat nests the schema; responses' text.format does not
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        where = f"{param}.json_schema.schema" if "json_schema" in raw else f"{param}.schema"
        raise GatewayHTTPError(400, f"{where}: a JSON Schema object is required", param=where)
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


def _normalise_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in _ROLES:
            raise GatewayHTTPError(
                400,
                f"messages.{i}.role: must be one of {sorted(_ROLES)}, got {role!r}",
                param=f"messages.{i}.role",
            )
        normalised = dict(message)
        if role == "developer":
            normalised["role"] = "system"
        normalised["content"] = text_of(message.get("content"), f"messages.{i}.content")
        calls = message.get("tool_calls")
        if calls is not None and (
            not isinstance(calls, list)
            or not all(isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls)
        ):
            raise GatewayHTTPError(
                400,
                f"messages.{i}.tool_calls: must be a list of function calls",
                param=f"messages.{i}.tool_calls",
            )
        out.append(normalised)
    return out


def _check_tools(tools: list[dict[str, Any]] | None, param: str = "tools") -> list[dict[str, Any]] | None:
    if not tools:
        return None
    for i, tool in enumerate(tools):
        fn = tool.get("function")
        if tool.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise GatewayHTTPError(
                400, f"{param}.{i}: only function tools with a name are supported", param=f"{param}.{i}"
            )
    return tools


def chat_request(body: ChatCompletionBody) -> GenerationRequest:
    if body.top_logprobs:
        raise _reject("top_logprobs", "alternative tokens are not recorded; use logprobs=true alone")
    for name in (
        "audio",
        "prediction",
        "functions",
        "function_call",
        "web_search_options",
        "reasoning_effort",
    ):
        if getattr(body, name) is not None:
            raise _reject(name, "not supported by the reinforge gateway")
    if body.modalities and body.modalities != ["text"]:
        raise _reject("modalities", "only text output is supported")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return GenerationRequest(
        messages=_normalise_messages(body.messages),
        tools=_check_tools(body.tools),
        tool_choice=_tool_choice(body.tool_choice, "tool_choice"),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        response_format=_response_format(body.response_format, "response_format"),
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
    if body.echo:
        raise _reject("echo", "echo is not supported")
    if body.suffix:
        raise _reject("suffix", "suffix is not supported")
    if body.best_of not in (None, 1):
        raise _reject("best_of", "only best_of=1 is supported")
    if body.logprobs:
        raise _reject("logprobs", "alternative tokens are not recorded; use logprobs=0 for the chosen tokens")
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


def _responses_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise _reject(f"tools.{i}", "only function tools are supported")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


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
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else text_of(output, f"input.{i}.output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        else:
            raise _reject(f"input.{i}.type", f"input items of type {kind!r} are not supported")
    if not messages:
        raise GatewayHTTPError(400, "input: must not be empty", param="input")
    return messages


def responses_request(body: ResponsesBody) -> GenerationRequest:
    if body.previous_response_id:
        raise _reject("previous_response_id", "the gateway keeps no conversation state; send the whole input")
    if body.conversation is not None or body.prompt is not None:
        raise _reject("conversation" if body.conversation is not None else "prompt", "not supported")
    if body.background:
        raise _reject("background", "background responses are not supported")
    if body.top_logprobs:
        raise _reject("top_logprobs", "alternative tokens are not recorded")
    if body.reasoning and any(v is not None for v in body.reasoning.values()):
        raise _reject("reasoning", "reasoning options are not supported")
    return GenerationRequest(
        messages=_responses_messages(body),
        tools=_responses_tools(body.tools),
        tool_choice=_responses_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        response_format=_response_format((body.text or {}).get("format"), "text.format"),
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
