"""Parsing Hermes/Qwen-style tool calls out of completion text.

Format (the project's tiny models and Qwen/Hermes models alike):
`<tool_call>{"name": "calc", "arguments": {"expression": "58*2"}}</tool_call>`, one block per call,
any number of blocks. A block that is not a JSON object with a string `name` and an object (or
JSON-object string) `arguments`, or a block left open, makes the whole completion malformed: it is
returned as plain text with the flag set, so the gateway can record it (an AIR signal).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from reinforge.gateway.backend import ToolCall
from reinforge.models.chat_template import TOOL_CALL_END, TOOL_CALL_START

_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)


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
    if TOOL_CALL_START in rest or TOOL_CALL_END in rest:  # an unclosed or stray marker
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
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=obj["name"], arguments=json.dumps(args))


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
