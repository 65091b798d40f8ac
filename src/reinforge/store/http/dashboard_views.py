"""Spans as the dashboard's rollout page shows them: prompt and response text, token counts, tool calls
with their results and errors, rewards and AIR signals, and no token-id lists.

An LLM span carries its prompt and completion token ids and a logprob per completion token; a page
of a long trajectory would be mostly those numbers. The view keeps their counts (and the mean
logprob) and the page asks for one call's logprobs when the user opens them. Prompt and response
text are read from the request and response bodies the gateway recorded, whichever API they used
(chat completions, completions, responses, Anthropic messages).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from reinforge import semconv
from reinforge.types import Span

_BULKY = (
    semconv.ATTR_PROMPT_TOKEN_IDS,
    semconv.ATTR_COMPLETION_TOKEN_IDS,
    semconv.ATTR_COMPLETION_LOGPROBS,
    semconv.ATTR_LLM_REQUEST,
    semconv.ATTR_LLM_RESPONSE,
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Message(_Model):
    role: str
    text: str


class ToolCallView(_Model):
    name: str
    arguments: str


class LlmView(_Model):
    endpoint: str | None
    model: str | None
    messages: list[Message]
    response_text: str
    tool_calls: list[ToolCallView]
    prompt_tokens: int
    completion_tokens: int
    mean_logprob: float | None
    finish_reason: str | None
    policy_version: int | None
    latency_ms: float | None


class SpanView(_Model):
    span_id: str
    parent_id: str | None
    attempt_id: str
    name: str
    kind: str
    """reinforge's step kind: llm, tool, reward, agent, custom."""
    start_time: float
    end_time: float | None
    status: str
    status_message: str | None
    agent_name: str | None
    air_signal: str | None
    reward: float | None
    reward_name: str | None
    tool_name: str | None
    attributes: dict[str, Any]
    """Every attribute except the bulky LLM ones, which `llm` summarises."""
    events: list[dict[str, Any]]
    llm: LlmView | None


class LogprobsView(_Model):
    span_id: str
    token_ids: list[int]
    logprobs: list[float]


def _text(content: Any) -> str:
    """Text of a message content in any API's shape (a string, or a list of typed parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(part) for part in content)
    if isinstance(content, dict):
        kind = content.get("type")
        if isinstance(content.get("text"), str):
            return str(content["text"])
        if kind == "tool_result":
            return _text(content.get("content"))
        if kind in ("tool_use", "function_call"):
            return (
                f"[{kind} {content.get('name')}] {json.dumps(content.get('input', content.get('arguments')))}"
            )
        if kind == "function_call_output":
            return _text(content.get("output"))
        return json.dumps(content, ensure_ascii=False)
    return str(content)


def _call(name: Any, arguments: Any) -> ToolCallView:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCallView(name=str(name), arguments=args)


def _messages(request: dict[str, Any]) -> list[Message]:
    out: list[Message] = []
    system = request.get("system") or request.get("instructions")
    if system:
        out.append(Message(role="system", text=_text(system)))
    if isinstance(request.get("prompt"), str):
        out.append(Message(role="prompt", text=request["prompt"]))
    items = request.get("messages")
    if items is None:
        raw = request.get("input")
        items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    for m in items or []:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role") or m.get("type") or "item")
        text = _text(m.get("content", m.get("output")))
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {}) if isinstance(call, dict) else {}
            text += f"\n[tool call {fn.get('name')}] {fn.get('arguments')}"
        if m.get("type") == "function_call":
            text = f"[tool call {m.get('name')}] {m.get('arguments')}"
        out.append(Message(role=role, text=text.strip()))
    return out


def _response(response: dict[str, Any]) -> tuple[str, list[ToolCallView]]:
    choices = response.get("choices")
    if isinstance(choices, list) and choices:
        first = choices[0] if isinstance(choices[0], dict) else {}
        if "text" in first:
            return str(first.get("text") or ""), []
        message = first.get("message") or {}
        calls = [
            _call(c.get("function", {}).get("name"), c.get("function", {}).get("arguments"))
            for c in message.get("tool_calls") or []
            if isinstance(c, dict)
        ]
        return _text(message.get("content")), calls
    text_parts: list[str] = []
    calls = []
    for item in response.get("output") or response.get("content") or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") in ("function_call", "tool_use"):
            calls.append(_call(item.get("name"), item.get("arguments", item.get("input"))))
        elif item.get("type") == "message":
            text_parts.append(_text(item.get("content")))
        elif item.get("type") == "text":
            text_parts.append(str(item.get("text", "")))
    return "\n".join(text_parts), calls


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _llm(attrs: dict[str, Any]) -> LlmView:
    request = attrs.get(semconv.ATTR_LLM_REQUEST)
    response = attrs.get(semconv.ATTR_LLM_RESPONSE)
    text, calls = _response(response) if isinstance(response, dict) else ("", [])
    logprobs = attrs.get(semconv.ATTR_COMPLETION_LOGPROBS) or []
    completion = attrs.get(semconv.ATTR_COMPLETION_TOKEN_IDS) or []
    version = attrs.get(semconv.ATTR_POLICY_VERSION)
    return LlmView(
        endpoint=attrs.get(semconv.ATTR_LLM_ENDPOINT),
        model=attrs.get(semconv.ATTR_MODEL),
        messages=_messages(request) if isinstance(request, dict) else [],
        response_text=text,
        tool_calls=calls,
        prompt_tokens=len(attrs.get(semconv.ATTR_PROMPT_TOKEN_IDS) or []),
        completion_tokens=len(completion),
        mean_logprob=sum(logprobs) / len(logprobs) if logprobs else None,
        finish_reason=attrs.get(semconv.ATTR_FINISH_REASON),
        policy_version=version if isinstance(version, int) else None,
        latency_ms=_number(attrs.get(semconv.ATTR_LATENCY_MS)),
    )


def span_view(span: Span) -> SpanView:
    attrs = span.attributes
    is_llm = span.name == semconv.SPAN_LLM_CALL or semconv.ATTR_COMPLETION_TOKEN_IDS in attrs
    kind = str(attrs.get(semconv.ATTR_STEP_KIND) or ("llm" if is_llm else "custom"))
    if span.name in (semconv.SPAN_REWARD, semconv.SPAN_FINAL_REWARD):
        kind = semconv.STEP_REWARD
    reward = _number(attrs.get(semconv.ATTR_REWARD_VALUE))
    return SpanView(
        span_id=span.span_id,
        parent_id=span.parent_id,
        attempt_id=span.attempt_id,
        name=span.name,
        kind=kind,
        start_time=span.start_time,
        end_time=span.end_time,
        status=span.status.code.value,
        status_message=span.status.message,
        agent_name=attrs.get(semconv.ATTR_AGENT_NAME),
        air_signal=attrs.get(semconv.ATTR_AIR_SIGNAL)
        or (semconv.AIR_MALFORMED_TOOL_CALL if attrs.get(semconv.ATTR_MALFORMED_TOOL_CALL) else None),
        reward=reward,
        reward_name=attrs.get(semconv.ATTR_REWARD_NAME),
        tool_name=attrs.get(semconv.ATTR_TOOL_NAME),
        attributes={k: v for k, v in attrs.items() if k not in _BULKY},
        events=[e.model_dump() for e in span.events],
        llm=_llm(attrs) if is_llm else None,
    )


def logprobs_view(span: Span) -> LogprobsView:
    attrs = span.attributes
    ids = attrs.get(semconv.ATTR_COMPLETION_TOKEN_IDS) or []
    logprobs = attrs.get(semconv.ATTR_COMPLETION_LOGPROBS) or []
    return LogprobsView(
        span_id=span.span_id, token_ids=[int(i) for i in ids], logprobs=[float(x) for x in logprobs]
    )
