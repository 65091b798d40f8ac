"""A fast scripted model for a one-tool agent loop, in three API formats, with exact token ids.

`python benchmarks/baselines/tool_loop_upstream.py PORT` serves 127.0.0.1:PORT:
- `POST .../chat/completions` (with vLLM's token fields, so the reinforge gateway can front it),
  `POST .../responses` and `POST .../messages` (Anthropic), each answering a conversation whose last
  message is not a tool result with one call of the request's first tool (arguments `{}`), and
  otherwise with the text "done".
- Token ids are the UTF-8 bytes of a fixed rendering of the conversation (role markers, content,
  tool calls as `<tool_call>{"name":..,"arguments":..}</tool_call>`), so a conversation whose history
  comes back exactly as generated has prompts that extend the previous prompt and completion: the
  condition reinforge merges calls on. The frameworks' own re-serialisations break it unless the
  gateway restores the generated spelling.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from raw_http import http_response, serve

END = "</s>"


def ids_of(text: str) -> list[int]:
    return list(text.encode())


def _call_markup(name: str, arguments: str) -> str:
    return '<tool_call>{"name":' + json.dumps(name) + ',"arguments":' + arguments + "}</tool_call>"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def render_chat(messages: list[dict[str, Any]]) -> str:
    out = []
    for m in messages:
        calls = "".join(
            _call_markup(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []
        )
        out.append(f"<|{m['role']}|>{_text(m.get('content'))}{calls}{END}")
    return "".join(out) + "<|assistant|>"


def _wants_tool(last_is_tool_result: bool, tools: list[str]) -> str | None:
    return tools[0] if tools and not last_is_tool_result else None


def chat(body: dict[str, Any]) -> dict[str, Any]:
    messages = body["messages"]
    tools = [t["function"]["name"] for t in body.get("tools") or []]
    name = _wants_tool(messages[-1]["role"] == "tool", tools)
    prompt = ids_of(render_chat(messages))
    if name:
        call = {
            "id": f"call_{len(messages)}",
            "type": "function",
            "function": {"name": name, "arguments": "{}"},
        }
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        completion = ids_of(_call_markup(name, "{}") + END)
        finish = "tool_calls"
    else:
        message = {"role": "assistant", "content": "done"}
        completion = ids_of("done" + END)
        finish = "stop"
    return {
        "id": "chatcmpl-loop",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": body.get("model") or "policy",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish,
                "token_ids": completion,
                "logprobs": {
                    "content": [
                        {"token": f"token_id:{t}", "logprob": -0.25, "bytes": None, "top_logprobs": []}
                        for t in completion
                    ]
                },
            }
        ],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion), "total_tokens": 0},
    }


def responses(body: dict[str, Any]) -> dict[str, Any]:
    items = body["input"] if isinstance(body["input"], list) else []
    last_is_result = bool(items) and items[-1].get("type") == "function_call_output"
    name = _wants_tool(last_is_result, [t["name"] for t in body.get("tools") or []])
    if name:
        output: list[dict[str, Any]] = [
            {
                "type": "function_call",
                "id": f"fc_{len(items)}",
                "call_id": f"call_{len(items)}",
                "name": name,
                "arguments": "{}",
                "status": "completed",
            }
        ]
    else:
        text = {"type": "output_text", "text": "done", "annotations": []}
        output = [
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [text]}
        ]
    return {
        "id": "resp_loop",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "model": body.get("model") or "policy",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": body.get("tools") or [],
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
    }


def messages(body: dict[str, Any]) -> dict[str, Any]:
    last = body["messages"][-1]
    content = last.get("content")
    last_is_result = isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )
    name = _wants_tool(last_is_result, [t["name"] for t in body.get("tools") or []])
    if name:
        blocks: list[dict[str, Any]] = [
            {"type": "tool_use", "id": f"toolu_{len(body['messages'])}", "name": name, "input": {}}
        ]
        stop = "tool_use"
    else:
        blocks, stop = [{"type": "text", "text": "done"}], "end_turn"
    return {
        "id": "msg_loop",
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or "policy",
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


ROUTES = {"/chat/completions": chat, "/responses": responses, "/messages": messages}


def respond(method: str, path: str, body: bytes) -> bytes:
    path = path.split("?")[0]
    if path.startswith("/health"):
        return http_response("200 OK", b'{"status":"ok"}')
    handler = next((h for suffix, h in ROUTES.items() if path.endswith(suffix)), None)
    if method != "POST" or handler is None:
        return http_response("404 Not Found", b'{"error":{"message":"not found"}}')
    return http_response("200 OK", json.dumps(handler(json.loads(body))).encode())


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), respond))
