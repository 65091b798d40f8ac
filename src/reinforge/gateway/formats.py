"""OpenAI response bodies and stream events built from one GenerationResult.

Pure functions: the app decides when to send what; these decide only the shapes, which follow
OpenAI's API reference so the official SDKs parse them into their typed objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reinforge.inference.contract import GenerationResult, ToolCall
from reinforge.json_codec import dumps, loads

__all__ = ["dumps", "loads"]  # re-exported: the gateway's handlers write bodies through formats

TokenTexts = Callable[[list[int]], list[str]]
"""Maps token ids to the text of each token, for the `token` fields of logprobs."""


def token_id_texts(ids: list[int]) -> list[str]:
    """vLLM's `return_tokens_as_token_ids` convention, used when a backend can't name its tokens."""
    return [f"token_id:{i}" for i in ids]


def sse(data: Any) -> bytes:
    return b"data: " + dumps(data) + b"\n\n"


def sse_event(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + dumps(event) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def usage(result: GenerationResult) -> dict[str, int]:
    p, c = len(result.prompt_token_ids), len(result.completion_token_ids)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def chat_message(result: GenerationResult) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.text or None, "refusal": None}
    if result.tool_calls:
        message["tool_calls"] = [_tool_call(c) for c in result.tool_calls]
    elif message["content"] is None:
        message["content"] = ""
    return message


def chat_logprobs(ids: list[int], logprobs: list[float], texts: TokenTexts) -> dict[str, Any]:
    content = []
    for token, logprob in zip(texts(ids), logprobs, strict=True):
        content.append(
            {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}
        )
    return {"content": content, "refusal": None}


def chat_body(
    result: GenerationResult,
    *,
    response_id: str,
    created: int,
    model: str,
    with_logprobs: bool,
    with_token_ids: bool,
    texts: TokenTexts,
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": chat_message(result),
        "logprobs": chat_logprobs(result.completion_token_ids, result.logprobs, texts)
        if with_logprobs
        else None,
        "finish_reason": result.finish_reason,
    }
    body: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(result),
        "system_fingerprint": f"policy-v{result.policy_version}",
    }
    if with_token_ids:
        body["prompt_token_ids"] = result.prompt_token_ids
        choice["token_ids"] = result.completion_token_ids
    return body


def chat_chunk(
    response_id: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
    }


def chat_tool_call_deltas(result: GenerationResult) -> list[dict[str, Any]]:
    return [{"index": i, **_tool_call(call)} for i, call in enumerate(result.tool_calls)]


def completion_logprobs(ids: list[int], logprobs: list[float], texts: TokenTexts) -> dict[str, Any]:
    tokens = texts(ids)
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": offsets}


def completion_body(
    result: GenerationResult,
    *,
    response_id: str,
    created: int,
    model: str,
    with_logprobs: bool,
    with_token_ids: bool,
    texts: TokenTexts,
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "text": result.text,
        "logprobs": completion_logprobs(result.completion_token_ids, result.logprobs, texts)
        if with_logprobs
        else None,
        "finish_reason": "stop" if result.finish_reason == "tool_calls" else result.finish_reason,
    }
    if with_token_ids:
        choice["prompt_token_ids"] = result.prompt_token_ids
        choice["token_ids"] = result.completion_token_ids
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(result),
        "system_fingerprint": f"policy-v{result.policy_version}",
    }


def completion_chunk(
    response_id: str, created: int, model: str, text: str, finish_reason: str | None
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }


# --- Responses API -------------------------------------------------------------------------------


def responses_logprobs(result: GenerationResult, texts: TokenTexts) -> list[dict[str, Any]]:
    """Every generated token's logprob (tool-call markup included: it was generated too)."""
    return chat_logprobs(result.completion_token_ids, result.logprobs, texts)["content"]


def responses_message_item(
    item_id: str, text: str, status: str = "completed", logprobs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}]
        if status == "completed"
        else []
    )
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def responses_function_item(item_id: str, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if status == "completed" else "",
    }


def responses_output(
    result: GenerationResult, ids: Callable[[], str], logprobs: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = []
    if result.text or not result.tool_calls:
        output.append(responses_message_item("msg_" + ids(), result.text, logprobs=logprobs))
    output.extend(responses_function_item("fc_" + ids(), call) for call in result.tool_calls)
    return output


def responses_body(
    *,
    response_id: str,
    created: int,
    model: str,
    request: dict[str, Any],
    status: str,
    output: list[dict[str, Any]],
    result: GenerationResult | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": request.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": None,
        "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }
    if result is not None:
        if result.finish_reason == "length":
            body["status"] = "incomplete"
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        p, c = len(result.prompt_token_ids), len(result.completion_token_ids)
        body["usage"] = {
            "input_tokens": p,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": c,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p + c,
        }
    return body
