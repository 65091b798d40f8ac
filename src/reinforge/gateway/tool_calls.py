"""Hermes/Qwen tool-call markup: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Used where a backend returns raw text (SGLang's native API) and to flag malformed calls; a model that
opened a tool call it could not finish is an Automatic Intermediate Reward signal, so it is reported,
never silently dropped.
"""

from __future__ import annotations

import json
import re
import secrets

from reinforge.gateway.backend import ToolCall

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall], bool]:
    """(text without the markup, the parsed calls, whether some call was malformed).

    When any call is malformed, the text is returned unchanged and no calls are returned: executing
    half of what the model asked for would be worse than treating the turn as plain text.
    """
    if TOOL_CALL_START not in text:
        return text, [], False
    calls: list[ToolCall] = []
    for block in _BLOCK.findall(text):
        try:
            payload = json.loads(block)
        except ValueError:
            return text, [], True
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return text, [], True
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):
            try:
                json.loads(arguments)
            except ValueError:
                return text, [], True
        elif isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        else:
            return text, [], True
        calls.append(ToolCall(id="call_" + secrets.token_hex(8), name=payload["name"], arguments=arguments))
    rest = _BLOCK.sub("", text)
    if TOOL_CALL_START in rest or not calls:
        return text, [], True
    return rest.strip(), calls, False
