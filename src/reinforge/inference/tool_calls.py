"""Hermes/Qwen tool-call markup: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

One parser for every backend that returns raw text (the embedded engine, SGLang's native API), and
the format the project's tiny models are trained on. A block that is not a JSON object with a
non-empty string `name` and an object (or JSON-object string) `arguments`, or a marker left open,
makes the whole completion malformed: it comes back as plain text with the flag set, so the gateway
records it (an Automatic Intermediate Reward signal) — executing half of what the model asked for
would be worse than treating the turn as text.

`arguments` keeps the exact text the model wrote. The agent sends it back in the next request's
history, the chat template inserts it as is, and so the next prompt extends the tokens the model
generated: that is what lets credit/ merge a conversation's calls into one sample.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from reinforge.inference.contract import ToolCall

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)
_ARGUMENTS_KEY = re.compile(r'"arguments"\s*:\s*')
_DECODER = json.JSONDecoder()


@dataclass
class ParsedCompletion:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    malformed: bool = False


def parse_tool_calls(text: str) -> ParsedCompletion:
    """Split `text` into plain text and tool calls (see the module docstring for the rules)."""
    if TOOL_CALL_START not in text:
        return ParsedCompletion(text)
    calls: list[ToolCall] = []
    for match in _BLOCK.finditer(text):
        call = _parse_block(match.group(1))
        if call is None:
            return ParsedCompletion(text, malformed=True)
        calls.append(call)
    rest = _BLOCK.sub("", text)
    if TOOL_CALL_START in rest or TOOL_CALL_END in rest or not calls:  # an unclosed or stray marker
        return ParsedCompletion(text, malformed=True)
    return ParsedCompletion(rest.rstrip(), calls)


def _parse_block(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError:
            return None
        if not isinstance(parsed, dict):
            return None
        return _call(obj["name"], args)
    if not isinstance(args, dict):
        return None
    return _call(obj["name"], _raw_arguments(body, args))


def _raw_arguments(body: str, args: dict[str, object]) -> str:
    """The arguments object exactly as written in `body`; compact JSON when it can't be located."""
    for key in _ARGUMENTS_KEY.finditer(body):
        try:
            value, end = _DECODER.raw_decode(body, key.end())
        except json.JSONDecodeError:
            continue
        if value == args:
            return body[key.end() : end]
    return json.dumps(args, ensure_ascii=False, separators=(",", ":"))


def _call(name: str, arguments: str) -> ToolCall:
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=name, arguments=arguments)


def safe_prefix_len(text: str) -> int:
    """How much of streamed `text` can be shown before tool-call markup may begin. Trailing
    whitespace waits too: the parsed text drops whitespace that ends up just before a call."""
    start = text.find(TOOL_CALL_START)
    if start >= 0:
        return len(text[:start].rstrip())
    if text[-1:].isspace():
        return len(text.rstrip())
    # Hold back a suffix that could be the beginning of the marker.
    for keep in range(min(len(TOOL_CALL_START) - 1, len(text)), 0, -1):
        if TOOL_CALL_START.startswith(text[-keep:]):
            return len(text[:-keep].rstrip())
    return len(text)
