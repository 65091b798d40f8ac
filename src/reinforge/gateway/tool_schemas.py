"""One spelling for a tool set: the same tools render the same prompt whichever framework sends them.

Why: every framework serialises a Python function's schema its own way (LangChain puts `type` last,
the Agents SDK adds titles, `strict` and `additionalProperties`, AutoGen titles every property, the
Anthropic SDK sorts keys). A chat template that renders the schema as JSON would then show the model
a different prompt for the same tool depending on who sent it. The gateway renders from a canonical
form: schema keywords in one order, `title`/`$schema`/`strict` dropped (they say nothing to the
model), property order kept (it is the function's parameter order). The request body is recorded as
sent.
"""

from __future__ import annotations

from typing import Any

_DROPPED = frozenset({"title", "$schema", "strict"})
_ORDER = (
    "type",
    "description",
    "enum",
    "const",
    "properties",
    "items",
    "required",
    "anyOf",
    "oneOf",
    "allOf",
    "default",
    "additionalProperties",
)
_RANK = {key: i for i, key in enumerate(_ORDER)}
_NESTED = frozenset({"items", "additionalProperties", "not"})
_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties"})


def canonical_schema(schema: Any) -> Any:
    """A JSON Schema with its keywords in one order and presentation-only keywords dropped."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key in sorted(schema, key=lambda k: (_RANK.get(k, len(_ORDER)), k)):
        if key in _DROPPED:
            continue
        value = schema[key]
        if key in _MAPS and isinstance(value, dict):
            value = {name: canonical_schema(sub) for name, sub in value.items()}
        elif key in _LISTS and isinstance(value, list):
            value = [canonical_schema(sub) for sub in value]
        elif key in _NESTED:
            value = canonical_schema(value)
        out[key] = value
    return out


def canonical_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """OpenAI function tools as `{type, function: {name, description, parameters}}` in one spelling."""
    if not tools:
        return tools
    out = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else None
        if tool.get("type") != "function" or fn is None:
            out.append(tool)
            continue
        canonical: dict[str, Any] = {"name": fn["name"]}
        if fn.get("description"):
            canonical["description"] = fn["description"]
        if fn.get("parameters") is not None:
            canonical["parameters"] = canonical_schema(fn["parameters"])
        out.append({"type": "function", "function": canonical})
    return out
