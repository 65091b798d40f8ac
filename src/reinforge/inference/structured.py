"""Output constraints as grammars: structured output (`response_format`) and forced tool calls.

Why grammars and not retries: a request that asks for JSON, or for a tool call (`tool_choice`
"required" or a named function), must get one on the first sample, or the agent framework fails the
run. A backend that samples its own tokens (the embedded engine) masks the logits with the grammar at
every step, so every sampled token is the policy's own choice among those the grammar allows.

The grammars are Lark in llguidance's dialect (`%json {schema}` embeds a JSON Schema). Tool calls use
the Hermes markup of `tool_calls.py`, the format the project's chat template renders, so a forced call
reads back exactly like a free one.
"""

from __future__ import annotations

import json
from typing import Any

from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import GenerationRequest, ResponseFormat
from reinforge.inference.tool_calls import TOOL_CALL_END, TOOL_CALL_START

ANY_OBJECT: dict[str, Any] = {"type": "object"}

COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
"""JSON is constrained to its compact spelling: with free whitespace a model off its training
distribution can pad a value with spaces until max_tokens, and the chat template renders compact
JSON, so this is also the spelling the model reads back."""


def _lark_string(text: str) -> str:
    """A Lark string literal (JSON escaping is a subset Lark reads)."""
    return json.dumps(text)


def _json_rule(schema: dict[str, Any]) -> str:
    styled = {**schema, "x-guidance": {**COMPACT_JSON, **schema.get("x-guidance", {})}}
    return "%json " + json.dumps(styled, ensure_ascii=False, separators=(",", ":"))


def json_grammar(fmt: ResponseFormat) -> str:
    """The whole output is one JSON value of the format (any object for "json_object")."""
    schema = ANY_OBJECT if fmt.type == "json_object" else fmt.json_schema
    if not isinstance(schema, dict):
        raise InvalidRequestError("response_format json_schema needs a schema object")
    return "start: " + _json_rule(schema)


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool.get("function", tool)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidRequestError("every tool needs a function name")
    return fn


def _call_schema(fn: dict[str, Any]) -> dict[str, Any]:
    parameters = fn.get("parameters")
    return {
        "type": "object",
        "properties": {
            "name": {"const": fn["name"]},
            "arguments": parameters if isinstance(parameters, dict) and parameters else ANY_OBJECT,
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def forced_tool(choice: Any) -> str | None:
    """The function a `tool_choice` names ({"type": "function", "function": {"name": ...}}), if any."""
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequestError("tool_choice names no function: give {'type': 'function', ...}")
        return name
    return None


def tool_call_grammar(tools: list[dict[str, Any]], choice: Any, parallel: bool) -> str | None:
    """A grammar for a turn that must be tool calls, or None when the model may answer in text."""
    if choice in (None, "auto", "none"):
        return None
    if choice != "required" and not isinstance(choice, dict):
        raise InvalidRequestError(f"tool_choice {choice!r} is not 'auto', 'none', 'required' or a function")
    functions = [_function(tool) for tool in tools]
    name = forced_tool(choice)
    if name is not None:
        functions = [fn for fn in functions if fn["name"] == name]
        if not functions:
            raise InvalidRequestError(f"tool_choice names {name!r}, which is not among the tools")
    if not functions:
        raise InvalidRequestError("tool_choice 'required' needs at least one tool")
    bodies = [f"call_{i}: {_json_rule(_call_schema(fn))}" for i, fn in enumerate(functions)]
    alternatives = " | ".join(f"call_{i}" for i in range(len(functions)))
    repeat = "+" if parallel and name is None else ""
    call = f"call: {_lark_string(TOOL_CALL_START)} ({alternatives}) {_lark_string(TOOL_CALL_END)}"
    return "\n".join([f"start: call{repeat}", call, *bodies])


def request_grammar(request: GenerationRequest) -> str | None:
    """The grammar a request's output must match: its forced tool calls, else its response format."""
    if request.tools:
        forced = tool_call_grammar(request.tools, request.tool_choice, request.parallel_tool_calls)
        if forced is not None:
            return forced
    elif request.tool_choice not in (None, "auto", "none"):
        raise InvalidRequestError("tool_choice forces a tool call, but the request has no tools")
    if request.response_format is not None:
        return json_grammar(request.response_format)
    return None
